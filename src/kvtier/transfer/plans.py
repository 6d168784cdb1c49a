"""How a transfer job becomes copies: its plan (built once), and the plan's execution.

A plan is ``(kind, data)``, the cheapest way the job's stores allow:

- ``"rows"``: the store moves whole rows of consecutive slots in one batched call per
  region (the CPU slab: one gather or scatter per region and run of slots);
- ``"buffers"``: the store takes the chunks as flat address arrays
  (:class:`~kvtier.contract.Buffers`: the disk tier's native path, host-memory KV):
  built with a few NumPy operations per job, where ``"segments"`` builds a tensor view
  per block and region (a 4k-token hit of a 30-layer model at 16-token chunks: 15,360
  views, tens of ms of Python, slower still while the engine's thread wants the GIL);
- ``"segments"``: one ``(offset, view)`` list per chunk, which every store accepts;
- ``"partial"``: segments of the leading chunks a store can take (KV groups with freed
  blocks);
- ``"regions"``: segments sorted by region (``data[r][c]``: region r's segments of chunk
  c), so a part of the regions can be copied alone: a ``"segments"`` load from a memory
  store split for a load layer by layer (:func:`split_segments`; device-memory KV, where
  no ``"rows"`` plan exists);
- ``"copy"`` / ``"copy-buffers"`` / ``"staged"``: tier to tier, from the source's payload
  views, its payload addresses, or through a scratch buffer;
- ``"read-buffers"`` / ``"read-into"``: tier to tier into a destination that exposes its
  slots as memory (the CPU tier: a prefetch from disk or Redis), the source reading
  straight into the destination's payload addresses or views (no scratch buffer, one
  copy instead of two).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from kvtier.contract import SlotStore
from kvtier.jobs import TransferJob
from kvtier.transfer.groups import GroupedRegions
from kvtier.transfer.regions import KVRegions

Plan = tuple[str, Any]


def make_plan(
    job: TransferJob,
    regions: KVRegions | GroupedRegions,
    stores: Mapping[str, SlotStore],
    blocks_per_chunk: int,
) -> Plan:
    """The plan of ``job`` (see the module docstring). Raises ValueError for block ids
    that do not match the job's chunks."""
    bpc = blocks_per_chunk
    store = stores[job.tier]
    if job.kind == "copy":
        dst = stores[job.dst_tier]
        if store.host_payload and dst.accepts_buffers():
            return "copy-buffers", store.payload_buffers(job.slots)
        if store.host_payload:
            return "copy", [store.payload_segments(s) for s in job.slots]
        if dst.host_payload and store.accepts_buffers():
            return "read-buffers", dst.payload_buffers(job.dst_slots)
        if dst.host_payload:
            return "read-into", [dst.payload_segments(s) for s in job.dst_slots]
        return "staged", None  # through a buffer (see copy_staged)
    if not regions.grouped and store.supports_rows(regions.rows):  # (rows: one group's)
        return "rows", _row_runs(job, bpc)
    if isinstance(regions, KVRegions) and regions.arrays and store.accepts_buffers():
        return "buffers", regions.buffers(job.block_ids, job.skip, bpc)
    chunks = job.chunk_blocks(bpc)
    views = [regions.segments(ids, first, bpc) for first, ids in chunks]
    if job.kind == "store" and isinstance(regions, GroupedRegions):
        # A chunk with a freed (null) block cannot be stored; nor can any after it.
        cut = regions.storable_chunks(chunks)
        if cut < len(chunks):
            return "partial", (cut, views[:cut])
    return "segments", views


def _row_runs(job: TransferJob, bpc: int) -> list[tuple[int, Any]]:
    """Runs of consecutive slots: (first slab row, the engine blocks of the run)."""
    runs: list[tuple[int, Any]] = []
    pos = 0
    i = 0
    n = len(job.slots)
    while i < n:
        j = i + 1
        while j < n and job.slots[j] == job.slots[j - 1] + 1:
            j += 1
        first = job.skip if i == 0 else 0
        count = (j - i) * bpc - first
        ids = job.block_ids[pos : pos + count]
        blocks = (
            np.asarray(ids, dtype=np.int64)
            if job.kind == "load"
            else (torch.tensor(ids, dtype=torch.int64))
        )
        runs.append((job.slots[i] * bpc + first, blocks))
        pos += count
        i = j
    if pos != len(job.block_ids):
        raise ValueError(f"job {job.job_id}: block ids do not match its chunks")
    return runs


def split_last_block(prepared: Plan) -> tuple[Plan, Plan]:
    """A load's ``"rows"`` plan as (the job's last engine block, every other block): a
    load layer by layer copies the first part before the forward (the engine may write
    this step's KV into that block before the layer's attention, see
    :mod:`kvtier.worker`), the rest one layer at a time. ValueError for other plans."""
    how, runs = prepared
    if how != "rows" or not runs:
        raise ValueError(f"cannot split a {how!r} plan by block")
    slab_row, blocks = runs[-1]
    last = [(slab_row + blocks.size - 1, blocks[-1:])]
    rest = [*runs[:-1], (slab_row, blocks[:-1])] if blocks.size > 1 else runs[:-1]
    return ("rows", last), ("rows", rest)


def split_by_layer(
    prepared: Plan, store: SlotStore, row_bytes: Sequence[int], blocks_per_chunk: int
) -> tuple[Plan, Plan] | None:
    """A sync load's plan as (the job's last engine block, every other block), to be
    copied layer by layer, or None where it cannot be: only a store declaring
    ``partial_reads`` (memory: the CPU tier, or a fault wrapper keeping its row path) can
    read any part of a chunk alone, good once read; a disk chunk's checksum covers every
    layer."""
    if prepared[0] == "rows":
        return split_last_block(prepared)
    if prepared[0] == "segments" and store.partial_reads:
        return split_segments(prepared, row_bytes, blocks_per_chunk)
    return None


def split_segments(
    prepared: Plan, row_bytes: Sequence[int], blocks_per_chunk: int
) -> tuple[Plan, Plan]:
    """A load's ``"segments"`` plan (one block table: :class:`KVRegions`) as two
    ``"regions"`` plans, (the job's last engine block, every other block): what
    :func:`split_last_block` does for ``"rows"`` plans, for KV a store copies by segment
    (device memory). A segment's region is read from its payload offset (a chunk's payload
    is region-major, region r at ``blocks_per_chunk * sum(row_bytes[:r])``); the job's
    last block is the last row of each region's last segment in the last chunk (segments
    are runs of chunk positions, in order). ValueError for other plans."""
    how, views = prepared
    if how != "segments" or not views:
        raise ValueError(f"cannot split a {how!r} plan by region")
    starts, pos = [], 0
    for rb in row_bytes:
        starts.append(pos)
        pos += blocks_per_chunk * rb
    nreg, nchunks = len(row_bytes), len(views)
    tail: list[list[list[tuple[int, Any]]]] = [[[] for _ in views] for _ in range(nreg)]
    rest: list[list[list[tuple[int, Any]]]] = [[[] for _ in views] for _ in range(nreg)]
    for c, segs in enumerate(views):
        for off, view in segs:
            rest[bisect.bisect_right(starts, off) - 1][c].append((off, view))
    for r, rb in enumerate(row_bytes):
        segs = rest[r][nchunks - 1]
        if not segs:
            continue
        i = max(range(len(segs)), key=lambda k: segs[k][0])
        off, view = segs[i]
        n = view.numel() // rb
        tail[r][nchunks - 1].append((off + (n - 1) * rb, view.narrow(0, (n - 1) * rb, rb)))
        if n > 1:
            segs[i] = (off, view.narrow(0, 0, (n - 1) * rb))
        else:
            del segs[i]
    return ("regions", tail), ("regions", rest)


def run_plan(
    job: TransferJob,
    prepared: Plan,
    regions: KVRegions | GroupedRegions,
    stores: Mapping[str, SlotStore],
    only: list[int] | None = None,
) -> list[bool]:
    """Execute a plan from :func:`make_plan` on the calling thread. ``only``: copy these
    regions alone (one engine layer's; ``"rows"`` and ``"regions"`` plans only, ValueError
    for others)."""
    store = stores[job.tier]
    how, plan = prepared
    if only is not None and how not in ("rows", "regions"):
        raise ValueError(f"a {how!r} plan cannot copy a subset of regions")
    parents = job.parents or None
    if how == "copy":
        return list(stores[job.dst_tier].write(job.dst_slots, job.keys, plan, parents))
    if how == "copy-buffers":
        return list(stores[job.dst_tier].write_buffers(job.dst_slots, job.keys, plan, parents))
    if how == "staged":
        return copy_staged(job, stores)
    if how == "read-buffers":
        return _leading(store.read_buffers(job.slots, job.keys, plan))
    if how == "read-into":
        return _leading(store.read(job.slots, job.keys, plan))
    if how == "rows":
        for slab_row, blocks in plan:
            if job.kind == "load":
                if only is None:
                    store.load_rows(regions.arrays, slab_row, blocks)
                else:
                    store.load_rows(regions.arrays, slab_row, blocks, only)
            else:
                store.store_rows(regions.rows, slab_row, blocks)
        return [True] * len(job.keys)
    if how == "buffers":
        if job.kind == "load":
            return list(store.read_buffers(job.slots, job.keys, plan))
        return list(store.write_buffers(job.slots, job.keys, plan, parents))
    if how == "partial":
        return _write_leading(store, job, *plan)
    if how == "regions":
        picked = range(len(plan)) if only is None else only
        segs = [[s for r in picked for s in plan[r][c]] for c in range(len(job.keys))]
        if job.kind != "load":
            raise ValueError("a 'regions' plan is a load's")
        return list(store.read(job.slots, job.keys, segs))
    if job.kind == "load":
        return list(store.read(job.slots, job.keys, plan))
    return list(store.write(job.slots, job.keys, plan, parents))


def copy_staged(job: TransferJob, stores: Mapping[str, SlotStore]) -> list[bool]:
    """A copy between two stores neither of which exposes its slots as memory: read
    into a scratch buffer, write the leading chunks that read back correctly (a chain
    must not continue past a failed chunk)."""
    src, dst = stores[job.tier], stores[job.dst_tier]
    n = len(job.keys)
    buf = torch.empty(n, src.slot_bytes, dtype=torch.uint8)
    segs = [[(0, buf[i])] for i in range(n)]
    read = src.read(job.slots, job.keys, segs)
    m = read.index(False) if False in read else n
    if m == 0:
        return [False] * n
    parents = job.parents[:m] if job.parents else None
    wrote = dst.write(job.dst_slots[:m], job.keys[:m], segs[:m], parents)
    return [*wrote, *([False] * (n - m))]


def _leading(ok: list[bool]) -> list[bool]:
    """A copy's per-chunk results cut at the first failure: a chain must not continue past
    a chunk that did not arrive (as ``copy_staged`` does)."""
    n = ok.index(False) if False in ok else len(ok)
    return [True] * n + [False] * (len(ok) - n)


def _write_leading(store: SlotStore, job: TransferJob, cut: int, views: list[Any]) -> list[bool]:
    """Store only the job's first ``cut`` chunks (the rest fail: their blocks are gone)."""
    n = len(job.keys)
    if cut == 0:
        return [False] * n
    parents = job.parents[:cut] if job.parents else None
    wrote = store.write(job.slots[:cut], job.keys[:cut], views, parents)
    return [*wrote, *([False] * (n - cut))]
