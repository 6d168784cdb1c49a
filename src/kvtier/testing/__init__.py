"""Test helpers shipped with kvtier: the tier conformance suites (whole tiers, and the
index/store split the engine runs)."""

from kvtier.testing.split_conformance import SplitConformance
from kvtier.testing.tier_conformance import TierConformance

__all__ = ["SplitConformance", "TierConformance"]
