"""The parts of one DiskSlab that its read and write paths share, in one explicit record."""

from __future__ import annotations

from typing import NamedTuple

from kvtier.tiers.disk.batching import IOThreads
from kvtier.tiers.disk.files import SlabFiles
from kvtier.tiers.disk.gate import SlabGate
from kvtier.tiers.disk.native import NativeIO
from kvtier.tiers.disk.state import SlotTable


class SlabParts(NamedTuple):
    """One slab's collaborators, built by :class:`~kvtier.tiers.disk.slab.DiskSlab` and
    handed to its :class:`~kvtier.tiers.disk.writes.SlabWriter` and
    :class:`~kvtier.tiers.disk.reads.SlabReader`."""

    files: SlabFiles
    """The directory, its geometry and open files."""
    table: SlotTable
    """What each slot holds in memory (key, checksum, seed) and the sequence numbers."""
    gate: SlabGate
    """Admission, lifetime and the failure counters."""
    io: IOThreads
    """The I/O threads and their scratch buffers."""
    native: NativeIO | None
    """The native data path, or None (the Python path only)."""
