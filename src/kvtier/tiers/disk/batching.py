"""How a DiskSlab batch is cut and spread: runs of slots, I/O threads, scratch buffers,
native batches as arrays."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple, TypeVar, cast

import numpy as np

from kvtier.contract import Buffers
from kvtier.tiers.disk.buffers import IOV_MAX, Plan
from kvtier.tiers.disk.files import SlabFiles

RUN_BYTES = 256 << 10
"""Consecutive slots of one file move in one preadv/pwritev of up to this many bytes (and
IOV_MAX buffers): fewer syscalls for small chunks, while a run still fits in L2, where the
checksum pass that follows the read finds it."""
MIN_PARALLEL_BYTES = 1 << 20
"""A batch is split over the I/O threads only in parts of at least this many bytes: a
thread hand-off costs tens of microseconds, more than reading a small chunk."""

_T = TypeVar("_T")


class NativeBatch(NamedTuple):
    """A native batch as arrays: per chunk its slot, file and payload offset; the flat
    buffer lists (see :class:`~kvtier.tiers.disk.buffers.Iovecs`), the gap entries and
    their payload offsets."""

    slots: np.ndarray
    fds: np.ndarray
    offs: np.ndarray
    start: np.ndarray
    ptrs: np.ndarray
    lens: np.ndarray
    gaps: np.ndarray
    gap_offs: np.ndarray


class IOThreads:
    """The I/O threads of one slab: the calling thread plus a pool of ``threads - 1``, each
    with a scratch buffer of one ``stride``. A batch of ``slot_bytes`` chunks is split in
    contiguous parts, one per thread, so each thread's I/O stays sequential in the file."""

    def __init__(self, threads: int, slot_bytes: int, stride: int) -> None:
        self.threads = threads
        self._slot_bytes = slot_bytes
        self._stride = stride
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        if threads > 1:
            self._pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="kvtier-disk")

    def scratch(self) -> memoryview:
        """This thread's scratch buffer of one stride (allocated once per thread): skipped
        payload ranges, staged segments and the padding between slots go there."""
        buf: memoryview | None = getattr(self._local, "buf", None)
        if buf is None:
            arr = np.zeros(self._stride, dtype=np.uint8)
            buf = memoryview(arr.data).cast("B")
            self._local.buf, self._local.addr = buf, arr.ctypes.data
        return buf

    def with_scratch(self, plan: Plan) -> list[memoryview]:
        """The chunk's buffers, scratch ranges filled in from this thread's scratch."""
        bufs, staged = plan
        if not staged:
            return cast(list[memoryview], bufs)
        smv = self.scratch()
        out = list(bufs)
        for st in staged:
            out[st.pos] = smv[st.offset : st.offset + st.length]
        return cast(list[memoryview], out)

    def native_ptrs(self, batch: NativeBatch, a: int, b: int) -> np.ndarray:
        """The batch's buffer addresses, with the gaps of chunks ``a .. b-1`` pointed into
        this thread's scratch buffer (parts own disjoint entries, so threads can share)."""
        if batch.gaps.size:
            lo, hi = np.searchsorted(batch.gaps, [batch.start[a], batch.start[b]])
            if hi > lo:
                self.scratch()
                addr = cast(int, self._local.addr)
                batch.ptrs[batch.gaps[lo:hi]] = batch.gap_offs[lo:hi] + addr
        return batch.ptrs

    def spread(self, fn: Callable[[int, int], _T], n: int) -> list[_T]:
        """``fn(a, b)`` over contiguous parts of ``range(n)`` chunks, results in order: one
        part per I/O thread (the calling thread takes the first), none smaller than
        MIN_PARALLEL_BYTES."""
        groups = min(self.threads, n, max(1, n * self._slot_bytes // MIN_PARALLEL_BYTES))
        if groups <= 1 or self._pool is None:
            return [fn(0, n)] if n else []
        bounds = [n * g // groups for g in range(groups + 1)]
        futures = [self._pool.submit(fn, bounds[g], bounds[g + 1]) for g in range(1, groups)]
        return [fn(bounds[0], bounds[1]), *(f.result() for f in futures)]

    def batch(
        self, fn: Callable[[int, int], list[bool]], runs: list[tuple[int, int]]
    ) -> list[bool]:
        """``fn`` over every run, results in order. Runs are split in contiguous groups over
        the I/O threads (the calling thread takes the first); a batch smaller than
        MIN_PARALLEL_BYTES per thread stays on the calling thread."""
        nbytes = (runs[-1][1] if runs else 0) * self._slot_bytes
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

    def close(self) -> None:
        """Stop the pool (after the tasks it holds); idempotent."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def runs(slots: Sequence[int], plans: Sequence[Plan], files: SlabFiles) -> list[tuple[int, int]]:
    """Index ranges ``[i, j)`` of chunks that move in one syscall: consecutive slots of
    one file, no scratch ranges, at most RUN_BYTES and IOV_MAX buffers."""
    out: list[tuple[int, int]] = []
    n, spf, stride = len(slots), files.spf, files.stride
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
        out.append((i, j))
        i = j
    return out


def native_batch(
    files: SlabFiles, slots: Sequence[int], bufs: Buffers, chunks: list[int] | None
) -> NativeBatch:
    """NumPy arrays of a native batch, for ``chunks`` (indices into ``slots``; None: all).
    The buffer addresses are copied: gap entries are rewritten per thread (see
    :meth:`IOThreads.native_ptrs`), and the caller may run the same buffers again."""
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
    spf = files.spf
    return NativeBatch(
        sl,
        files.fd_arr[sl // spf],
        files.payload_base + (sl % spf) * files.stride,
        start,
        ptrs,
        lens,
        np.flatnonzero(gap),
        ptrs[gap].copy(),
    )
