"""The worker side of the tier contract: a :class:`SlotStore` (the bytes of each slot, one
rank's shard) and the two forms a copy hands it, :data:`Segments` and :class:`Buffers`.

The scheduler decides which slot a chunk goes to (:mod:`kvtier.contract.index`); the store
only moves bytes. Besides ``read`` and ``write``, which every store implements, a store
declares the optional copy paths it offers (see :class:`SlotStore`); the transfer engine
reads those declarations and never probes a store for attributes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np
import torch

from kvtier.keys import Key

Segments = Sequence[tuple[int, torch.Tensor]]
"""Where one chunk's bytes go (or come from): ``(offset, tensor)`` pairs, each a 1-D uint8
tensor holding payload bytes ``[offset, offset + numel)``. A load may cover only part of a
payload (it skips blocks the engine already holds)."""


class Buffers(NamedTuple):
    """Where a batch of chunks' payloads live in host memory, as flat address arrays: the
    vectorized form of one :data:`Segments` list per chunk, for copies of many chunks made
    of many small pieces (a chunk of an engine's KV is one row per layer), where building a
    tensor view per piece costs more than moving the bytes.

    Chunk i is entries ``start[i] .. start[i+1] - 1`` of ``ptrs``/``lens`` (addresses and
    byte counts), in payload order, covering its whole payload. Entries listed in ``gaps``
    are payload ranges the caller skips (a load of blocks the engine already holds): their
    ``ptrs`` hold the payload offset instead of an address. The caller keeps the memory
    alive and unchanged (writes) or untouched by others (reads) for the call; a store only
    accepts these where it can check nothing else (:meth:`SlotStore.read` stays the
    general form).
    """

    start: np.ndarray
    """int64, one entry per chunk and one more."""
    ptrs: np.ndarray
    """uint64 addresses (payload offsets for gaps)."""
    lens: np.ndarray
    """uint64 byte counts."""
    gaps: np.ndarray
    """int64 indices of the gap entries, ascending (empty for writes)."""


def chunk_buffers(
    bases: np.ndarray, row_bytes: np.ndarray, rows: np.ndarray, rows_per_chunk: int
) -> Buffers:
    """:class:`Buffers` of chunks laid out region-major, each
    ``rows_per_chunk`` rows of every region: chunk c's payload is, for each region r in
    order, rows ``rows[c * rows_per_chunk ..]`` of region r (at ``bases[r]``, rows of
    ``row_bytes[r]`` bytes). A row number < 0 is a gap (the payload range stays with the
    caller's scratch). Vectorized: a few NumPy operations per batch, none per row."""
    k, nreg = rows_per_chunk, len(bases)
    ids = rows.reshape(-1, 1, k)  # chunk, region (broadcast), row in chunk
    n = ids.shape[0]
    rb = row_bytes.astype(np.uint64).reshape(1, nreg, 1)
    gap = np.broadcast_to(ids < 0, (n, nreg, k))
    ptrs = bases.astype(np.uint64).reshape(1, nreg, 1) + np.maximum(ids, 0).astype(np.uint64) * rb
    if gap.any():  # a gap's entry holds its payload offset
        region_off = (k * np.concatenate([[0], np.cumsum(row_bytes)[:-1]])).astype(np.uint64)
        offs = region_off.reshape(1, nreg, 1) + np.arange(k, dtype=np.uint64).reshape(1, 1, k) * rb
        ptrs = np.where(gap, np.broadcast_to(offs, (n, nreg, k)), ptrs)
    per_chunk = nreg * k
    return Buffers(
        np.arange(0, (n + 1) * per_chunk, per_chunk, dtype=np.int64),
        np.ascontiguousarray(ptrs, dtype=np.uint64).reshape(-1),
        np.ascontiguousarray(np.broadcast_to(rb, (n, nreg, k)), dtype=np.uint64).reshape(-1),
        np.flatnonzero(gap.reshape(-1)).astype(np.int64),
    )


class SlotStore(ABC):
    """Data plane of a tier: ``num_slots`` slots of ``slot_bytes`` bytes, addressed by slot
    (cpu, disk, private memory) or by key (``addressing = "key"``: shared stores, which
    ignore the slot numbers they are given).

    Contract:
    - ``read``/``write`` move chunk payloads between slots and caller-owned segments. The
      caller keeps ownership of the segments; the store never keeps a reference past the call.
    - Failure granularity is per chunk: the result lists, per chunk, whether it succeeded. A
      failed read leaves the destination bytes unspecified but never reports success for bytes
      that differ from what was written under that key (stores with headers check the key and
      a checksum). A failed write means the slot holds nothing valid.
    - Thread-safety: concurrent calls on *different* slots are allowed; the scheduler never
      lets two in-flight operations touch the same slot unless both read.

    Optional copy paths: ``read`` and ``write`` are all a store must implement. A store may
    also offer faster paths, each declared by a member below whose default means "not
    offered"; the transfer engine (:mod:`kvtier.transfer.plans`) reads these declarations
    and calls a path's methods only where its declaration says so:

    - ``network``: where its jobs queue;
    - :meth:`accepts_buffers`: :meth:`read_buffers` / :meth:`write_buffers` (addresses);
    - ``host_payload``: :meth:`payload_segments` / :meth:`payload_buffers` (its slots are
      host memory a tier-to-tier copy reads or writes in place);
    - :meth:`supports_rows`: :meth:`store_rows` / :meth:`load_rows` (batched row copies);
    - ``partial_reads``: a load may read part of a chunk (one layer) on its own.

    A wrapper (the fault wrapper) declares what it forwards.
    """

    num_slots: int
    slot_bytes: int
    addressing: Literal["slot", "key"] = "slot"
    network: bool = False
    """Its copies wait on a network (a remote server): the transfer engine runs the jobs
    touching it on lanes of their own, so a slow or dead server never holds up disk or
    memory copies. False: local I/O or memory."""
    host_payload: bool = False
    """Its slots are this process's host memory: :meth:`payload_segments` and
    :meth:`payload_buffers` answer, and a copy from or into another tier reads or writes
    them in place (no scratch buffer). False: those methods raise."""
    partial_reads: bool = False
    """A read of part of a chunk's payload (some regions: one engine layer) is good on its
    own, nothing checking the whole payload (memory), so a sync load may be copied layer by
    layer. False: a read is only good whole (a disk chunk's checksum covers every layer)."""

    @abstractmethod
    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        """Copy slot payloads into ``dst`` segments."""

    @abstractmethod
    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        """Copy ``src`` segments into slots, recording ``keys`` with them. A write covers
        the whole payload. ``parents[i]`` is the key before ``keys[i]`` in its chain (None
        for a chain start); stores that survive restarts record it, others ignore it."""

    # -- optional copy paths (see the class docstring); defaults: not offered -------------

    def accepts_buffers(self) -> bool:
        """Whether :meth:`read_buffers` and :meth:`write_buffers` move bytes by address
        (stores that do implement them say True; a store may decide at run time, e.g. when
        its native library is missing)."""
        return False

    def read_buffers(self, slots: Sequence[int], keys: Sequence[Key], dst: Buffers) -> list[bool]:
        """:meth:`read`, with the destination given as :class:`Buffers`."""
        raise NotImplementedError(f"{type(self).__name__} does not read into addresses")

    def write_buffers(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Buffers,
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        """:meth:`write`, with the source given as :class:`Buffers` (no gaps)."""
        raise NotImplementedError(f"{type(self).__name__} does not write from addresses")

    def payload_segments(self, slot: int) -> Segments:
        """The payload of ``slot`` in place, as :data:`Segments` (``host_payload`` only)."""
        raise NotImplementedError(f"{type(self).__name__} has no payload in host memory")

    def payload_buffers(self, slots: Sequence[int]) -> Buffers:
        """The payloads of ``slots`` in place, as :class:`Buffers` (``host_payload``
        only); ValueError for a slot out of range."""
        raise NotImplementedError(f"{type(self).__name__} has no payload in host memory")

    def supports_rows(self, engine_regions: Sequence[torch.Tensor]) -> bool:
        """Whether :meth:`store_rows` / :meth:`load_rows` can copy between these engine
        regions (one block-major tensor per KV region) and the store: one batched copy per
        region and run of consecutive slots."""
        return False

    def store_rows(
        self, engine_regions: Sequence[torch.Tensor], slab_row: int, blocks: torch.Tensor
    ) -> None:
        """Copy engine rows ``blocks`` of every region into store rows ``slab_row ..``
        (a slot is ``blocks_per_chunk`` rows of each region). Raises on failure: the
        whole copy failed."""
        raise NotImplementedError(f"{type(self).__name__} has no row path")

    def load_rows(
        self,
        engine_arrays: Sequence[np.ndarray],
        slab_row: int,
        blocks: np.ndarray,
        only: Sequence[int] | None = None,
    ) -> None:
        """Copy store rows ``slab_row ..`` of every region (or of the regions ``only``
        lists) into engine rows ``blocks``. Raises on failure: the whole copy failed."""
        raise NotImplementedError(f"{type(self).__name__} has no row path")

    def take_counters(self) -> dict[str, float]:
        """Counts of tier-specific events (kvtier metric names, e.g. bad remote values)
        since the last call; none by default."""
        return {}

    def close(self) -> None:
        """Release resources; idempotent."""
