"""How a disk-tier chunk's segments become syscall buffers, and the Python path's raw I/O.

A chunk's payload arrives as ``(offset, uint8 tensor)`` segments that may skip ranges (a
load of blocks the engine already holds) or live where a syscall cannot reach them (device
memory, non-contiguous views). :func:`pieces` orders and validates them; the Python data
path turns them into memoryviews (:func:`plan_segments`), the native one into addresses
(:class:`Iovecs`). Skipped ranges are still read, into scratch, so that every load hashes
the whole payload.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch
import xxhash

from kvtier.contract import Buffers, Segments

IOV_MAX = max(16, os.sysconf("SC_IOV_MAX")) if hasattr(os, "sysconf") else 1024
"""Buffers one preadv/pwritev takes (the system's limit)."""


def _advance(bufs: list[memoryview], n: int) -> list[memoryview]:
    """``bufs`` without their first ``n`` bytes (after a short preadv/pwritev)."""
    i = 0
    while i < len(bufs) and n >= len(bufs[i]):
        n -= len(bufs[i])
        i += 1
    rest = bufs[i:]
    if rest and n:
        rest[0] = rest[0][n:]
    return rest


IoOp = Callable[[int, Sequence[memoryview], int], int]


def io_all(op: IoOp, fd: int, bufs: list[memoryview], offset: int, total: int) -> int:
    """``os.preadv``/``os.pwritev`` of ``total`` bytes, repeated after a short transfer and
    split at IOV_MAX buffers. Returns the bytes moved: less than ``total`` only at end of
    file (reads). The first call is the whole transfer in the common case."""
    if len(bufs) <= IOV_MAX:
        n = op(fd, bufs, offset)
        if n == total or n <= 0:
            return max(n, 0)
        done, bufs = n, _advance(bufs, n)
    else:
        done = 0
    while bufs:
        batch = bufs[:IOV_MAX]
        want = sum(len(b) for b in batch)
        n = op(fd, batch, offset + done)
        if n <= 0:
            break
        done += n
        bufs = bufs[len(batch) :] if n == want else _advance(batch, n) + bufs[len(batch) :]
    return done


def digest(bufs: Sequence[memoryview], seed: int) -> int:
    """xxh3_64 of the concatenated buffers (one call for the common single buffer)."""
    if len(bufs) == 1:
        return xxhash.xxh3_64_intdigest(bufs[0], seed)
    h = xxhash.xxh3_64(seed=seed)
    for b in bufs:
        h.update(b)
    return h.intdigest()


class Views:
    """Byte views of the caller's host tensors, for one call: one memoryview per storage,
    sliced per segment (a NumPy round trip per segment costs several times more). Views
    never outlive the call, during which the caller keeps its tensors alive."""

    __slots__ = ("_bases",)

    def __init__(self) -> None:
        self._bases: dict[tuple[int, int], memoryview] = {}

    def view(self, t: torch.Tensor) -> memoryview | None:
        """``t``'s bytes, or None when it needs staging (device memory, non-contiguous)."""
        if not in_host_memory(t):
            return None
        st = t.untyped_storage()
        ident = (st.data_ptr(), st.nbytes())
        base = self._bases.get(ident)
        if base is None:
            base = memoryview((ctypes.c_char * ident[1]).from_address(ident[0])).cast("B")
            self._bases[ident] = base
        start = t.data_ptr() - ident[0]
        return base[start : start + t.numel()]


def in_host_memory(t: torch.Tensor) -> bool:
    """Whether a segment can be a syscall buffer as it is (contiguous host memory); False
    when it needs staging. A segment that is not uint8 is a caller bug (ValueError)."""
    if t.dtype is not torch.uint8:
        raise ValueError(f"segments must be uint8 tensors, got {t.dtype}")
    return t.is_cpu and t.is_contiguous()


def pieces(
    segs: Segments, slot_bytes: int, *, whole: bool
) -> list[tuple[int, int, torch.Tensor | None]]:
    """The payload ``[0, slot_bytes)`` as ordered ``(offset, length, segment)`` pieces, the
    segment None for a gap the caller skipped. ``whole`` (writes) forbids gaps; overlapping
    or out-of-range segments raise ValueError (a caller bug, not an I/O fault)."""
    out: list[tuple[int, int, torch.Tensor | None]] = []
    pos = 0
    for off, seg in sorted(segs, key=lambda s: s[0]):
        n = seg.numel()
        if off < pos or off + n > slot_bytes:
            raise ValueError(
                f"segment [{off}, {off + n}) overlaps another or leaves the payload "
                f"[0, {slot_bytes})"
            )
        if off > pos:
            if whole:
                raise ValueError(
                    f"a write must cover the whole payload; bytes [{pos}, {off}) missing"
                )
            out.append((pos, off - pos, None))
        if n:
            out.append((off, n, seg))
        pos = off + n
    if pos < slot_bytes:
        if whole:
            raise ValueError(
                f"a write must cover the whole payload; bytes [{pos}, {slot_bytes}) missing"
            )
        out.append((pos, slot_bytes - pos, None))
    return out


class Iovecs:
    """Flat buffer lists of a native batch: chunk i is entries ``start[i]:start[i+1]``,
    built chunk by chunk from segments (:meth:`to_buffers` gives the
    :class:`~kvtier.contract.Buffers` the native path takes). A gap's entry holds its
    payload offset until the I/O thread points it into its scratch buffer."""

    __slots__ = ("gaps", "lens", "ptrs", "start")

    def __init__(self) -> None:
        self.ptrs: list[int] = []
        self.lens: list[int] = []
        self.gaps: list[int] = []
        self.start = [0]

    def add(self, segs: Segments, slot_bytes: int, *, whole: bool) -> bool:
        """Append one chunk; False (nothing appended) if a segment needs staging."""
        if len(segs) == 1 and segs[0][0] == 0:
            t = segs[0][1]
            if t.numel() == slot_bytes and in_host_memory(t):  # the common case
                self.ptrs.append(t.data_ptr())
                self.lens.append(slot_bytes)
                self.start.append(len(self.ptrs))
                return True
        parts = pieces(segs, slot_bytes, whole=whole)
        if any(seg is not None and not in_host_memory(seg) for _, _, seg in parts):
            return False
        for off, n, seg in parts:
            if seg is None:
                self.gaps.append(len(self.ptrs))
                self.ptrs.append(off)
            else:
                self.ptrs.append(seg.data_ptr())
            self.lens.append(n)
        self.start.append(len(self.ptrs))
        return True

    def to_buffers(self) -> Buffers:
        """The chunks appended so far, as arrays."""
        return Buffers(
            np.array(self.start, dtype=np.int64),
            np.array(self.ptrs, dtype=np.uint64),
            np.array(self.lens, dtype=np.uint64),
            np.array(self.gaps, dtype=np.int64),
        )


class Staged(NamedTuple):
    """A payload range served by the thread's scratch buffer instead of caller memory."""

    pos: int
    """Position in the chunk's buffer list."""
    offset: int
    length: int
    tensor: torch.Tensor | None
    """A segment that cannot be a buffer (device memory, non-contiguous): copied to or
    from scratch. None: a range the caller skipped, read only to verify the checksum."""


Plan = tuple[list[memoryview | None], list[Staged]]
"""One chunk's buffers in payload order, covering the whole payload (None where scratch
goes), and the scratch ranges."""


def plan_segments(segs: Segments, slot_bytes: int, views: Views, *, whole: bool) -> Plan:
    """Buffers covering the whole payload ``[0, slot_bytes)`` in order.

    Gaps between segments (a load that skips blocks the engine holds) become scratch
    ranges, read only to be hashed. ``whole`` (writes) forbids gaps. Overlapping or
    out-of-range segments raise ValueError (a caller bug, not an I/O fault).
    """
    if len(segs) == 1 and segs[0][0] == 0 and segs[0][1].numel() == slot_bytes:
        view = views.view(segs[0][1])  # the common case: one whole-payload segment
        if view is not None:
            return [view], []
    bufs: list[memoryview | None] = []
    staged: list[Staged] = []
    for off, n, seg in pieces(segs, slot_bytes, whole=whole):
        view = None if seg is None else views.view(seg)
        if view is None:
            staged.append(Staged(len(bufs), off, n, seg))
        bufs.append(view)
    return bufs, staged
