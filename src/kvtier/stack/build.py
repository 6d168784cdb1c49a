"""The builders every caller uses to turn a config into tiers.

The connector's two roles, the mini engine, the benchmarks, the simulator and the
conformance suite all build their tiers here, from the same resolved
:class:`~kvtier.contract.TierSpec` list (:meth:`KVTierConfig.tier_specs`): the scheduler
side gets a :class:`~kvtier.stack.stack.TierStack` of indexes (:func:`build_stack`), each
worker its stores (:func:`build_stores`). A spec with ``faults`` gets its store wrapped in
the fault wrapper here (:mod:`kvtier.tiers.faulty`): no kind has fault code of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvtier.contract.kind import TierContext, TierKind
from kvtier.contract.spec import TierSpec
from kvtier.errors import ConfigError, TierError
from kvtier.sources import HitSource
from kvtier.stack.registry import tier_kind
from kvtier.stack.stack import StackTier, TierStack

if TYPE_CHECKING:
    from kvtier.config import KVTierConfig
    from kvtier.contract import SlotStore, TierIndex


def _kind_of(spec: TierSpec) -> TierKind:
    kind = tier_kind(spec.kind)
    if not isinstance(spec.options, kind.options):
        raise ConfigError(
            f"tier {spec.label!r}: the options of a {kind.name} tier are a "
            f"{kind.options.__name__}, got a {type(spec.options).__name__}"
        )
    return kind


def make_index(spec: TierSpec, ctx: TierContext) -> TierIndex:
    """The scheduler side of one tier; TierError if the kind's index contradicts the
    capabilities it declares."""
    kind = _kind_of(spec)
    index = kind.make_index(spec, ctx)
    if bool(index.shared) != kind.capabilities(spec).shared:
        raise TierError(
            f"tier {spec.label!r}: the {kind.name} kind declares shared="
            f"{kind.capabilities(spec).shared} but its index says {index.shared}"
        )
    for name in ("admit_chain", "settle"):  # added to TierIndex later than the rest
        if not callable(getattr(index, name, None)):
            raise TierError(f"tier {spec.label!r}: the {kind.name} kind's index has no {name}()")
    return index


def make_store(spec: TierSpec, ctx: TierContext) -> SlotStore:
    """One worker's store of one tier, in the fault wrapper if the spec has ``faults``."""
    store = _kind_of(spec).make_store(spec, ctx)
    if spec.faults is not None:
        from kvtier.tiers.faulty import FaultyStore

        store = FaultyStore(store, spec.faults)
    return store


def stack_tier(spec: TierSpec, ctx: TierContext) -> StackTier:
    """One tier as the scheduler sees it."""
    kind = _kind_of(spec)
    caps = kind.capabilities(spec)
    source = kind.source
    if spec.source:
        source = HitSource[spec.source.upper()]
    elif caps.shared:
        source = HitSource.P2P  # a store shared with other engines
    return StackTier(spec.label, source, make_index(spec, ctx), spec, caps)


def build_stack(
    config: KVTierConfig, ctx: TierContext, specs: Sequence[TierSpec] | None = None
) -> TierStack:
    """The scheduler side: every tier's index, in stack order (``specs``: these instead
    of the config's, e.g. the recurrent states' share of them)."""
    specs = config.tier_specs() if specs is None else specs
    return TierStack([stack_tier(spec, ctx) for spec in specs])


def build_stores(
    config: KVTierConfig, ctx: TierContext, specs: Sequence[TierSpec] | None = None
) -> dict[str, SlotStore]:
    """One worker's side: every tier's store by tier name, in stack order."""
    stores: dict[str, SlotStore] = {}
    try:
        for spec in config.tier_specs() if specs is None else specs:
            stores[spec.label] = make_store(spec, ctx)
    except BaseException:
        for store in stores.values():
            store.close()
        raise
    return stores


def tier_files(config: KVTierConfig, ctx: TierContext, rank: int) -> str | None:
    """The directory of one rank's files of the first tier that keeps files on this
    machine (a disk tier); None without one."""
    for spec in config.tier_specs():
        kind = tier_kind(spec.kind)
        if kind.files is not None:
            return kind.files(spec, ctx, rank)
    return None
