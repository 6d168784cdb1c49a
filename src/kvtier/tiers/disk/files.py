"""The slab directory of a DiskSlab: its lock, geometry and files, and header scans of a
directory (its own, or another owner's, read-only)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvtier.errors import TierUnavailable
from kvtier.tiers.disk.format import (
    HEADER_BYTES,
    LOCK_NAME,
    SLAB_PATTERN,
    SUPER_NAME,
    ZERO_HEADER,
    SlabGeometry,
    SlotHeader,
    SlotRecord,
    gc_paused,
    parse_headers,
    read_header_area,
    records_of,
    slab_file_name,
)
from kvtier.tiers.disk.private import (
    UnsafeDirectory,
    list_names,
    open_file,
    open_private_dir,
    remove_file,
)

log = logging.getLogger("kvtier.tiers.disk.slab")


class SlabFiles:
    """The slab directory of one owner: its lock, geometry and open slab files.

    Opening takes the directory's lock (:func:`lock_dir`), reads or writes its superblock
    (reformatting a directory of another ``slot_bytes``) and opens (creating) the files for
    ``num_slots`` slots; if any step fails, what was opened is closed and the error
    (TierUnavailable, or its subclass UnsafeDirectory) raised. Every file is opened
    relative to the directory's fd, never following a link (:mod:`.private`). The
    descriptors stay open until :meth:`close`.
    """

    def __init__(self, path: Path, num_slots: int, slot_bytes: int, file_bytes: int) -> None:
        self.path = path
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self.fds: list[int] = []
        """One descriptor per slab file (emptied, in place, at :meth:`close`)."""
        self._lock_fd = self._dir_fd = -1
        try:
            self._dir_fd, self._lock_fd = lock_dir(path)
            self.geometry = self._open_geometry(file_bytes)
            self._open_files()
        except BaseException:
            self.close()
            raise
        geo = self.geometry
        self.fd_arr = np.array(self.fds, dtype=np.int32)
        """:attr:`fds` as an array (for the native path)."""
        self.spf, self.stride, self.payload_base = geo.slots_per_file, geo.stride, geo.header_area
        self.pad = memoryview(bytes(geo.stride - slot_bytes))
        """The zero bytes written after each payload, up to the next page-aligned slot."""

    def _open_geometry(self, file_bytes: int) -> SlabGeometry:
        dfd = self._dir_fd
        found = superblock_at(dfd, self.path)
        if found is not None and found.slot_bytes == self.slot_bytes:
            return found
        geo = SlabGeometry.for_slot_bytes(self.slot_bytes, file_bytes)
        if found is not None or slab_files_at(dfd):
            was = f"{found.slot_bytes}-byte slots" if found else "no valid superblock"
            log.warning(
                "kvtier disk tier: %s holds slab files with %s, not %d-byte slots; "
                "reformatting it (its cached chunks are dropped)",
                self.path,
                was,
                self.slot_bytes,
            )
        try:
            for fi in slab_files_at(dfd):
                remove_file(dfd, slab_file_name(fi))  # a link goes, never its target
            tmp = SUPER_NAME + ".tmp"
            remove_file(dfd, tmp)  # left by a crash (or planted): made afresh with O_EXCL
            fd = open_file(dfd, tmp, self.path, write=True, create=True)
            try:
                os.write(fd, geo.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, SUPER_NAME, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as e:
            raise TierUnavailable(f"disk tier {self.path}: cannot format: {e}") from e
        return geo

    def _open_files(self) -> None:
        geo = self.geometry
        need = geo.num_files(self.num_slots)
        dfd = self._dir_fd
        try:
            for fi in slab_files_at(dfd):
                if fi >= need:  # capacity shrank: give the space back
                    remove_file(dfd, slab_file_name(fi))
            for fi in range(need):
                fd = open_file(dfd, slab_file_name(fi), self.path, write=True, create=True)
                self.fds.append(fd)
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
        fd = self.fds[fi]
        if used == geo.slots_per_file or os.fstat(fd).st_size <= geo.file_size(used):
            return
        first = used * HEADER_BYTES
        area = os.pread(fd, geo.slots_per_file * HEADER_BYTES - first, first)
        for h in parse_headers(area, used):
            os.pwrite(fd, ZERO_HEADER, geo.header_offset(h.slot))
        os.ftruncate(fd, geo.file_size(used))

    def scan(self) -> list[SlotHeader]:
        """Valid headers of every namespace in our files; unreadable files count as empty."""
        out: list[SlotHeader] = []
        geo = self.geometry
        for fi, fd in enumerate(self.fds):
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

    def removed(self, slots: Sequence[int]) -> bool:
        """Whether a file holding one of ``slots`` was unlinked (or cannot be checked)."""
        spf = self.spf
        try:
            return any(os.fstat(self.fds[fi]).st_nlink == 0 for fi in {s // spf for s in slots})
        except OSError:
            return True

    def locate(self, slot: int) -> tuple[int, int]:
        """(file descriptor, payload offset) of ``slot``."""
        spf = self.spf
        return self.fds[slot // spf], self.payload_base + (slot % spf) * self.stride

    def zero_header(self, slot: int) -> bool:
        """Erase ``slot``'s header on disk (a restart will not re-admit it); False on an
        OSError."""
        try:
            os.pwrite(self.fds[slot // self.spf], ZERO_HEADER, self.geometry.header_offset(slot))
        except OSError:
            return False
        return True

    def sync(self) -> bool:
        """fsync every slab file: chunks written so far survive a power loss. False if
        any fsync failed."""
        ok = True
        for fd in self.fds:
            try:
                os.fsync(fd)
            except OSError:
                ok = False
        return ok

    def drop_page_cache(self) -> None:
        """Write back and drop the slab files' pages from the page cache, so the next reads
        come from the device (cold-cache benchmarks and tests). Best effort."""
        for fd in self.fds:
            with contextlib.suppress(OSError, AttributeError):
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        """Close the files and drop the lock (closing its last descriptor drops the flock).
        Idempotent; the caller lets no I/O run from here on."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        for fd in (self._lock_fd, self._dir_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._lock_fd = self._dir_fd = -1


def scan_dir(
    path: str | os.PathLike[str],
    namespace: bytes,
    slot_bytes: int,
    num_slots: int | None = None,
) -> list[SlotRecord]:
    """Restorable chunks of ``namespace`` in directory ``path``, reading headers only.

    For the scheduler process, which rebuilds its index (:func:`restore_index`) while
    a worker owns the slab: takes no lock, writes nothing. Empty when the directory is
    missing or formatted for another ``slot_bytes``, and (logged) when it or a file in
    it is unsafe (:mod:`kvtier.tiers.disk.private`; never changed here). Slots at or
    past ``num_slots`` are ignored. A header that validates says nothing yet about its
    payload: a torn payload is found (and becomes a miss) when it is read.
    """
    where = Path(path)
    try:
        dfd = open_private_dir(where, create=False, tighten=False)
    except FileNotFoundError:
        return []
    except UnsafeDirectory as e:
        log.warning("kvtier disk tier: nothing restored: %s", e)
        return []
    try:
        geo = superblock_at(dfd, where)
        if geo is None or geo.slot_bytes != slot_bytes:
            return []
        with gc_paused():
            headers = headers_at(dfd, where, geo, num_slots, namespace)
            return records_of(h for h in headers if h.length == slot_bytes)
    except UnsafeDirectory as e:
        log.warning("kvtier disk tier: nothing restored: %s", e)
        return []
    finally:
        os.close(dfd)


def superblock_at(dir_fd: int, where: Path) -> SlabGeometry | None:
    """The geometry the directory's superblock records; None when absent or invalid.
    A link or a file another user could write raises :class:`UnsafeDirectory`."""
    try:
        fd = open_file(dir_fd, SUPER_NAME, where, write=False, create=False)
    except FileNotFoundError:
        return None
    try:
        return SlabGeometry.decode(os.pread(fd, 4096, 0))  # a longer file: not ours
    finally:
        os.close(fd)


def slab_files_at(dir_fd: int) -> list[int]:
    """Indices of the slab files in the directory (names matching ours only)."""
    return sorted(int(m.group(1)) for n in list_names(dir_fd) if (m := SLAB_PATTERN.fullmatch(n)))


def headers_at(
    dir_fd: int,
    where: Path,
    geometry: SlabGeometry,
    num_slots: int | None = None,
    namespace: bytes | None = None,
) -> list[SlotHeader]:
    """Valid headers of every slab file in the directory (slots below ``num_slots`` if
    given; of ``namespace`` if given), one ``pread`` per file. A link or a file another user
    could write raises :class:`UnsafeDirectory`; an unreadable file counts as empty."""
    out: list[SlotHeader] = []
    for fi in slab_files_at(dir_fd):
        first = fi * geometry.slots_per_file
        count = geometry.slots_per_file
        if num_slots is not None:
            count = geometry.file_slots(fi, num_slots)
        if count <= 0:
            continue
        try:
            fd = open_file(dir_fd, slab_file_name(fi), where, write=False, create=False)
        except UnsafeDirectory:
            raise
        except OSError:
            continue
        try:
            out.extend(parse_headers(read_header_area(fd, geometry, count), first, namespace))
        except OSError:
            continue
        finally:
            os.close(fd)
    return out


def lock_dir(path: Path) -> tuple[int, int]:
    """Create ``path`` if needed (0700), check it (:func:`.private.open_private_dir`) and
    take its exclusive lock; return (directory fd, lock fd)."""
    dfd = open_private_dir(path)
    try:
        fd = open_file(dfd, LOCK_NAME, path, write=True, create=True)
    except TierUnavailable:
        os.close(dfd)
        raise
    except OSError as e:
        os.close(dfd)
        raise TierUnavailable(f"disk tier directory {path} cannot be used: {e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as e:
        owner = lock_owner(fd)
        os.close(fd)
        os.close(dfd)
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
        os.close(dfd)
        raise TierUnavailable(f"disk tier directory {path}: cannot lock {LOCK_NAME}: {e}") from e
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return dfd, fd


def lock_owner(fd: int) -> int | None:
    """The pid the lock's owner wrote into the lock file, if it reads as one."""
    try:
        text = os.pread(fd, 32, 0).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
