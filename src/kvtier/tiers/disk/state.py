"""What a DiskSlab knows about its slots in memory: the key and payload checksum each holds,
the keys' checksum seeds, and the write sequence numbers."""

from __future__ import annotations

import array
import threading
from collections.abc import Sequence

import numpy as np
import xxhash

from kvtier.keys import Key
from kvtier.tiers.disk.format import SlotHeader


class SlotTable:
    """Per slot: the key it holds (None: nothing readable), the payload checksum of its
    last write and the checksum seed of that key (0: not computed yet); the next write
    sequence number of the directory.

    Filled at open from the headers (:meth:`restore`), then changed by writes, erases and
    reads that fail their checksum. An entry is changed only by the operation that owns its
    slot (the scheduler never lets a write overlap another operation on the same slot), so
    entries need no lock; sequence numbers, which every write takes, have one.
    """

    __slots__ = ("_lock", "_next_seq", "key_of", "namespace", "seed_of", "sum_of")

    def __init__(self, num_slots: int, namespace: bytes) -> None:
        self.namespace = namespace
        self.key_of: list[Key | None] = [None] * num_slots
        self.sum_of = array.array("Q", bytes(8 * num_slots))  # exact 64-bit compares
        self.seed_of = np.zeros(num_slots, dtype=np.uint64)
        self._next_seq = 1
        self._lock = threading.Lock()

    def restore(self, headers: Sequence[SlotHeader], slot_bytes: int) -> list[SlotHeader]:
        """Hold what the valid ``headers`` found at open record for our namespace and slot
        size; sequence numbers continue past every header's (all namespaces). Returns the
        headers taken."""
        mine = [h for h in headers if h.namespace == self.namespace and h.length == slot_bytes]
        for h in mine:
            self.key_of[h.slot] = h.key
            self.sum_of[h.slot] = h.checksum
        self._next_seq = max((h.seq for h in headers), default=0) + 1
        return mine

    def take_seqs(self, n: int) -> int:
        """The first of ``n`` fresh write sequence numbers."""
        with self._lock:
            first = self._next_seq
            self._next_seq += n
        return first

    def seed(self, key: Key) -> int:
        """The payload checksum seed of ``key``."""
        # Seeded by key and namespace: bytes written under another key or namespace never
        # verify, even where the payloads are equal.
        return xxhash.xxh3_64_intdigest(key + self.namespace)

    def seeds(self, slots: np.ndarray, keys: Sequence[Key]) -> np.ndarray:
        """The checksum seeds of ``keys``, which ``slots`` hold: from the per-slot cache,
        filled in where it is empty (slots restored at open: hashing every key there
        would slow the open of a large tier)."""
        seeds: np.ndarray = self.seed_of[slots]
        for m in np.flatnonzero(seeds == 0).tolist():
            seeds[m] = self.seed_of[slots[m]] = self.seed(keys[m])
        return seeds

    def hold(self, slot: int, key: Key, checksum: int, seed: int) -> None:
        """Record that ``slot`` now holds ``key``, whose payload hashes to ``checksum``.
        The seed goes first: a reader checks the key before it takes the seed."""
        self.seed_of[slot] = seed
        self.sum_of[slot] = checksum
        self.key_of[slot] = key

    def forget(self, slot: int, key: Key) -> bool:
        """Make ``slot`` hold nothing readable, if it holds ``key``; whether it did."""
        if self.key_of[slot] != key:
            return False
        self.key_of[slot] = None
        return True


class Links:
    """The parents of a write's chunks, or the fact that they are unknown."""

    __slots__ = ("parents", "unknown")

    def __init__(self, parents: Sequence[Key | None] | None) -> None:
        self.parents = parents
        self.unknown = parents is None

    def parent(self, k: int) -> Key | None:
        return None if self.parents is None else self.parents[k]
