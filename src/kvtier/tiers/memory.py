"""Memory tier: a dictionary-backed test tier with the full tier contract.

No preallocated slab and no batched copies: one small tensor per stored chunk. Use it to
exercise managers, adapters and tools without sizing a real tier. Configured ``shared``, it
is a key-addressed store other engines write and that evicts on its own
(:mod:`kvtier.tiers.shared`): the stand-in for a remote tier.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvtier.contract import Segments, SlotStore, TierIndex
from kvtier.contract.kind import Capabilities, TierKind
from kvtier.contract.spec import TierOptions, TierSpec
from kvtier.errors import ConfigError
from kvtier.keys import Key
from kvtier.options import Label, boolean, delay_ms, opt_nonempty, option
from kvtier.policies.registry import DEFAULT_EVICTION, make_eviction_policy
from kvtier.sources import HitSource
from kvtier.tiers.index import SlotIndex
from kvtier.tiers.remote.options import masked_url
from kvtier.tiers.shared import ProbeIndex, SharedSpace, SharedStore, shared_space

if TYPE_CHECKING:
    from kvtier.contract.kind import TierContext


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


@dataclass(frozen=True)
class MemoryOptions(TierOptions):
    """Options of a memory tier."""

    shared: bool = option(False, boolean)
    """A store other engines write and that evicts on its own: no prefix closure, lookups
    probe keys and stop at the first miss, no pins (the stand-in for a remote tier)."""
    url: str | None = option(None, opt_nonempty)
    """A shared tier's space: ``memory://NAME`` names an in-process shared space, so two
    engines in one process share it; default ``memory://`` + the tier's name."""
    lookup_delay_ms: float = option(0.0, delay_ms)
    """Testing: a shared tier's lookups answer "not yet" until this long after they were
    first asked (the connector then asks vLLM to retry the request later)."""

    def shown(self) -> dict[str, Any]:
        out = super().shown()
        if self.url:
            out["url"] = masked_url(self.url)
        return out


DEFAULT_CAPACITY = 64 << 20


def _opts(spec: TierSpec) -> MemoryOptions:
    assert isinstance(spec.options, MemoryOptions), spec
    return spec.options


def _check(spec: TierSpec, label: Label) -> TierSpec:
    opts = _opts(spec)
    if opts.lookup_delay_ms and not opts.shared:
        raise ConfigError(
            f"{label('lookup_delay_ms')}: only a shared tier's lookups can wait, got "
            f"{opts.lookup_delay_ms!r} on a private one"
        )
    return spec


def _shared(spec: TierSpec, ctx: TierContext) -> SharedSpace:
    url = _opts(spec).url or f"memory://{spec.label}"
    return shared_space(url, ctx.capacity_chunks(spec, DEFAULT_CAPACITY))


def _index(spec: TierSpec, ctx: TierContext) -> TierIndex:
    opts = _opts(spec)
    if opts.shared:
        return ProbeIndex(_shared(spec, ctx), ctx.world, opts.lookup_delay_ms / 1e3)
    n = ctx.capacity_chunks(spec, DEFAULT_CAPACITY)
    return SlotIndex(n, make_eviction_policy(spec.eviction or DEFAULT_EVICTION, n))


def _store(spec: TierSpec, ctx: TierContext) -> SlotStore:
    if _opts(spec).shared:
        return SharedStore(
            _shared(spec, ctx), ctx.chunk_bytes, ctx.namespace.digest(), ctx.namespace.rank
        )
    return DictStore(ctx.capacity_chunks(spec, DEFAULT_CAPACITY), ctx.chunk_bytes)


def _capabilities(spec: TierSpec) -> Capabilities:
    if _opts(spec).shared:
        return Capabilities(shared=True)
    return Capabilities(byte_addressable=True)


KIND = TierKind(
    name="memory",
    source=HitSource.HOST,
    make_index=_index,
    make_store=_store,
    default_capacity=DEFAULT_CAPACITY,
    capabilities=_capabilities,
    options=MemoryOptions,
    check=_check,
)
"""Chunks in a dict: private (a slot tier) or, with ``shared``, a key-addressed space."""
