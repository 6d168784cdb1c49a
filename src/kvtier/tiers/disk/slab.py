"""Disk tier: slab files of fixed-size slots under one directory, moved with preadv/pwritev.

The on-disk format (directory layout, superblock, 128-byte slot headers kept apart from
page-aligned payloads) is described in :mod:`kvtier.tiers.disk.format`.

Two data paths, same bytes and headers: the native one (:mod:`kvtier.tiers.disk.native`, built
at install) moves each chunk in cache-sized pieces, hashing each piece while it is in cache,
with the GIL released, one call per I/O thread per batch; the Python one (no compiler, or
segments that need staging through scratch) moves runs of consecutive slots with one
``preadv``/``pwritev`` and hashes each chunk after it. The native path exists because the
few microseconds of Python per chunk (buffer views, a checksum call, bookkeeping) cost as
much as moving a 64 KiB chunk: it doubled load and store throughput at 64-256 KiB chunks
(``benchmarks/disk_tier.py``). Hashing in cache-sized pieces keeps the checksum pass off
main memory for chunks larger than the last-level cache.

Crash safety, without fsync on the data path: a write is ``pwritev(payload)``, then
``pwrite(header)``. Whatever a kill -9 (or a power loss that reorders pages) leaves behind, a
slot validates only if its header checksum matches (a torn header never does) *and* its
payload hashes to the checksum that header records for that key and namespace. So a slot
never validates with bytes other than those written under its key: a crash may lose the
chunks being written (and, without :meth:`DiskSlab.sync`, what the OS had not flushed at a
power loss), never corrupt one silently. Invalidating the old header before writing, as a
journal would, buys nothing on top of that and would cost a third syscall per chunk.

Concurrency between processes: one process owns a directory's data plane. ``DiskSlab``
takes an exclusive, non-blocking ``flock`` on ``kvtier.lock`` and raises
:class:`~kvtier.errors.TierUnavailable` naming the directory (and the owner's pid) while
another open file holds it, so a second engine (or a second slab in the same process) on one
directory is refused instead of both overwriting each other's slots. Sharing a directory
safely would need a cross-process slot allocator; separate directories are simpler and as
fast. The kernel drops the lock when its owner dies (SIGKILL included), so no stale lock
survives a crash. Header readers (:meth:`DiskSlab.scan`, :mod:`kvtier.tiers.disk.inspect`)
take no lock: a scheduler process rebuilds its index with ``scan`` while its worker owns the
slab.

Inside an engine: the scheduler calls :meth:`DiskSlab.scan` and
:func:`~kvtier.tiers.disk.restore.restore_index` to rebuild its
:class:`~kvtier.tiers.index.SlotIndex` and passes each chunk's parent key to the worker;
every worker opens its own :class:`DiskSlab` (one directory per rank) and moves bytes.
:class:`DiskTier` composes both in one process. How segments become buffers lives in
:mod:`kvtier.tiers.disk.buffers`.
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, TypeVar, cast

import numpy as np
import torch
import xxhash

from kvtier.errors import TierUnavailable
from kvtier.keys import KEY_BYTES, Key, Namespace
from kvtier.policies.registry import make_eviction_policy
from kvtier.sources import HitSource
from kvtier.tiers.base import Segments, SlotStore
from kvtier.tiers.disk.buffers import (
    IOV_MAX,
    Iovecs,
    Plan,
    Views,
    digest,
    io_all,
    plan_segments,
)
from kvtier.tiers.disk.format import (
    DEFAULT_FILE_BYTES,
    HEADER_BYTES,
    LOCK_NAME,
    SUPER_NAME,
    ZERO_HEADER,
    SlabGeometry,
    SlotHeader,
    SlotRecord,
    gc_paused,
    list_slab_files,
    pack_header,
    pack_headers,
    parse_headers,
    read_header_area,
    read_superblock,
    records_of,
    scan_headers,
    slab_file_name,
)
from kvtier.tiers.disk.native import CORRUPT, NativeIO, native_io
from kvtier.tiers.disk.restore import restore_index
from kvtier.tiers.index import SlotIndex
from kvtier.tiers.slot_tier import SlotTier

log = logging.getLogger(__name__)

RUN_BYTES = 256 << 10
"""Consecutive slots of one file move in one preadv/pwritev of up to this many bytes (and
IOV_MAX buffers): fewer syscalls for small chunks, while a run still fits in L2, where the
checksum pass that follows the read finds it."""
MIN_PARALLEL_BYTES = 1 << 20
"""A batch is split over the I/O threads only in parts of at least this many bytes: a
thread hand-off costs tens of microseconds, more than reading a small chunk."""


class _NativeBatch(NamedTuple):
    """A native batch as arrays: per chunk its slot, file and payload offset; the flat
    buffer lists (see :class:`Iovecs`), the gap entries and their payload offsets."""

    slots: np.ndarray
    fds: np.ndarray
    offs: np.ndarray
    start: np.ndarray
    ptrs: np.ndarray
    lens: np.ndarray
    gaps: np.ndarray
    gap_offs: np.ndarray


_T = TypeVar("_T")


class _Links:
    """The parents of a write's chunks, or the fact that they are unknown."""

    __slots__ = ("parents", "unknown")

    def __init__(self, parents: Sequence[Key | None] | None) -> None:
        self.parents = parents
        self.unknown = parents is None

    def parent(self, k: int) -> Key | None:
        return None if self.parents is None else self.parents[k]


# -- the data plane -------------------------------------------------------------------------


class DiskSlab(SlotStore):
    """``num_slots`` slots of ``slot_bytes`` in slab files under ``path``; one namespace.

    Contract (beyond :class:`~kvtier.tiers.base.SlotStore`):

    - Ownership: the caller's segments are read (writes) or filled (reads) during the call
      only, straight from/into their memory with ``pwritev``/``preadv``; device or
      non-contiguous segments go through a per-thread scratch buffer.
    - Failure granularity: per chunk. An ``OSError`` (ENOSPC, EFBIG, EIO, a removed
      directory), a short read (truncated file), a key that is not the one the slot holds,
      or a payload that fails its checksum make that chunk False; nothing raises for them.
      Malformed requests (slot out of range, overlapping segments, a write not covering the
      payload) raise ValueError before any I/O.
    - Verification: every read reads the *whole* payload (the ranges the caller skips go to
      scratch, never to the caller) and succeeds only if the slot holds the key asked for
      and the payload hashes, seeded by that key and our namespace, to the checksum of the
      slot's last write. Key and checksum are kept in memory from the write (or from the
      on-disk header, checked at open for magic, version, namespace, length and header
      checksum), so a read is one ``preadv``. A checksum mismatch also erases the slot's
      header, so a restart does not re-admit it. Destination bytes of a failed read are
      unspecified.
    - Batching: consecutive slots of one file move in one ``preadv``/``pwritev`` (up to
      RUN_BYTES), with one checksum per chunk; an error there is retried chunk by chunk,
      so outcomes stay per chunk.
    - Atomicity and durability: a chunk is readable only after its write returned True;
      see the module docstring for crashes. No fsync on the data path; :meth:`sync` makes
      everything written so far durable.
    - If the backing files disappear (directory removed), every later read and write
      fails, logged once; the space held by the open files is released at :meth:`close`.
    - Thread-safety: calls on different slots may run concurrently (the scheduler never
      lets a write overlap another operation on the same slot). One batch runs on the
      calling thread plus up to ``threads - 1`` pool threads.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        num_slots: int,
        slot_bytes: int,
        namespace: bytes,
        threads: int = 4,
        *,
        file_bytes: int = DEFAULT_FILE_BYTES,
        native: bool = True,
    ) -> None:
        """Open (creating or reformatting as needed) the slab directory ``path``.

        ``namespace`` is the 16-byte ``Namespace.digest()``; slots written under another
        namespace are treated as free. ``file_bytes`` sizes slab files when the directory
        is formatted; an existing directory keeps its layout. If the directory was
        formatted for another ``slot_bytes``, its slab files are deleted (a cache of
        another geometry is useless to us) and it is formatted afresh. ``native``: move
        host-memory segments with the native data path when it is built (see
        :mod:`kvtier.tiers.disk.native`); False forces the Python path (both give the same bytes
        and headers).

        Raises TierUnavailable when the directory is locked by another owner or cannot be
        created or opened.
        """
        if len(namespace) != KEY_BYTES:
            raise ValueError(f"namespace must be {KEY_BYTES} bytes, got {len(namespace)}")
        if num_slots < 0 or slot_bytes <= 0 or threads < 1:
            raise ValueError(
                f"need num_slots >= 0, slot_bytes > 0, threads >= 1; got {num_slots}, "
                f"{slot_bytes}, {threads}"
            )
        self.path = Path(path)
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.namespace = bytes(namespace)
        self.threads = threads
        self.corrupt_reads = 0
        """Reads whose payload failed its checksum (bit rot, torn or foreign writes)."""
        self.io_errors = 0
        """Reads or writes that hit an OSError or a short read (truncated file)."""
        self.stale_reads = 0
        """Reads of a key the slot does not hold (never written, erased, overwritten)."""
        self.unavailable = False
        """True once the backing files were found removed: every operation fails."""
        self._lock_fd = -1
        self._fds: list[int] = []
        self._closed = False
        self._stats_lock = threading.Lock()
        self._active = 0
        self._idle = threading.Condition(self._stats_lock)
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        try:
            self._lock_fd = _lock_dir(self.path)
            self.geometry = self._open_geometry(file_bytes)
            self._open_files()
        except BaseException:
            self._release()
            raise
        self._key_of: list[Key | None] = [None] * num_slots
        self._sum_of = array.array("Q", bytes(8 * num_slots))  # exact 64-bit compares
        with gc_paused():
            headers = self._scan_own()
            mine = [h for h in headers if h.namespace == self.namespace and h.length == slot_bytes]
            for h in mine:
                self._key_of[h.slot] = h.key
                self._sum_of[h.slot] = h.checksum
            self.records = records_of(mine)
            """Restorable chunks found at open (this namespace), for :func:`restore_index`."""
        self._next_seq = max((h.seq for h in headers), default=0) + 1
        self._fd_arr = np.array(self._fds, dtype=np.int32)
        self._native: NativeIO | None = native_io() if native else None
        geo = self.geometry
        self._spf, self._stride, self._payload_base = (
            geo.slots_per_file,
            geo.stride,
            geo.header_area,
        )
        self._pad = memoryview(bytes(geo.stride - slot_bytes))
        if threads > 1:
            self._pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="kvtier-disk")

    # -- opening --------------------------------------------------------------------------

    def _open_geometry(self, file_bytes: int) -> SlabGeometry:
        found = read_superblock(self.path)
        if found is not None and found.slot_bytes == self.slot_bytes:
            return found
        geo = SlabGeometry.for_slot_bytes(self.slot_bytes, file_bytes)
        if found is not None or list_slab_files(self.path):
            was = f"{found.slot_bytes}-byte slots" if found else "no valid superblock"
            log.warning(
                "kvtier disk tier: %s holds slab files with %s, not %d-byte slots; "
                "reformatting it (its cached chunks are dropped)",
                self.path,
                was,
                self.slot_bytes,
            )
        try:
            for fi in list_slab_files(self.path):
                os.unlink(self.path / slab_file_name(fi))
            tmp = self.path / (SUPER_NAME + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, geo.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path / SUPER_NAME)
        except OSError as e:
            raise TierUnavailable(f"disk tier {self.path}: cannot format: {e}") from e
        return geo

    def _open_files(self) -> None:
        geo = self.geometry
        need = geo.num_files(self.num_slots)
        try:
            for fi in list_slab_files(self.path):
                if fi >= need:  # capacity shrank: give the space back
                    os.unlink(self.path / slab_file_name(fi))
            for fi in range(need):
                fd = os.open(self.path / slab_file_name(fi), os.O_RDWR | os.O_CREAT, 0o600)
                self._fds.append(fd)
            if need:
                self._trim_last_file(need - 1)
        except OSError as e:
            raise TierUnavailable(f"disk tier {self.path}: cannot open slab files: {e}") from e

    def _trim_last_file(self, fi: int) -> None:
        """Drop slots past ``num_slots`` in the last file (capacity shrank): erase their
        valid headers, so a later, larger capacity does not re-admit them, and truncate
        their payloads, so the files fit the new capacity."""
        geo = self.geometry
        used = geo.file_slots(fi, self.num_slots)
        fd = self._fds[fi]
        if used == geo.slots_per_file or os.fstat(fd).st_size <= geo.file_size(used):
            return
        first = used * HEADER_BYTES
        area = os.pread(fd, geo.slots_per_file * HEADER_BYTES - first, first)
        for h in parse_headers(area, used):
            os.pwrite(fd, ZERO_HEADER, geo.header_offset(h.slot))
        os.ftruncate(fd, geo.file_size(used))

    def _scan_own(self) -> list[SlotHeader]:
        """Valid headers of every namespace in our files (sequence numbers continue past
        every namespace's); unreadable files count as empty."""
        out: list[SlotHeader] = []
        geo = self.geometry
        for fi, fd in enumerate(self._fds):
            count = geo.file_slots(fi, self.num_slots)
            try:
                area = read_header_area(fd, geo, count)
            except OSError as e:
                log.warning(
                    "kvtier disk tier: cannot read headers of file %d in %s: %s", fi, self.path, e
                )
                continue
            out.extend(parse_headers(area, fi * geo.slots_per_file))
        return out

    @classmethod
    def scan(
        cls,
        path: str | os.PathLike[str],
        namespace: bytes,
        slot_bytes: int,
        num_slots: int | None = None,
    ) -> list[SlotRecord]:
        """Restorable chunks of ``namespace`` in directory ``path``, reading headers only.

        For the scheduler process, which rebuilds its index (:func:`restore_index`) while
        a worker owns the slab: takes no lock, writes nothing. Empty when the directory is
        missing or formatted for another ``slot_bytes``. Slots at or past ``num_slots``
        are ignored. A header that validates says nothing yet about its payload: a torn
        payload is found (and becomes a miss) when it is read.
        """
        geo = read_superblock(path)
        if geo is None or geo.slot_bytes != slot_bytes:
            return []
        with gc_paused():
            headers = scan_headers(path, geo, num_slots, namespace)
            return records_of(h for h in headers if h.length == slot_bytes)

    # -- per-thread scratch, runs and batching --------------------------------------------

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
        self, slots: Sequence[int], iov: Iovecs, chunks: list[int] | None
    ) -> _NativeBatch:
        """NumPy arrays of a native batch, for ``chunks`` (indices into ``slots``; None: all)."""
        start = np.array(iov.start, dtype=np.int64)
        ptrs = np.array(iov.ptrs, dtype=np.uint64)
        lens = np.array(iov.lens, dtype=np.uint64)
        gap = np.zeros(len(ptrs), dtype=bool)
        gap[iov.gaps] = True
        if chunks is not None:  # leave out chunks that need no I/O (rare: stale keys)
            keep = np.concatenate([np.arange(start[k], start[k + 1]) for k in chunks])
            ptrs, lens, gap = ptrs[keep], lens[keep], gap[keep]
            counts = np.diff(start)[chunks]
            start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            slots = [slots[k] for k in chunks]
        sl = np.array(slots, dtype=np.int64)
        spf = self._spf
        return _NativeBatch(
            sl,
            self._fd_arr[sl // spf],
            self._payload_base + (sl % spf) * self._stride,
            start,
            ptrs,
            lens,
            np.flatnonzero(gap),
            ptrs[gap].copy(),
        )

    def _native_ptrs(self, batch: _NativeBatch, a: int, b: int) -> np.ndarray:
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

    def _backing_present(self, slots: Sequence[int]) -> bool:
        """False (and the slab disabled, logged once) if a file the batch touches was
        unlinked: writes would vanish at close and reads hold space the operator freed."""
        spf = self._spf
        try:
            gone = any(os.fstat(self._fds[fi]).st_nlink == 0 for fi in {s // spf for s in slots})
        except OSError:
            gone = True
        if gone:
            with self._stats_lock:
                first = not self.unavailable
                self.unavailable = True
            if first:
                log.error(
                    "kvtier disk tier: slab files in %s were removed while in use; the disk "
                    "tier is disabled until restart",
                    self.path,
                )
        return not gone

    def _locate(self, slot: int) -> tuple[int, int]:
        """(file descriptor, payload offset) of ``slot``."""
        spf = self._spf
        return self._fds[slot // spf], self._payload_base + (slot % spf) * self._stride

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

    # -- reads ------------------------------------------------------------------------------

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
                got = self._read_native(self._native, slots, keys, dst)
                if got is not None:
                    return got
            views = Views()
            plans = [plan_segments(segs, self.slot_bytes, views, whole=False) for segs in dst]
            return self._batch(
                lambda i, j: self._read_run(slots, keys, plans, i, j), self._runs(slots, plans)
            )
        finally:
            self._exit()

    def _read_native(
        self, native: NativeIO, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool] | None:
        """The native read path; None (nothing done) if a segment needs staging."""
        iov = Iovecs()
        for segs in dst:
            if not iov.add(segs, self.slot_bytes, whole=False):
                return None
        n = len(slots)
        key_of = self._key_of
        live = [k for k in range(n) if key_of[slots[k]] == keys[k]]
        out = [False] * n
        if len(live) < n:
            self._count(stale=n - len(live))
        if not live:
            return out
        batch = self._native_arrays(slots, iov, live if len(live) < n else None)
        seeds = np.array([self._seed(keys[k]) for k in live], dtype=np.uint64)
        sums = np.frombuffer(self._sum_of, dtype=np.uint64)[batch.slots]

        def part(a: int, b: int) -> np.ndarray:
            ptrs = self._native_ptrs(batch, a, b)
            return native.read(
                batch.fds[a:b],
                batch.offs[a:b],
                batch.start[a : b + 1],
                ptrs,
                batch.lens,
                seeds[a:b],
                sums[a:b],
            )

        status = np.concatenate(self._spread(part, len(live)))
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

    # -- writes -----------------------------------------------------------------------------

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
                got = self._write_native(self._native, slots, keys, src, parents)
                if got is not None:
                    return got
            views = Views()
            plans = [plan_segments(segs, self.slot_bytes, views, whole=True) for segs in src]
            links = _Links(parents)
            return self._batch(
                lambda i, j: self._write_run(slots, keys, plans, links, i, j),
                self._runs(slots, plans),
            )
        finally:
            self._exit()

    def _write_native(
        self,
        native: NativeIO,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None,
    ) -> list[bool] | None:
        """The native write path; None (nothing done) if a segment needs staging."""
        iov = Iovecs()
        for segs in src:
            if not iov.add(segs, self.slot_bytes, whole=True):
                return None
        n = len(slots)
        if not n:
            return []
        for s in slots:  # unreadable from here until its header is written
            self._key_of[s] = None
        batch = self._native_arrays(slots, iov, None)
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
        for s, key, ok, checksum in zip(slots, keys, out, sums, strict=True):
            if ok:
                self._sum_of[s] = checksum
                self._key_of[s] = key
        failed = n - sum(out)
        if failed:
            self._count(io=failed)
        return out

    def _header(self, key: Key, links: _Links, k: int, bufs: list[memoryview]) -> tuple[bytes, int]:
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
        links: _Links,
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
            self._key_of[slots[k]] = keys[k]
        return [True] * (j - i)

    def _write_chunk(self, slot: int, key: Key, plan: Plan, links: _Links, k: int) -> bool:
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
        self._key_of[slot] = key
        return True

    # -- erasing and maintenance ------------------------------------------------------------

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

    def holds(self, slot: int) -> Key | None:
        """The key slot ``slot`` holds (per the last write or the open-time scan)."""
        return self._key_of[slot]

    def sync(self) -> bool:
        """fsync every slab file: chunks written so far survive a power loss. False if
        any fsync failed."""
        ok = True
        for fd in self._fds:
            try:
                os.fsync(fd)
            except OSError:
                ok = False
        return ok

    def drop_page_cache(self) -> None:
        """Write back and drop the slab files' pages from the page cache, so the next reads
        come from the device (cold-cache benchmarks and tests). Best effort."""
        for fd in self._fds:
            with contextlib.suppress(OSError, AttributeError):
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        """Wait for in-flight operations, stop the pool, close the files, drop the lock.
        Idempotent; later reads and writes fail (False)."""
        with self._stats_lock:
            if self._closed:
                return
            self._closed = True
            while self._active:
                self._idle.wait()
        self._release()

    def _release(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # closing the last descriptor drops the flock
            self._lock_fd = -1

    def __enter__(self) -> DiskSlab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lock_dir(path: Path) -> int:
    """Create ``path`` if needed and take its exclusive lock; return the lock's fd."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise TierUnavailable(f"disk tier directory {path} cannot be used: {e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
        owner = _lock_owner(fd)
        os.close(fd)
        if owner == os.getpid():
            who = "already open in this process (another DiskSlab or DiskTier)"
        else:
            who = f"in use by another process (pid {owner or 'unknown'})"
        raise TierUnavailable(
            f"disk tier directory {path} is {who}; one owner per directory: give every "
            f"engine (and every rank) its own disk_path"
        ) from e
    except OSError as e:
        os.close(fd)
        raise TierUnavailable(f"disk tier directory {path}: cannot lock {LOCK_NAME}: {e}") from e
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _lock_owner(fd: int) -> int | None:
    """The pid the lock's owner wrote into the lock file, if it reads as one."""
    try:
        text = os.pread(fd, 32, 0).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


# -- the whole tier in one process ------------------------------------------------------------


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
