"""The engine's KV cache seen as byte regions, for any block-major layout.

An engine hands over one tensor per layer (or one cross-layer tensor). Each has a *block
dimension*, which the engine declares (the caller passes it: kvtier never needs to guess
it from sizes, which is ambiguous whenever the block count equals another dimension);
dimensions after it must be dense, so one block of one tensor is a contiguous byte range.
The block dimension may hold a multiple of ``num_blocks`` entries (an engine that splits
each of its blocks into equal kernel blocks): block ``b`` is then entries
``b * k .. b * k + k - 1``, still one contiguous range. Dimensions before it (e.g. the
leading 2 of a ``[2, blocks, ...]`` K/V layout) split a tensor into several regions. A
region is then ``num_blocks`` equal rows of bytes.

A chunk's payload in a tier slot is region-major: region 0's blocks of the chunk, then
region 1's, ... so a run of consecutive engine blocks is one contiguous copy per region.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from kvtier.contract import Buffers, chunk_buffers
from kvtier.errors import ConfigError


class KVRegions:
    """Byte views of an engine's KV tensors.

    ``regions[r]`` is a 1-D uint8 view of ``num_blocks * row_bytes[r]`` bytes; the tensors
    stay owned by the engine and must outlive this object.
    """

    grouped = False
    """One block table (:class:`~kvtier.transfer.groups.GroupedRegions` says True)."""

    def __init__(
        self,
        regions: Sequence[torch.Tensor],
        row_bytes: Sequence[int],
        num_blocks: int,
        layer_regions: Mapping[str, Sequence[int]] | None = None,
    ):
        self.regions = list(regions)
        self.layer_regions = {k: list(v) for k, v in (layer_regions or {}).items()}
        """The region indices of each named tensor (an engine layer), in the order given;
        an alias of another tensor's storage maps to that tensor's regions. Empty when
        the tensors came without names."""
        self.row_bytes = list(row_bytes)
        self.num_blocks = num_blocks
        self.block_bytes = sum(self.row_bytes)
        self.rows = [
            r.view(num_blocks, rb) for r, rb in zip(self.regions, self.row_bytes, strict=True)
        ]
        """Region r as a 2-D ``[num_blocks, row_bytes[r]]`` view (same memory)."""
        self.arrays = [r.numpy() for r in self.rows] if not self.regions[0].is_cuda else []
        """NumPy views of ``rows`` for host-memory engines (same memory)."""
        self._bases: np.ndarray | None = None  # region addresses, for buffers()
        self._row_arr = np.array(self.row_bytes, dtype=np.int64)

    @classmethod
    def from_tensors(
        cls,
        tensors: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
        num_blocks: int,
        block_dim: int | Mapping[str, int] | None = None,
    ) -> KVRegions:
        """Build regions from per-layer tensors with ``num_blocks`` blocks each.

        ``block_dim``: the block dimension the engine declares, one for every tensor or,
        with ``tensors`` a mapping, one per tensor name (negative counts from the end).
        ``None`` falls back to a guess: the one dimension of size ``num_blocks``;
        ConfigError when none or several match. Tensors that share storage (aliases of one
        buffer at the same offset) are counted once.
        """
        names: list[str | None]
        if isinstance(tensors, Mapping):
            names, tensors = list(tensors.keys()), list(tensors.values())
        else:
            names = [None] * len(tensors)
        if isinstance(block_dim, Mapping):
            missing = [n for n in names if n not in block_dim]
            if missing:
                raise ConfigError(f"KV layout: no block dimension declared for {missing[0]!r}")
        regions: list[torch.Tensor] = []
        rows: list[int] = []
        seen: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        layer_regions: dict[str, list[int]] = {}
        for name, t in zip(names, tensors, strict=True):
            ident = (t.data_ptr(), tuple(t.shape))
            if ident in seen:
                if name is not None:
                    layer_regions[name] = seen[ident]
                continue
            mine: list[int] = []
            seen[ident] = mine
            if name is not None:
                layer_regions[name] = mine
            declared = block_dim.get(name or "") if isinstance(block_dim, Mapping) else block_dim
            dim = _block_dim(t, num_blocks, declared)
            outer = t.shape[:dim]
            for idx in itertools.product(*(range(s) for s in outer)):
                sub = t[idx] if idx else t
                if not sub.is_contiguous():
                    raise ConfigError(
                        f"KV layout: tensor of shape {tuple(t.shape)} strides {t.stride()} "
                        f"is not dense after its block dimension {dim}; unsupported layout"
                    )
                flat = sub.reshape(-1).view(torch.uint8)
                mine.append(len(regions))
                regions.append(flat)
                rows.append(flat.numel() // num_blocks)
        if not regions:
            raise ConfigError("KV layout: no KV tensors given")
        return cls(regions, rows, num_blocks, layer_regions)

    def chunk_bytes(self, blocks_per_chunk: int) -> int:
        """Payload bytes of a chunk of ``blocks_per_chunk`` blocks."""
        return blocks_per_chunk * self.block_bytes

    def segments(
        self, block_ids: Sequence[int], first_block: int, blocks_per_chunk: int
    ) -> list[tuple[int, torch.Tensor]]:
        """``(payload offset, engine view)`` pairs for chunk blocks
        ``first_block .. first_block + len(block_ids) - 1`` living in ``block_ids``.

        Consecutive engine blocks coalesce into one view per region.
        """
        runs: list[tuple[int, int, int]] = []  # (chunk-relative block, engine block, length)
        for j, b in enumerate(block_ids, start=first_block):
            if runs and runs[-1][1] + runs[-1][2] == b:
                j0, b0, n = runs[-1]
                runs[-1] = (j0, b0, n + 1)
            else:
                runs.append((j, b, 1))
        out: list[tuple[int, torch.Tensor]] = []
        base = 0
        for flat, rb in zip(self.regions, self.row_bytes, strict=True):
            for j, b, n in runs:
                out.append((base + j * rb, flat.narrow(0, b * rb, n * rb)))
            base += blocks_per_chunk * rb
        return out

    def buffers(self, block_ids: Sequence[int], skip: int, blocks_per_chunk: int) -> Buffers:
        """The chunks of a job (:class:`~kvtier.jobs.TransferJob` order: ``block_ids``
        chunk after chunk, the first chunk's leading ``skip`` blocks not moved, those become
        gaps) as :class:`~kvtier.contract.Buffers` into host-memory regions: what
        :meth:`segments` gives per chunk, without a tensor view per block. ValueError for
        block ids outside the regions (never an address outside them) or a block count
        that is not whole chunks."""
        if not self.arrays:
            raise ValueError("KVRegions.buffers: regions are not in host memory")
        ids = np.asarray(block_ids, dtype=np.int64)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.num_blocks):
            raise ValueError(f"block ids outside [0, {self.num_blocks})")
        if (skip + ids.size) % blocks_per_chunk or not 0 <= skip < blocks_per_chunk:
            raise ValueError(
                f"{ids.size} block ids (skip {skip}) are not whole chunks of {blocks_per_chunk}"
            )
        rows = np.concatenate([np.full(skip, -1, dtype=np.int64), ids]) if skip else ids
        if self._bases is None:
            self._bases = np.array([r.data_ptr() for r in self.regions], dtype=np.uint64)
        return chunk_buffers(self._bases, self._row_arr, rows, blocks_per_chunk)


def _block_dim(t: torch.Tensor, num_blocks: int, block_dim: int | None) -> int:
    if block_dim is not None:
        dim = block_dim if block_dim >= 0 else t.dim() + block_dim
        if not 0 <= dim < t.dim() or t.shape[dim] % num_blocks or t.shape[dim] == 0:
            raise ConfigError(
                f"KV layout: dimension {block_dim} of shape {tuple(t.shape)} does not hold "
                f"{num_blocks} blocks"
            )
        return dim
    matches = [d for d, s in enumerate(t.shape) if s == num_blocks]
    if len(matches) != 1:
        raise ConfigError(
            f"KV layout: cannot tell the block dimension of shape {tuple(t.shape)} "
            f"({num_blocks} blocks); pass block_dim"
        )
    return matches[0]
