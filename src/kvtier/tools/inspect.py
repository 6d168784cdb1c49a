"""``kvtier inspect DIR``: what a disk tier directory holds, from its headers only.

Read-only and lock-free, so it is safe beside a running engine (a slot being rewritten at
that moment may be missed). Payloads are never read: a chunk counted here is one whose
header validates; its payload is checked when a tier loads it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from kvtier.errors import TierUnavailable
from kvtier.tiers.disk.files import headers_at, lock_owner, slab_files_at, superblock_at
from kvtier.tiers.disk.format import (
    HEADER_BYTES,
    LOCK_NAME,
    SlotHeader,
    gc_paused,
    records_of,
    slab_file_name,
)
from kvtier.tiers.disk.private import UnsafeDirectory, open_file, open_private_dir
from kvtier.tiers.disk.restore import restorable


def inspect_dir(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Summarize a disk tier directory (JSON-friendly).

    The directory and its files are opened as the tier opens them
    (:mod:`kvtier.tiers.disk.private`: no link followed, no FIFO or other special file
    opened, only a directory and files of this user that others cannot write, nothing
    changed); anything else is an ``error`` naming it.

    Keys: ``path``; ``error`` (a reason text, or None when the directory holds a formatted
    tier); ``format`` (slot geometry, or None); ``files``, ``apparent_bytes`` and
    ``allocated_bytes`` of the slab files; ``newest_mtime`` (Unix seconds, or None);
    ``lock_pid`` (pid written by the last owner, or None) and ``lock_pid_alive``;
    ``valid_chunks``; ``namespaces``: one dict per namespace digest (hex), largest first,
    with ``chunks``, ``restorable`` (what a restart re-admits: newest copy per key, whole
    chains only), ``payload_bytes``, ``oldest_seq``/``newest_seq`` (write sequence
    numbers, larger is newer) and ``parent_unknown`` (chunks written without their parent
    key); ``scan_seconds``.
    """
    p = Path(path)
    out: dict[str, Any] = {"path": str(p), "error": None, "format": None, "namespaces": []}
    try:
        dfd = open_private_dir(p, create=False, tighten=False)
    except (FileNotFoundError, NotADirectoryError):
        out["error"] = "not a directory"
        return out
    except TierUnavailable as e:
        out["error"] = str(e)
        return out
    try:
        out.update(_files_info(dfd, p))
        out.update(_lock_info(dfd, p))
        geo = superblock_at(dfd, p)
        if geo is None:
            out["error"] = "no valid kvtier.super: not a formatted disk tier"
            return out
        out["format"] = {
            "slot_bytes": geo.slot_bytes,
            "stride": geo.stride,
            "slots_per_file": geo.slots_per_file,
            "header_bytes": HEADER_BYTES,
        }
        t0 = time.perf_counter()
        with gc_paused():
            headers = headers_at(dfd, p, geo)
            out["scan_seconds"] = time.perf_counter() - t0
            out["valid_chunks"] = len(headers)
            out["namespaces"] = _by_namespace(headers)
    except UnsafeDirectory as e:
        out["error"] = str(e)
    finally:
        os.close(dfd)
    return out


def _files_info(dfd: int, p: Path) -> dict[str, Any]:
    apparent = allocated = 0
    newest: float | None = None
    files = slab_files_at(dfd)
    for fi in files:
        try:
            fd = open_file(dfd, slab_file_name(fi), p, write=False, create=False)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        apparent += st.st_size
        allocated += st.st_blocks * 512
        newest = st.st_mtime if newest is None else max(newest, st.st_mtime)
    return {
        "files": len(files),
        "apparent_bytes": apparent,
        "allocated_bytes": allocated,
        "newest_mtime": newest,
    }


def _lock_info(dfd: int, p: Path) -> dict[str, Any]:
    # Only reads the pid the last owner wrote: taking the lock, even briefly, could make
    # an engine starting at that moment fail to open its tier.
    pid: int | None = None
    try:
        fd = open_file(dfd, LOCK_NAME, p, write=False, create=False)
    except FileNotFoundError:
        fd = -1
    if fd >= 0:
        try:
            pid = lock_owner(fd)
        finally:
            os.close(fd)
    alive: bool | None = None
    if pid is not None:
        try:
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        except PermissionError:
            alive = True
    return {"lock_pid": pid, "lock_pid_alive": alive}


def _by_namespace(headers: list[SlotHeader]) -> list[dict[str, Any]]:
    groups: dict[bytes, list[SlotHeader]] = {}
    for h in headers:
        groups.setdefault(h.namespace, []).append(h)
    rows: list[dict[str, Any]] = []
    for ns, hs in groups.items():
        rows.append(
            {
                "namespace": ns.hex(),
                "chunks": len(hs),
                "restorable": len(restorable(records_of(hs))),
                "payload_bytes": sum(h.length for h in hs),
                "oldest_seq": min(h.seq for h in hs),
                "newest_seq": max(h.seq for h in hs),
                "parent_unknown": sum(h.parent_unknown for h in hs),
            }
        )
    rows.sort(key=lambda r: (-r["chunks"], r["namespace"]))
    return rows


def _size(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    cells = [headers, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return [line.rstrip() for line in lines]


def format_inspect(info: dict[str, Any]) -> str:
    """``inspect_dir``'s result as text: a few facts, then one table row per namespace."""
    lines = [f"disk tier: {info['path']}"]
    if info.get("error"):
        lines.append(f"  {info['error']}")
        if not info.get("format"):
            return "\n".join(lines)
    fmt = info["format"]
    lines.append(
        f"  slots of {_size(fmt['slot_bytes'])} (stride {_size(fmt['stride'])}), "
        f"{fmt['slots_per_file']} per file; {info['files']} files, "
        f"{_size(info['allocated_bytes'])} allocated of {_size(info['apparent_bytes'])}"
    )
    if info.get("newest_mtime") is not None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["newest_mtime"]))
        lines.append(f"  last write: {stamp}")
    if info.get("lock_pid") is not None:
        state = "running" if info.get("lock_pid_alive") else "not running"
        lines.append(f"  last owner: pid {info['lock_pid']} ({state})")
    lines.append(
        f"  {info.get('valid_chunks', 0)} valid chunks "
        f"(headers scanned in {info.get('scan_seconds', 0.0) * 1e3:.1f} ms)"
    )
    if not info["namespaces"]:
        return "\n".join(lines)
    rows = [
        [
            ns["namespace"],
            str(ns["chunks"]),
            str(ns["restorable"]),
            _size(ns["payload_bytes"]),
            str(ns["oldest_seq"]),
            str(ns["newest_seq"]),
        ]
        for ns in info["namespaces"]
    ]
    lines.append("")
    lines.extend(
        _table(["namespace", "chunks", "restorable", "bytes", "oldest seq", "newest seq"], rows)
    )
    return "\n".join(lines)
