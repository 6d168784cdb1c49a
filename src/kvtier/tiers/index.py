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

from collections.abc import Iterable, Sequence
from itertools import compress, count
from operator import itemgetter

from kvtier.contract import IndexListener
from kvtier.keys import Key
from kvtier.policies.eviction import EvictionPolicy
from kvtier.tiers.index_commit import commit_chain
from kvtier.tiers.index_entry import READY, STORING, EntryMap, add_child
from kvtier.tiers.index_removal import drop_subtree, remove_entry
from kvtier.tiers.index_restore import check_index, restore_entries
from kvtier.tiers.recency import ChainRecency
from kvtier.tiers.runs import Run, run_after, run_slots


class SlotIndex:
    """Key -> slot map of a tier with ``num_slots`` fixed-size slots: the authoritative,
    prefix-closed :class:`~kvtier.contract.TierIndex`."""

    shared = False

    def __init__(self, num_slots: int, policy: EvictionPolicy) -> None:
        if num_slots < 0:
            raise ValueError(f"num_slots must be >= 0, got {num_slots}")
        self.num_slots = num_slots
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
        self.recency = ChainRecency(policy, self._entries)
        """The policy's recency order: deferred ancestor touches, no-op touches skipped;
        told of every change of the order made past it (``recency.changed()``)."""
        self.listener: IndexListener | None = None
        """Told when a key becomes readable, stops being readable, or leaves (tier events,
        :mod:`kvtier.tier_events`); None (default) costs one test per change."""

    @property
    def policy(self) -> EvictionPolicy:
        """The eviction policy, its order settled (:attr:`ChainRecency.policy`)."""
        return self.recency.policy

    @policy.setter
    def policy(self, policy: EvictionPolicy) -> None:
        self.recency.policy = policy

    def settle(self) -> None:
        """Do the ancestor touch a reservation deferred (:meth:`ChainRecency.stored`);
        a request's end does too, so its cost stays with the request."""
        self.recency.settle()

    def admit_chain(self, keys: Sequence[Key]) -> int:
        return self.recency.admit_chain(keys)

    # -- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def entries(self) -> EntryMap:
        """Key -> a view of its entry (state, slot, pins), and the run and position
        columns behind them: for others to read (inspection, tests); changed only by the
        index's own paths (its commit: :mod:`kvtier.tiers.index_commit`)."""
        return self._entries

    @property
    def free_slot_order(self) -> tuple[int, ...]:
        """The free slots, the next one handed out last (inspection and tests)."""
        return tuple(self._free)

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
        self.recency.before_store(parent, evicting=need > 0)
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
        # Ancestors stay more recent than their descendants, their touch deferred.
        self.recency.stored(keys, parent)
        return slots

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
        return self._entries.pin(keys)

    def hold(self, key: Key) -> bool:
        self.pin((key,))
        return True

    def release(self, key: Key) -> None:
        self.unpin((key,))

    def unpin(self, keys: Iterable[Key]) -> None:
        for key in keys:
            if self._entries.unpin(key):
                self._drop(key)

    def observe(self, keys: Sequence[Key]) -> None:
        """One request's use of its chain ``keys`` (root first), for the eviction policy's
        reuse counting. Call once per request, before touching its hit."""
        self.recency.observe(keys, self.prefix_len(keys))

    def touch(self, keys: Sequence[Key]) -> None:
        """Refresh the recency of a chain prefix ``keys`` (which must start at the chain's
        root); not a use (see :meth:`observe`): :meth:`ChainRecency.touch`."""
        self.recency.touch(keys)

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
