"""How a DiskSlab batch is cut and spread: runs of slots, I/O threads, scratch buffers."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import cast

import numpy as np
import xxhash

from kvtier.keys import Key
from kvtier.tiers.base import Buffers
from kvtier.tiers.disk.buffers import IOV_MAX, Plan
from kvtier.tiers.disk.files import SlabFiles
from kvtier.tiers.disk.format import (
    ZERO_HEADER,
)
from kvtier.tiers.disk.state import _T, MIN_PARALLEL_BYTES, RUN_BYTES, NativeBatch


class SlabBatching(SlabFiles):
    """Per-thread scratch, runs of consecutive slots, the thread pool, counters, checks."""

    def _scratch(self) -> memoryview:
        """This thread's scratch buffer of one stride (allocated once per thread): skipped
        payload ranges, staged segments and the padding between slots go there."""
        buf: memoryview | None = getattr(self._local, "buf", None)
        if buf is None:
            arr = np.zeros(self._stride, dtype=np.uint8)
            buf = memoryview(arr.data).cast("B")
            self._local.buf, self._local.addr = buf, arr.ctypes.data
        return buf

    def _scratch_addr(self) -> int:
        """Address of this thread's scratch buffer (for the native path)."""
        self._scratch()
        return cast(int, self._local.addr)

    def _take_seqs(self, n: int) -> int:
        """The first of ``n`` fresh write sequence numbers."""
        with self._stats_lock:
            first = self._next_seq
            self._next_seq += n
        return first

    def _spread(self, fn: Callable[[int, int], _T], n: int) -> list[_T]:
        """``fn(a, b)`` over contiguous parts of ``range(n)`` chunks, results in order: one
        part per I/O thread (the calling thread takes the first), none smaller than
        MIN_PARALLEL_BYTES, so each thread's I/O stays sequential in the file."""
        groups = min(self.threads, n, max(1, n * self.slot_bytes // MIN_PARALLEL_BYTES))
        if groups <= 1 or self._pool is None:
            return [fn(0, n)] if n else []
        bounds = [n * g // groups for g in range(groups + 1)]
        futures = [self._pool.submit(fn, bounds[g], bounds[g + 1]) for g in range(1, groups)]
        return [fn(bounds[0], bounds[1]), *(f.result() for f in futures)]

    def _native_arrays(
        self, slots: Sequence[int], bufs: Buffers, chunks: list[int] | None
    ) -> NativeBatch:
        """NumPy arrays of a native batch, for ``chunks`` (indices into ``slots``; None: all).
        The buffer addresses are copied: gap entries are rewritten per thread (see
        :meth:`_native_ptrs`), and the caller may run the same buffers again."""
        start, ptrs, lens = bufs.start, bufs.ptrs.copy(), bufs.lens
        gap = np.zeros(len(ptrs), dtype=bool)
        gap[bufs.gaps] = True
        if chunks is not None:  # leave out chunks that need no I/O (rare: stale keys)
            keep = np.concatenate([np.arange(start[k], start[k + 1]) for k in chunks])
            ptrs, lens, gap = ptrs[keep], lens[keep], gap[keep]
            counts = np.diff(start)[chunks]
            start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            slots = [slots[k] for k in chunks]
        sl = np.array(slots, dtype=np.int64)
        spf = self._spf
        return NativeBatch(
            sl,
            self._fd_arr[sl // spf],
            self._payload_base + (sl % spf) * self._stride,
            start,
            ptrs,
            lens,
            np.flatnonzero(gap),
            ptrs[gap].copy(),
        )

    def _check_buffers(self, bufs: Buffers, n: int, *, whole: bool) -> None:
        """ValueError unless ``bufs`` describes ``n`` whole payloads (gaps, which only
        reads may have, inside the payload): a caller bug, found before any I/O."""
        start, lens, gaps = bufs.start, bufs.lens, bufs.gaps
        if len(start) != n + 1 or (n and (start[0] != 0 or start[-1] != len(bufs.ptrs))):
            raise ValueError(f"buffers for {len(start) - 1} chunks, {n} slots")
        if len(lens) != len(bufs.ptrs) or (n and bool((np.diff(start) < 1).any())):
            raise ValueError("buffers: every chunk needs at least one entry")
        total = np.concatenate([[0], np.cumsum(lens, dtype=np.uint64)])
        if n and bool((total[start[1:]] - total[start[:-1]] != self.slot_bytes).any()):
            raise ValueError(f"buffers must cover whole {self.slot_bytes}-byte payloads")
        if gaps.size and (
            whole
            or int(gaps.min()) < 0
            or int(gaps.max()) >= len(lens)
            or bool((bufs.ptrs[gaps] + lens[gaps] > self.slot_bytes).any())
        ):
            raise ValueError("buffers: gaps only in reads, and inside the payload")

    def _native_ptrs(self, batch: NativeBatch, a: int, b: int) -> np.ndarray:
        """The batch's buffer addresses, with the gaps of chunks ``a .. b-1`` pointed into
        this thread's scratch buffer (parts own disjoint entries, so threads can share)."""
        if batch.gaps.size:
            lo, hi = np.searchsorted(batch.gaps, [batch.start[a], batch.start[b]])
            if hi > lo:
                batch.ptrs[batch.gaps[lo:hi]] = batch.gap_offs[lo:hi] + self._scratch_addr()
        return batch.ptrs

    def _runs(self, slots: Sequence[int], plans: Sequence[Plan]) -> list[tuple[int, int]]:
        """Index ranges ``[i, j)`` of chunks that move in one syscall: consecutive slots of
        one file, no scratch ranges, at most RUN_BYTES and IOV_MAX buffers."""
        runs: list[tuple[int, int]] = []
        n, spf, stride = len(slots), self._spf, self._stride
        i = 0
        while i < n:
            j = i + 1
            if not plans[i][1]:
                nbufs = len(plans[i][0]) + 1
                while (
                    j < n
                    and slots[j] == slots[j - 1] + 1
                    and slots[j] % spf
                    and not plans[j][1]
                    and (j - i + 1) * stride <= RUN_BYTES
                    and nbufs + len(plans[j][0]) + 1 <= IOV_MAX
                ):
                    nbufs += len(plans[j][0]) + 1
                    j += 1
            runs.append((i, j))
            i = j
        return runs

    def _batch(
        self, fn: Callable[[int, int], list[bool]], runs: list[tuple[int, int]]
    ) -> list[bool]:
        """``fn`` over every run, results in order. Runs are split in contiguous groups over
        the I/O threads (the calling thread takes the first), so that each thread's reads
        stay sequential in the file; a batch smaller than MIN_PARALLEL_BYTES per thread
        stays on the calling thread."""
        nbytes = (runs[-1][1] if runs else 0) * self.slot_bytes
        groups = min(self.threads, len(runs), max(1, nbytes // MIN_PARALLEL_BYTES))

        def run(g: int) -> list[bool]:
            out: list[bool] = []
            for i, j in runs[len(runs) * g // groups : len(runs) * (g + 1) // groups]:
                out.extend(fn(i, j))
            return out

        if groups <= 1 or self._pool is None:
            return run(0) if runs else []
        futures: list[Future[list[bool]]] = [self._pool.submit(run, g) for g in range(1, groups)]
        out = run(0)
        for f in futures:
            out.extend(f.result())
        return out

    def _enter(self) -> bool:
        with self._stats_lock:
            if self._closed or self.unavailable:
                return False
            self._active += 1
            return True

    def _exit(self) -> None:
        with self._stats_lock:
            self._active -= 1
            if self._active == 0:
                self._idle.notify_all()

    def _count(self, io: int = 0, corrupt: int = 0, stale: int = 0) -> None:
        with self._stats_lock:
            self.io_errors += io
            self.corrupt_reads += corrupt
            self.stale_reads += stale

    def _check_slots(
        self, slots: Sequence[int], keys: Sequence[Key], segs: Sequence[object]
    ) -> None:
        if not len(slots) == len(keys) == len(segs):
            raise ValueError(f"{len(slots)} slots, {len(keys)} keys, {len(segs)} segment lists")
        for s in slots:
            if not 0 <= s < self.num_slots:
                raise ValueError(f"slot {s} out of range [0, {self.num_slots})")

    def _seeds(self, slots: np.ndarray, keys: Sequence[Key]) -> np.ndarray:
        """The checksum seeds of ``keys``, which ``slots`` hold: from the per-slot cache,
        filled in where it is empty (slots restored at open: hashing every key there
        would slow the open of a large tier)."""
        seeds: np.ndarray = self._seed_of[slots]
        for m in np.flatnonzero(seeds == 0).tolist():
            seeds[m] = self._seed_of[slots[m]] = self._seed(keys[m])
        return seeds

    def _seed(self, key: Key) -> int:
        # The payload checksum is seeded by key and namespace: bytes written under another
        # key or namespace never verify, even where the payloads are equal.
        return xxhash.xxh3_64_intdigest(key + self.namespace)

    def _with_scratch(self, plan: Plan) -> list[memoryview]:
        """The chunk's buffers, scratch ranges filled in from this thread's scratch."""
        bufs, staged = plan
        if not staged:
            return cast(list[memoryview], bufs)
        smv = self._scratch()
        out = list(bufs)
        for st in staged:
            out[st.pos] = smv[st.offset : st.offset + st.length]
        return cast(list[memoryview], out)

    def _erase(self, slot: int, key: Key) -> bool:
        if self._key_of[slot] != key:
            return False
        self._key_of[slot] = None
        geo = self.geometry
        try:
            os.pwrite(self._fds[slot // geo.slots_per_file], ZERO_HEADER, geo.header_offset(slot))
        except OSError:
            return False
        return True
