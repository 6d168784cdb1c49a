"""The scheduler side of the tier contract: a :class:`TierIndex` (which chunk is where, in
what state, what to evict), the :class:`IndexListener` it tells of residency changes, and
what every shared (key-addressed) index answers alike (:class:`KeyAddressedIndex`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from kvtier.keys import Key


class Pending:
    """A lookup answer meaning "not yet": the index is still finding out (a slow probe);
    ask again later. Never blocks the caller."""

    _instance: Pending | None = None

    def __new__(cls) -> Pending:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "PENDING"


PENDING = Pending()


class IndexListener(Protocol):
    """Hears an index's residency changes, on the index's own thread, as they happen.

    ``ready_run``: the keys became readable; they are consecutive keys of one chain, parent
    first (an index tells a commit's chains in one call each, parents' calls first).
    ``unready``: a readable key stopped being readable (evicted, dropped, invalidated,
    hidden while a copy still uses it); an authoritative index tells a chain's keys
    deepest first. ``removed``: the key left the index, in any state.
    A listener must not call back into the index.
    """

    def ready_run(self, keys: list[Key]) -> None: ...

    def unready(self, key: Key) -> None: ...

    def removed(self, key: Key) -> None: ...


class TierIndex(Protocol):
    """Scheduler-side membership of one tier: which keys it holds, where, in what state.

    Two kinds implement it:

    - authoritative, prefix-closed (:class:`~kvtier.tiers.index.SlotIndex`: cpu, disk,
      private memory): kvtier alone writes the tier, so the index knows exactly what it
      holds; ``leading`` is a binary search, ``reserve`` hands out slots (evicting),
      ``hold`` pins a chain against eviction while it is read;
    - shared (:class:`KeyAddressedIndex`: the in-process test tier, Redis): other engines
      write the store and it evicts on its own. ``leading`` probes keys and stops at the
      first miss (and may answer PENDING), ``reserve`` hands out no slots (the store is
      addressed by key), ``hold`` cannot pin: a load may find a key gone and then fails that chunk.

    Single-threaded (the scheduler's thread). Every method is cheap or non-blocking.
    """

    shared: bool
    """True for a shared index (no prefix closure, no pins, key-addressed)."""
    evictions: int
    """Chunks this index evicted so far (0 for a shared one: the store evicts unseen)."""
    record_evictions: bool
    listener: IndexListener | None
    """Told of residency changes (tier events); None: nobody listens. A shared index tells
    only what this engine sees: its own successful stores and failed checks."""

    def leading(self, keys: Sequence[Key], start: int = 0) -> int | Pending:
        """Index of the first key at or after ``start`` that is not readable now."""

    def stored_len(self, keys: Sequence[Key], end: int | None = None) -> int:
        """Leading keys of ``keys[:end]`` present in any state (stored or being stored):
        where a store of this chain starts. A shared index answers 0: its store skips
        present keys."""

    def reserve(self, keys: Sequence[Key], parent: Key | None) -> list[int]:
        """Room for a chain continuing ``parent``: one address per key of the longest
        prefix that fits (slots; -1 for key-addressed stores)."""

    def commit(self, keys: Sequence[Key], ok: Sequence[bool]) -> list[Key]:
        """Stores finished (per-chunk success); returns keys dropped."""

    def slots_of(self, keys: Sequence[Key]) -> list[int]:
        """Addresses of readable keys (-1 each for key-addressed stores)."""

    def chain_slots(self, keys: Sequence[Key]) -> list[int]:
        """:meth:`slots_of` of consecutive keys of one chain (each the child of the one
        before), readable: a hit's, answered in far less than one step per key."""

    def hold(self, key: Key) -> bool:
        """Keep ``key``'s chain from eviction while a copy reads it; False if the index
        cannot (shared): the reader must then cope with the key vanishing."""

    def release(self, key: Key) -> None:
        """End a :meth:`hold` that returned True."""

    def touch(self, keys: Sequence[Key]) -> None:
        """Record reuse of a chain prefix (root first)."""

    def observe(self, keys: Sequence[Key]) -> None:
        """A request's chain was looked up (once per request): policies that count reuse
        per request hear of it here."""

    def admit_chain(self, keys: Sequence[Key]) -> int:
        """How many leading ``keys`` (a chain the tier lacks) are worth storing now, by the
        tier's eviction policy (asked when the tier is the stack's only one)."""

    def settle(self) -> None:
        """Finish any recency bookkeeping the index deferred (a request ended)."""

    def invalidate(self, key: Key) -> list[Key]:
        """Forget ``key`` and its descendants (their bytes failed a check)."""

    def take_evicted(self) -> list[tuple[Key, int, Key | None]]:
        """``(key, slot, parent)`` evicted since the last call, when recording."""

    def is_ready(self, key: Key) -> bool: ...

    def has(self, key: Key) -> bool: ...

    def slot_of(self, key: Key) -> int: ...

    def parent_of(self, key: Key) -> Key | None: ...

    def clear(self) -> None:
        """Forget what is not in use (reset). A shared index forgets its local state only."""

    def __len__(self) -> int: ...


NO_SLOT = -1
"""The address of a chunk in a key-addressed store (there are no slots)."""


class KeyAddressedIndex:
    """What every shared index answers alike (:class:`TierIndex`, shared kind): the store
    is addressed by key, written by other engines too and evicts on its own, so there are
    no slots, pins, stored prefix, recency or evictions to keep here. Subclasses answer
    ``leading`` (the probe), ``is_ready``, ``has``, ``clear`` and ``__len__``."""

    shared = True
    evictions = 0
    record_evictions = False
    listener: IndexListener | None = None

    def stored_len(self, keys: Sequence[Key], end: int | None = None) -> int:
        return 0  # the store skips keys already present

    def reserve(self, keys: Sequence[Key], parent: Key | None) -> list[int]:
        return [NO_SLOT] * len(keys)

    def commit(self, keys: Sequence[Key], ok: Sequence[bool]) -> list[Key]:
        if self.listener is not None:
            run: list[Key] = []  # the successful keys, cut at each failure
            for key, success in zip(keys, ok, strict=True):
                if success:
                    run.append(key)
                elif run:
                    self.listener.ready_run(run)
                    run = []
            if run:
                self.listener.ready_run(run)
        return []

    def slots_of(self, keys: Sequence[Key]) -> list[int]:
        return [NO_SLOT] * len(keys)

    chain_slots = slots_of

    def hold(self, key: Key) -> bool:
        return False  # no pins: a load copes with keys gone

    def release(self, key: Key) -> None:
        return None

    def touch(self, keys: Sequence[Key]) -> None:
        return None  # the store keeps its own recency

    def observe(self, keys: Sequence[Key]) -> None:
        return None  # the store's own policy decides what stays

    def admit_chain(self, keys: Sequence[Key]) -> int:
        return len(keys)  # the store's own policy decides what stays

    def settle(self) -> None:
        return None

    def invalidate(self, key: Key) -> list[Key]:
        if self.listener is not None:
            self.listener.unready(key)
        return []  # other engines may hold good copies; a bad value is just a miss

    def take_evicted(self) -> list[tuple[Key, int, Key | None]]:
        return []

    def slot_of(self, key: Key) -> int:
        return NO_SLOT

    def parent_of(self, key: Key) -> Key | None:
        return None
