"""On-disk format of the disk tier: directory layout, superblock, slot headers, scans.

Directory layout (every file name is ours; no path is built from stored text)::

    kvtier.lock        flock()ed exclusively by the process that owns the data plane
    kvtier.super       superblock: format version and slot geometry (48 bytes, checksummed)
    slab-00000.kvt     slab files, ``slots_per_file`` slots each (the last one may hold fewer)
    slab-00001.kvt ...

Slab file ``f`` holds slots ``f * spf .. f * spf + spf - 1``::

    [0, header_area)                 one HEADER_BYTES header per slot, in slot order
    header_area + j * stride         payload of the file's slot j (stride = slot_bytes
                                     rounded up to 4 KiB, so payloads are page aligned)

Headers live apart from payloads so that rebuilding the index at start reads one small
contiguous region per file (a 10 GiB tier of 1 MiB slots: 10 reads of 128 KiB), never the
payloads. A slot header is the chunk envelope of :mod:`kvtier.tiers.envelope` (128 bytes:
key, parent, namespace, sequence number, payload length and checksum, header checksum).

Superblock (``kvtier.super``, 48 bytes): magic b"KVTSUPER", version u32, header bytes u32,
slot bytes u64, stride u64, slots per file u64, xxh3_64 of the preceding 40 bytes. It is
written once, when a directory is formatted (temporary file, fsync, rename).

Nothing here locks or writes slab files: these readers are safe beside a running tier
(they may see a slot being rewritten as invalid).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import xxhash

from kvtier.keys import KEY_BYTES, NS_BYTES, Key
from kvtier.tiers.envelope import (
    FLAG_HAS_PARENT,
    FLAG_PARENT_UNKNOWN,
    KEY_AT,
    MAGIC,
    NAMESPACE_AT,
    NO_KEY,
    PARENT_AT,
    RESERVED_BYTES,
    SUMMED_BYTES,
    VERSION,
    pack_envelope,
)
from kvtier.tiers.envelope import (
    HEADER_BYTES as HEADER_BYTES,
)

ALIGN = 4096
"""Payload alignment (bytes): page size, so payload writes never read-modify-write a page."""
DEFAULT_FILE_BYTES = 1 << 30
"""Target size of one slab file (bytes), used when a directory is formatted."""

LOCK_NAME = "kvtier.lock"
SUPER_NAME = "kvtier.super"
SLAB_PATTERN = re.compile(r"slab-(\d{5})\.kvt")

SLOT_MAGIC = MAGIC
FORMAT_VERSION = VERSION
_HEADER_SUMMED = SUMMED_BYTES

SUPER_MAGIC = b"KVTSUPER"
_SUPER = struct.Struct("<8sIIQQQQ")
"""magic, version, header bytes, slot bytes, stride, slots per file, checksum of the rest."""

_NO_KEY = NO_KEY
ZERO_HEADER = bytes(HEADER_BYTES)
"""An erased header (never validates)."""


def _round_up(n: int, align: int) -> int:
    return -(-n // align) * align


# -- geometry and headers -------------------------------------------------------------------


@dataclass(frozen=True)
class SlabGeometry:
    """Where slot ``s``'s header and payload live. Fixed when a directory is formatted."""

    slot_bytes: int
    """Payload bytes of one slot."""
    slots_per_file: int

    @classmethod
    def for_slot_bytes(cls, slot_bytes: int, file_bytes: int = DEFAULT_FILE_BYTES) -> SlabGeometry:
        stride = _round_up(max(1, slot_bytes), ALIGN)
        return cls(slot_bytes, max(1, file_bytes // stride))

    @property
    def stride(self) -> int:
        """Bytes between two payloads in a file (page aligned)."""
        return _round_up(max(1, self.slot_bytes), ALIGN)

    @property
    def header_area(self) -> int:
        """Bytes at the start of every file holding its headers (page aligned)."""
        return _round_up(self.slots_per_file * HEADER_BYTES, ALIGN)

    def num_files(self, num_slots: int) -> int:
        return -(-num_slots // self.slots_per_file)

    def file_slots(self, file_index: int, num_slots: int) -> int:
        """Slots of file ``file_index`` in a tier of ``num_slots``."""
        return max(0, min(self.slots_per_file, num_slots - file_index * self.slots_per_file))

    def header_offset(self, slot: int) -> int:
        return (slot % self.slots_per_file) * HEADER_BYTES

    def payload_offset(self, slot: int) -> int:
        return self.header_area + (slot % self.slots_per_file) * self.stride

    def file_size(self, slots_in_file: int) -> int:
        """Size of a file whose slots ``0 .. slots_in_file - 1`` were all written."""
        return self.header_area + slots_in_file * self.stride

    def encode(self) -> bytes:
        body = _SUPER.pack(
            SUPER_MAGIC,
            FORMAT_VERSION,
            HEADER_BYTES,
            self.slot_bytes,
            self.stride,
            self.slots_per_file,
            0,
        )[:-8]
        return body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))

    @classmethod
    def decode(cls, data: bytes) -> SlabGeometry | None:
        """The geometry a superblock records; None if it is not a valid superblock."""
        if len(data) != _SUPER.size:
            return None
        magic, version, hbytes, slot_bytes, stride, spf, csum = _SUPER.unpack(data)
        if magic != SUPER_MAGIC or version != FORMAT_VERSION or hbytes != HEADER_BYTES:
            return None
        if csum != xxhash.xxh3_64_intdigest(data[:-8]) or spf < 1:
            return None
        geo = cls(slot_bytes, spf)
        return geo if geo.stride == stride else None


class SlotHeader(NamedTuple):
    """A decoded, validated slot header."""

    slot: int
    key: Key
    parent: Key | None
    """None for a chain start; also None when ``parent_unknown``."""
    parent_unknown: bool
    """Written without its parent key: readable now, not restorable after a restart."""
    namespace: bytes
    seq: int
    length: int
    checksum: int


class SlotRecord(NamedTuple):
    """What the index needs to re-admit a chunk after a restart."""

    slot: int
    key: Key
    parent: Key | None
    seq: int
    """Write sequence number: larger is newer (monotonic per directory)."""


pack_header = pack_envelope
"""Encode a slot header: the chunk envelope (:mod:`kvtier.tiers.envelope`)."""


# A slot header as a NumPy record: headers are packed and parsed a whole batch at once.
_RECORD_DTYPE = np.dtype(
    [
        ("magic", "S4"),
        ("version", "<u2"),
        ("flags", "<u2"),
        ("seq", "<u8"),
        ("length", "<u8"),
        ("psum", "<u8"),
        ("key", f"V{KEY_BYTES}"),
        ("parent", f"V{KEY_BYTES}"),
        ("namespace", f"V{NS_BYTES}"),
        ("reserved", f"V{RESERVED_BYTES}"),
        ("hsum", "<u8"),
    ]
)
PSUM_OFFSET = 24
"""Byte offset of the payload checksum in a header (the native write path fills it in)."""
assert _RECORD_DTYPE.itemsize == HEADER_BYTES and _RECORD_DTYPE.fields is not None
assert _RECORD_DTYPE.fields["psum"][1] == PSUM_OFFSET
assert _RECORD_DTYPE.fields["key"][1] == KEY_AT and _RECORD_DTYPE.fields["parent"][1] == PARENT_AT
assert _RECORD_DTYPE.fields["namespace"][1] == NAMESPACE_AT


def pack_headers(
    keys: Sequence[Key],
    parents: Sequence[Key | None] | None,
    namespace: bytes,
    first_seq: int,
    length: int,
) -> np.ndarray:
    """Headers for a batch (``n x HEADER_BYTES`` uint8, sequence numbers ``first_seq``
    onwards) with both checksum fields zero: the writer fills them in once the payload is
    hashed (the payload checksum, then the header checksum over ``[0, 120)``), giving the
    bytes :func:`pack_header` gives. ``parents`` None: parents unknown (not restorable)."""
    n = len(keys)
    rec = np.zeros(n, dtype=_RECORD_DTYPE)
    rec["magic"] = SLOT_MAGIC
    rec["version"] = FORMAT_VERSION
    rec["seq"] = np.arange(first_seq, first_seq + n, dtype=np.uint64)
    rec["length"] = length
    rec["key"] = np.frombuffer(b"".join(keys), dtype=f"V{KEY_BYTES}")
    rec["namespace"] = np.frombuffer(namespace, dtype=f"V{NS_BYTES}")[0]
    if parents is None:
        rec["flags"] = FLAG_PARENT_UNKNOWN
    else:
        rec["parent"] = np.frombuffer(
            b"".join(p or _NO_KEY for p in parents), dtype=f"V{KEY_BYTES}"
        )
        rec["flags"] = [FLAG_HAS_PARENT if p else 0 for p in parents]
    return rec.view(np.uint8).reshape(n, HEADER_BYTES)


def parse_headers(
    area: bytes | bytearray | memoryview, first_slot: int, namespace: bytes | None = None
) -> list[SlotHeader]:
    """Validated headers of a header area (slot ``first_slot`` first).

    A header counts only if its magic, version and header checksum are right (and its
    namespace is ``namespace``, when given). Everything but the header checksums is done
    for the whole area at once with NumPy: a 10 GiB tier of 23 KiB slots has ~440k headers.
    """
    n = len(area) // HEADER_BYTES
    if n == 0:
        return []
    arr = np.frombuffer(area, dtype=_RECORD_DTYPE, count=n)
    raw = np.frombuffer(area, dtype=np.uint8, count=n * HEADER_BYTES).reshape(n, HEADER_BYTES)
    mask = (arr["magic"] == SLOT_MAGIC) & (arr["version"] == FORMAT_VERSION)
    if namespace is not None:
        ns = raw[:, NAMESPACE_AT : NAMESPACE_AT + NS_BYTES]
        mask &= (ns == np.frombuffer(namespace, dtype=np.uint8)).all(axis=1)
    idx = np.flatnonzero(mask)
    mv = memoryview(area).cast("B")
    digest = xxhash.xxh3_64_intdigest
    summed = [
        digest(mv[i * HEADER_BYTES : i * HEADER_BYTES + _HEADER_SUMMED]) == hsum
        for i, hsum in zip(idx.tolist(), arr["hsum"][idx].tolist(), strict=True)
    ]
    idx = idx[np.array(summed, dtype=bool)]
    if not idx.size:
        return []
    good, rows = arr[idx], raw[idx]
    count = int(idx.size)
    keys, parents = (
        _split(rows[:, a : a + KEY_BYTES].tobytes(), count, KEY_BYTES) for a in (KEY_AT, PARENT_AT)
    )
    spaces = _split(rows[:, NAMESPACE_AT : NAMESPACE_AT + NS_BYTES].tobytes(), count, NS_BYTES)
    flags = good["flags"]
    unknown = ((flags & FLAG_PARENT_UNKNOWN) != 0).tolist()
    linked = (((flags & FLAG_HAS_PARENT) != 0) & ((flags & FLAG_PARENT_UNKNOWN) == 0)).tolist()
    columns = zip(
        (idx + first_slot).tolist(),
        keys,
        [p if has else None for p, has in zip(parents, linked, strict=True)],
        unknown,
        spaces,
        good["seq"].tolist(),
        good["length"].tolist(),
        good["psum"].tolist(),
        strict=True,
    )
    # tuple.__new__ through _make: a NamedTuple's keyword __new__ costs several times more.
    return list(map(SlotHeader._make, columns))


def _split(blob: bytes, count: int, width: int) -> list[bytes]:
    return [blob[o : o + width] for o in range(0, count * width, width)]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC during a bulk load (start-up scans and index rebuilds create a
    few objects per chunk, ~440k chunks for 10 GiB of 23 KiB slots, and each collection
    would walk them all again: twice the time); its previous state is restored after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_superblock(path: str | os.PathLike[str]) -> SlabGeometry | None:
    """The geometry recorded in directory ``path``; None when absent or invalid."""
    try:
        with open(Path(path) / SUPER_NAME, "rb") as f:
            return SlabGeometry.decode(f.read(_SUPER.size + 1))
    except OSError:
        return None


def slab_file_name(file_index: int) -> str:
    return f"slab-{file_index:05d}.kvt"


def list_slab_files(path: str | os.PathLike[str]) -> list[int]:
    """Indices of the slab files present in ``path`` (names matching ours only)."""
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := SLAB_PATTERN.fullmatch(n)))


def read_header_area(fd: int, geometry: SlabGeometry, count: int) -> bytes:
    """The first ``count`` headers of a slab file, zero-filled past its end (one read)."""
    want = count * HEADER_BYTES
    data = os.pread(fd, want, 0)
    return data if len(data) == want else data + bytes(want - len(data))


def scan_headers(
    path: str | os.PathLike[str],
    geometry: SlabGeometry,
    num_slots: int | None = None,
    namespace: bytes | None = None,
) -> list[SlotHeader]:
    """Valid headers of every slab file in ``path`` (slots below ``num_slots`` if given).

    Reads only header areas, one ``pread`` per file; unreadable files count as empty.
    """
    out: list[SlotHeader] = []
    for fi in list_slab_files(path):
        first = fi * geometry.slots_per_file
        count = geometry.slots_per_file
        if num_slots is not None:
            count = geometry.file_slots(fi, num_slots)
        if count <= 0:
            continue
        try:
            fd = os.open(Path(path) / slab_file_name(fi), os.O_RDONLY)
        except OSError:
            continue
        try:
            out.extend(parse_headers(read_header_area(fd, geometry, count), first, namespace))
        except OSError:
            continue
        finally:
            os.close(fd)
    return out


def records_of(headers: Iterable[SlotHeader]) -> list[SlotRecord]:
    """The restorable records among ``headers`` (those written with their parent key)."""
    return [
        SlotRecord._make((h.slot, h.key, h.parent, h.seq)) for h in headers if not h.parent_unknown
    ]
