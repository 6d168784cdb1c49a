"""Damage to a disk tier's slab files that only the payload checks can see."""

from __future__ import annotations

from pathlib import Path


def corrupt_payloads(disk_dir: Path) -> int:
    """Flip one byte in the payload of every slot written (headers stay valid)."""
    from kvtier.tiers.disk.format import read_superblock, slab_file_name

    flipped = 0
    for rank_dir in disk_dir.iterdir():
        geo = read_superblock(rank_dir)
        assert geo is not None
        for f in sorted(rank_dir.glob("slab-*.kvt")):
            fi = int(f.stem.split("-")[1])
            assert f.name == slab_file_name(fi)
            data = bytearray(f.read_bytes())
            for j in range(geo.slots_per_file):
                off = geo.payload_offset(fi * geo.slots_per_file + j) + 100
                if off < len(data) and any(data[off - 100 : off - 36]):
                    data[off] ^= 0xFF
                    flipped += 1
            f.write_bytes(bytes(data))
    return flipped
