"""The read path of a DiskSlab: payloads verified against their checksums (native or Python)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import torch

from kvtier.contract import Buffers, Segments
from kvtier.keys import Key
from kvtier.tiers.disk.batching import native_batch, runs
from kvtier.tiers.disk.buffers import Iovecs, Plan, Views, digest, io_all, plan_segments
from kvtier.tiers.disk.native import CORRUPT
from kvtier.tiers.disk.parts import SlabParts


class SlabReader:
    """Reads chunks from a slab's files, each verified: the slot must hold the key asked
    for and the whole payload (skipped ranges read into scratch) must hash to the checksum
    in the slot table; a mismatch is counted and erases the slot (``erase``).

    Outcomes are per chunk: failures are counted at the gate, never raised. The caller has
    validated the request and been admitted by the gate
    (:class:`~kvtier.tiers.disk.slab.DiskSlab` does both).
    """

    def __init__(self, parts: SlabParts, erase: Callable[[int, Key], bool]) -> None:
        self._files, self._table, self._gate, self._io, self._native = parts
        self._erase = erase
        self._slot_bytes = parts.files.slot_bytes

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        """Read into segments (which may cover only parts of payloads): the native path
        where every segment is contiguous host memory, else the Python path."""
        if self._native is not None:
            iov = Iovecs()
            if all(iov.add(segs, self._slot_bytes, whole=False) for segs in dst):
                return self.read_buffers(slots, keys, iov.to_buffers())
        views = Views()
        plans = [plan_segments(segs, self._slot_bytes, views, whole=False) for segs in dst]
        return self._io.batch(
            lambda i, j: self._read_run(slots, keys, plans, i, j), runs(slots, plans, self._files)
        )

    def read_buffers(self, slots: Sequence[int], keys: Sequence[Key], bufs: Buffers) -> list[bool]:
        """Read into host-memory addresses: the native path (the caller checked it is
        built)."""
        native = self._native
        assert native is not None
        n = len(slots)
        key_of = self._table.key_of
        live = [k for k in range(n) if key_of[slots[k]] == keys[k]]
        out = [False] * n
        if len(live) < n:
            self._gate.count(stale=n - len(live))
        if not live:
            return out
        batch = native_batch(self._files, slots, bufs, live if len(live) < n else None)
        seeds = self._table.seeds(batch.slots, [keys[k] for k in live])
        sums = np.frombuffer(self._table.sum_of, dtype=np.uint64)[batch.slots]
        pad = self._files.stride - self._slot_bytes

        def part(a: int, b: int) -> np.ndarray:
            return native.read(
                batch.fds[a:b],
                batch.offs[a:b],
                batch.start[a : b + 1],
                self._io.native_ptrs(batch, a, b),
                batch.lens,
                pad,
                seeds[a:b],
                sums[a:b],
            )

        status = np.concatenate(self._io.spread(part, len(live)))
        if not status.any():
            if len(live) == n:
                return [True] * n
            for k in live:
                out[k] = True
            return out
        io = corrupt = 0
        for k, st in zip(live, status.tolist(), strict=True):
            if st == 0:
                out[k] = True
            elif st == CORRUPT:
                corrupt += 1
                self._erase(slots[k], keys[k])
            else:
                io += 1
        if io or corrupt:
            self._gate.count(io=io, corrupt=corrupt)
        return out

    def _read_run(
        self, slots: Sequence[int], keys: Sequence[Key], plans: Sequence[Plan], i: int, j: int
    ) -> list[bool]:
        """Chunks ``i .. j-1`` (consecutive slots of one file): one preadv, then one
        checksum per chunk. Any error there, and each chunk is read alone (per-chunk
        outcomes)."""
        key_of, files = self._table.key_of, self._files
        if j - i == 1 or any(key_of[slots[k]] != keys[k] for k in range(i, j)):
            return [self._read_chunk(slots[k], keys[k], plans[k]) for k in range(i, j)]
        pad = self._io.scratch()[: files.stride - self._slot_bytes]
        bufs: list[memoryview] = []
        for k in range(i, j):
            if k > i and pad:
                bufs.append(pad)  # the gap between two payloads
            bufs.extend(cast(list[memoryview], plans[k][0]))
        fd, offset = files.locate(slots[i])
        total = (j - i - 1) * files.stride + self._slot_bytes
        try:
            n = io_all(os.preadv, fd, bufs, offset, total)
        except OSError:
            n = -1
        if n != total:
            return [self._read_chunk(slots[k], keys[k], plans[k]) for k in range(i, j)]
        return [
            self._verify(slots[k], keys[k], cast(list[memoryview], plans[k][0]))
            for k in range(i, j)
        ]

    def _read_chunk(self, slot: int, key: Key, plan: Plan) -> bool:
        if self._table.key_of[slot] != key:
            self._gate.count(stale=1)
            return False
        bufs = self._io.with_scratch(plan)
        fd, offset = self._files.locate(slot)
        try:
            n = io_all(os.preadv, fd, bufs, offset, self._slot_bytes)
        except OSError:
            n = -1
        if n != self._slot_bytes:
            self._gate.count(io=1)
            return False
        if not self._verify(slot, key, bufs):
            return False
        for st in plan[1]:
            if st.tensor is not None:
                src = torch.frombuffer(bufs[st.pos], dtype=torch.uint8)
                st.tensor.copy_(src.view(st.tensor.shape))
        return True

    def _verify(self, slot: int, key: Key, bufs: list[memoryview]) -> bool:
        """Whether the bytes read for ``slot`` hash to its recorded checksum; a mismatch
        is counted and erases the slot."""
        if digest(bufs, self._table.seed(key)) == self._table.sum_of[slot]:
            return True
        self._gate.count(corrupt=1)
        self._erase(slot, key)
        return False
