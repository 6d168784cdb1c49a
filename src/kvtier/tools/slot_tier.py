"""A whole tier in one process, for tools, tests and benchmarks (not the runtime): a
convenience adapter over the one tier contract, and the disk tier as one (:class:`DiskTier`).

Not a second contract: a kind implements :class:`~kvtier.contract.TierIndex` and
:class:`~kvtier.contract.SlotStore` (built by its ``TierKind``) and nothing else.
:class:`SlotTier` composes an authoritative index and its store behind one lock, with the
calls a single-process tool or test wants (``put`` / ``get`` a chain of whole chunks), doing
what the engine's scheduler and worker do between them: reserve, write, commit; hold, read,
release, invalidate what failed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

import torch

from kvtier.contract import SlotStore, TierIndex
from kvtier.errors import TierError
from kvtier.keys import Key, Namespace
from kvtier.policies.registry import make_eviction_policy
from kvtier.sources import HitSource
from kvtier.tiers.disk.format import DEFAULT_FILE_BYTES
from kvtier.tiers.disk.restore import restore_index
from kvtier.tiers.disk.slab import DiskSlab
from kvtier.tiers.index import SlotIndex


class SlotTier:
    """An authoritative tier's index and store in one process.

    - ``put(keys, data, parent)`` stores ``data[i]`` under ``keys[i]`` (a chain continuing
      ``parent``) and returns how many leading keys are now stored; keys present already
      count, chunks after the first refusal are refused (no room, a refused parent, a
      failed write).
    - ``get(keys, out)`` reads chunk i into ``out[i]`` and returns how many leading chunks
      were read correctly; a chunk that fails its read leaves the tier with its
      descendants.
    - Thread-safe: one lock guards the index; copies run outside it, protected by the
      slot states (a slot being written is reserved, a chain being read is held).
    - ``close()`` is idempotent; the other methods raise TierError after it.
    """

    def __init__(self, name: str, source: HitSource, index: TierIndex, store: SlotStore) -> None:
        if index.shared:
            raise TypeError("SlotTier composes an authoritative index, not a shared one")
        self.name = name
        self.source = source
        self.index = index
        self.store = store
        self.chunk_bytes = store.slot_bytes
        self.capacity_chunks = store.num_slots
        self._lock = threading.Lock()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise TierError(f"{self.name} tier is closed")

    def put(self, keys: Sequence[Key], data: torch.Tensor, parent: Key | None = None) -> int:
        self._check_open()
        _check_data(data, len(keys), self.chunk_bytes)
        with self._lock:
            present = self.index.stored_len(keys)
            todo = list(keys[present:])
            anchor = keys[present - 1] if present else parent
            slots = self.index.reserve(todo, anchor) if todo else []
        if not slots:
            return present
        n = len(slots)
        ok = [False] * n
        parents: list[Key | None] = [anchor, *todo[: n - 1]]  # stores may record them
        segs = [[(0, data[present + i])] for i in range(n)]
        try:
            ok = self.store.write(slots, todo[:n], segs, parents)
        finally:  # a raising store must not leave slots reserved forever
            with self._lock:
                self.index.commit(todo[:n], ok)
        with self._lock:
            return self.index.stored_len(keys)

    def get(self, keys: Sequence[Key], out: torch.Tensor) -> int:
        self._check_open()
        _check_data(out, len(keys), self.chunk_bytes)
        with self._lock:
            n = self.index.leading(keys)
            assert isinstance(n, int)  # an authoritative index answers at once
            if n == 0:
                return 0
            held = self.index.hold(keys[n - 1])
            slots = self.index.slots_of(keys[:n])
            self.index.touch(keys[:n])
        try:
            ok = self.store.read(slots, keys[:n], [[(0, out[i])] for i in range(n)])
        finally:
            if held:
                with self._lock:
                    self.index.release(keys[n - 1])
        for i, success in enumerate(ok):
            if not success:
                with self._lock:
                    self.index.invalidate(keys[i])
                return i
        return n

    def prefix_len(self, keys: Sequence[Key]) -> int:
        """Leading keys readable now."""
        self._check_open()
        with self._lock:
            n = self.index.leading(keys)
            assert isinstance(n, int)
            return n

    def contains(self, key: Key) -> bool:
        return self.prefix_len([key]) == 1

    def delete(self, keys: Sequence[Key]) -> None:
        """Remove keys and, to keep chains whole, their descendants."""
        self._check_open()
        with self._lock:
            for key in keys:
                self.index.invalidate(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self.index)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.store.close()


def _check_data(data: torch.Tensor, n: int, chunk_bytes: int) -> None:
    if data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != chunk_bytes:
        raise ValueError(
            f"expected a uint8 tensor [n, {chunk_bytes}], got {data.dtype} {tuple(data.shape)}"
        )
    if data.shape[0] < n:
        raise ValueError(f"data holds {data.shape[0]} chunks, {n} keys given")


class DiskTier(SlotTier):
    """The disk tier in one process: a SlotIndex over a DiskSlab, rebuilt from the slab's
    headers at open, so chunks stored before a restart (or a crash) are found again.

    ``capacity_bytes // chunk_bytes`` slots; ``namespace`` is a Namespace or its 16-byte
    digest. A second DiskTier (or DiskSlab) on the same directory raises TierUnavailable.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        capacity_bytes: int,
        chunk_bytes: int,
        namespace: bytes | Namespace,
        eviction: str = "lru",
        threads: int = 4,
        *,
        file_bytes: int = DEFAULT_FILE_BYTES,
    ) -> None:
        digest = namespace.digest() if isinstance(namespace, Namespace) else namespace
        num_slots = capacity_bytes // chunk_bytes if chunk_bytes else 0
        slab = DiskSlab(path, num_slots, chunk_bytes, digest, threads, file_bytes=file_bytes)
        index = SlotIndex(num_slots, make_eviction_policy(eviction, num_slots))
        try:
            restored = restore_index(index, slab.records)
        except BaseException:
            slab.close()
            raise
        slab.records = []  # in the index now; a big tier's records weigh tens of MB
        self.restored = restored
        """Chunks re-admitted from disk at open."""
        self.slab = slab
        super().__init__("disk", HitSource.DISK, index, slab)

    def delete(self, keys: Sequence[Key]) -> None:
        # Also erase the headers, so a restart does not bring deleted keys back. Under the
        # index lock: a freed slot cannot be reserved (and rewritten) before its erase.
        self._check_open()
        with self._lock:
            for key in keys:
                if not self.index.has(key):
                    continue
                slot = self.index.slot_of(key)
                self.index.invalidate(key)
                self.slab.erase([slot], [key])

    def sync(self) -> bool:
        """Make every chunk stored so far durable (fsync)."""
        return self.slab.sync()
