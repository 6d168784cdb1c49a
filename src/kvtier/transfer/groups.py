"""KV caches of several block tables (KV-cache groups), addressed by one id per position.

An engine with several KV-cache groups (vLLM's hybrid KV-cache manager: sliding-window
and full-attention layers, or layers of different shapes) gives every group its own
block table: the token block at position ``j`` of a request lives in block ``ids[g][j]``
of group ``g``'s layers. kvtier's scheduler and jobs speak one block id per position, so
:class:`BlockIdCodec` packs the per-group ids of a position into one integer and
:class:`GroupedRegions` copies each group's layers from its own block.

A group may hold the engine's *null block* at a position (a sliding-window group frees
blocks that left the window and puts the null block in their place). A load skips those
(nothing will read them); a chunk with one cannot be stored (its bytes are gone), which
:meth:`GroupedRegions.storable_chunks` tells the transfer engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvtier.transfer.regions import KVRegions

NULL_BLOCK = 0
"""vLLM's null block id: its block pool reserves block 0 as the placeholder of freed
positions, and never hands it to a request as a real block."""


class BlockIdCodec:
    """Per-group block ids of one position <-> one non-negative integer.

    ``encode(ids)[j] = sum(ids[g][j] * num_blocks**g)``: with one group the id is unchanged
    (dense models pay nothing). The integers are Python ints (unbounded); they cross
    vLLM's scheduler/worker boundary inside the step plan, which vLLM pickles.
    """

    def __init__(self, num_groups: int, num_blocks: int) -> None:
        if num_groups < 1 or num_blocks < 1:
            raise ValueError(f"BlockIdCodec: {num_groups} groups of {num_blocks} blocks")
        self.num_groups = num_groups
        self.num_blocks = num_blocks

    def encode(self, per_group: Sequence[Sequence[int]]) -> Sequence[int]:
        """One id per position; positions beyond the shortest group's list are dropped
        (a position is usable only where every group has a block). With one group, that
        group's list itself (no copy: this runs per scheduled request per step)."""
        if len(per_group) != self.num_groups:
            raise ValueError(f"BlockIdCodec: {len(per_group)} block lists for {self.num_groups}")
        if self.num_groups == 1:
            return per_group[0]
        n = min(len(ids) for ids in per_group)
        out = [0] * n
        scale = 1
        for ids in per_group:
            for j in range(n):
                out[j] += ids[j] * scale
            scale *= self.num_blocks
        return out

    def decode(self, v: int) -> tuple[int, ...]:
        """The per-group ids of one position."""
        out = []
        for _ in range(self.num_groups):
            v, b = divmod(v, self.num_blocks)
            out.append(b)
        return tuple(out)

    def real_blocks(self, ids: Sequence[int]) -> set[int]:
        """Every group's engine block behind ``ids``, null block excluded."""
        return {b for v in ids for b in self.decode(v) if b != NULL_BLOCK}


class GroupedRegions:
    """Regions of several groups, copied with ids from :class:`BlockIdCodec`.

    Offers what :class:`~kvtier.transfer.engine.TransferEngine` uses of
    :class:`KVRegions`; a chunk's payload is region-major over all groups' regions in
    group order (group 0's regions first), the same layout ``row_bytes`` describes.
    """

    grouped = True

    def __init__(self, groups: Sequence[KVRegions], codec: BlockIdCodec) -> None:
        if len(groups) != codec.num_groups:
            raise ValueError(f"GroupedRegions: {len(groups)} groups, codec for {codec.num_groups}")
        self.groups = list(groups)
        self.codec = codec
        self.num_blocks = codec.num_blocks
        self.regions = [r for g in self.groups for r in g.regions]
        self.row_bytes = [rb for g in self.groups for rb in g.row_bytes]
        self.rows = [r for g in self.groups for r in g.rows]
        self.arrays = [a for g in self.groups for a in g.arrays]
        self.block_bytes = sum(self.row_bytes)

    def chunk_bytes(self, blocks_per_chunk: int) -> int:
        """Payload bytes of a chunk of ``blocks_per_chunk`` positions."""
        return blocks_per_chunk * self.block_bytes

    def segments(
        self, block_ids: Sequence[int], first_block: int, blocks_per_chunk: int
    ) -> list[tuple[int, torch.Tensor]]:
        """As :meth:`KVRegions.segments`; null-block positions of a group are left out."""
        decoded = [self.codec.decode(v) for v in block_ids]
        out: list[tuple[int, torch.Tensor]] = []
        base = 0
        for g, regions in enumerate(self.groups):
            runs: list[tuple[int, int, int]] = []  # (chunk-relative block, engine block, n)
            for j, ids in enumerate(decoded, start=first_block):
                b = ids[g]
                if b == NULL_BLOCK:
                    continue
                if runs and runs[-1][0] + runs[-1][2] == j and runs[-1][1] + runs[-1][2] == b:
                    j0, b0, n = runs[-1]
                    runs[-1] = (j0, b0, n + 1)
                else:
                    runs.append((j, b, 1))
            for flat, rb in zip(regions.regions, regions.row_bytes, strict=True):
                for j, b, n in runs:
                    out.append((base + j * rb, flat.narrow(0, b * rb, n * rb)))
                base += blocks_per_chunk * rb
        return out

    def storable_chunks(self, chunks: Sequence[tuple[int, Sequence[int]]]) -> int:
        """How many leading chunks (``TransferJob.chunk_blocks``) hold no null block."""
        for i, (_, ids) in enumerate(chunks):
            if any(NULL_BLOCK in self.codec.decode(v) for v in ids):
                return i
        return len(chunks)
