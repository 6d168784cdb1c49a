"""kvtier: tiered KV-cache offloading for LLM serving (a vLLM KV-connector plugin).

The core (this package, minus ``kvtier.vllm``) never imports vLLM: keys, tiers, lookup and
load planning, hit sources, the transfer engine and metrics are engine-agnostic.
"""

from kvtier.budget import SyncBudget
from kvtier.config import KVTierConfig
from kvtier.errors import ConfigError, KVTierError, TierError, TierUnavailable
from kvtier.sources import HitRun, HitSource, hit_sources

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "HitRun",
    "HitSource",
    "KVTierConfig",
    "KVTierError",
    "SyncBudget",
    "TierError",
    "TierUnavailable",
    "__version__",
    "hit_sources",
]
