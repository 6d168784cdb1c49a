"""Rebuilding a disk tier's index after a restart: which chunks found on disk to re-admit,
and in which recency order."""

from __future__ import annotations

from collections.abc import Iterable

from kvtier.keys import Key
from kvtier.tiers.disk.format import SlotRecord, gc_paused
from kvtier.tiers.index import SlotIndex


def restorable(records: Iterable[SlotRecord], num_slots: int | None = None) -> list[SlotRecord]:
    """The records an index may re-admit, parents before children.

    Of several copies of one key (an evicted copy whose slot was not reused yet, and a newer
    one) the newest wins. Prefix closure: a record is admitted only if it starts a chain or
    its parent is admitted; the fixpoint is computed as one walk down from the chain starts
    (records whose ancestry never reaches a chain start are never met). O(records).
    """
    best: dict[Key, SlotRecord] = {}
    for r in records:
        if num_slots is not None and r.slot >= num_slots:
            continue
        cur = best.get(r.key)
        if cur is None or r.seq > cur.seq:
            best[r.key] = r
    children: dict[Key, list[SlotRecord]] = {}
    order: list[SlotRecord] = []
    for r in best.values():
        if r.parent is None:
            order.append(r)
        else:
            children.setdefault(r.parent, []).append(r)
    i = 0
    while i < len(order):  # breadth first: ``order`` grows while it is walked
        kids = children.get(order[i].key)
        if kids:
            order.extend(kids)
        i += 1
    return order


def restore_index(index: SlotIndex, records: Iterable[SlotRecord]) -> int:
    """Re-admit chunks found on disk into an empty ``index`` as READY, each in its own slot.

    Returns how many keys were restored (see :func:`restorable` for which). Recency for the
    eviction policy follows the write sequence numbers, with every chunk at least as recent
    as its descendants (as stores leave it), so the oldest chains go first.
    """
    with gc_paused():
        order = restorable(records, index.num_slots)
        newest = _subtree_newest(order)
        depth: dict[Key, int] = {}
        for r in order:  # parents first
            depth[r.key] = depth[r.parent] + 1 if r.parent is not None else 0
        index.restore((r.key, r.slot, r.parent) for r in order)  # parents first
        # Then recency: by the newest write in each key's subtree, deeper keys first on
        # ties, so every key is at least as recent as its descendants.
        policy = index.policy
        for r in sorted(order, key=lambda r: (newest[r.key], -depth[r.key])):
            policy.remove(r.key)
            policy.insert(r.key)
        index.recency.changed()
    return len(order)


def _subtree_newest(order: list[SlotRecord]) -> dict[Key, int]:
    """Per key, the newest write sequence number in its subtree (``order``: parents first)."""
    newest = {r.key: r.seq for r in order}
    for r in reversed(order):  # children first
        if r.parent is not None and newest[r.key] > newest[r.parent]:
            newest[r.parent] = newest[r.key]
    return newest
