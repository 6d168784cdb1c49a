"""Tier kinds by name, and the builders every caller uses to turn specs into tiers.

The connector's two roles, the mini engine, the benchmarks and the simulator all build
their tiers here, from the same :class:`~kvtier.stack.spec.TierSpec` list: the scheduler
side gets a :class:`~kvtier.stack.stack.TierStack` of indexes (:func:`build_stack`), each
worker its stores (:func:`build_stores`).

Adding a tier kind is one module defining ``KIND = TierKind(...)`` plus one line in
``_BUILTIN`` (or a :func:`register_tier_kind` call).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvtier.keys import Namespace
from kvtier.sources import HitSource
from kvtier.tiers.base import SlotStore, TierIndex

if TYPE_CHECKING:
    from kvtier.config import KVTierConfig
    from kvtier.stack.spec import TierSpec
    from kvtier.stack.stack import TierStack


@dataclass(frozen=True)
class TierContext:
    """What a kind needs besides its spec to build an index or a store."""

    config: KVTierConfig
    chunk_bytes: int
    """Payload bytes of one chunk."""
    namespace: Namespace
    """This process's namespace (its ``rank`` is the worker's shard; 0 on the scheduler)."""
    blocks_per_chunk: int = 1
    row_bytes: Sequence[int] = field(default_factory=tuple)
    """Worker side: bytes of one engine block row per KV region (the CPU slab mirrors them);
    empty: one region of ``chunk_bytes`` per chunk."""
    world: int = 1
    """Ranks that each store their shard of every chunk (tensor parallel size)."""
    rank_dirs: bool = True
    """Disk: one subdirectory per rank under the tier's path (the connector); False opens
    the path itself (single-process tools and tests)."""
    restore: bool = True
    """Scheduler side: rebuild persistent tiers' indexes from what they hold (False: the
    simulator, which has no data)."""
    sizing_bytes: int = 0
    """Chunk bytes that capacities are divided by (0: ``chunk_bytes``): the scheduler's
    geometry, so both sides count the same slots even if the engine's chunk differs."""

    def capacity_chunks(self, spec: TierSpec, default: int) -> int:
        nbytes = spec.capacity if spec.capacity is not None else default
        unit = self.sizing_bytes or self.chunk_bytes
        return nbytes // unit if unit else 0

    def eviction(self, spec: TierSpec) -> str:
        return spec.eviction or self.config.eviction


@dataclass(frozen=True)
class TierKind:
    """A kind of tier: its defaults and how to build each side of it."""

    name: str
    source: HitSource
    """Hit source of its hits unless the spec names another."""
    sync_loads: bool
    """Whether a hit served from it may load within the step (fast host memory)."""
    make_index: Callable[[TierSpec, TierContext], TierIndex]
    make_store: Callable[[TierSpec, TierContext], SlotStore]
    default_capacity: Callable[[KVTierConfig], int]


_BUILTIN: dict[str, str] = {
    "cpu": "kvtier.tiers.cpu",
    "disk": "kvtier.tiers.disk.kind",
    "memory": "kvtier.tiers.memory",
    "redis": "kvtier.tiers.remote.kind",
}
"""Kind name -> module defining ``KIND`` (imported on first use)."""
_KINDS: dict[str, TierKind] = {}


def register_tier_kind(kind: TierKind) -> None:
    if kind.name in _KINDS or kind.name in _BUILTIN:
        raise ValueError(f"tier kind {kind.name!r} is registered twice")
    _KINDS[kind.name] = kind


def tier_kinds() -> tuple[str, ...]:
    return (*_BUILTIN, *_KINDS)


def tier_kind(name: str) -> TierKind:
    kind = _KINDS.get(name)
    if kind is None and name in _BUILTIN:
        kind = importlib.import_module(_BUILTIN[name]).KIND
        assert isinstance(kind, TierKind) and kind.name == name
    if kind is None:
        raise KeyError(f"unknown tier kind {name!r}; known: {', '.join(tier_kinds())}")
    return kind


def build_stack(config: KVTierConfig, ctx: TierContext) -> TierStack:
    """The scheduler side: every tier's index, in stack order."""
    from kvtier.stack.stack import StackTier, TierStack

    tiers = []
    for spec in config.tier_specs():
        kind = tier_kind(spec.kind)
        source = kind.source
        if spec.source:
            source = HitSource[spec.source.upper()]
        elif spec.shared:
            source = HitSource.P2P  # a store shared with other engines
        index = kind.make_index(spec, ctx)
        tiers.append(StackTier(spec.label, source, index, spec, kind.sync_loads))
    return TierStack(tiers)


def build_stores(config: KVTierConfig, ctx: TierContext) -> dict[str, SlotStore]:
    """One worker's side: every tier's store by tier name, in stack order."""
    stores: dict[str, SlotStore] = {}
    try:
        for spec in config.tier_specs():
            stores[spec.label] = tier_kind(spec.kind).make_store(spec, ctx)
    except BaseException:
        for store in stores.values():
            store.close()
        raise
    return stores
