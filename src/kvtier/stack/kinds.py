"""What a tier kind is (:class:`TierKind`) and what building one needs (:class:`TierContext`).

Kept apart from the registry so the modules defining kinds import nothing but this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvtier.keys import Namespace
from kvtier.sources import HitSource

if TYPE_CHECKING:
    from kvtier.config import KVTierConfig
    from kvtier.stack.spec import TierSpec
    from kvtier.tiers.base import SlotStore, TierIndex


@dataclass(frozen=True)
class TierContext:
    """What a kind needs besides its spec to build an index or a store."""

    config: KVTierConfig
    chunk_bytes: int
    """Payload bytes of one chunk."""
    namespace: Namespace
    """This process's namespace (its ``rank`` is the worker's shard; 0 on the scheduler)."""
    blocks_per_chunk: int = 1
    row_bytes: Sequence[int] = field(default_factory=tuple)
    """Worker side: bytes of one engine block row per KV region (the CPU slab mirrors them);
    empty: one region of ``chunk_bytes`` per chunk."""
    world: int = 1
    """Ranks that each store their shard of every chunk (tensor parallel size)."""
    rank_dirs: bool = True
    """Disk: one subdirectory per rank under the tier's path (the connector); False opens
    the path itself (single-process tools and tests)."""
    restore: bool = True
    """Scheduler side: rebuild persistent tiers' indexes from what they hold (False: the
    simulator, which has no data)."""
    sizing_bytes: int = 0
    """Chunk bytes that capacities are divided by (0: ``chunk_bytes``): the scheduler's
    geometry, so both sides count the same slots even if the engine's chunk differs."""

    def capacity_chunks(self, spec: TierSpec, default: int) -> int:
        nbytes = spec.capacity if spec.capacity is not None else default
        unit = self.sizing_bytes or self.chunk_bytes
        return nbytes // unit if unit else 0

    def eviction(self, spec: TierSpec) -> str:
        return spec.eviction or self.config.eviction


@dataclass(frozen=True)
class TierKind:
    """A kind of tier: its defaults and how to build each side of it."""

    name: str
    source: HitSource
    """Hit source of its hits unless the spec names another."""
    sync_loads: bool
    """Whether a hit served from it may load within the step (fast host memory)."""
    make_index: Callable[[TierSpec, TierContext], TierIndex]
    make_store: Callable[[TierSpec, TierContext], SlotStore]
    default_capacity: Callable[[KVTierConfig], int]
