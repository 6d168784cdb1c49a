"""Streaming row copies for host-memory KV: a ctypes binding of ``_rowcopy.c``.

The C side gathers or scatters whole rows with streaming (non-temporal) stores, which skip
the read of each destination line a plain copy makes first; see ``_rowcopy.c`` for why and
for its contract. ctypes drops the GIL for the whole call.

The library is built by ``pip install`` (an optional extension: no compiler, no library).
:func:`row_copier` returns None when it is missing, or with ``KVTIER_STREAM_COPY=0`` in the
environment; :mod:`kvtier.transfer.copy` then uses torch's and NumPy's copies.
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache

import numpy as np

from kvtier.native_lib import load_native

log = logging.getLogger(__name__)

_P = ctypes.c_void_p
_I = ctypes.c_int64


class RowCopier:
    """Gather and scatter of byte rows between a dense run of rows and rows picked by index.

    Arrays are 2-D NumPy views whose rows are contiguous bytes (any row stride); ``idx`` is
    contiguous int64. The caller guarantees bounds and keeps every array alive for the
    call (it is synchronous)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._gather = lib.kvt_gather_rows
        self._scatter = lib.kvt_scatter_rows
        for fn in (self._gather, self._scatter):
            fn.restype = None
            fn.argtypes = [_P, _I, _P, _I, _P, _I, _I]

    def gather(self, dense: np.ndarray, indexed: np.ndarray, idx: np.ndarray) -> None:
        """``dense[i] = indexed[idx[i]]``."""
        self._gather(
            dense.ctypes.data,
            dense.strides[0],
            indexed.ctypes.data,
            indexed.strides[0],
            idx.ctypes.data,
            idx.size,
            dense.shape[1],
        )

    def scatter(self, indexed: np.ndarray, idx: np.ndarray, dense: np.ndarray) -> None:
        """``indexed[idx[i]] = dense[i]``."""
        self._scatter(
            indexed.ctypes.data,
            indexed.strides[0],
            dense.ctypes.data,
            dense.strides[0],
            idx.ctypes.data,
            idx.size,
            dense.shape[1],
        )


@cache
def row_copier() -> RowCopier | None:
    """The streaming row copier, or None (not built, no streaming stores on this CPU, or
    ``KVTIER_STREAM_COPY=0``)."""
    lib = load_native("kvtier.transfer._rowcopy", "KVTIER_STREAM_COPY", "torch/NumPy copies")
    if lib is None:
        return None
    try:
        if not lib.kvt_streams():
            return None  # memcpy only: NumPy's and torch's copies are as good
        return RowCopier(lib)
    except AttributeError:
        log.warning("kvtier: the native row copies lack their functions; using torch/NumPy")
        return None
