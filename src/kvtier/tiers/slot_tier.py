"""A whole tier from a SlotIndex (keys) and a SlotStore (bytes)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from kvtier.errors import TierError
from kvtier.keys import Key
from kvtier.sources import HitSource
from kvtier.tiers.base import SlotStore, Tier
from kvtier.tiers.index import SlotIndex


class SlotTier(Tier):
    """Composes the scheduler-side index and the worker-side store in one process.

    One lock guards the index; copies run outside it, protected by the slot states
    (a slot being written is STORING, a slot being read is pinned).
    """

    def __init__(self, name: str, source: HitSource, index: SlotIndex, store: SlotStore) -> None:
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
            present = self.index.prefix_len(keys, any_state=True)
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
            return self.index.prefix_len(keys, any_state=True)

    def get(self, keys: Sequence[Key], out: torch.Tensor) -> int:
        self._check_open()
        _check_data(out, len(keys), self.chunk_bytes)
        with self._lock:
            n = self.index.prefix_len(keys)
            slots = self.index.pin(keys[:n])
            self.index.touch(keys[:n])
        try:
            ok = self.store.read(slots, keys[:n], [[(0, out[i])] for i in range(n)])
        finally:
            with self._lock:
                self.index.unpin(keys[:n])
        good = n
        for i, success in enumerate(ok):
            if not success:
                good = i
                with self._lock:
                    self.index.invalidate(keys[i])
                break
        return good

    def prefix_len(self, keys: Sequence[Key]) -> int:
        self._check_open()
        with self._lock:
            return self.index.prefix_len(keys)

    def delete(self, keys: Sequence[Key]) -> None:
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
