"""CPU tier: one preallocated host slab of fixed-size slots."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvtier.keys import Key
from kvtier.policies.eviction import make_eviction_policy
from kvtier.sources import HitSource
from kvtier.tiers.base import Segments, SlotStore
from kvtier.tiers.index import SlotIndex
from kvtier.tiers.slot_tier import SlotTier
from kvtier.transfer.copy import copy_segments
from kvtier.transfer.host_memory import alloc_host_buffer, cuda_available


class CpuSlab(SlotStore):
    """``num_slots`` x ``slot_bytes`` bytes of host memory, allocated once.

    Pinned when CUDA is present (asynchronous device copies), plain otherwise. Copies of a
    batch go out in one batched call. Memory copies cannot fail, so every chunk succeeds;
    the per-chunk result exists for the contract's sake.
    """

    def __init__(self, num_slots: int, slot_bytes: int, buffer: torch.Tensor | None = None):
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        nbytes = num_slots * slot_bytes
        self.flat = buffer if buffer is not None else alloc_host_buffer(nbytes)
        if self.flat.numel() < nbytes or self.flat.dtype != torch.uint8:
            raise ValueError("CpuSlab: buffer too small or not uint8")
        self._non_blocking = cuda_available()

    def slot_view(self, slot: int) -> torch.Tensor:
        """The bytes of one slot (a view; tests and tools)."""
        return self.flat.narrow(0, slot * self.slot_bytes, self.slot_bytes)

    def _views(
        self, slots: Sequence[int], segs: Sequence[Segments]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        slab_views: list[torch.Tensor] = []
        seg_views: list[torch.Tensor] = []
        flat, sb = self.flat, self.slot_bytes
        for slot, chunk in zip(slots, segs, strict=True):
            base = slot * sb
            for off, seg in chunk:
                slab_views.append(flat.narrow(0, base + off, seg.numel()))
                seg_views.append(seg)
        return slab_views, seg_views

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        slab_views, seg_views = self._views(slots, dst)
        copy_segments(seg_views, slab_views, non_blocking=self._non_blocking)
        return [True] * len(slots)

    def write(
        self, slots: Sequence[int], keys: Sequence[Key], src: Sequence[Segments]
    ) -> list[bool]:
        slab_views, seg_views = self._views(slots, src)
        copy_segments(slab_views, seg_views, non_blocking=self._non_blocking)
        return [True] * len(slots)


class CpuTier(SlotTier):
    """The CPU tier in one process: a SlotIndex over a CpuSlab."""

    def __init__(self, capacity_bytes: int, chunk_bytes: int, eviction: str = "lru") -> None:
        num_slots = capacity_bytes // chunk_bytes if chunk_bytes else 0
        index = SlotIndex(num_slots, make_eviction_policy(eviction, num_slots))
        super().__init__("cpu", HitSource.HOST, index, CpuSlab(num_slots, chunk_bytes))
