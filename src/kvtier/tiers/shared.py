"""A shared tier: a key-addressed store that other engines write and that evicts on its own.

Three parts, as a remote store (Redis, next) will have them:

- :class:`SharedSpace`, the store itself: sealed values (envelope + payload) by rank key,
  bounded, evicting random keys when full (``allkeys-random``), and ``evict_random`` for
  tests that pull keys from under kvtier. Here it lives in the process, named by
  ``memory://NAME`` URLs (:func:`shared_space`), so two engines in one process share it.
- :class:`ProbeIndex`, the scheduler's view: no membership of its own; a lookup probes the
  keys in one batch and stops at the first miss (a chunk counts only when every rank stored
  it); optionally it answers PENDING until a probe delay has passed, as a network probe
  running off the scheduler's thread would.
- :class:`SharedStore`, a worker's data plane: writes wrap the payload in its envelope
  (skipping keys already present: another engine stored them), reads unwrap and check it;
  a missing or bad value fails that chunk, which the engine recomputes.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence

import torch

from kvtier.contract import PENDING, KeyAddressedIndex, Pending, Segments, SlotStore
from kvtier.keys import Key, rank_key
from kvtier.tiers.envelope import unwrap, wrap


class SharedSpace:
    """A bounded map of rank keys to sealed values; thread-safe; evicts random keys."""

    def __init__(self, capacity_values: int, seed: int = 0) -> None:
        self.capacity_values = capacity_values
        self._data: dict[bytes, bytes] = {}
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self.evicted = 0
        self.probes = 0
        """Lookup batches answered (one round trip each)."""

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        with self._lock:
            return [self._data.get(k) for k in keys]

    def put_many(self, items: Sequence[tuple[bytes, bytes]]) -> list[bool]:
        """Store values; a key already present keeps its value (and counts as stored)."""
        out = []
        with self._lock:
            for k, v in items:
                if k not in self._data:
                    if self.capacity_values <= 0:
                        out.append(False)
                        continue
                    while len(self._data) >= self.capacity_values:
                        self._evict_one()
                    self._data[k] = v
                out.append(True)
        return out

    def leading(self, keys: Sequence[Key], ranks: int, start: int = 0) -> int:
        """Index of the first chunk key at or after ``start`` that some rank lacks."""
        with self._lock:
            self.probes += 1
            data = self._data
            i = start
            while i < len(keys) and all(rank_key(keys[i], r) in data for r in range(ranks)):
                i += 1
            return i

    def _evict_one(self) -> None:
        victim = self._rng.choice(list(self._data))
        del self._data[victim]
        self.evicted += 1

    def evict_random(self, n: int) -> int:
        """Drop up to ``n`` random values behind every engine's back; returns how many."""
        with self._lock:
            n = min(n, len(self._data))
            for _ in range(n):
                self._evict_one()
            return n

    def drop(self, key: bytes) -> bool:
        """Remove one value behind every engine's back (fault tests); whether it was there."""
        with self._lock:
            return self._data.pop(key, None) is not None

    def overwrite(self, key: bytes, value: bytes) -> None:
        """Replace a value as a misbehaving writer would (fault tests)."""
        with self._lock:
            self._data[key] = value

    def keys(self) -> list[bytes]:
        with self._lock:
            return list(self._data)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


_SPACES: dict[str, SharedSpace] = {}
_SPACES_LOCK = threading.Lock()


def shared_space(url: str, capacity_values: int) -> SharedSpace:
    """The in-process space a ``memory://NAME`` URL names, created on first use."""
    if not url.startswith("memory://") or len(url) <= len("memory://"):
        raise ValueError(f"shared memory tier: expected a url 'memory://NAME', got {url!r}")
    with _SPACES_LOCK:
        space = _SPACES.get(url)
        if space is None:
            space = _SPACES[url] = SharedSpace(capacity_values)
        return space


def drop_shared_space(url: str) -> None:
    with _SPACES_LOCK:
        _SPACES.pop(url, None)


class ProbeIndex(KeyAddressedIndex):
    """The shared :class:`~kvtier.contract.TierIndex` over a :class:`SharedSpace`.

    ``ranks``: how many tensor-parallel ranks store each chunk (all must have it).
    ``delay_s``: a probe's answer is available that long after it was first asked; before,
    :meth:`leading` returns PENDING. Answers are not cached: the store may lose any key at
    any time, and a load that finds one gone fails that chunk into recompute.
    """

    def __init__(self, space: SharedSpace, ranks: int = 1, delay_s: float = 0.0) -> None:
        self.space = space
        self.ranks = ranks
        self.delay_s = delay_s
        self._asked: dict[tuple[Key, int], float] = {}
        self.pending_answers = 0
        """Lookups answered PENDING (tests)."""

    def leading(self, keys: Sequence[Key], start: int = 0) -> int | Pending:
        if start >= len(keys):
            return start
        if self.delay_s > 0:
            ask = (keys[start], len(keys))
            now = time.monotonic()
            first = self._asked.setdefault(ask, now)
            if now - first < self.delay_s:
                self.pending_answers += 1
                return PENDING
            del self._asked[ask]
            if len(self._asked) > 4096:  # abandoned asks (requests that went away)
                self._asked = {k: t for k, t in self._asked.items() if now - t < 60}
        return self.space.leading(keys, self.ranks, start)

    def is_ready(self, key: Key) -> bool:
        return self.space.leading([key], self.ranks) == 1

    def has(self, key: Key) -> bool:
        return self.is_ready(key)

    def clear(self) -> None:
        self._asked.clear()

    def __len__(self) -> int:
        return len(self.space)


class SharedStore(SlotStore):
    """One rank's data plane on a :class:`SharedSpace` (key-addressed: slots are ignored).

    ``namespace``: this rank's 16-byte ``Namespace.digest()``, sealed into every value and
    checked on every read. Failure granularity: per chunk. Thread-safe.
    """

    addressing = "key"

    def __init__(self, space: SharedSpace, slot_bytes: int, namespace: bytes, rank: int = 0):
        self.space = space
        self.slot_bytes = slot_bytes
        self.num_slots = space.capacity_values
        self.namespace = namespace
        self.rank = rank
        self.bad_reads = 0
        """Reads that found a value missing, truncated, foreign or corrupt."""

    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        items = []
        for i, (key, chunk) in enumerate(zip(keys, src, strict=True)):
            buf = torch.empty(self.slot_bytes, dtype=torch.uint8)
            for off, seg in chunk:
                buf[off : off + seg.numel()].copy_(seg.reshape(-1).cpu())
            parent = parents[i] if parents else None
            value = wrap(key, parent, self.namespace, buf.numpy().tobytes())
            items.append((rank_key(key, self.rank), value))
        return self.space.put_many(items)

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        values = self.space.get_many([rank_key(k, self.rank) for k in keys])
        ok = []
        for key, value, chunk in zip(keys, values, dst, strict=True):
            payload = unwrap(value, key, self.namespace, self.slot_bytes)
            if payload is None:
                self.bad_reads += 1
                ok.append(False)
                continue
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            for off, seg in chunk:
                seg.copy_(data[off : off + seg.numel()].view(seg.shape))
            ok.append(True)
        return ok
