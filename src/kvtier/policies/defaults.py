"""The policies the connector builds for each tier from a :class:`KVTierConfig`.

One code path for the connector, the test engine and ``kvtier sim --policies default``, so
what the simulator calls "default" is exactly what a deployment runs.
"""

from __future__ import annotations

from kvtier.config import KVTierConfig
from kvtier.policies.admission import AdmissionPolicy, make_admission_policy
from kvtier.policies.eviction import EvictionPolicy
from kvtier.policies.registry import make_eviction_policy

TIER_NAMES: tuple[str, ...] = ("cpu", "disk")
"""Tiers a config names policies for, innermost first."""


def tier_eviction_name(config: KVTierConfig, tier: str) -> str:
    """The eviction policy's name for ``tier`` ("cpu" or "disk")."""
    if tier == "cpu":
        return config.eviction
    if tier == "disk":
        return config.disk_eviction or config.eviction
    raise ValueError(f"tier: expected one of {', '.join(TIER_NAMES)}, got {tier!r}")


def tier_eviction_policy(config: KVTierConfig, tier: str, num_slots: int) -> EvictionPolicy:
    """The eviction policy of ``tier`` with ``num_slots`` slots."""
    return make_eviction_policy(tier_eviction_name(config, tier), num_slots)


def admission_policy(config: KVTierConfig, first_tier_slots: int) -> AdmissionPolicy:
    """The admission policy of stores into the first tier (the manager's)."""
    # Remember seen counts for a few times more keys than the first tier holds.
    return make_admission_policy(
        config.admission_min_seen, max_tracked=max(1 << 16, 4 * first_tier_slots)
    )
