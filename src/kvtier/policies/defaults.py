"""The policies the connector builds for each tier from the config's policy fields.

One code path for the connector, the test engine and ``kvtier sim --policies default``, so
what the simulator calls "default" is exactly what a deployment runs. It reads only the
fields of :class:`PolicyFields` (a :class:`kvtier.config.KVTierConfig` has them), so the
policies sit below the config and never import it.
"""

from __future__ import annotations

from typing import Protocol

from kvtier.policies.admission import AdmissionPolicy, make_admission_policy
from kvtier.policies.eviction import EvictionPolicy
from kvtier.policies.registry import make_eviction_policy

TIER_NAMES: tuple[str, ...] = ("cpu", "disk")
"""Tiers a config names policies for, innermost first."""


class PolicyFields(Protocol):
    """The config fields the default policies are built from (``KVTierConfig``'s)."""

    @property
    def eviction(self) -> str: ...

    @property
    def disk_eviction(self) -> str | None: ...

    @property
    def admission_min_seen(self) -> int: ...


def tier_eviction_name(config: PolicyFields, tier: str) -> str:
    """The eviction policy's name for ``tier`` ("cpu" or "disk")."""
    if tier == "cpu":
        return config.eviction
    if tier == "disk":
        return config.disk_eviction or config.eviction
    raise ValueError(f"tier: expected one of {', '.join(TIER_NAMES)}, got {tier!r}")


def tier_eviction_policy(config: PolicyFields, tier: str, num_slots: int) -> EvictionPolicy:
    """The eviction policy of ``tier`` with ``num_slots`` slots."""
    return make_eviction_policy(tier_eviction_name(config, tier), num_slots)


def admission_policy(config: PolicyFields, first_tier_slots: int) -> AdmissionPolicy:
    """The admission policy of stores into the first tier (the manager's)."""
    # Remember seen counts for a few times more keys than the first tier holds.
    return make_admission_policy(
        config.admission_min_seen, max_tracked=max(1 << 16, 4 * first_tier_slots)
    )
