"""What one replay of the cache simulator counts, and its progress callback."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Tick = Callable[[int], None]
"""Progress callback: called with the number of trace requests just replayed."""

TICK_EVERY = 256
"""Requests between two progress ticks of a replay."""


@dataclass
class ReplayCounts:
    """Hits of one replay, per tier (innermost first)."""

    hit_blocks: list[int]
    hit_tokens: list[int]
    evictions: list[int] = field(default_factory=list)
    policies: list[Any] = field(default_factory=list, repr=False)
    """The tiers' eviction policies after an index replay (inspection, tests)."""
