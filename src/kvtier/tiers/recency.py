"""Recency bookkeeping of a slot index (:mod:`kvtier.tiers.index`): the eviction policy's
order kept with ancestors more recent than their descendants (:class:`ChainRecency`), and
when a refresh of a chain's recency changes nothing (:class:`RecencyMemo`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvtier.keys import Key
from kvtier.policies.eviction import EvictionPolicy
from kvtier.tiers.index_entry import EntryMap
from kvtier.tiers.runs import Run


class RecencyMemo:
    """Tells when refreshing a chain's recency would change nothing.

    A touch of a chain prefix makes its keys the most recent, ancestors last. Doing it again
    is a no-op while nothing changed the policy's order since, and the prefix is covered by
    the last refresh: the index then skips it. Every change of the order must be reported
    (:meth:`changed`), or a touch that matters is skipped.
    """

    __slots__ = ("_changes", "_fresh")

    def __init__(self) -> None:
        self._changes = 0
        self._fresh: tuple[int, Sequence[Key], int] | None = None
        """``(changes, chain, n)`` of the last refresh: the chain's first ``n`` keys were
        made the most recent (chains only grow, so those keys stay as they were)."""

    def changed(self) -> None:
        """The policy's order may have changed (a store, removal, deferral, restore)."""
        self._changes += 1

    def refreshed(self, keys: Sequence[Key], n: int) -> None:
        """``keys[:n]`` were just made the most recent, tail first."""
        self._changes += 1
        self._fresh = (self._changes, keys, n)

    def is_fresh(self, keys: Sequence[Key]) -> bool:
        """Whether the chain prefix ``keys`` is as a touch would leave it."""
        n, fresh = len(keys), self._fresh
        return (
            n > 0
            and fresh is not None
            and fresh[0] == self._changes
            and n <= fresh[2]
            and fresh[1][n - 1] == keys[n - 1]  # chained keys: equal here, equal prefix
        )


class ChainRecency:
    """The eviction policy's recency order, as a prefix-closed index keeps it.

    Owned by one :class:`~kvtier.tiers.index.SlotIndex` (the scheduler's thread); it reads
    the index's entries (``entries``: key -> run and position) and never changes them.
    Contract: every ancestor stays more recent than its descendants, so recency orders meet
    leaves first. A store's touch of its ancestors is deferred (:meth:`stored`) until the
    policy is used otherwise: :attr:`policy` settles first, so what it shows is what
    touching at once would have left. A refresh that would change nothing is skipped
    (:class:`RecencyMemo`): every change of the order made past this object must be
    reported (:meth:`changed`).
    """

    __slots__ = ("_memo", "_pending", "_policy", "_positions", "_runs")

    def __init__(self, policy: EvictionPolicy, entries: EntryMap) -> None:
        self._policy = policy
        self._runs, self._positions = entries.runs, entries.positions
        self._memo = RecencyMemo()
        self._pending: tuple[Key, Key] | None = None

    @property
    def policy(self) -> EvictionPolicy:
        """The policy, its order settled (:meth:`settled`)."""
        return self.settled()

    @policy.setter
    def policy(self, policy: EvictionPolicy) -> None:
        self.settle()
        self._policy = policy

    @property
    def pending(self) -> tuple[Key, Key] | None:
        """The deferred ancestor touch, ``(parent, last)``: the path from ``parent`` to the
        root still to be touched, and the deepest key that store added, where the same
        chain's next store continues; None when nothing is deferred."""
        return self._pending

    def settle(self) -> None:
        """Do the deferred ancestor touch, if any."""
        pending = self._pending
        if pending is not None:
            self._pending = None
            self._policy.touch_many(path_to_root(self._runs, self._positions, pending[0]))
            self._memo.changed()

    def settled(self) -> EvictionPolicy:
        """:meth:`settle`, then the policy: one call where a removal (thousands in an
        eviction) needs both."""
        if self._pending is not None:
            self.settle()
        return self._policy

    def changed(self) -> None:
        """The policy's order may have changed (a removal, deferral, restore)."""
        self._memo.changed()

    def admit_chain(self, keys: Sequence[Key]) -> int:
        """The policy's ``admit_chain``, unsettled: admission reads no recency order."""
        return self._policy.admit_chain(keys)

    def before_store(self, parent: Key | None, evicting: bool) -> None:
        """Settle, unless the store coming is the same chain's next one (under the key the
        deferred store added last) and evicts nothing: then its own touch takes over."""
        pending = self._pending
        if pending is not None and (evicting or pending[1] != parent):
            self.settle()

    def stored(self, keys: list[Key], parent: Key | None) -> None:
        """``keys``, a chain continuing ``parent``, were just reserved.

        The policy inserts children first (by default); the existing ancestors are touched
        after, but the touch is deferred: a chunked prefill stores its chain over many
        steps, and touching every ancestor at each was O(chain) per step. The next store
        of the same chain touches a superset of these keys, tail first, after its own
        insert, which leaves exactly the order touching now would: each touched key ends
        at the recent end wherever it was, and an insert reads membership, never order
        (the policy's contract). Anything else settles first (:meth:`before_store`)."""
        self._policy.insert_chain(keys, parent)
        if parent is not None:
            self._pending = (parent, keys[-1] if keys else parent)
        self._memo.changed()

    def observe(self, keys: Sequence[Key], held: int) -> None:
        """One request's use of its chain ``keys``, of which the index holds ``held``."""
        policy = self.policy  # settled
        policy.observe(keys, held)
        if policy.observe_refreshes:
            self._memo.refreshed(keys, held)
        else:
            self._memo.changed()

    def touch(self, keys: Sequence[Key]) -> None:
        """Refresh a chain prefix ``keys`` (root first), tail first so ancestors end the
        most recent; skipped, as the no-op it would be, when nothing changed the order
        since this chain's last ``observe`` or ``touch`` covered ``keys`` (a request's hit
        is touched right after its first lookup observed it: a 128k-token hit would be
        8,192 moves)."""
        if self._pending is not None:
            self.settle()
        if self._memo.is_fresh(keys):
            return
        self._policy.touch_many(reversed(keys))
        self._memo.refreshed(keys, len(keys))


def path_to_root(runs: Mapping[Key, Run], positions: Mapping[Key, int], key: Key) -> list[Key]:
    """``key`` and its ancestors, deepest first: one slice per run the path passes through,
    for one ``touch_many``, where a key at a time cost a Python call per ancestor (a
    128k-token prefill's later steps touch thousands)."""
    parts: list[list[Key]] = []
    k: Key | None = key
    while k is not None:
        run, pos = runs[k], positions[k]
        keys = run.keys
        parts.append(keys[pos::-1] if pos + 1 < len(keys) else keys[::-1])
        k = run.parent
    return parts[0] if len(parts) == 1 else [x for p in parts for x in p]
