"""A template tier kind: copy this file to add a medium to kvtier.

The medium here is a ``bytearray`` in this process (so the template runs anywhere); each
slot holds one chunk wrapped in kvtier's envelope (:mod:`kvtier.tiers.envelope`: key,
parent, namespace digest, payload checksum), so a read under the wrong key, by another
namespace or of damaged bytes fails that chunk alone, as the contract asks. To write a
real medium, replace :class:`TemplateStore`'s ``_put`` / ``_get`` with your medium's
I/O and keep the rest; then register the kind::

    from kvtier.stack.registry import register_tier_kind
    import template_tier
    register_tier_kind(template_tier.KIND)

and name it in a config: ``"tiers": [{"kind": "cpu"}, {"kind": "template"}]``.
``tests/conformance/test_conformance.py`` registers this file's kind and runs the conformance suite
(:mod:`kvtier.conformance`) on it: run the same on yours. docs/tiers.md ("Adding a tier
kind") walks through each part.

The four parts of a kind, in the order this file defines them:

1. the worker side's :class:`~kvtier.contract.SlotStore` (bytes in, bytes out, per
   chunk; thread-safe across different slots);
2. the kind's options (a :class:`~kvtier.contract.TierOptions` dataclass: one field
   per key of the tier's config entry, with its parser and a docstring);
3. the scheduler side's :class:`~kvtier.contract.TierIndex`: a private medium that only
   this engine writes reuses :class:`~kvtier.tiers.index.SlotIndex` (prefix-closed,
   pinned, evicting by the tier's policy); a shared one is a
   :class:`~kvtier.contract.KeyAddressedIndex` (see ``kvtier/tiers/shared.py``);
4. the :class:`~kvtier.contract.TierKind` record: name, hit source, builders,
   default capacity, capabilities (what the stack may do with it), options.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvtier.contract import (
    Capabilities,
    Segments,
    SlotStore,
    TierContext,
    TierIndex,
    TierKind,
    TierOptions,
    TierSpec,
    fixed,
)
from kvtier.keys import Key
from kvtier.options import boolean, option
from kvtier.policies.registry import DEFAULT_EVICTION, make_eviction_policy
from kvtier.sources import HitSource
from kvtier.tiers.envelope import HEADER_BYTES, unwrap, wrap
from kvtier.tiers.index import SlotIndex

NAME = "template"
DEFAULT_CAPACITY = 64 << 20
"""Bytes per device when the config names no capacity."""


# -- 1. the store ---------------------------------------------------------------------------


class TemplateStore(SlotStore):
    """``num_slots`` enveloped slots in one ``bytearray``.

    Contract (:class:`~kvtier.contract.SlotStore`): the caller owns the segments; a
    failure fails its chunk only; a failed write leaves nothing readable in the slot; calls
    on different slots may run at once (each slot is a disjoint range of the array)."""

    def __init__(self, num_slots: int, chunk_bytes: int, namespace: bytes, wipe: bool) -> None:
        self.num_slots = num_slots
        self.slot_bytes = chunk_bytes
        self._namespace = namespace
        self._wipe = wipe
        self._stride = HEADER_BYTES + chunk_bytes
        self._data = bytearray(num_slots * self._stride)
        self._closed = threading.Event()

    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        ok = []
        for i, (slot, key, segments) in enumerate(zip(slots, keys, src, strict=True)):
            payload = torch.empty(self.slot_bytes, dtype=torch.uint8)
            for off, seg in segments:
                payload[off : off + seg.numel()].copy_(seg.reshape(-1))
            parent = parents[i] if parents is not None else None
            ok.append(
                self._put(slot, wrap(key, parent, self._namespace, payload.numpy().tobytes()))
            )
        return ok

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        ok = []
        for slot, key, segments in zip(slots, keys, dst, strict=True):
            payload = unwrap(self._get(slot), key, self._namespace, self.slot_bytes)
            if payload is None:  # absent, another key or namespace, or damaged
                ok.append(False)
                continue
            src = torch.frombuffer(payload, dtype=torch.uint8)
            for off, seg in segments:
                seg.copy_(src[off : off + seg.numel()].view(seg.shape))
            ok.append(True)
        return ok

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            if self._wipe:
                self._data[:] = bytes(len(self._data))

    # The medium's own I/O: all a real medium changes (a file, a device, a service).

    def _put(self, slot: int, value: bytes) -> bool:
        if self._closed.is_set() or not 0 <= slot < self.num_slots:
            return False
        self._data[slot * self._stride : (slot + 1) * self._stride] = value
        return True

    def _get(self, slot: int) -> bytearray | None:
        if self._closed.is_set() or not 0 <= slot < self.num_slots:
            return None
        return self._data[slot * self._stride : (slot + 1) * self._stride]  # a copy


# -- 2. options -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TemplateOptions(TierOptions):
    """Options of a template tier (the keys of its ``tiers`` entry besides the common
    ``kind``, ``name``, ``capacity``, ``eviction``, ``source``, ``faults``)."""

    wipe_on_close: bool = option(False, boolean)
    """Overwrite the medium with zeros when the store closes (KV reveals the prompt it
    came from)."""


def _options(spec: TierSpec) -> TemplateOptions:
    assert isinstance(spec.options, TemplateOptions), spec
    return spec.options


# -- 3. the index, and the builders ---------------------------------------------------------


def _index(spec: TierSpec, ctx: TierContext) -> TierIndex:
    n = ctx.capacity_chunks(spec, DEFAULT_CAPACITY)
    return SlotIndex(n, make_eviction_policy(spec.eviction or DEFAULT_EVICTION, n))


def _store(spec: TierSpec, ctx: TierContext) -> SlotStore:
    n = ctx.capacity_chunks(spec, DEFAULT_CAPACITY)
    return TemplateStore(n, ctx.chunk_bytes, ctx.namespace.digest(), _options(spec).wipe_on_close)


# -- 4. the kind ----------------------------------------------------------------------------


KIND = TierKind(
    name=NAME,
    source=HitSource.HOST,
    make_index=_index,
    make_store=_store,
    default_capacity=DEFAULT_CAPACITY,
    # Private, lost with the process, not copied to by address, loads async only.
    capabilities=fixed(Capabilities()),
    options=TemplateOptions,
)
"""The template medium: enveloped slots in process memory."""
