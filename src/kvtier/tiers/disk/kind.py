"""The disk tier kind: a SlotIndex rebuilt from the slab headers, over one DiskSlab per rank."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from kvtier.contract import (
    Capabilities,
    SlotStore,
    TierContext,
    TierIndex,
    TierKind,
    TierOptions,
    TierSpec,
    fixed,
)
from kvtier.options import integer, opt_nonempty, option
from kvtier.policies.registry import DEFAULT_EVICTION, make_eviction_policy
from kvtier.sources import HitSource
from kvtier.tiers.disk.restore import restore_index
from kvtier.tiers.disk.slab import DiskSlab
from kvtier.tiers.index import SlotIndex

log = logging.getLogger("kvtier")

STATES_DIR = "states"
"""Subdirectory of a disk tier's directory holding the recurrent states of hybrid models
(their own slab files: a state's slot size differs from a chunk's)."""

DEFAULT_CAPACITY = 16 << 30
"""Bytes of a disk tier that names no capacity (the flat key ``disk_bytes``'s default too)."""


@dataclass(frozen=True)
class DiskOptions(TierOptions):
    """Options of a disk tier."""

    path: str | None = option(None, opt_nonempty, "a disk tier needs a directory")
    """Directory of the slab files (required); each tensor-parallel rank gets its own
    subdirectory."""
    threads: int = option(4, integer(1))
    """I/O threads."""


def _opts(spec: TierSpec) -> DiskOptions:
    assert isinstance(spec.options, DiskOptions), spec
    return spec.options


def rank_dir(spec: TierSpec, ctx: TierContext, rank: int) -> str:
    """The directory of one tensor-parallel rank (each owns its shard's slab files)."""
    path = _opts(spec).path
    assert path
    if not ctx.rank_dirs:
        return path
    return os.path.join(path, f"tp{ctx.world}-rank{rank}")


def _index(spec: TierSpec, ctx: TierContext) -> TierIndex:
    n = ctx.capacity_chunks(spec, DEFAULT_CAPACITY)
    index = SlotIndex(n, make_eviction_policy(spec.eviction or DEFAULT_EVICTION, n))
    if ctx.restore and _opts(spec).path:
        # Chunks a previous engine wrote (same namespace, rank 0's shard) are found again.
        path = rank_dir(spec, ctx, 0)
        digest = ctx.namespace.for_rank(0).digest()
        restored = restore_index(index, DiskSlab.scan(path, digest, ctx.chunk_bytes, n))
        log.info("kvtier: disk tier %s: %d slots, %d chunks restored", path, n, restored)
    return index


def _store(spec: TierSpec, ctx: TierContext) -> SlotStore:
    n = ctx.capacity_chunks(spec, DEFAULT_CAPACITY)
    path = rank_dir(spec, ctx, ctx.namespace.rank)
    return DiskSlab(path, n, ctx.chunk_bytes, ctx.namespace.digest(), _opts(spec).threads)


KIND = TierKind(
    name="disk",
    source=HitSource.DISK,
    make_index=_index,
    make_store=_store,
    default_capacity=DEFAULT_CAPACITY,
    capabilities=fixed(Capabilities(persistent=True, sync_loads=True)),
    options=DiskOptions,
    check=None,
    files=rank_dir,
)
"""Slab files on a local directory; survives restarts (the index is rebuilt from them)."""
