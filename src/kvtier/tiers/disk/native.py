"""The disk tier's native data path: a ctypes binding of ``_slabio.c``.

The C side moves chunks between files and memory in cache-sized pieces (several small chunks
of consecutive slots in one piece), hashing each piece while it is in cache, and writes slot
headers; see ``_slabio.c`` for its contract and the piece sizes.
ctypes drops the GIL for the whole call, so the I/O threads of a :class:`DiskSlab` run
their parts of a batch in parallel.

The library is built by ``pip install`` (an optional extension: no compiler, no library).
Its XXH3 functions come from the ``xxhash`` package at run time, so both data paths compute
the same checksums. :func:`native_io` returns None when the library or those functions
cannot be found; the disk tier then uses its Python path.
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache
from typing import Any

import numpy as np
import numpy.typing as npt

from kvtier.native_lib import load_native

log = logging.getLogger(__name__)

OK, IO_ERROR, CORRUPT = 0, 1, 2
"""Per-chunk status codes of :meth:`NativeIO.read` and :meth:`NativeIO.write`."""

_I64 = npt.NDArray[np.int64]
_U64 = npt.NDArray[np.uint64]
_P = ctypes.c_void_p


def _xxh3_functions() -> list[int] | None:
    """Addresses of the XXH3 streaming and one-shot functions in the xxhash package's
    extension (its dispatching variants where it has them: AVX2 where the CPU has it)."""
    import xxhash._xxhash as ext  # type: ignore[import-not-found]  # its file is loaded

    try:
        lib = ctypes.CDLL(ext.__file__)
    except OSError:
        return None

    def addr(*names: str) -> int | None:
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                return ctypes.cast(fn, _P).value
        return None

    found = [
        addr("XXH3_createState"),
        addr("XXH3_freeState"),
        addr("XXH3_64bits_reset_withSeed"),
        addr("XXH3_64bits_update_dispatch", "XXH3_64bits_update"),
        addr("XXH3_64bits_digest"),
        addr("XXH3_64bits_withSeed_dispatch", "XXH3_64bits_withSeed"),
    ]
    if any(a is None for a in found):
        return None
    return [a for a in found if a is not None]


class NativeIO:
    """Batched, checksummed slot I/O. Arrays are NumPy, one entry per chunk unless noted;
    ``iov_start`` has one entry more (chunk i's buffers are ``iov_start[i]:iov_start[i+1]``
    of ``iov_ptr``/``iov_len``, addresses and byte counts). The caller keeps every buffer
    alive and unchanged for the call."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._read = lib.kvt_read
        self._read.restype = ctypes.c_int
        self._read.argtypes = [ctypes.c_int64, *[_P] * 5, ctypes.c_uint64, *[_P] * 3]
        self._write = lib.kvt_write
        self._write.restype = ctypes.c_int
        self._write.argtypes = [ctypes.c_int64, *[_P] * 5, ctypes.c_uint64, *[_P] * 5]

    def read(
        self,
        fds: npt.NDArray[np.int32],
        offs: _I64,
        iov_start: _I64,
        iov_ptr: _U64,
        iov_len: _U64,
        pad: int,
        seeds: _U64,
        sums: _U64,
    ) -> npt.NDArray[np.uint8]:
        """Read each chunk and check it hashes (seed ``seeds[i]``) to ``sums[i]``; ``pad``
        bytes of padding follow each payload in the file. Returns per-chunk status: OK,
        IO_ERROR or CORRUPT."""
        status = np.zeros(len(fds), dtype=np.uint8)
        self._call(self._read, status, (fds, offs, iov_start, iov_ptr, iov_len), pad,
                   (seeds, sums, status))  # fmt: skip
        return status

    def write(
        self,
        fds: npt.NDArray[np.int32],
        offs: _I64,
        iov_start: _I64,
        iov_ptr: _U64,
        iov_len: _U64,
        pad: int,
        seeds: _U64,
        headers: npt.NDArray[np.uint8],
        hdr_offs: _I64,
    ) -> tuple[npt.NDArray[np.uint8], _U64]:
        """Write each chunk plus ``pad`` zero bytes, then its header (``headers``: n x 128
        prepared headers whose two checksum fields are filled in here; a failed chunk's
        header is zeroed and still written). Returns (status, payload checksums)."""
        status = np.zeros(len(fds), dtype=np.uint8)
        sums = np.zeros(len(fds), dtype=np.uint64)
        self._call(self._write, status, (fds, offs, iov_start, iov_ptr, iov_len), pad,
                   (seeds, headers, hdr_offs, sums, status))  # fmt: skip
        return status, sums

    @staticmethod
    def _call(
        fn: Any, status: npt.NDArray[np.uint8], io: tuple[Any, ...], pad: int, rest: tuple[Any, ...]
    ) -> None:
        """``fn(n, *io, pad, *rest)`` with each array passed by address; a call that fails
        as a whole marks every chunk IO_ERROR."""
        if fn(len(status), *(a.ctypes.data for a in io), pad, *(a.ctypes.data for a in rest)):
            status[:] = IO_ERROR


@cache
def native_io() -> NativeIO | None:
    """The native data path, or None (no built library, no XXH3 functions, or
    ``KVTIER_DISK_NATIVE=0`` in the environment)."""
    lib = load_native("kvtier.tiers.disk._slabio", "KVTIER_DISK_NATIVE", "the Python disk path")
    if lib is None:
        return None
    fns = _xxh3_functions()
    if fns is None:
        log.warning("kvtier: xxhash exposes no XXH3 functions; using the Python disk path")
        return None
    try:
        if lib.kvt_init(*[_P(a) for a in fns]) != 0:
            return None
    except AttributeError:
        log.warning("kvtier: the native disk I/O lacks its functions; using the Python path")
        return None
    return NativeIO(lib)
