"""Moved to :mod:`kvtier.contract.spec`; kept for the modules not yet moved."""

# shim: removed once every importer moved
from kvtier.contract.spec import TierOptions, TierSpec

__all__ = ["TierOptions", "TierSpec"]
