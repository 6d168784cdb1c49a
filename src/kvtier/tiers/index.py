"""Scheduler-side bookkeeping of a slot tier: which key lives in which slot, in which state.

The index never touches data. It is owned by one thread (the scheduler's); tiers that are
used from several threads wrap it in a lock.

Invariants (checked by :meth:`SlotIndex.check`):

- *Prefix closure.* A key's parent (the previous chunk of its chain) is present whenever the
  key is: stores go in chain order, a key is only reserved under a present parent, and
  eviction only takes leaves (keys with no stored children). Presence along a chain is
  therefore monotone, so :meth:`prefix_len` is a binary search, and a lookup across tiers
  yields one run per tier.
- *Readiness is monotone too.* A key becomes READY only when its parent is READY; a child
  whose store finished first waits (``done``) and is promoted with its parent.
- A slot is *evictable* only when READY, unpinned (no load in flight) and childless. Slots
  being stored or loaded are never handed out again.
- *Runs.* Every entry belongs to one path of the tree, a :class:`~kvtier.tiers.runs.Run`,
  so a chain's slots are a few list slices (:meth:`SlotIndex.chain_slots`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, count
from operator import itemgetter

from kvtier.contract import IndexListener
from kvtier.keys import Key
from kvtier.policies.eviction import EvictionPolicy
from kvtier.tiers.index_entry import READY, STORING, EntryMap, IndexEntry, add_child
from kvtier.tiers.index_removal import drop_subtree, remove_entry
from kvtier.tiers.index_restore import check_index, restore_entries
from kvtier.tiers.recency import RecencyMemo
from kvtier.tiers.runs import Run, run_after, run_slots


class SlotIndex:
    """Key -> slot map of a tier with ``num_slots`` fixed-size slots: the authoritative,
    prefix-closed :class:`~kvtier.contract.TierIndex`."""

    shared = False

    def __init__(self, num_slots: int, policy: EvictionPolicy) -> None:
        if num_slots < 0:
            raise ValueError(f"num_slots must be >= 0, got {num_slots}")
        self.num_slots = num_slots
        self._policy = policy
        self._pending: tuple[Key, Key] | None = None
        """A deferred ancestor touch (:meth:`reserve`): ``(parent, last)``, the path from
        ``parent`` to the root still to be touched, and the deepest key that reservation
        added, where the same chain's next store continues."""
        self._entries = EntryMap()  # key -> a view; the store paths use its two dicts:
        self._runs, self._positions = self._entries.runs, self._entries.positions
        self._slots: dict[Key, int] = {}
        """Slot of every entry, apart from the entries: a hit's slots are read for every
        chunk of it, and a dict of ints answers them in one C-level pass (docs/benchmarks.md,
        "Measurements behind design choices")."""
        # Pop from the end: low slot numbers are handed out first.
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self.evictions = 0
        self.record_evictions = False
        """Keep ``(key, slot, parent)`` of every evicted key for :meth:`take_evicted`
        (write-back demotes them); off by default, so nothing accumulates unread."""
        self._evicted: list[tuple[Key, int, Key | None]] = []
        self.recency = RecencyMemo()
        """Told of every change of the policy's order, so a no-op touch is skipped."""
        self.listener: IndexListener | None = None
        """Told when a key becomes readable, stops being readable, or leaves (tier events,
        :mod:`kvtier.tier_events`); None (default) costs one test per change."""

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy, its order settled (:meth:`settle`): what it shows is what
        touching at once would have left."""
        self.settle()
        return self._policy

    @policy.setter
    def policy(self, policy: EvictionPolicy) -> None:
        self.settle()
        self._policy = policy

    def settle(self) -> None:
        """Do the ancestor touch a reservation deferred, if any (see :meth:`reserve`).
        Every use of the policy but a reservation continuing the same chain does this
        first; a request's end does too, so its cost stays with the request."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._touch_ancestors(pending[0])
            self.recency.changed()

    def admit_chain(self, keys: Sequence[Key]) -> int:
        """The policy's :meth:`~kvtier.policies.eviction.EvictionPolicy.admit_chain`,
        without settling: admission reads no recency order (the policy's contract)."""
        return self._policy.admit_chain(keys)

    # -- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def entries(self) -> Mapping[Key, IndexEntry]:
        """Key -> a read-only view of its entry (state, slot, pins): inspection and tests."""
        return self._entries

    def is_ready(self, key: Key) -> bool:
        run = self._runs.get(key)
        if run is None:
            return False
        pos = self._positions[key]
        return run.state[pos] == READY and pos not in run.doomed

    def has(self, key: Key) -> bool:
        """Present in any state (being stored or ready)."""
        run = self._runs.get(key)
        return run is not None and self._positions[key] not in run.doomed

    def slot_of(self, key: Key) -> int:
        return self._slots[key]

    def parent_of(self, key: Key) -> Key | None:
        return self._entries[key].parent

    def take_evicted(self) -> list[tuple[Key, int, Key | None]]:
        """``(key, slot, parent)`` of the keys evicted since the last call, in eviction
        order (a key's descendants before it), when ``record_evictions`` is on. Their
        slots are free already: a caller that still needs their bytes must keep writers
        of those slots waiting until it has read them."""
        out, self._evicted = self._evicted, []
        return out

    def slots_of(self, keys: Sequence[Key]) -> list[int]:
        """Slots of present keys (KeyError for an absent one)."""
        if len(keys) < 2:  # itemgetter of one key returns the value itself, of none fails
            return [self._slots[k] for k in keys]
        # One C call for the lot: ~35 ns a key here, where mapping __getitem__ took ~55.
        return list(itemgetter(*keys)(self._slots))

    def chain_slots(self, keys: Sequence[Key]) -> list[int]:
        """Slots of ``keys``, consecutive keys of one chain of this index (each the child
        of the one before; KeyError for an absent one): what :meth:`slots_of` answers, in
        O(runs * log chunks) (see the module docstring's *Runs*)."""
        return run_slots(self._runs, self._positions, keys)

    def ready_keys(self) -> list[Key]:
        return [k for k, e in self._entries.items() if e.state == READY and not e.doomed]

    def prefix_len(
        self,
        keys: Sequence[Key],
        start: int = 0,
        *,
        any_state: bool = False,
        end: int | None = None,
    ) -> int:
        """Index of the first key of ``keys[start:end]`` that is absent (binary search),
        ``end`` (default ``len(keys)``) when none is.

        Relies on prefix closure: along one chain, presence (and readiness) is monotone.
        """
        check = self.has if any_state else self.is_ready
        lo, hi = start, len(keys) if end is None else min(end, len(keys))
        while lo < hi:
            mid = (lo + hi) // 2
            if check(keys[mid]):
                lo = mid + 1
            else:
                hi = mid
        return lo

    def leading(self, keys: Sequence[Key], start: int = 0) -> int:
        return self.prefix_len(keys, start)

    def stored_len(self, keys: Sequence[Key], end: int | None = None) -> int:
        return self.prefix_len(keys, any_state=True, end=end)

    # -- stores ----------------------------------------------------------------------------

    def reserve(self, keys: Sequence[Key], parent: Key | None) -> list[int]:
        """Reserve slots for ``keys`` (a chain continuing ``parent``), evicting as needed.

        Returns the slots of the longest prefix of ``keys`` that fits; those keys are now
        STORING. Nothing is reserved if ``parent`` is given but absent, or if a key is
        already present (callers skip present keys first). Atomic: on a short answer the
        keys beyond it are untouched.
        """
        if not keys or (parent is not None and not self.has(parent)):
            return []
        runs = self._runs
        cut = next(compress(count(), map(runs.__contains__, keys)), None)
        if cut is not None:
            keys = keys[:cut]
        if not keys:
            return []
        free = self._free
        need = len(keys) - len(free)
        pending = self._pending
        if pending is not None and (need > 0 or pending[1] != parent):
            self.settle()  # not the same chain's next store: the order is read or changed
        if need > 0:
            evict_leaves(self, need, protect=parent)
        n = min(len(keys), len(free))
        keys = list(keys[:n])
        slots = free[len(free) - n :][::-1]  # popped from the end, as pop() would
        del free[len(free) - n :]
        if parent is None:
            run, pos = Run(), 0
        else:
            run, pos = run_after(runs[parent], self._positions[parent], parent)
        # Columns extended in C, nothing built per chunk (see kvtier.tiers.runs).
        run.extend(keys, slots, STORING)
        self._entries.add(keys, run, pos)
        self._slots.update(zip(keys, slots, strict=True))
        if parent is not None and n:
            add_child(self._entries[parent], keys[0], pos)
        # The policy inserts children first (by default), then the existing ancestors are
        # touched: every ancestor stays more recent than its descendants, so recency orders
        # meet leaves first and eviction never has to scan past inner nodes.
        self._policy.insert_chain(keys, parent)
        # The touch is deferred: a chunked prefill stores its chain over many steps, and
        # touching every ancestor at each was O(chain) per step. The next store of the same
        # chain (under the last key stored here) touches a superset of these keys, tail
        # first, after its own insert, which leaves exactly the order touching now would:
        # each touched key ends at the recent end wherever it was, and an insert reads
        # membership, never order (the policy's contract). Anything else settles first.
        if parent is not None:
            self._pending = (parent, keys[-1] if keys else parent)
        self.recency.changed()
        return slots

    def _touch_ancestors(self, key: Key | None) -> None:
        """Touch ``key`` and its ancestors, deepest first (:func:`path_to_root`)."""
        if key is not None:
            self._policy.touch_many(path_to_root(self, key))

    def commit(self, keys: Sequence[Key], ok: Sequence[bool]) -> list[Key]:
        """Finish stores: successful keys become READY, failed ones are dropped with their
        descendants. Returns the keys dropped. The listener hears each chain this makes
        READY in one ``ready_run``, before any removal the call makes; while the keys are
        promoted in order (a store's own commit), that costs nothing per key."""
        return commit_chain(self, keys, ok)

    def restore(self, entries: Iterable[tuple[Key, int, Key | None]]) -> int:
        """:func:`~kvtier.tiers.index_restore.restore_entries` (a tier's restart)."""
        return restore_entries(self, entries)

    # -- loads -----------------------------------------------------------------------------

    def pin(self, keys: Iterable[Key]) -> list[int]:
        """Protect READY keys from eviction while a load reads them; returns their slots."""
        slots = []
        for key in keys:
            e = self._entries[key]
            if e.state != READY or e.doomed:
                raise KeyError("pin: key is not ready")
            e.pins += 1
            slots.append(e.slot)
        return slots

    def hold(self, key: Key) -> bool:
        self.pin((key,))
        return True

    def release(self, key: Key) -> None:
        self.unpin((key,))

    def unpin(self, keys: Iterable[Key]) -> None:
        for key in keys:
            e = self._entries.get(key)
            if e is None:
                continue
            e.pins -= 1
            if e.pins == 0 and e.doomed:
                self._drop(key)

    def observe(self, keys: Sequence[Key]) -> None:
        """One request's use of its chain ``keys`` (root first), for the eviction policy's
        reuse counting. Call once per request, before touching its hit."""
        held = self.prefix_len(keys)
        policy = self.policy  # settled
        policy.observe(keys, held)
        if policy.observe_refreshes:
            self.recency.refreshed(keys, held)
        else:
            self.recency.changed()

    def touch(self, keys: Sequence[Key]) -> None:
        """Refresh the recency of a chain prefix ``keys`` (which must start at the chain's
        root); not a use (see :meth:`observe`).

        Tail first, so ancestors end up the most recent (see :meth:`reserve`). Skipped, as
        the no-op it would be, when nothing changed the order since this chain's last
        ``observe`` or ``touch`` covered ``keys``: a request's hit is touched when vLLM
        allocates its blocks, right after its first lookup observed the chain (a 128k-token
        hit would be 8,192 moves).
        """
        self.settle()
        if self.recency.is_fresh(keys):
            return
        self._policy.touch_many(reversed(keys))
        self.recency.refreshed(keys, len(keys))

    # -- removal ---------------------------------------------------------------------------

    def invalidate(self, key: Key) -> list[Key]:
        """Remove ``key`` and its descendants (e.g. their bytes failed a check).

        Pinned keys are hidden at once and removed when their last load finishes.
        Returns the keys removed now.
        """
        if key not in self._entries:
            return []
        return self._drop(key)

    def clear(self) -> None:
        """Forget everything that is not pinned or being stored (reset)."""
        for key, e in list(self._entries.items()):
            if key in self._entries and e.parent is None:
                self._drop(key)

    _drop = drop_subtree
    _remove = remove_entry

    # -- integrity -------------------------------------------------------------------------

    def check(self) -> None:
        """Raise AssertionError if an invariant is broken (tests and debugging)."""
        check_index(self, self._entries, self._free)


def path_to_root(index: SlotIndex, key: Key) -> list[Key]:
    """``key`` and its ancestors, deepest first: one slice per run the path passes through,
    for one ``touch_many``, where a key at a time cost a Python call per ancestor (a
    128k-token prefill's later steps touch thousands)."""
    parts: list[list[Key]] = []
    runs, positions = index._runs, index._positions
    k: Key | None = key
    while k is not None:
        run, pos = runs[k], positions[k]
        keys = run.keys
        parts.append(keys[pos::-1] if pos + 1 < len(keys) else keys[::-1])
        k = run.parent
    return parts[0] if len(parts) == 1 else [x for p in parts for x in p]


def commit_chain(index: SlotIndex, keys: Sequence[Key], ok: Sequence[bool]) -> list[Key]:
    """:meth:`SlotIndex.commit`. In-order promotions (each key's parent READY when the loop
    reaches it, no waiting child) are the fast path: nothing is recorded for them, and
    ``tell_ready`` finds them as the head of ``keys``; anything else starts recording."""
    if commit_run(index, keys, ok):
        return []
    return commit_each(index, keys, ok)


def commit_each(index: SlotIndex, keys: Sequence[Key], ok: Sequence[bool]) -> list[Key]:
    """:func:`commit_chain` key by key: any order, failures, waiting children."""
    dropped: list[Key] = []
    entries, listener = index._entries, index.listener
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
            dropped.extend(index._drop(key))
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


def commit_run(index: SlotIndex, keys: Sequence[Key], ok: Sequence[bool]) -> bool:
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
    run = index._runs.get(keys[0])
    if run is None:
        return False
    pos = index._positions[keys[0]]
    end = pos + n
    members = run.keys
    if end > len(members) or members[pos:end] != (keys if isinstance(keys, list) else [*keys]):
        return False  # not one path of the tree
    parent = run.parent_at(pos)
    if parent is not None:
        prun = index._runs.get(parent)
        if prun is None or prun.state[index._positions[parent]] != READY:
            return False
    state = run.state
    if state.find(READY, pos, end) >= 0 or end in run.done:
        return False  # a key settled already, or a waiting child to promote: the loop
    if any(pos <= p < end for m in (run.doomed, run.done, run.branches) for p in m):
        return False  # a key doomed or waiting, or a branch: the general loop
    state[pos:end] = bytes([READY]) * n
    if index.listener is not None:
        tell_ready(index.listener, index._entries, keys, n, [])
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


def evict_leaves(index: SlotIndex, n: int, protect: Key | None) -> list[Key]:
    """Evict up to ``n`` leaves of ``index`` in its policy's order, never ``protect``. A
    parent left childless by a pass may come earlier in the order than its child, so passes
    repeat while they free something and more is needed."""
    victims: list[Key] = []
    while len(victims) < n:
        got = _eviction_pass(index, n - len(victims), protect)
        if not got:
            break
        victims += got
    return victims


def _eviction_pass(index: SlotIndex, n: int, protect: Key | None) -> list[Key]:
    victims: list[Key] = []
    inner: list[Key] = []  # offered before their descendants: handed to policy.defer
    gone_children: dict[Key, int] = {}
    entries, runs, positions = index._entries, index._runs, index._positions
    for key in index.policy.candidates():
        run, pos = runs[key], positions[key]  # the columns, not a view: a pass reads many
        if key == protect or run.state[pos] != READY or pos in run.pins or pos in run.doomed:
            continue
        if run.num_children(pos) > gone_children.get(key, 0):
            inner.append(key)
            continue
        victims.append(key)
        parent = run.parent_at(pos)
        if parent is not None:
            gone_children[parent] = gone_children.get(parent, 0) + 1
        if len(victims) == n:
            break
    if index.record_evictions:
        index._evicted.extend((k, entries[k].slot, entries[k].parent) for k in victims)
    for key in victims:
        index._remove(key, evicted=True)
    if inner:  # those still inner now (this pass may have taken their last child)
        index.policy.defer([k for k in inner if k in runs and runs[k].has_children(positions[k])])
        index.recency.changed()
    index.evictions += len(victims)
    return victims


def store_at_once(index: SlotIndex, keys: Sequence[Key], admission: object = None) -> int:
    """Store the chunks of chain ``keys`` the index lacks and commit them as successful at
    once (index-only tools and tests, which have no bytes to move): the run after the
    present prefix, cut at the first key ``admission`` (an AdmissionPolicy) refuses,
    reserved in one call. Returns how many chunks were stored."""
    present = index.prefix_len(keys, any_state=True)
    todo = list(keys[present:])
    admit = getattr(admission, "admit", None)
    if admit is not None:
        n = 0
        while n < len(todo) and admit(todo[n]):
            n += 1
        todo = todo[:n]
    if not todo:
        return 0
    slots = index.reserve(todo, keys[present - 1] if present else None)
    if slots:
        index.commit(todo[: len(slots)], [True] * len(slots))
    return len(slots)
