"""The disk tier's directory as a private place: created 0700, checked, used through its fd.

A cache directory on a shared host (``/var/cache/kvtier``, ``/tmp/...``) can be prepared by
another local user before kvtier starts: created first and owned by them, left world
writable, or seeded with symbolic links at the names kvtier opens, so that a write follows
the link and clobbers the target (KV also reveals the prompt it came from). The defence:

- Missing directories are created with mode 0700 (each missing component).
- The directory is opened with ``O_DIRECTORY | O_NOFOLLOW`` and ``fstat``-ed: it must be a
  directory (not a link to one) owned by this process's effective uid and writable by
  nobody else. One we own that others may only read or enter (0755, as older kvtier
  versions left theirs) is tightened to 0700 by the tier (logged; read-only scans use it
  as it is): nobody else could have written into it, so its entries are ours.
- Every file is then opened *relative to that fd* (``dir_fd``), so swapping a path component
  for a link after the check changes nothing, with ``O_NOFOLLOW``: a link at a name is
  refused (``ELOOP``), never followed. A file is created only with ``O_CREAT | O_EXCL``,
  mode 0600; an existing one must be a regular file (a FIFO is refused, never waited on)
  with one link (a hard link shares its bytes with a name elsewhere), owned by us and not
  group or world writable.
- The tier (a writer) uses an existing directory only when it is empty or holds nothing
  but kvtier's own names: a mistyped ``disk_path`` (``/var/lib``) is refused, never
  tightened to 0700 or written into.

Symbolic links in the path *above* the directory are still followed (the kernel resolves
them before ``O_NOFOLLOW`` applies to the last component): give a path whose parents only
you or root can write. Every refusal is a :class:`UnsafeDirectory` (a ``TierUnavailable``)
that names the path, what is wrong and the command that fixes it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
from pathlib import Path

from kvtier.errors import TierUnavailable
from kvtier.tiers.disk.format import LOCK_NAME, SLAB_PATTERN, SUPER_NAME

log = logging.getLogger("kvtier.tiers.disk")

DIR_MODE = 0o700
FILE_MODE = 0o600
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
RANK_DIR = re.compile(r"tp\d+-rank\d+")


class UnsafeDirectory(TierUnavailable):
    """The disk tier's directory, or a file in it, could be read or replaced by another
    user (or is a symbolic link): refused, with what to do about it."""


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and any missing parent with mode 0700 (existing ones untouched)."""
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # created meanwhile: checked when opened
            os.mkdir(d, DIR_MODE)  # the umask may narrow 0700, never widen it


def open_private_dir(path: Path, *, create: bool = True, tighten: bool = True) -> int:
    """An fd of directory ``path`` (created 0700 when missing and ``create``), checked as
    the module docstring says. ``tighten``: a directory of ours that others may read but not
    write is chmod-ed to 0700; readers pass False and use it as it is (nobody else could
    have written into it), changing nothing.

    Raises :class:`UnsafeDirectory` for a link, another owner or a group/world writable
    directory; ``FileNotFoundError`` when missing and not ``create``; TierUnavailable for
    other OS errors."""
    if create:
        try:
            make_private_dirs(path)
        except OSError as e:
            raise TierUnavailable(f"disk tier directory {path} cannot be created: {e}") from e
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symbolic link" if os.path.islink(path) else "not a directory"
            raise UnsafeDirectory(
                f"disk tier directory {path} is {kind}; kvtier uses only a real directory "
                f"it owns: point disk_path at one (or remove {path} and let kvtier create it)"
            ) from e
        raise TierUnavailable(f"disk tier directory {path} cannot be opened: {e}") from e
    try:
        _check_dir(fd, path, tighten)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_dir(fd: int, path: Path, tighten: bool) -> None:
    st = os.fstat(fd)
    me = os.geteuid()
    if st.st_uid != me:
        raise UnsafeDirectory(
            f"disk tier directory {path} is owned by uid {st.st_uid}, not by this process "
            f"(uid {me}): another user could read or replace its chunks; use a directory "
            f"you own (or, if it is yours: chown {me} {path} && chmod 700 {path})"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise UnsafeDirectory(
            f"disk tier directory {path} has mode {mode:04o}: group or other users may "
            f"create, replace or link files in it; check what it holds, then chmod 700 {path} "
            "(or use a fresh directory)"
        )
    if tighten:
        _check_contents(fd, path)
    if mode & 0o077 and tighten:
        os.fchmod(fd, DIR_MODE)
        log.warning(
            "kvtier disk tier: %s had mode %04o (others could list it); now 0700", path, mode
        )


def is_own_name(name: str) -> bool:
    """Whether ``name`` is one kvtier puts in a disk tier directory: slab files, the
    superblock (and its temporary), the lock file, per-rank subdirectories."""
    return (
        name in (SUPER_NAME, SUPER_NAME + ".tmp", LOCK_NAME)
        or SLAB_PATTERN.fullmatch(name) is not None
        or RANK_DIR.fullmatch(name) is not None
    )


def _check_contents(fd: int, path: Path) -> None:
    """Refuse a directory holding anything but kvtier's own names: a mistyped
    ``disk_path`` (``/var/lib``, a web root, a home directory) must not be chmod-ed to
    0700 (locking every other user out) nor get slab files written beside someone's data."""
    foreign = sorted(n for n in list_names(fd) if not is_own_name(n))
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise UnsafeDirectory(
            f"disk tier directory {path} holds {foreign[0]!r}{more}, which kvtier did not "
            "write; kvtier uses only an empty directory or one holding its own files (it "
            f"would tighten it to 0700 and write beside them): give disk_path a directory "
            f"of its own, e.g. {path / 'kvtier'}"
        )


def open_file(dir_fd: int, name: str, where: Path, *, write: bool, create: bool) -> int:
    """Open ``name`` in the directory ``dir_fd`` (``where`` is its path, for messages):
    read-write or read-only, never following a link; when missing and ``create``, created
    with ``O_EXCL`` and mode 0600. An existing file must be a regular file we own that the
    group and others cannot write, else :class:`UnsafeDirectory`. Other failures raise
    their ``OSError`` (``FileNotFoundError`` when missing and not ``create``)."""
    # O_NONBLOCK: opening a FIFO planted at a name would wait for a writer forever; a
    # regular file ignores it, and anything else is refused by check_file.
    flags = (os.O_RDWR if write else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    for _ in range(2):  # created by another between our two opens: check it as existing
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise
            try:
                return os.open(name, flags | os.O_CREAT | os.O_EXCL, FILE_MODE, dir_fd=dir_fd)
            except FileExistsError:
                continue
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise UnsafeDirectory(
                    f"{where / name} is a symbolic link; kvtier never follows links in its "
                    f"directory (the link's target was not touched): remove {where / name}"
                ) from e
            if e.errno == errno.EISDIR:
                raise UnsafeDirectory(
                    f"{where / name} is a directory, not a kvtier file: remove it"
                ) from e
            raise
        try:
            check_file(fd, where / name)
        except BaseException:
            os.close(fd)
            raise
        return fd
    raise TierUnavailable(f"{where / name}: created and removed repeatedly while opened")


def check_file(fd: int, path: Path) -> None:
    """Refuse (:class:`UnsafeDirectory`) a file that is not regular, not ours, or writable
    by the group or others."""
    st = os.fstat(fd)
    me = os.geteuid()
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeDirectory(f"{path} is not a regular file: remove it")
    if st.st_nlink > 1:
        # Another name of the same file: writes here would change that file too (or it
        # changes our chunks), wherever the other name lives.
        raise UnsafeDirectory(
            f"{path} has {st.st_nlink} hard links: another name shares its bytes; remove "
            f"{path} (kvtier recreates it; the other name is not touched)"
        )
    if st.st_uid != me:
        raise UnsafeDirectory(
            f"{path} is owned by uid {st.st_uid}, not by this process (uid {me}): another "
            f"user may have planted its bytes; remove it (kvtier recreates it)"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise UnsafeDirectory(
            f"{path} has mode {mode:04o}: group or other users may rewrite it; remove it "
            f"(kvtier recreates it) or chmod 600 {path}"
        )


def remove_file(dir_fd: int, name: str) -> None:
    """Unlink ``name`` in ``dir_fd`` if present (a link is removed, never its target)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def list_names(dir_fd: int) -> list[str]:
    """The names in the directory ``dir_fd`` (``listdir`` reads a duplicate of the fd)."""
    return os.listdir(dir_fd)
