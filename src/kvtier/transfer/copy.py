"""Batched copies of byte segments and rows."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvtier.transfer.native import row_copier

_foreach_copy = getattr(torch, "_foreach_copy_", None)

STREAM_MIN_BYTES = 256 << 10
"""Row copies of at least this many bytes in one call use streaming stores
(:mod:`kvtier.transfer.native`): 1.4-1.7x a plain copy's bandwidth, and the destination is
left out of the cache. Below it, a plain copy: a small load's rows stay in cache for the
attention that reads them next, and the plain copy's cost is small anyway."""


def copy_segments(
    dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor], *, non_blocking: bool = False
) -> None:
    """``dst[i].copy_(src[i])`` for every i, in one call when torch allows.

    The generic path (device copies, stores without a batched row path): one
    ``_foreach_copy_`` call loops in C++, so per-segment cost is a few hundred nanoseconds
    instead of a Python-level ``copy_`` each. Falls back to a Python loop on torch builds
    without it.
    """
    if not dst:
        return
    if _foreach_copy is not None:
        _foreach_copy(list(dst), list(src), non_blocking=non_blocking)
        return
    for d, s in zip(dst, src, strict=True):
        d.copy_(s, non_blocking=non_blocking)


def gather_rows(dst: torch.Tensor, src: torch.Tensor, rows: torch.Tensor) -> None:
    """``dst[i] = src[rows[i]]`` for 2-D byte ``src``/``dst`` (dst contiguous): one batched
    gather. Raises IndexError for a row outside ``src``."""
    if not dst.is_cuda and not src.is_cuda and _streams(dst.numel()):
        _stream_gather(dst.numpy(), src.numpy(), rows.numpy())
        return
    torch.index_select(src, 0, rows, out=dst)


def scatter_rows(dst: np.ndarray, rows: np.ndarray, src: np.ndarray) -> None:
    """``dst[rows[i]] = src[i]`` on host arrays: one batched scatter. Raises IndexError for
    a row outside ``dst``.

    Without streaming stores, NumPy's fancy-index assignment: a C loop at memcpy speed that
    releases the GIL (torch's CPU ``index_copy_``/``index_put_`` kernels are far slower
    on byte rows: docs/benchmarks.md, "Measurements behind design choices").
    """
    copier = row_copier() if _streams(src.nbytes) else None
    if copier is not None and _rows_ok(dst, src, rows):
        copier.scatter(dst, _checked(rows, dst.shape[0]), src)
        return
    dst[rows] = src


def _streams(nbytes: int) -> bool:
    return nbytes >= STREAM_MIN_BYTES and row_copier() is not None


def _stream_gather(dst: np.ndarray, src: np.ndarray, rows: np.ndarray) -> None:
    copier = row_copier()
    if copier is not None and _rows_ok(src, dst, rows):
        copier.gather(dst, src, _checked(rows, src.shape[0]))
        return
    dst[:] = src[rows]


def _rows_ok(indexed: np.ndarray, dense: np.ndarray, rows: np.ndarray) -> bool:
    """Whether the C copier takes these: 2-D byte arrays of equal, contiguous rows, one
    dense row per index."""
    return (
        indexed.ndim == 2
        and dense.ndim == 2
        and indexed.itemsize == 1
        and dense.itemsize == 1
        and indexed.strides[1] == 1
        and dense.strides[1] == 1
        and indexed.shape[1] == dense.shape[1]
        and rows.ndim == 1
        and rows.shape[0] == dense.shape[0]
    )


def _checked(rows: np.ndarray, bound: int) -> np.ndarray:
    """``rows`` as contiguous int64, every entry in ``[0, bound)`` (the C side trusts it)."""
    idx = np.ascontiguousarray(rows, dtype=np.int64)
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= bound):
        raise IndexError(f"row index out of range [0, {bound})")
    return idx
