"""Disk tier: slab files of fixed-size slots under one directory, moved with preadv/pwritev.

The on-disk format (directory layout, superblock, 128-byte slot headers kept apart from
page-aligned payloads) is described in :mod:`kvtier.tiers.disk.format`.

Two data paths, same bytes and headers: the native one (:mod:`kvtier.tiers.disk.native`,
built at install) moves bytes in cache-sized pieces (512 KiB reads, 1 MiB writes,
consecutive small slots sharing one), hashing each piece while it is in cache, with the
GIL released, one call per I/O thread per batch; the Python one (no compiler, or segments
that need staging through scratch) moves runs of consecutive slots with one
``preadv``/``pwritev`` and hashes each chunk after it. The native path exists because the
few microseconds of Python per chunk (buffer views, a checksum call, bookkeeping) cost as
much as moving a 64 KiB chunk (``benchmarks/disk_tier.py``; docs/benchmarks.md has the
figures). Hashing in cache-sized pieces keeps the checksum pass off main memory for chunks
larger than the last-level cache. The native path also takes chunks as flat address arrays
(:meth:`DiskSlab.read_buffers` / ``write_buffers``, :class:`~kvtier.contract.Buffers`),
which the transfer engine computes for a whole job at once instead of a tensor view per
block and layer.

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
survives a crash. Header readers (:meth:`DiskSlab.scan`, :mod:`kvtier.tools.inspect`)
take no lock: a scheduler process rebuilds its index with ``scan`` while its worker owns the
slab.

Inside an engine: the scheduler calls :meth:`DiskSlab.scan` and
:func:`~kvtier.tiers.disk.restore.restore_index` to rebuild its
:class:`~kvtier.tiers.index.SlotIndex` and passes each chunk's parent key to the worker;
every worker opens its own :class:`DiskSlab` (one directory per rank) and moves bytes.
:class:`kvtier.tools.slot_tier.DiskTier` composes both in one process (tools and tests).
How segments become buffers lives in :mod:`kvtier.tiers.disk.buffers`.

:class:`DiskSlab` is a facade over collaborators that each do one job and are handed, in
their constructors, the state they share (no base classes): the directory and its files
(:class:`~kvtier.tiers.disk.files.SlabFiles`), what each slot holds in memory
(:class:`~kvtier.tiers.disk.state.SlotTable`), admission, lifetime and counters
(:class:`~kvtier.tiers.disk.gate.SlabGate`), the I/O threads and their scratch
(:class:`~kvtier.tiers.disk.batching.IOThreads`), the write path
(:class:`~kvtier.tiers.disk.writes.SlabWriter`) and the read path
(:class:`~kvtier.tiers.disk.reads.SlabReader`); the last two get the others in one record,
:class:`~kvtier.tiers.disk.parts.SlabParts`. The facade checks each request
(:mod:`kvtier.tiers.disk.checks`), passes it through the gate and hands it on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from kvtier.contract import Buffers, Segments, SlotStore
from kvtier.keys import NS_BYTES, Key
from kvtier.tiers.disk.batching import IOThreads
from kvtier.tiers.disk.checks import check_buffers, check_slots
from kvtier.tiers.disk.files import SlabFiles, scan_dir
from kvtier.tiers.disk.format import DEFAULT_FILE_BYTES, SlotRecord, gc_paused, records_of
from kvtier.tiers.disk.gate import SlabGate
from kvtier.tiers.disk.native import native_io
from kvtier.tiers.disk.parts import SlabParts
from kvtier.tiers.disk.reads import SlabReader
from kvtier.tiers.disk.state import SlotTable
from kvtier.tiers.disk.writes import SlabWriter

log = logging.getLogger(__name__)


class DiskSlab(SlotStore):
    """``num_slots`` slots of ``slot_bytes`` in slab files under ``path``; one namespace.

    Contract (beyond :class:`~kvtier.contract.SlotStore`):

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
        created or opened; its subclass UnsafeDirectory when the directory or a file in it
        could be read or replaced by another user, or is a symbolic link
        (:mod:`kvtier.tiers.disk.private`: created 0700, files 0600, no link followed).
        """
        if len(namespace) != NS_BYTES:
            raise ValueError(f"namespace must be {NS_BYTES} bytes, got {len(namespace)}")
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
        self._files = SlabFiles(self.path, num_slots, slot_bytes, file_bytes)
        self.geometry = self._files.geometry
        try:
            self._table = SlotTable(num_slots, self.namespace)
            with gc_paused():
                self.records: list[SlotRecord] = records_of(
                    self._table.restore(self._files.scan(), slot_bytes)
                )
                """Restorable chunks found at open (this namespace), for :func:`restore_index`."""
            self._gate = SlabGate(self._files)
            native_path = native_io() if native else None
            self._io = IOThreads(threads, slot_bytes, self.geometry.stride)
        except BaseException:
            self._files.close()
            raise
        self._accepts_buffers = native_path is not None
        parts = SlabParts(self._files, self._table, self._gate, self._io, native_path)
        self._writes = SlabWriter(parts)
        self._reads = SlabReader(parts, self._writes.erase)

    @property
    def corrupt_reads(self) -> int:
        """Reads whose payload failed its checksum (bit rot, torn or foreign writes)."""
        return self._gate.corrupt_reads

    @property
    def io_errors(self) -> int:
        """Reads or writes that hit an OSError or a short read (truncated file)."""
        return self._gate.io_errors

    @property
    def stale_reads(self) -> int:
        """Reads of a key the slot does not hold (never written, erased, overwritten)."""
        return self._gate.stale_reads

    @property
    def unavailable(self) -> bool:
        """True once the backing files were found removed: every operation fails."""
        return self._gate.unavailable

    @classmethod
    def scan(
        cls,
        path: str | os.PathLike[str],
        namespace: bytes,
        slot_bytes: int,
        num_slots: int | None = None,
    ) -> list[SlotRecord]:
        """Restorable chunks of ``namespace`` in directory ``path``, reading headers only
        (:func:`~kvtier.tiers.disk.files.scan_dir`): for the scheduler process, while a
        worker owns the slab; takes no lock, writes nothing."""
        return scan_dir(path, namespace, slot_bytes, num_slots)

    def _admitted(
        self, slots: Sequence[int], op: Callable[..., list[bool]], *args: object
    ) -> list[bool]:
        """``op(slots, *args)`` if the gate admits an operation on ``slots``; else every
        chunk False."""
        gate = self._gate
        if not gate.enter(slots):
            return [False] * len(slots)
        try:
            return op(slots, *args)
        finally:
            gate.exit()

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
        check_slots(self.num_slots, slots, keys, src, parents)
        return self._admitted(slots, self._writes.write, keys, src, parents)

    def write_buffers(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Buffers,
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        """:meth:`write` from host-memory addresses (:class:`~kvtier.contract.Buffers`,
        no gaps), same headers and outcomes; the native path only (RuntimeError without
        it). Malformed buffers raise ValueError before any I/O."""
        check_slots(self.num_slots, slots, keys, range(len(src.start) - 1), parents)
        check_buffers(src, len(slots), self.slot_bytes, whole=True)
        if not self._accepts_buffers:
            raise RuntimeError("DiskSlab.write_buffers needs the native data path")
        return self._admitted(slots, self._writes.write_buffers, keys, src, parents)

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        """Read and verify chunks into ``dst`` (which may cover only parts of payloads)."""
        check_slots(self.num_slots, slots, keys, dst)
        return self._admitted(slots, self._reads.read, keys, dst)

    def accepts_buffers(self) -> bool:
        """True where the native data path is built (it alone moves bytes by address)."""
        return self._accepts_buffers

    def read_buffers(self, slots: Sequence[int], keys: Sequence[Key], dst: Buffers) -> list[bool]:
        """:meth:`read` into host-memory addresses (:class:`~kvtier.contract.Buffers`),
        same verification and outcomes; the native path only (see :meth:`accepts_buffers`,
        RuntimeError without it). Malformed buffers raise ValueError before any I/O."""
        check_slots(self.num_slots, slots, keys, range(len(dst.start) - 1))
        check_buffers(dst, len(slots), self.slot_bytes, whole=False)
        if not self._accepts_buffers:
            raise RuntimeError("DiskSlab.read_buffers needs the native data path")
        return self._admitted(slots, self._reads.read_buffers, keys, dst)

    def erase(self, slots: Sequence[int], keys: Sequence[Key]) -> list[bool]:
        """Forget chunks (persistently: their headers are zeroed), only where slot ``i``
        still holds ``keys[i]``. For deletes; the scheduler must not let a write to these
        slots run concurrently. Returns, per chunk, whether a header was erased."""
        check_slots(self.num_slots, slots, keys, keys)
        if not self._gate.enter(()):  # no file check: erasing needs no payload
            return [False] * len(slots)
        try:
            return [self._writes.erase(s, k) for s, k in zip(slots, keys, strict=True)]
        finally:
            self._gate.exit()

    def holds(self, slot: int) -> Key | None:
        """The key slot ``slot`` holds (per the last write or the open-time scan)."""
        return self._table.key_of[slot]

    def sync(self) -> bool:
        """fsync every slab file: chunks written so far survive a power loss. False if
        any fsync failed."""
        return self._files.sync()

    def drop_page_cache(self) -> None:
        """Write back and drop the slab files' pages from the page cache, so the next reads
        come from the device (cold-cache benchmarks and tests). Best effort."""
        self._files.drop_page_cache()

    def close(self) -> None:
        """Wait for in-flight operations, stop the pool, close the files, drop the lock.
        Idempotent; later reads and writes fail (False)."""
        if self._gate.close():
            self._io.close()
            self._files.close()

    def __enter__(self) -> DiskSlab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the whole tier in one process ------------------------------------------------------------
