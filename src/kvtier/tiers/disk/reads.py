"""The read path of a DiskSlab: payloads verified against their checksums (native or Python)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from kvtier.keys import Key
from kvtier.tiers.base import Buffers, Segments
from kvtier.tiers.disk.buffers import Iovecs, Plan, Views, digest, io_all, plan_segments
from kvtier.tiers.disk.native import CORRUPT, NativeIO
from kvtier.tiers.disk.writes import SlabWrites


class SlabReads(SlabWrites):
    """Reads, each verified (a mismatch erases the slot)."""

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        """Read and verify chunks into ``dst`` (which may cover only parts of payloads)."""
        self._check_slots(slots, keys, dst)
        if not self._enter():
            return [False] * len(slots)
        try:
            if not self._backing_present(slots):
                return [False] * len(slots)
            if self._native is not None:
                iov = Iovecs()
                if all(iov.add(segs, self.slot_bytes, whole=False) for segs in dst):
                    return self._read_native(self._native, slots, keys, iov.to_buffers())
            views = Views()
            plans = [plan_segments(segs, self.slot_bytes, views, whole=False) for segs in dst]
            return self._batch(
                lambda i, j: self._read_run(slots, keys, plans, i, j), self._runs(slots, plans)
            )
        finally:
            self._exit()

    def accepts_buffers(self) -> bool:
        """True where the native data path is built (it alone moves bytes by address)."""
        return self._native is not None

    def read_buffers(self, slots: Sequence[int], keys: Sequence[Key], dst: Buffers) -> list[bool]:
        """:meth:`read` into host-memory addresses (:class:`~kvtier.tiers.base.Buffers`),
        same verification and outcomes; the native path only (see :meth:`accepts_buffers`,
        RuntimeError without it). Malformed buffers raise ValueError before any I/O."""
        self._check_slots(slots, keys, range(len(dst.start) - 1))
        self._check_buffers(dst, len(slots), whole=False)
        if self._native is None:
            raise RuntimeError("DiskSlab.read_buffers needs the native data path")
        if not self._enter():
            return [False] * len(slots)
        try:
            if not self._backing_present(slots):
                return [False] * len(slots)
            return self._read_native(self._native, slots, keys, dst)
        finally:
            self._exit()

    def _read_native(
        self, native: NativeIO, slots: Sequence[int], keys: Sequence[Key], bufs: Buffers
    ) -> list[bool]:
        """The native read path."""
        n = len(slots)
        key_of = self._key_of
        live = [k for k in range(n) if key_of[slots[k]] == keys[k]]
        out = [False] * n
        if len(live) < n:
            self._count(stale=n - len(live))
        if not live:
            return out
        batch = self._native_arrays(slots, bufs, live if len(live) < n else None)
        seeds = self._seeds(batch.slots, [keys[k] for k in live])
        sums = np.frombuffer(self._sum_of, dtype=np.uint64)[batch.slots]

        def part(a: int, b: int) -> np.ndarray:
            ptrs = self._native_ptrs(batch, a, b)
            return native.read(
                batch.fds[a:b],
                batch.offs[a:b],
                batch.start[a : b + 1],
                ptrs,
                batch.lens,
                self._stride - self.slot_bytes,
                seeds[a:b],
                sums[a:b],
            )

        status = np.concatenate(self._spread(part, len(live)))
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
            self._count(io=io, corrupt=corrupt)
        return out

    def _read_run(
        self, slots: Sequence[int], keys: Sequence[Key], plans: Sequence[Plan], i: int, j: int
    ) -> list[bool]:
        """Chunks ``i .. j-1`` (consecutive slots of one file): one preadv, then one
        checksum per chunk. Any error there, and each chunk is read alone (per-chunk
        outcomes)."""
        key_of = self._key_of
        if j - i == 1 or any(key_of[slots[k]] != keys[k] for k in range(i, j)):
            return [self._read_chunk(slots[k], keys[k], plans[k]) for k in range(i, j)]
        pad = self._scratch()[: self._stride - self.slot_bytes]
        bufs: list[memoryview] = []
        for k in range(i, j):
            if k > i and pad:
                bufs.append(pad)  # the gap between two payloads
            bufs.extend(cast(list[memoryview], plans[k][0]))
        fd, offset = self._locate(slots[i])
        total = (j - i - 1) * self._stride + self.slot_bytes
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
        if self._key_of[slot] != key:
            self._count(stale=1)
            return False
        bufs = self._with_scratch(plan)
        fd, offset = self._locate(slot)
        try:
            n = io_all(os.preadv, fd, bufs, offset, self.slot_bytes)
        except OSError:
            n = -1
        if n != self.slot_bytes:
            self._count(io=1)
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
        if digest(bufs, self._seed(key)) == self._sum_of[slot]:
            return True
        self._count(corrupt=1)
        self._erase(slot, key)
        return False
