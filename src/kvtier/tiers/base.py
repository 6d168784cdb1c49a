"""The tier contract.

A tier stores fixed-size *chunks* (``chunk_bytes`` each) under ``KEY_BYTES``-byte keys
(:mod:`kvtier.keys`). Chunks form chains: chunk i's parent is chunk i-1 of the same token
sequence. Two interfaces:

- :class:`Tier`, the whole tier in one process: what a direct user, the simulator and the
  conformance suite (``kvtier.testing``) use.
- The split used inside an engine, where scheduler and workers may be different processes:
  the scheduler owns a :class:`~kvtier.tiers.index.SlotIndex` (keys, states, eviction) and
  every worker owns a :class:`SlotStore` (the bytes of each slot). The scheduler decides
  which slot a chunk goes to; the worker only moves bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Literal, NamedTuple, Protocol

import numpy as np
import torch

from kvtier.keys import Key
from kvtier.sources import HitSource

Segments = Sequence[tuple[int, torch.Tensor]]
"""Where one chunk's bytes go (or come from): ``(offset, tensor)`` pairs, each a 1-D uint8
tensor holding payload bytes ``[offset, offset + numel)``. A load may cover only part of a
payload (it skips blocks the engine already holds)."""


class Buffers(NamedTuple):
    """Where a batch of chunks' payloads live in host memory, as flat address arrays: the
    vectorized form of one :data:`Segments` list per chunk, for copies of many chunks made
    of many small pieces (a chunk of an engine's KV is one row per layer), where building a
    tensor view per piece costs more than moving the bytes.

    Chunk i is entries ``start[i] .. start[i+1] - 1`` of ``ptrs``/``lens`` (addresses and
    byte counts), in payload order, covering its whole payload. Entries listed in ``gaps``
    are payload ranges the caller skips (a load of blocks the engine already holds): their
    ``ptrs`` hold the payload offset instead of an address. The caller keeps the memory
    alive and unchanged (writes) or untouched by others (reads) for the call; a store only
    accepts these where it can check nothing else (:meth:`SlotStore.read` stays the
    general form).
    """

    start: np.ndarray
    """int64, one entry per chunk and one more."""
    ptrs: np.ndarray
    """uint64 addresses (payload offsets for gaps)."""
    lens: np.ndarray
    """uint64 byte counts."""
    gaps: np.ndarray
    """int64 indices of the gap entries, ascending (empty for writes)."""


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

    ``ready``: the key became readable (parents are told before their children).
    ``unready``: a readable key stopped being readable (evicted, dropped, invalidated,
    hidden while a copy still uses it). ``removed``: the key left the index, in any state.
    A listener must not call back into the index.
    """

    def ready(self, key: Key) -> None: ...

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

    def stored_len(self, keys: Sequence[Key]) -> int:
        """Leading keys present in any state (stored or being stored): where a store of
        this chain starts. A shared index answers 0: its store skips present keys."""

    def reserve(self, keys: Sequence[Key], parent: Key | None) -> list[int]:
        """Room for a chain continuing ``parent``: one address per key of the longest
        prefix that fits (slots; -1 for key-addressed stores)."""

    def commit(self, keys: Sequence[Key], ok: Sequence[bool]) -> list[Key]:
        """Stores finished (per-chunk success); returns keys dropped."""

    def slots_of(self, keys: Sequence[Key]) -> list[int]:
        """Addresses of readable keys (-1 each for key-addressed stores)."""

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

    def stored_len(self, keys: Sequence[Key]) -> int:
        return 0  # the store skips keys already present

    def reserve(self, keys: Sequence[Key], parent: Key | None) -> list[int]:
        return [NO_SLOT] * len(keys)

    def commit(self, keys: Sequence[Key], ok: Sequence[bool]) -> list[Key]:
        if self.listener is not None:
            for key, success in zip(keys, ok, strict=True):
                if success:
                    self.listener.ready(key)
        return []

    def slots_of(self, keys: Sequence[Key]) -> list[int]:
        return [NO_SLOT] * len(keys)

    def hold(self, key: Key) -> bool:
        return False  # no pins: a load copes with keys gone

    def release(self, key: Key) -> None:
        return None

    def touch(self, keys: Sequence[Key]) -> None:
        return None  # the store keeps its own recency

    def observe(self, keys: Sequence[Key]) -> None:
        return None  # the store's own policy decides what stays

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


class SlotStore(ABC):
    """Data plane of a tier: ``num_slots`` slots of ``slot_bytes`` bytes, addressed by slot
    (cpu, disk, private memory) or by key (``addressing = "key"``: shared stores, which
    ignore the slot numbers they are given).

    Contract:
    - ``read``/``write`` move chunk payloads between slots and caller-owned segments. The
      caller keeps ownership of the segments; the store never keeps a reference past the call.
    - Failure granularity is per chunk: the result lists, per chunk, whether it succeeded. A
      failed read leaves the destination bytes unspecified but never reports success for bytes
      that differ from what was written under that key (stores with headers check the key and
      a checksum). A failed write means the slot holds nothing valid.
    - Thread-safety: concurrent calls on *different* slots are allowed; the scheduler never
      lets two in-flight operations touch the same slot unless both read.
    """

    num_slots: int
    slot_bytes: int
    addressing: Literal["slot", "key"] = "slot"

    @abstractmethod
    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        """Copy slot payloads into ``dst`` segments."""

    @abstractmethod
    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        """Copy ``src`` segments into slots, recording ``keys`` with them. A write covers
        the whole payload. ``parents[i]`` is the key before ``keys[i]`` in its chain (None
        for a chain start); stores that survive restarts record it, others ignore it."""

    def accepts_buffers(self) -> bool:
        """Whether :meth:`read_buffers` and :meth:`write_buffers` move bytes by address
        (stores that do implement them say True)."""
        return False

    def read_buffers(self, slots: Sequence[int], keys: Sequence[Key], dst: Buffers) -> list[bool]:
        """:meth:`read`, with the destination given as :class:`Buffers`."""
        raise NotImplementedError(f"{type(self).__name__} does not read into addresses")

    def write_buffers(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Buffers,
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        """:meth:`write`, with the source given as :class:`Buffers` (no gaps)."""
        raise NotImplementedError(f"{type(self).__name__} does not write from addresses")

    def take_counters(self) -> dict[str, float]:
        """Counts of tier-specific events (kvtier metric names, e.g. bad remote values)
        since the last call; none by default."""
        return {}

    def close(self) -> None:
        """Release resources; idempotent."""


class Tier(ABC):
    """A whole tier in one process.

    Contract:
    - ``put(keys, data, parent)`` stores ``data[i]`` under ``keys[i]``, where ``keys`` is a
      chain continuing ``parent`` (None for a chain start). It returns how many leading
      chunks are now stored; chunks after the first refusal are refused too (a tier never
      holds a chunk whose parent it lacks). A refusal means: no room that eviction could
      free, a refused parent, or a failed write. Keys already present count as stored.
      Atomic per chunk: a chunk is either fully readable or absent.
    - ``get(keys, out)`` reads chunk i into ``out[i]`` and returns how many leading chunks
      were read correctly. Bytes past that count are unspecified. A tier never reports
      success for bytes that differ from what was put.
    - ``prefix_len(keys)`` is how many leading keys are present.
    - Ownership: ``data`` is copied during ``put``; ``out`` belongs to the caller.
    - Thread-safety: every method may be called from several threads.
    - ``close()`` is idempotent; other methods raise TierError after it.
    """

    name: str
    source: HitSource
    chunk_bytes: int
    capacity_chunks: int

    @abstractmethod
    def put(self, keys: Sequence[Key], data: torch.Tensor, parent: Key | None = None) -> int:
        """Store a chain of chunks; ``data`` is uint8 ``[len(keys), chunk_bytes]``."""

    @abstractmethod
    def get(self, keys: Sequence[Key], out: torch.Tensor) -> int:
        """Read chunks into uint8 ``out[len(keys), chunk_bytes]``."""

    @abstractmethod
    def prefix_len(self, keys: Sequence[Key]) -> int:
        """Leading keys present."""

    def contains(self, key: Key) -> bool:
        return self.prefix_len([key]) == 1

    @abstractmethod
    def delete(self, keys: Sequence[Key]) -> None:
        """Remove keys (and, to keep chains whole, their descendants)."""

    @abstractmethod
    def __len__(self) -> int:
        """Chunks stored."""

    @abstractmethod
    def close(self) -> None: ...
