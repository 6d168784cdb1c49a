"""Memory tier: a dictionary-backed test tier with the full tier contract.

No preallocated slab and no batched copies: one small tensor per stored chunk. Use it to
exercise managers, adapters and tools without sizing a real tier. Configured ``shared``, it
is a key-addressed store other engines write and that evicts on its own
(:mod:`kvtier.tiers.shared`): the stand-in for a remote tier.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from kvtier.keys import Key
from kvtier.policies.registry import make_eviction_policy
from kvtier.sources import HitSource
from kvtier.stack.kinds import TierKind
from kvtier.tiers.base import Segments, SlotStore, TierIndex
from kvtier.tiers.index import SlotIndex
from kvtier.tiers.shared import ProbeIndex, SharedSpace, SharedStore, shared_space
from kvtier.tiers.slot_tier import SlotTier

if TYPE_CHECKING:
    from kvtier.stack.kinds import TierContext
    from kvtier.stack.spec import TierSpec


class DictStore(SlotStore):
    """Slots as a dict of tensors, written and read segment by segment."""

    def __init__(self, num_slots: int, slot_bytes: int) -> None:
        self.num_slots = num_slots
        self.slot_bytes = slot_bytes
        self._data: dict[int, tuple[Key, torch.Tensor]] = {}

    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        for slot, key, chunk in zip(slots, keys, src, strict=True):
            buf = torch.empty(self.slot_bytes, dtype=torch.uint8)
            for off, seg in chunk:
                buf[off : off + seg.numel()].copy_(seg.reshape(-1).cpu())
            self._data[slot] = (key, buf)
        return [True] * len(slots)

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        ok = []
        for slot, key, chunk in zip(slots, keys, dst, strict=True):
            stored = self._data.get(slot)
            if stored is None or stored[0] != key:
                ok.append(False)
                continue
            for off, seg in chunk:
                seg.copy_(stored[1][off : off + seg.numel()].view(seg.shape))
            ok.append(True)
        return ok

    def close(self) -> None:
        self._data.clear()


class MemoryTier(SlotTier):
    """A tier of ``capacity_chunks`` chunks held in a dict."""

    def __init__(
        self,
        capacity_chunks: int,
        chunk_bytes: int,
        eviction: str = "lru",
        source: HitSource = HitSource.HOST,
        name: str = "memory",
    ) -> None:
        index = SlotIndex(capacity_chunks, make_eviction_policy(eviction, capacity_chunks))
        super().__init__(name, source, index, DictStore(capacity_chunks, chunk_bytes))


def _shared(spec: TierSpec, ctx: TierContext) -> SharedSpace:
    return shared_space(spec.url or f"memory://{spec.label}", ctx.capacity_chunks(spec, 64 << 20))


def _index(spec: TierSpec, ctx: TierContext) -> TierIndex:
    if spec.shared:
        return ProbeIndex(_shared(spec, ctx), ctx.world, spec.lookup_delay_ms / 1e3)
    n = ctx.capacity_chunks(spec, 64 << 20)
    return SlotIndex(n, make_eviction_policy(ctx.eviction(spec), n))


def _store(spec: TierSpec, ctx: TierContext) -> SlotStore:
    if spec.shared:
        return SharedStore(
            _shared(spec, ctx), ctx.chunk_bytes, ctx.namespace.digest(), ctx.namespace.rank
        )
    return DictStore(ctx.capacity_chunks(spec, 64 << 20), ctx.chunk_bytes)


KIND = TierKind("memory", HitSource.HOST, False, _index, _store, lambda c: 64 << 20)
