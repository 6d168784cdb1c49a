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
from typing import TYPE_CHECKING

from kvtier.sources import HitSource
from kvtier.stack.kinds import TierContext, TierKind

if TYPE_CHECKING:
    from kvtier.config import KVTierConfig
    from kvtier.stack.stack import TierStack
    from kvtier.tiers.base import SlotStore

__all__ = [
    "TierContext",
    "TierKind",
    "build_stack",
    "build_stores",
    "register_tier_kind",
    "tier_kind",
    "tier_kinds",
]


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
