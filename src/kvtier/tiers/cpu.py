"""CPU tier: one preallocated host slab of fixed-size slots.

Layout: *region-major*. The engine's KV is a list of byte regions (``KVRegions``: one per
layer, or per layer and K/V), each ``num_blocks`` rows of ``row_bytes[r]``. The slab mirrors
that: region r is a contiguous array of ``num_slots * blocks_per_chunk`` rows, and chunk
slot s owns rows ``s * bpc .. s * bpc + bpc - 1`` of every region. A run of consecutive
slots is then one contiguous block of rows per region, so moving a request's chain costs
one batched gather (store) or scatter (load) per region, not one copy per block.

A chunk's *payload* (what the SlotStore contract and other tiers see) is region-major too:
region 0's rows of the chunk, then region 1's, ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from kvtier.contract import Buffers, Segments, SlotStore, chunk_buffers
from kvtier.contract.kind import Capabilities, TierKind, fixed
from kvtier.keys import Key
from kvtier.policies.registry import DEFAULT_EVICTION, make_eviction_policy
from kvtier.sources import HitSource
from kvtier.tiers.index import SlotIndex
from kvtier.transfer.copy import copy_segments, gather_rows, scatter_rows
from kvtier.transfer.host_memory import SLICE_BYTES, HostBuffer, cuda_available

if TYPE_CHECKING:
    from kvtier.contract.kind import TierContext
    from kvtier.contract.spec import TierSpec


class CpuSlab(SlotStore):
    """``num_slots`` chunks of host memory, allocated once.

    Usable at once: the pages are faulted in (and pinned when CUDA is present, for
    asynchronous device copies) by a background thread in slot order, lowest slots first,
    which are the ones the index hands out first (:class:`~kvtier.transfer.host_memory.
    HostBuffer`); start-up does not grow with the tier's size. Memory copies cannot fail,
    so every chunk succeeds; the per-chunk result exists for the contract's sake.

    Offers every optional copy path of the contract but addresses (``host_payload``,
    ``partial_reads``, the row path for host-memory engine KV).
    """

    host_payload = True
    partial_reads = True

    def __init__(
        self,
        num_slots: int,
        row_bytes: Sequence[int],
        blocks_per_chunk: int = 1,
        buffer: torch.Tensor | None = None,
    ) -> None:
        self.num_slots = num_slots
        self.row_bytes = list(row_bytes)
        self.blocks_per_chunk = bpc = blocks_per_chunk
        self.slot_bytes = bpc * sum(self.row_bytes)
        nbytes = num_slots * self.slot_bytes
        self.host: HostBuffer | None = None
        """The slab's own memory and its background warm-up (None for a given buffer)."""
        if buffer is None:
            self.host = HostBuffer(nbytes, self._warm_spans(num_slots))
            buffer = self.host.tensor
        self.flat = buffer
        if self.flat.numel() < nbytes or self.flat.dtype != torch.uint8:
            raise ValueError("CpuSlab: buffer too small or not uint8")
        self.regions: list[torch.Tensor] = []
        """Region r as a 2-D ``[num_slots * bpc, row_bytes[r]]`` view."""
        self._payload_offsets: list[int] = []
        base = pay = 0
        for rb in self.row_bytes:
            size = num_slots * bpc * rb
            self.regions.append(self.flat.narrow(0, base, size).view(num_slots * bpc, rb))
            self._payload_offsets.append(pay)
            base += size
            pay += bpc * rb
        self._arrays = [r.numpy() for r in self.regions] if not self.flat.is_cuda else []
        self._non_blocking = cuda_available()

    def _warm_spans(self, num_slots: int) -> list[tuple[int, int]]:
        """Byte spans of the flat buffer in the order to make them ready: groups of slots
        (about SLICE_BYTES each) from slot 0 up, each group as one span per region, so no
        copy (a run of one region's rows) crosses two spans."""
        bpc = self.blocks_per_chunk
        group = max(1, SLICE_BYTES // max(1, self.slot_bytes))
        bases, base = [], 0
        for rb in self.row_bytes:
            bases.append(base)
            base += num_slots * bpc * rb
        spans = []
        for a in range(0, num_slots, group):
            b = min(num_slots, a + group)
            for rb, region_base in zip(self.row_bytes, bases, strict=True):
                spans.append((region_base + a * bpc * rb, (b - a) * bpc * rb))
        return spans

    def close(self) -> None:
        if self.host is not None:
            self.host.close()

    @classmethod
    def flat_chunks(cls, num_slots: int, chunk_bytes: int) -> CpuSlab:
        """A slab whose chunks are plain ``chunk_bytes`` byte strings (one region)."""
        return cls(num_slots, [chunk_bytes], 1)

    # -- the generic SlotStore path ---------------------------------------------------------

    def _views(
        self, slots: Sequence[int], segs: Sequence[Segments]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Slab views matching each segment, split where a segment crosses regions."""
        slab_views: list[torch.Tensor] = []
        seg_views: list[torch.Tensor] = []
        bpc = self.blocks_per_chunk
        offsets = self._payload_offsets
        for slot, chunk in zip(slots, segs, strict=True):
            for off, seg in chunk:
                flat_seg = seg.reshape(-1)
                done, total = 0, flat_seg.numel()
                while done < total:
                    p = off + done
                    r = _region_of(offsets, p)
                    rb = self.row_bytes[r]
                    in_region = p - offsets[r]
                    n = min(total - done, bpc * rb - in_region)
                    region_flat = self.regions[r].view(-1)
                    slab_views.append(region_flat.narrow(0, slot * bpc * rb + in_region, n))
                    seg_views.append(flat_seg.narrow(0, done, n))
                    done += n
        return slab_views, seg_views

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        slab_views, seg_views = self._views(slots, dst)
        copy_segments(seg_views, slab_views, non_blocking=self._non_blocking)
        return [True] * len(slots)

    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        slab_views, seg_views = self._views(slots, src)
        copy_segments(slab_views, seg_views, non_blocking=self._non_blocking)
        return [True] * len(slots)

    def payload_segments(self, slot: int) -> Segments:
        """The payload of ``slot`` as ``(offset, view)`` pairs, one per region (for copies
        from this tier to another)."""
        bpc = self.blocks_per_chunk
        return [
            (off, region.narrow(0, slot * bpc, bpc).view(-1))
            for off, region in zip(self._payload_offsets, self.regions, strict=True)
        ]

    def payload_buffers(self, slots: Sequence[int]) -> Buffers:
        """The payloads of ``slots`` as :class:`~kvtier.contract.Buffers` (for copies
        from this tier to a store that accepts addresses); ValueError for a slot out of
        range."""
        sl = np.asarray(slots, dtype=np.int64)
        if sl.size and (int(sl.min()) < 0 or int(sl.max()) >= self.num_slots):
            raise ValueError(f"slots outside [0, {self.num_slots})")
        bpc = self.blocks_per_chunk
        rows = (sl[:, None] * bpc + np.arange(bpc, dtype=np.int64)).reshape(-1)
        bases = np.array([r.data_ptr() for r in self.regions], dtype=np.uint64)
        return chunk_buffers(bases, np.array(self.row_bytes, dtype=np.int64), rows, bpc)

    # -- the batched path --------------------------------------------------------------------

    def supports_rows(self, engine_regions: Sequence[torch.Tensor]) -> bool:
        """Whether :meth:`load_rows`/:meth:`store_rows` can serve these engine regions."""
        return (
            bool(self._arrays)
            and len(engine_regions) == len(self.regions)
            and all(
                not e.is_cuda and e.shape[1] == s.shape[1]
                for e, s in zip(engine_regions, self.regions, strict=True)
            )
        )

    def store_rows(
        self, engine_regions: Sequence[torch.Tensor], slab_row: int, blocks: torch.Tensor
    ) -> None:
        """Gather engine rows ``blocks`` into slab rows ``slab_row ..`` of every region."""
        n = blocks.numel()
        for eng, slab in zip(engine_regions, self.regions, strict=True):
            gather_rows(slab.narrow(0, slab_row, n), eng, blocks)

    def load_rows(
        self,
        engine_arrays: Sequence[np.ndarray],
        slab_row: int,
        blocks: np.ndarray,
        only: Sequence[int] | None = None,
    ) -> None:
        """Scatter slab rows ``slab_row ..`` of every region (or of the regions ``only``
        lists: one engine layer's, for a load layer by layer) into engine rows ``blocks``."""
        n = blocks.size
        if len(engine_arrays) != len(self._arrays):
            raise ValueError("load_rows: engine regions do not match the slab's")
        for r in range(len(engine_arrays)) if only is None else only:
            eng, slab = engine_arrays[r], self._arrays[r]
            scatter_rows(eng, blocks, slab[slab_row : slab_row + n])


def _region_of(offsets: list[int], p: int) -> int:
    r = 0
    while r + 1 < len(offsets) and offsets[r + 1] <= p:
        r += 1
    return r


DEFAULT_CAPACITY = 4 << 30
"""Bytes of a cpu tier that names no capacity (the flat key ``cpu_bytes``'s default too)."""


def _index(spec: TierSpec, ctx: TierContext) -> SlotIndex:
    n = ctx.capacity_chunks(spec, DEFAULT_CAPACITY)
    return SlotIndex(n, make_eviction_policy(spec.eviction or DEFAULT_EVICTION, n))


def _store(spec: TierSpec, ctx: TierContext) -> SlotStore:
    n = ctx.capacity_chunks(spec, DEFAULT_CAPACITY)
    if ctx.row_bytes:
        return CpuSlab(n, ctx.row_bytes, ctx.blocks_per_chunk)
    return CpuSlab.flat_chunks(n, ctx.chunk_bytes)


KIND = TierKind(
    name="cpu",
    source=HitSource.HOST,
    make_index=_index,
    make_store=_store,
    default_capacity=DEFAULT_CAPACITY,
    capabilities=fixed(Capabilities(byte_addressable=True, sync_loads=True)),
)
"""Host memory: no options of its own (its capacity and eviction are common keys)."""
