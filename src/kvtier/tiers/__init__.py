"""Tiers: where evicted KV chunks live (CPU, disk, ...)."""

from kvtier.tiers.base import Segments, SlotStore, Tier
from kvtier.tiers.cpu import CpuSlab, CpuTier
from kvtier.tiers.faulty import FaultPlan, FaultyStore, faulty_tier
from kvtier.tiers.index import SlotIndex
from kvtier.tiers.memory import DictStore, MemoryTier
from kvtier.tiers.slot_tier import SlotTier

__all__ = [
    "CpuSlab",
    "CpuTier",
    "DictStore",
    "FaultPlan",
    "FaultyStore",
    "MemoryTier",
    "Segments",
    "SlotIndex",
    "SlotStore",
    "SlotTier",
    "Tier",
    "faulty_tier",
]
