"""Start-up cost of the disk tier: rebuilding the index from slot headers (part of
``benchmarks/disk_tier.py``, which imports it).

On 10 GiB tiers synthesized as sparse files (valid headers, payloads never written): 1 MiB
slots (10,240) and 23 KiB slots (436,906), chains of 16; ``DiskSlab.scan`` (headers only)
and a full ``DiskTier`` open (scan + ``restore_index``), hot and (cold) after fsync +
``posix_fadvise(DONTNEED)`` on the header areas.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from common import fmt_bytes, format_table
from kvtier.keys import KEY_BYTES, Namespace
from kvtier.tiers.disk.format import SlabGeometry, pack_header, slab_file_name
from kvtier.tiers.disk.slab import DiskSlab
from kvtier.tools.slot_tier import DiskTier

GiB = 1 << 30
NS = Namespace("bench-model", "bench-layout").digest()
HAS_FADVISE = hasattr(os, "posix_fadvise")


def write_sparse_tier(path: Path, slot_bytes: int, num_slots: int, chain_len: int = 16) -> None:
    """A full tier of valid headers over sparse (never written) payloads."""
    geo = SlabGeometry.for_slot_bytes(slot_bytes)
    path.mkdir(parents=True, exist_ok=True)
    (path / "kvtier.super").write_bytes(geo.encode())
    seq = 0
    for fi in range(geo.num_files(num_slots)):
        count = geo.file_slots(fi, num_slots)
        parts = []
        for j in range(count):
            slot = fi * geo.slots_per_file + j
            seq += 1
            parent = (slot - 1).to_bytes(KEY_BYTES, "little") if slot % chain_len else None
            parts.append(
                pack_header(slot.to_bytes(KEY_BYTES, "little"), parent, NS, seq, slot_bytes, 0)
            )
        with open(path / slab_file_name(fi), "wb") as f:
            f.write(b"".join(parts))
            f.truncate(geo.file_size(count))


def _drop_headers(path: Path) -> None:
    for p in path.glob("slab-*.kvt"):
        fd = os.open(p, os.O_RDWR)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_scan(root: Path, slot_bytes: int, cold: bool) -> dict[str, Any]:
    num_slots = (10 * GiB) // SlabGeometry.for_slot_bytes(slot_bytes).stride
    path = root / f"scan-{slot_bytes}"
    try:
        t0 = time.perf_counter()
        write_sparse_tier(path, slot_bytes, num_slots)
        t_make = time.perf_counter() - t0
        out: dict[str, Any] = {"slot_bytes": slot_bytes, "slots": num_slots, "make_s": t_make}
        if cold and HAS_FADVISE:
            _drop_headers(path)
            t0 = time.perf_counter()
            DiskSlab.scan(path, NS, slot_bytes, num_slots)
            out["scan_cold_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        records = DiskSlab.scan(path, NS, slot_bytes, num_slots)
        out["scan_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        tier = DiskTier(path, num_slots * slot_bytes, slot_bytes, NS)
        out["open_restore_s"] = time.perf_counter() - t0
        assert len(records) == tier.restored == num_slots, (len(records), tier.restored)
        tier.close()
        return out
    finally:
        shutil.rmtree(path, ignore_errors=True)


def scan_table(scans: list[dict[str, Any]]) -> str:
    """The readable table of :func:`run_scan` results."""
    return format_table(
        ["slot", "slots", "scan", "scan cold", "open + restore"],
        [
            [
                fmt_bytes(s["slot_bytes"]),
                s["slots"],
                f"{s['scan_s'] * 1e3:.0f} ms",
                f"{s['scan_cold_s'] * 1e3:.0f} ms" if "scan_cold_s" in s else "",
                f"{s['open_restore_s']:.2f} s",
            ]
            for s in scans
        ],
        title="10 GiB tiers (sparse): DiskSlab.scan reads headers only; open + "
        "restore = DiskTier(...) including restore_index",
    )
