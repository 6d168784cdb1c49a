"""The disk tier kind: a SlotIndex rebuilt from the slab headers, over one DiskSlab per rank."""

from __future__ import annotations

import logging
import os

from kvtier.policies.registry import make_eviction_policy
from kvtier.sources import HitSource
from kvtier.stack.registry import TierContext, TierKind
from kvtier.stack.spec import TierSpec
from kvtier.tiers.base import SlotStore, TierIndex
from kvtier.tiers.disk.restore import restore_index
from kvtier.tiers.disk.slab import DiskSlab
from kvtier.tiers.index import SlotIndex

log = logging.getLogger("kvtier")


def rank_dir(spec: TierSpec, ctx: TierContext, rank: int) -> str:
    """The directory of one tensor-parallel rank (each owns its shard's slab files)."""
    assert spec.path
    if not ctx.rank_dirs:
        return spec.path
    return os.path.join(spec.path, f"tp{ctx.world}-rank{rank}")


def _index(spec: TierSpec, ctx: TierContext) -> TierIndex:
    n = ctx.capacity_chunks(spec, ctx.config.disk_bytes)
    index = SlotIndex(n, make_eviction_policy(ctx.eviction(spec), n))
    if ctx.restore and spec.path:
        # Chunks a previous engine wrote (same namespace, rank 0's shard) are found again.
        path = rank_dir(spec, ctx, 0)
        digest = ctx.namespace.for_rank(0).digest()
        restored = restore_index(index, DiskSlab.scan(path, digest, ctx.chunk_bytes, n))
        log.info("kvtier: disk tier %s: %d slots, %d chunks restored", path, n, restored)
    return index


def _store(spec: TierSpec, ctx: TierContext) -> SlotStore:
    n = ctx.capacity_chunks(spec, ctx.config.disk_bytes)
    path = rank_dir(spec, ctx, ctx.namespace.rank)
    return DiskSlab(path, n, ctx.chunk_bytes, ctx.namespace.digest(), spec.threads)


KIND = TierKind("disk", HitSource.DISK, False, _index, _store, lambda c: c.disk_bytes)
