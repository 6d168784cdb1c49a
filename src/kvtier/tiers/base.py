"""Moved to :mod:`kvtier.contract`; kept for the modules not yet moved."""

# shim: removed once every importer moved
from kvtier.contract import Buffers, IndexListener, Segments, SlotStore, TierIndex

__all__ = ["Buffers", "IndexListener", "Segments", "SlotStore", "TierIndex"]
