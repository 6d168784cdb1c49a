"""What every layer of a DiskSlab shares: its fields, batch shapes, tuning constants."""

from __future__ import annotations

import array
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, TypeVar

import numpy as np

from kvtier.keys import Key
from kvtier.tiers.disk.format import (
    SlabGeometry,
    SlotRecord,
)
from kvtier.tiers.disk.native import NativeIO

log = logging.getLogger("kvtier.tiers.disk.slab")

RUN_BYTES = 256 << 10
"""Consecutive slots of one file move in one preadv/pwritev of up to this many bytes (and
IOV_MAX buffers): fewer syscalls for small chunks, while a run still fits in L2, where the
checksum pass that follows the read finds it."""
MIN_PARALLEL_BYTES = 1 << 20
"""A batch is split over the I/O threads only in parts of at least this many bytes: a
thread hand-off costs tens of microseconds, more than reading a small chunk."""


class NativeBatch(NamedTuple):
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


class Links:
    """The parents of a write's chunks, or the fact that they are unknown."""

    __slots__ = ("parents", "unknown")

    def __init__(self, parents: Sequence[Key | None] | None) -> None:
        self.parents = parents
        self.unknown = parents is None

    def parent(self, k: int) -> Key | None:
        return None if self.parents is None else self.parents[k]


class SlabState:
    """The fields of a :class:`~kvtier.tiers.disk.slab.DiskSlab` (set in its __init__),
    declared once for the layers below: files, batching, writes, reads."""

    path: Path
    num_slots: int
    slot_bytes: int
    namespace: bytes
    threads: int
    corrupt_reads: int
    io_errors: int
    stale_reads: int
    unavailable: bool
    records: list[SlotRecord]
    geometry: SlabGeometry
    _lock_fd: int
    _dir_fd: int
    _fds: list[int]
    _closed: bool
    _stats_lock: threading.Lock
    _active: int
    _idle: threading.Condition
    _local: threading.local
    _pool: ThreadPoolExecutor | None
    _key_of: list[Key | None]
    _sum_of: array.array[int]
    _seed_of: np.ndarray
    _next_seq: int
    _fd_arr: np.ndarray
    _native: NativeIO | None
    _spf: int
    _stride: int
    _payload_base: int
    _pad: memoryview
