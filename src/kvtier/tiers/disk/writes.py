"""The write path of a DiskSlab: payloads, then headers (native or Python)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from kvtier.keys import Key
from kvtier.tiers.base import Buffers, Segments
from kvtier.tiers.disk.batching import SlabBatching
from kvtier.tiers.disk.buffers import Iovecs, Plan, Views, digest, io_all, plan_segments
from kvtier.tiers.disk.format import (
    HEADER_BYTES,
    ZERO_HEADER,
    pack_header,
    pack_headers,
)
from kvtier.tiers.disk.native import NativeIO
from kvtier.tiers.disk.state import Links


class SlabWrites(SlabBatching):
    """Writes and erases."""

    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        """Write whole payloads from ``src`` and record ``keys`` (and ``parents``).

        ``parents[i]`` is the key before ``keys[i]`` in its chain (None for a chain start);
        a restart re-admits a chunk only under its parent. Without ``parents`` the chunks
        are readable until the slab closes but are not restored after a restart.
        """
        self._check_slots(slots, keys, src)
        if parents is not None and len(parents) != len(keys):
            raise ValueError(f"{len(parents)} parents for {len(keys)} keys")
        if not self._enter():
            return [False] * len(slots)
        try:
            if not self._backing_present(slots):
                return [False] * len(slots)
            if self._native is not None:
                iov = Iovecs()
                if all(iov.add(segs, self.slot_bytes, whole=True) for segs in src):
                    return self._write_native(self._native, slots, keys, iov.to_buffers(), parents)
            views = Views()
            plans = [plan_segments(segs, self.slot_bytes, views, whole=True) for segs in src]
            links = Links(parents)
            return self._batch(
                lambda i, j: self._write_run(slots, keys, plans, links, i, j),
                self._runs(slots, plans),
            )
        finally:
            self._exit()

    def write_buffers(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Buffers,
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        """:meth:`write` from host-memory addresses (:class:`~kvtier.tiers.base.Buffers`,
        no gaps), same headers and outcomes; the native path only (RuntimeError without
        it). Malformed buffers raise ValueError before any I/O."""
        self._check_slots(slots, keys, range(len(src.start) - 1))
        if parents is not None and len(parents) != len(keys):
            raise ValueError(f"{len(parents)} parents for {len(keys)} keys")
        self._check_buffers(src, len(slots), whole=True)
        if self._native is None:
            raise RuntimeError("DiskSlab.write_buffers needs the native data path")
        if not self._enter():
            return [False] * len(slots)
        try:
            if not self._backing_present(slots):
                return [False] * len(slots)
            return self._write_native(self._native, slots, keys, src, parents)
        finally:
            self._exit()

    def _write_native(
        self,
        native: NativeIO,
        slots: Sequence[int],
        keys: Sequence[Key],
        bufs: Buffers,
        parents: Sequence[Key | None] | None,
    ) -> list[bool]:
        """The native write path."""
        n = len(slots)
        if not n:
            return []
        for s in slots:  # unreadable from here until its header is written
            self._key_of[s] = None
        batch = self._native_arrays(slots, bufs, None)
        headers = pack_headers(keys, parents, self.namespace, self._take_seqs(n), self.slot_bytes)
        hdr_offs = (batch.slots % self._spf) * HEADER_BYTES
        seeds = np.array([self._seed(k) for k in keys], dtype=np.uint64)
        pad = self._stride - self.slot_bytes

        def part(a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
            return native.write(
                batch.fds[a:b],
                batch.offs[a:b],
                batch.start[a : b + 1],
                batch.ptrs,
                batch.lens,
                pad,
                seeds[a:b],
                headers[a:b],
                hdr_offs[a:b],
            )

        parts = self._spread(part, n)
        status = np.concatenate([p[0] for p in parts]).tolist()
        sums = np.concatenate([p[1] for p in parts]).tolist()
        out = [st == 0 for st in status]
        self._seed_of[batch.slots] = seeds  # before any key: a reader checks the key first
        for s, key, ok, checksum in zip(slots, keys, out, sums, strict=True):
            if ok:
                self._sum_of[s] = checksum
                self._key_of[s] = key
        failed = n - sum(out)
        if failed:
            self._count(io=failed)
        return out

    def _header(self, key: Key, links: Links, k: int, bufs: list[memoryview]) -> tuple[bytes, int]:
        """(header, payload checksum) of chunk ``k``, whose payload was just written from
        ``bufs`` (the caller keeps them unchanged for the call)."""
        checksum = digest(bufs, self._seed(key))
        seq = self._take_seqs(1)
        header = pack_header(
            key,
            links.parent(k),
            self.namespace,
            seq,
            self.slot_bytes,
            checksum,
            parent_unknown=links.unknown,
        )
        return header, checksum

    def _write_run(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        plans: Sequence[Plan],
        links: Links,
        i: int,
        j: int,
    ) -> list[bool]:
        """Chunks ``i .. j-1`` (consecutive slots of one file): one pwritev of the payloads,
        then one pwrite of their (adjacent) headers. Any error, and each chunk is written
        alone (per-chunk outcomes)."""
        if j - i == 1:
            return [self._write_chunk(slots[i], keys[i], plans[i], links, i)]
        for k in range(i, j):
            self._key_of[slots[k]] = None
        bufs: list[memoryview] = []
        for k in range(i, j):
            bufs.extend(cast(list[memoryview], plans[k][0]))
            if self._pad:
                bufs.append(self._pad)
        fd, offset = self._locate(slots[i])
        total = (j - i) * self._stride
        try:
            if io_all(os.pwritev, fd, bufs, offset, total) != total:
                raise OSError("short write")
            made = [
                self._header(keys[k], links, k, cast(list[memoryview], plans[k][0]))
                for k in range(i, j)
            ]
            headers = b"".join(h for h, _ in made)
            if os.pwrite(fd, headers, (slots[i] % self._spf) * HEADER_BYTES) != len(headers):
                raise OSError("short header write")
        except OSError:
            return [self._write_chunk(slots[k], keys[k], plans[k], links, k) for k in range(i, j)]
        for k, (_, checksum) in zip(range(i, j), made, strict=True):
            self._sum_of[slots[k]] = checksum
            self._seed_of[slots[k]] = self._seed(keys[k])
            self._key_of[slots[k]] = keys[k]
        return [True] * (j - i)

    def _write_chunk(self, slot: int, key: Key, plan: Plan, links: Links, k: int) -> bool:
        # Forget the old contents first: from here until the header is written, the slot
        # holds nothing readable.
        self._key_of[slot] = None
        bufs = self._with_scratch(plan)
        for st in plan[1]:
            if st.tensor is not None:
                torch.frombuffer(bufs[st.pos], dtype=torch.uint8).copy_(st.tensor.reshape(-1))
        fd, offset = self._locate(slot)
        header_offset = (slot % self._spf) * HEADER_BYTES
        try:
            # Whole pages (with the zero pad): no read-modify-write of the last page.
            out = [*bufs, self._pad] if self._pad else bufs
            if io_all(os.pwritev, fd, out, offset, self._stride) != self._stride:
                raise OSError("short write")
            header, checksum = self._header(key, links, k, bufs)
            if os.pwrite(fd, header, header_offset) != HEADER_BYTES:
                raise OSError("short header write")
        except OSError:
            self._count(io=1)
            # Best effort: a stale header over a half-written payload would only fail its
            # checksum later, but erasing it keeps a restart from re-admitting it.
            with contextlib.suppress(OSError):
                os.pwrite(fd, ZERO_HEADER, header_offset)
            return False
        self._sum_of[slot] = checksum
        self._seed_of[slot] = self._seed(key)
        self._key_of[slot] = key
        return True

    def erase(self, slots: Sequence[int], keys: Sequence[Key]) -> list[bool]:
        """Forget chunks (persistently: their headers are zeroed), only where slot ``i``
        still holds ``keys[i]``. For deletes; the scheduler must not let a write to these
        slots run concurrently. Returns, per chunk, whether a header was erased."""
        self._check_slots(slots, keys, keys)
        if not self._enter():
            return [False] * len(slots)
        try:
            return [self._erase(s, k) for s, k in zip(slots, keys, strict=True)]
        finally:
            self._exit()
