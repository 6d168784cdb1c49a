"""The write path of a DiskSlab: payloads, then headers (native or Python), and erases."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from kvtier.contract import Buffers, Segments
from kvtier.keys import Key
from kvtier.tiers.disk.batching import native_batch, runs
from kvtier.tiers.disk.buffers import Iovecs, Plan, Views, digest, io_all, plan_segments
from kvtier.tiers.disk.format import HEADER_BYTES, ZERO_HEADER, pack_header, pack_headers
from kvtier.tiers.disk.parts import SlabParts
from kvtier.tiers.disk.state import Links


class SlabWriter:
    """Writes chunks into a slab's files and records them in its slot table; erases them.

    Each write is ``pwritev(payload + zero pad)`` then ``pwrite(header)``; from its start
    until its header is written a slot holds nothing readable. Outcomes are per chunk:
    failures are counted at the gate, never raised. The caller has validated the request
    and been admitted by the gate (:class:`~kvtier.tiers.disk.slab.DiskSlab` does both).
    """

    def __init__(self, parts: SlabParts) -> None:
        self._files, self._table, self._gate, self._io, self._native = parts
        self._slot_bytes = parts.files.slot_bytes

    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None,
    ) -> list[bool]:
        """Write whole payloads from segments: the native path where every segment is
        contiguous host memory, else the Python path (runs of consecutive slots)."""
        if self._native is not None:
            iov = Iovecs()
            if all(iov.add(segs, self._slot_bytes, whole=True) for segs in src):
                return self.write_buffers(slots, keys, iov.to_buffers(), parents)
        views = Views()
        plans = [plan_segments(segs, self._slot_bytes, views, whole=True) for segs in src]
        links = Links(parents)
        return self._io.batch(
            lambda i, j: self._write_run(slots, keys, plans, links, i, j),
            runs(slots, plans, self._files),
        )

    def write_buffers(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        bufs: Buffers,
        parents: Sequence[Key | None] | None,
    ) -> list[bool]:
        """Write whole payloads from host-memory addresses: the native path (the caller
        checked it is built)."""
        native = self._native
        assert native is not None
        n = len(slots)
        if not n:
            return []
        table, files = self._table, self._files
        for s in slots:  # unreadable from here until its header is written
            table.key_of[s] = None
        batch = native_batch(files, slots, bufs, None)
        first = table.take_seqs(n)
        headers = pack_headers(keys, parents, table.namespace, first, self._slot_bytes)
        hdr_offs = (batch.slots % files.spf) * HEADER_BYTES
        seeds = np.array([table.seed(k) for k in keys], dtype=np.uint64)
        pad = files.stride - self._slot_bytes

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

        parts = self._io.spread(part, n)
        status = np.concatenate([p[0] for p in parts]).tolist()
        sums = np.concatenate([p[1] for p in parts]).tolist()
        out = [st == 0 for st in status]
        table.seed_of[batch.slots] = seeds  # before any key: a reader checks the key first
        key_of, sum_of = table.key_of, table.sum_of
        for s, key, ok, checksum in zip(slots, keys, out, sums, strict=True):
            if ok:
                sum_of[s] = checksum
                key_of[s] = key
        failed = n - sum(out)
        if failed:
            self._gate.count(io=failed)
        return out

    def _header(self, key: Key, links: Links, k: int, bufs: list[memoryview]) -> tuple[bytes, int]:
        """(header, payload checksum) of chunk ``k``, whose payload was just written from
        ``bufs`` (the caller keeps them unchanged for the call)."""
        table = self._table
        checksum = digest(bufs, table.seed(key))
        header = pack_header(
            key,
            links.parent(k),
            table.namespace,
            table.take_seqs(1),
            self._slot_bytes,
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
        table, files = self._table, self._files
        for k in range(i, j):
            table.key_of[slots[k]] = None
        pad = files.pad
        bufs: list[memoryview] = []
        for k in range(i, j):
            bufs.extend(cast(list[memoryview], plans[k][0]))
            if pad:
                bufs.append(pad)
        fd, offset = files.locate(slots[i])
        total = (j - i) * files.stride
        try:
            if io_all(os.pwritev, fd, bufs, offset, total) != total:
                raise OSError("short write")
            made = [
                self._header(keys[k], links, k, cast(list[memoryview], plans[k][0]))
                for k in range(i, j)
            ]
            headers = b"".join(h for h, _ in made)
            if os.pwrite(fd, headers, (slots[i] % files.spf) * HEADER_BYTES) != len(headers):
                raise OSError("short header write")
        except OSError:
            return [self._write_chunk(slots[k], keys[k], plans[k], links, k) for k in range(i, j)]
        for k, (_, checksum) in zip(range(i, j), made, strict=True):
            table.hold(slots[k], keys[k], checksum, table.seed(keys[k]))
        return [True] * (j - i)

    def _write_chunk(self, slot: int, key: Key, plan: Plan, links: Links, k: int) -> bool:
        # Forget the old contents first: from here until the header is written, the slot
        # holds nothing readable.
        table, files = self._table, self._files
        table.key_of[slot] = None
        bufs = self._io.with_scratch(plan)
        for st in plan[1]:
            if st.tensor is not None:
                torch.frombuffer(bufs[st.pos], dtype=torch.uint8).copy_(st.tensor.reshape(-1))
        fd, offset = files.locate(slot)
        header_offset = (slot % files.spf) * HEADER_BYTES
        try:
            # Whole pages (with the zero pad): no read-modify-write of the last page.
            out = [*bufs, files.pad] if files.pad else bufs
            if io_all(os.pwritev, fd, out, offset, files.stride) != files.stride:
                raise OSError("short write")
            header, checksum = self._header(key, links, k, bufs)
            if os.pwrite(fd, header, header_offset) != HEADER_BYTES:
                raise OSError("short header write")
        except OSError:
            self._gate.count(io=1)
            # Best effort: a stale header over a half-written payload would only fail its
            # checksum later, but erasing it keeps a restart from re-admitting it.
            with contextlib.suppress(OSError):
                os.pwrite(fd, ZERO_HEADER, header_offset)
            return False
        table.hold(slot, key, checksum, table.seed(key))
        return True

    def erase(self, slot: int, key: Key) -> bool:
        """Forget ``slot``, in memory and on disk, if it holds ``key``; whether its header
        was erased."""
        return self._table.forget(slot, key) and self._files.zero_header(slot)
