"""Trace-driven simulation of kvtier's tier caches (``kvtier sim``).

Replays a Mooncake-format request trace through kvtier's own prefix-closed index, eviction
and admission policies, next to an offline Belady bound and an infinite cache, and reports
token hit ratios per tier. No engine and no KV data are involved.
"""

from kvtier.tools.sim.bounds import next_uses, replay_belady, replay_infinite
from kvtier.tools.sim.capacity import (
    SMOLLM2_BYTES_PER_TOKEN,
    TierCapacity,
    parse_capacity,
    tier_capacities,
)
from kvtier.tools.sim.counts import ReplayCounts
from kvtier.tools.sim.report import format_sim
from kvtier.tools.sim.simulator import (
    DEFAULT_POLICIES,
    DEFAULT_TIERS,
    PolicySpec,
    parse_policy,
    replay_index,
    run_sim,
)
from kvtier.tools.sim.trace import TRACE_BLOCK_TOKENS, SimRequest, Trace, load_trace, parse_request

__all__ = [
    "DEFAULT_POLICIES",
    "DEFAULT_TIERS",
    "SMOLLM2_BYTES_PER_TOKEN",
    "TRACE_BLOCK_TOKENS",
    "PolicySpec",
    "ReplayCounts",
    "SimRequest",
    "TierCapacity",
    "Trace",
    "format_sim",
    "load_trace",
    "next_uses",
    "parse_capacity",
    "parse_policy",
    "parse_request",
    "replay_belady",
    "replay_index",
    "replay_infinite",
    "run_sim",
    "tier_capacities",
]
