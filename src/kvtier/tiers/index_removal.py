"""Removal from a slot index (:mod:`kvtier.tiers.index`): a subtree, or one leaf.

Members being read (pinned) or written (a store in flight) are doomed instead of freed,
so their slot is never handed out while a copy still uses it.
"""

from __future__ import annotations

from typing import Any

from kvtier.keys import Key
from kvtier.tiers.index_entry import READY, writing


def drop_subtree(index: Any, key: Key) -> list[Key]:
    """Remove the subtree of ``key`` from ``index`` (``SlotIndex._drop``); returns the keys
    removed now. Busy members (and those a busy descendant keeps) are doomed: hidden now,
    removed when their copy ends (unpin, commit)."""
    removed: list[Key] = []
    order: list[Key] = []
    stack = [key]
    while stack:
        k = stack.pop()
        order.append(k)
        stack.extend(index._entries[k].children)
    # Leaves first so every parent is still there when its child detaches.
    for k in reversed(order):
        e = index._entries[k]
        busy = e.pins > 0 or writing(e)
        if busy or e.has_children():
            # A busy node, or one a busy descendant keeps (as doomed): hidden now,
            # removed when that copy ends.
            if index.listener is not None and e.state == READY and not e.doomed:
                index.listener.unready(k)
            e.doomed = True
            continue
        index._remove(k, evicted=False)
        removed.append(k)
    return removed


def remove_entry(index: Any, key: Key, evicted: bool) -> None:
    """Take ``key``, a leaf, out of ``index`` (``SlotIndex._remove``): its entry, its
    run's tail, its slot back to the free list; tell the listener and the policy, and
    remove a doomed parent it leaves idle. On the runs' columns (an eviction removes
    thousands)."""
    policy = index.recency.settled()
    runs, positions = index._runs, index._positions
    run, pos = runs.pop(key), positions.pop(key)
    parent, slot = run.parent_at(pos), run.slots[pos]
    readable = run.state[pos] == READY and pos not in run.doomed
    del index._slots[key]
    run.cut(pos)  # its successors there left first
    if index.listener is not None:
        if readable:
            index.listener.unready(key)
        index.listener.removed(key)
    if parent is not None and parent in runs:
        prun, ppos = runs[parent], positions[parent]
        if pos == 0:  # a branch of the parent (else the cut above detached it)
            kept = tuple(c for c in prun.branches[ppos] if c != key)
            if kept:
                prun.branches[ppos] = kept
            else:
                del prun.branches[ppos]
        if not prun.has_children(ppos):
            policy.on_leaf(parent)
            if ppos in prun.doomed and ppos not in prun.pins and not prun.writing(ppos):
                index._remove(parent, evicted=False)
    policy.remove(key, evicted=evicted)
    index.recency.changed()
    index._free.append(slot)
