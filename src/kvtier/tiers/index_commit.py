"""Finishing stores in a slot index (:meth:`kvtier.tiers.index.SlotIndex.commit`):
successful keys become READY in chain order, failed ones leave with their descendants,
and the index's listener hears each chain made READY as one run.

They are the index's commit path (:meth:`~kvtier.tiers.index.SlotIndex.commit` calls
them, nothing else changes entries this way) and take the index as a
:class:`Committing`: they promote keys in its entry map's run columns and drop keys
with ``invalidate``, its public removal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from kvtier.contract import IndexListener
from kvtier.keys import Key
from kvtier.tiers.index_entry import READY, STORING, EntryMap, IndexEntry


class Committing(Protocol):
    """What a commit needs of its index."""

    @property
    def entries(self) -> EntryMap: ...

    @property
    def listener(self) -> IndexListener | None: ...

    def invalidate(self, key: Key) -> list[Key]:
        """Remove ``key`` (present) and its descendants; the keys removed now."""


def commit_chain(index: Committing, keys: Sequence[Key], ok: Sequence[bool]) -> list[Key]:
    """:meth:`~kvtier.tiers.index.SlotIndex.commit`. In-order promotions (each key's
    parent READY when the loop reaches it, no waiting child) are the fast path: nothing is
    recorded for them, and ``tell_ready`` finds them as the head of ``keys``; anything
    else starts recording."""
    if commit_run(index, keys, ok):
        return []
    return commit_each(index, keys, ok)


def commit_each(index: Committing, keys: Sequence[Key], ok: Sequence[bool]) -> list[Key]:
    """:func:`commit_chain` key by key: any order, failures, waiting children."""
    dropped: list[Key] = []
    entries, listener = index.entries, index.listener
    rec: list[Key] | None = None  # with a listener, once the order broke: READY since
    head = i = 0  # keys promoted in order before that
    for i, (key, success) in enumerate(zip(keys, ok, strict=True)):
        e = entries.get(key)
        if e is None or e.state != STORING:
            if listener is not None and rec is None:
                rec, head = [], i
            continue
        if not success or e.doomed or (e.parent is not None and e.parent not in entries):
            e.done = True  # its write is over: its slot may be reused now
            if listener is not None:
                if rec is None:
                    rec, head = [], i
                tell_ready(listener, entries, keys, head, rec)
                head = 0
            dropped.extend(index.invalidate(key))
            continue
        e.done = True
        if e.parent is None or entries[e.parent].state == READY:
            e.state = READY
            e.done = False
            if rec is not None:
                rec.append(key)
            for c in e.children:
                ce = entries[c]
                if ce.done and not ce.doomed:  # its store ended first: ready now too
                    if listener is not None and rec is None:
                        rec, head = [], i + 1
                    promote(entries, c, rec)
        elif listener is not None and rec is None:
            rec, head = [], i
    if listener is not None:
        if rec is None:
            rec, head = [], (i + 1 if keys else 0)
        tell_ready(listener, entries, keys, head, rec)
    return dropped


def commit_run(index: Committing, keys: Sequence[Key], ok: Sequence[bool]) -> bool:
    """:func:`commit_chain`'s usual case on its run's columns: a store's own chain, all
    successful, every key STORING (not doomed, not waiting), consecutive members of one run
    whose first key's parent is READY (or the root), nothing branching off it, and the
    member after the last (the same chain's next store, when that was reserved before this
    commit came) not waiting to be promoted. Then every key becomes READY, exactly as the
    general loop would make them, in one slice assignment; False (nothing done) when the
    case does not apply."""
    n = len(keys)
    if n == 0 or False in ok:
        return False
    entries = index.entries
    runs, positions = entries.runs, entries.positions
    run = runs.get(keys[0])
    if run is None:
        return False
    pos = positions[keys[0]]
    end = pos + n
    members = run.keys
    if end > len(members) or members[pos:end] != (keys if isinstance(keys, list) else [*keys]):
        return False  # not one path of the tree
    parent = run.parent_at(pos)
    if parent is not None:
        prun = runs.get(parent)
        if prun is None or prun.state[positions[parent]] != READY:
            return False
    state = run.state
    if state.find(READY, pos, end) >= 0 or end in run.done:
        return False  # a key settled already, or a waiting child to promote: the loop
    if any(pos <= p < end for m in (run.doomed, run.done, run.branches) for p in m):
        return False  # a key doomed or waiting, or a branch: the general loop
    state[pos:end] = bytes([READY]) * n
    if index.listener is not None:
        tell_ready(index.listener, entries, keys, n, [])
    return True


def promote(entries: Mapping[Key, IndexEntry], key: Key, rec: list[Key] | None) -> None:
    """Make ``key`` READY, and the descendants whose stores ended while they waited for it,
    depth first (every parent before its children), appending them to ``rec``."""
    stack = [key]
    while stack:
        k = stack.pop()
        e = entries[k]
        e.state = READY
        e.done = False
        if rec is not None:
            rec.append(k)
        stack.extend(c for c in e.children if entries[c].done and not entries[c].doomed)


def tell_ready(
    listener: IndexListener,
    entries: Mapping[Key, IndexEntry],
    keys: Sequence[Key],
    head: int,
    rec: list[Key],
) -> None:
    """Tell ``listener`` what a commit made READY: ``keys[:head]``, promoted in order, then
    ``rec``; as chains, one ``ready_run`` each. The head is one chain when it is the run of
    the index it starts in (one C-level comparison); ``rec`` is cut where a key's parent is
    not the key before it. Empties ``rec``."""
    chains: list[list[Key]] = []
    if head:
        e0 = entries[keys[0]]
        part = e0.run.keys[e0.pos : e0.pos + head]
        if part == (keys if head == len(keys) else keys[:head]):
            chains.append(part)
        else:
            rec[:0] = keys[:head]  # not one path (not a store's chain): as any keys
    for k in rec:
        if chains and chains[-1][-1] == entries[k].parent:
            chains[-1].append(k)
        else:
            chains.append([k])
    rec.clear()
    for chain in chains:
        listener.ready_run(chain)
