"""Test helpers shipped with kvtier: the tier conformance suite."""

from kvtier.testing.tier_conformance import TierConformance

__all__ = ["TierConformance"]
