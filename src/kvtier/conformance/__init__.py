"""The public conformance suite of the tier contract, for kvtier's own tier kinds and for
third-party ones (docs/tiers.md): :class:`TierConformance` (subclass it in a pytest module
and list :class:`KindCase` s), run on tiers built from ``tiers`` entries as an engine builds
them. Tooling: the runtime never imports it; it needs pytest."""

from kvtier.conformance.case import (
    CHUNK_BYTES,
    NAMESPACE,
    WORLD,
    BuiltTier,
    CaseContext,
    KindCase,
    Tamper,
    chain,
    payload,
)
from kvtier.conformance.suite import TierConformance

__all__ = [
    "CHUNK_BYTES",
    "NAMESPACE",
    "WORLD",
    "BuiltTier",
    "CaseContext",
    "KindCase",
    "Tamper",
    "TierConformance",
    "chain",
    "payload",
]
