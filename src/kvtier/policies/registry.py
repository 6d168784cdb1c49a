"""Policies by name: the one place a new eviction or admission policy is registered.

A policy is one module defining the class plus one ``register_eviction`` line below (or in
the module itself); the config's accepted values, the tier registry, the simulator's policy
names and the README's list all read :func:`eviction_names`.
"""

from __future__ import annotations

from collections.abc import Callable

from kvtier.errors import ConfigError
from kvtier.policies.eviction import ARCPolicy, EvictionPolicy, LRUPolicy

EvictionFactory = Callable[[int], EvictionPolicy]
"""Builds a policy for a tier of ``capacity`` chunks."""

_EVICTION: dict[str, EvictionFactory] = {}
DEFAULT_EVICTION = "adaptive"
"""The policy of a tier that names none, when no config says otherwise (the config's
``eviction`` default)."""


def register_eviction(name: str, factory: EvictionFactory) -> None:
    """Make ``name`` a valid ``eviction`` value (config, tiers, simulator)."""
    if name in _EVICTION:
        raise ValueError(f"eviction policy {name!r} is registered twice")
    _EVICTION[name] = factory


def eviction_names() -> tuple[str, ...]:
    return tuple(_EVICTION)


def make_eviction_policy(name: str, capacity: int) -> EvictionPolicy:
    """Build a registered eviction policy by name."""
    factory = _EVICTION.get(name)
    if factory is None:
        raise ConfigError(
            f"eviction: unknown policy {name!r}; accepted values: {', '.join(_EVICTION)}"
        )
    return factory(capacity)


def _chain_arc(capacity: int) -> EvictionPolicy:
    from kvtier.policies.chain_arc import ChainARCPolicy

    return ChainARCPolicy(capacity)


def _adaptive_arc(capacity: int) -> EvictionPolicy:
    from kvtier.policies.adaptive import AdaptivePolicy

    return AdaptivePolicy(capacity)


def _lru_doorkeeper(capacity: int) -> EvictionPolicy:
    from kvtier.policies.doorkeeper import DoorkeeperLRUPolicy

    return DoorkeeperLRUPolicy(capacity)


def _dueling(capacity: int) -> EvictionPolicy:
    from kvtier.policies.dueling import DuelingPolicy

    return DuelingPolicy(capacity)


register_eviction("adaptive", _dueling)
register_eviction("adaptive-arc", _adaptive_arc)
register_eviction("chain-arc", _chain_arc)
register_eviction("lru", LRUPolicy)
register_eviction("arc", ARCPolicy)
register_eviction("lru-doorkeeper", _lru_doorkeeper)
