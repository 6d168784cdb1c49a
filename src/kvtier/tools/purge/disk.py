"""Removing chunks from a disk tier directory: by the namespace digest in slot headers, or all.

Contract:

- Ownership: a purge takes the directory's lock, as an engine does, so it refuses a
  directory an engine has open (the engine's index lives in its memory and would keep
  serving what the files no longer hold): stop that engine first. The directory checks of
  :mod:`kvtier.tiers.disk.private` apply (no link followed, nothing of another user's).
- Per slot, in this order: the payload is overwritten with zeros, then the header, then
  the file is fsync-ed. A slot whose header is zeroed is free (a zero header never
  validates, and a torn one fails its checksum); a crash between the two leaves a header
  whose payload fails its checksum (a miss, erased when read) and a rerun finds it again.
  So a purged chunk's bytes are gone from the file, not just unlisted (the filesystem or
  device may keep old blocks: see the security notes).
- ``every``: kvtier's files (slab files, superblock, a leftover temporary superblock and the
  lock file) are removed, then the directory itself if that leaves it empty. Nothing else in
  it is touched.
- A ``disk_path`` with per-rank subdirectories (``tp2-rank0``, ...) is purged rank by rank.
- ``dry_run``: headers are read only (no lock taken); the count is what a purge removes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvtier.errors import ConfigError, TierUnavailable
from kvtier.tiers.disk.files import headers_at, lock_dir, slab_files_at, superblock_at
from kvtier.tiers.disk.format import (
    HEADER_BYTES,
    LOCK_NAME,
    SUPER_NAME,
    ZERO_HEADER,
    SlabGeometry,
    parse_headers,
    slab_file_name,
)
from kvtier.tiers.disk.kind import STATES_DIR
from kvtier.tiers.disk.private import (
    RANK_DIR,
    list_names,
    open_file,
    open_private_dir,
    remove_file,
)
from kvtier.tools.purge import PurgeTarget


@dataclass
class DiskPurge:
    """What one purge found: ``chunks`` (removed, or counted in a dry run) and the
    tier directories it went through."""

    chunks: int = 0
    dirs: int = 0


def tier_dirs(path: Path) -> list[Path]:
    """The tier directories under ``path``: itself when it holds a superblock, else its
    per-rank subdirectories that do, and those of its ``states`` subdirectory (hybrid
    models' recurrent states, same namespaces). Opened as the tier opens them
    (:func:`kvtier.tiers.disk.private.open_private_dir`: no link followed, ours and private,
    nothing changed); ConfigError when there is no directory at all, UnsafeDirectory when
    one is not safe to read."""
    if not os.path.lexists(path):
        raise ConfigError(f"purge: --disk {path} is not a directory")
    dfd = open_private_dir(path, create=False, tighten=False)
    try:
        names = set(list_names(dfd))
    finally:
        os.close(dfd)
    if SUPER_NAME in names:
        return [path]
    out = _rank_dirs(path, names)
    if STATES_DIR in names:
        dfd = open_private_dir(path / STATES_DIR, create=False, tighten=False)
        try:
            states = set(list_names(dfd))
        finally:
            os.close(dfd)
        out += _rank_dirs(path / STATES_DIR, states)
    return out


def _rank_dirs(path: Path, names: set[str]) -> list[Path]:
    """The per-rank subdirectories among ``names`` (the entries of ``path``) that hold a
    superblock."""
    out = []
    for name in sorted(n for n in names if RANK_DIR.fullmatch(n)):
        try:
            sub = open_private_dir(path / name, create=False, tighten=False)
        except FileNotFoundError:
            continue
        try:
            if SUPER_NAME in list_names(sub):
                out.append(path / name)
        finally:
            os.close(sub)
    return out


def digests_of(target: PurgeTarget) -> set[bytes] | None:
    """The header namespace digests ``target`` selects on disk (None: every one)."""
    if target.every:
        return None
    if target.namespace is not None:
        return {target.namespace.for_rank(r).digest() for r in range(target.world())}
    assert target.digest is not None
    return {target.digest}


def purge_disk(
    path: str | os.PathLike[str],
    target: PurgeTarget,
    *,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
) -> DiskPurge:
    """Remove (or count) ``target``'s chunks in the disk tier at ``path``. Raises
    TierUnavailable (naming the directory) when it is in use or unsafe."""
    out = DiskPurge()
    digests = digests_of(target)
    for d in tier_dirs(Path(path)):
        out.dirs += 1
        out.chunks += _count(d, digests) if dry_run else _purge(d, digests)
        if progress is not None:
            progress(out.chunks)
    return out


def _count(d: Path, digests: set[bytes] | None) -> int:
    dfd = open_private_dir(d, create=False, tighten=False)
    try:
        geo = superblock_at(dfd, d)
        if geo is None:
            return 0
        return sum(digests is None or h.namespace in digests for h in headers_at(dfd, d, geo))
    finally:
        os.close(dfd)


def _purge(d: Path, digests: set[bytes] | None) -> int:
    try:
        dfd, lock = lock_dir(d)
    except TierUnavailable as e:
        raise TierUnavailable(f"{e} (purge: stop the engine using it first)") from None
    try:
        geo = superblock_at(dfd, d)
        if geo is None:
            return 0
        if digests is None:
            n = len(headers_at(dfd, d, geo))
            for fi in slab_files_at(dfd):
                remove_file(dfd, slab_file_name(fi))
            for name in (SUPER_NAME + ".tmp", SUPER_NAME, LOCK_NAME):
                remove_file(dfd, name)
            return n
        return sum(_wipe_file(dfd, d, geo, fi, digests) for fi in slab_files_at(dfd))
    finally:
        os.close(lock)
        os.close(dfd)
        if digests is None:
            _remove_if_empty(d)


def _wipe_file(dfd: int, d: Path, geo: SlabGeometry, fi: int, digests: set[bytes]) -> int:
    """Zero the payload, then the header, of every slot of file ``fi`` under ``digests``."""
    fd = open_file(dfd, slab_file_name(fi), d, write=True, create=False)
    try:
        size = os.fstat(fd).st_size
        area = os.pread(fd, geo.slots_per_file * HEADER_BYTES, 0)
        first = fi * geo.slots_per_file
        hit = [h for ns in digests for h in parse_headers(area, first, ns)]
        zeros = bytes(geo.stride)
        for h in hit:
            off = geo.payload_offset(h.slot)
            if off < size:
                os.pwrite(fd, zeros[: min(geo.stride, size - off)], off)
        if hit:
            os.fsync(fd)  # payloads gone before any header says the slot is free
        for h in hit:
            os.pwrite(fd, ZERO_HEADER, geo.header_offset(h.slot))
        if hit:
            os.fsync(fd)
        return len(hit)
    finally:
        os.close(fd)


def _remove_if_empty(d: Path) -> None:
    with contextlib.suppress(OSError):  # something else is in it: left as it is
        os.rmdir(d)
