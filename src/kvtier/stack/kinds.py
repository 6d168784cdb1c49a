"""Moved to :mod:`kvtier.contract.kind`; kept for the modules not yet moved."""

# shim: removed once every importer moved
from kvtier.contract.kind import Capabilities, TierContext, TierKind, fixed

__all__ = ["Capabilities", "TierContext", "TierKind", "fixed"]
