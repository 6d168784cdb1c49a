"""The hash under chunk keys: a chain of keyed BLAKE3 calls, native when built.

``chain(key, prev, data, step, extras)`` returns ``n = len(data) // step`` digests of 32
bytes, ``out[i] = BLAKE3(key, out[i-1] || extras[i] || data[i*step:(i+1)*step])`` with
``out[-1] = prev`` and ``extras[i]`` the i-th 32 bytes of ``extras`` (zeros when None).
Every message has the same length for one ``step``, so the parts of a message are fixed
fields and distinct inputs are distinct messages.

The scheduler's keys go one step further natively: :func:`chain_keys` turns a list of token
ids into the list of chunk keys in one call (ids to bytes, the chain, the keys' tags and
bytes objects), where the Python path converts the ids, calls :func:`chain` and slices keys.

Two implementations give byte-identical output: ``_keychain.c`` (built by ``pip install``
as an optional extension, loaded with ctypes, one call per chain) and the ``blake3``
package (one call per chunk, several times slower: docs/benchmarks.md, "Measurements
behind design choices"). ``KVTIER_KEYS_NATIVE=0`` in the environment forces the package path.
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache
from typing import TYPE_CHECKING

from kvtier.native_lib import load_native

if TYPE_CHECKING:
    from blake3 import blake3 as Blake3

log = logging.getLogger(__name__)

DIGEST_BYTES = 32
"""Bytes of one chain digest (and of ``prev`` and each ``extras`` entry)."""
KEY_LEN = 32
"""Bytes of a BLAKE3 key."""

_ZERO = bytes(DIGEST_BYTES)


class _Native:
    def __init__(self, lib: ctypes.CDLL, pylib: ctypes.PyDLL) -> None:
        self._chain = lib.kvt_chain
        self._chain.restype = ctypes.c_int
        self._chain.argtypes = [
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_void_p,
        ]
        # Through PyDLL: it builds Python objects, so it must run holding the GIL (it
        # releases it while hashing) and its exceptions propagate. A library built before
        # it existed still serves the chain.
        self._keys = getattr(pylib, "kvt_keys", None)
        if self._keys is not None:
            self._keys.restype = ctypes.py_object
            self._keys.argtypes = [
                ctypes.py_object,
                ctypes.c_ssize_t,
                ctypes.c_ssize_t,
                ctypes.c_ssize_t,
                ctypes.c_char_p,
                ctypes.c_void_p,
                ctypes.c_char_p,
                ctypes.c_char_p,
                ctypes.c_ssize_t,
            ]

    def chain(self, key: bytes, prev: bytes, data: bytes, step: int, extras: bytes | None) -> bytes:
        n = len(data) // step
        out = ctypes.create_string_buffer(n * DIGEST_BYTES)
        if self._chain(key, prev, n, step, data, extras, out) != 0:
            raise MemoryError("kvtier: chunk key chain: out of memory")
        return out.raw

    def keys(
        self,
        tokens: list[int],
        start: int,
        n: int,
        chunk: int,
        key: bytes,
        last: bytearray,
        extras: bytes | None,
        tag: bytes | None,
        base: int,
    ) -> list[bytes]:
        assert self._keys is not None
        buf = (ctypes.c_char * DIGEST_BYTES).from_buffer(last)
        out: list[bytes] = self._keys(tokens, start, n, chunk, key, buf, extras, tag, base)
        return out


@cache
def _native() -> _Native | None:
    lib = load_native("kvtier._keychain", "KVTIER_KEYS_NATIVE", "the blake3 package")
    if lib is None:
        return None
    try:
        return _Native(lib, ctypes.PyDLL(lib._name))
    except AttributeError:
        log.warning("kvtier: the native chunk-key hash lacks its functions; using blake3")
        return None


def _blake3() -> type[Blake3]:
    """The blake3 package's hasher, imported on first use: code that never hashes a key
    (the worker-side data path, ``benchmarks/gpu_check.py`` on a machine without the
    package) imports kvtier without it."""
    from blake3 import blake3

    return blake3


def is_native() -> bool:
    """Whether :func:`chain` runs the native implementation."""
    return _native() is not None


def chain_python(
    key: bytes, prev: bytes, data: bytes, step: int, extras: bytes | None = None
) -> bytes:
    """:func:`chain` with the blake3 package (the reference the native path must match)."""
    out = []
    h = _blake3()
    n = len(data) // step
    for i in range(n):
        x = extras[i * DIGEST_BYTES : (i + 1) * DIGEST_BYTES] if extras else _ZERO
        prev = h(prev + x + data[i * step : (i + 1) * step], key=key).digest()
        out.append(prev)
    return b"".join(out)


def native_keys() -> _Native | None:
    """The native implementation (its ``keys`` is :meth:`kvtier.keys.KeyChain.update`'s
    one-call path), or None when the package path runs."""
    native = _native()
    return native if native is not None and native._keys is not None else None


def chain(key: bytes, prev: bytes, data: bytes, step: int, extras: bytes | None = None) -> bytes:
    """The chain's digests (see the module docstring), ``len(data) // step`` of them."""
    if len(key) != KEY_LEN or len(prev) != DIGEST_BYTES or step <= 0:
        raise ValueError("chain: key and prev must be 32 bytes, step > 0")
    n = len(data) // step
    if extras is not None and len(extras) != n * DIGEST_BYTES:
        raise ValueError(f"chain: extras must be {n * DIGEST_BYTES} bytes, got {len(extras)}")
    native = _native()
    if native is None or n == 0:
        return chain_python(key, prev, data, step, extras)
    return native.chain(key, prev, data, step, extras)


def keyed_hash(key: bytes, data: bytes) -> bytes:
    """BLAKE3 of ``data`` under ``key``: 32 bytes."""
    return _blake3()(data, key=key).digest()


def derive_key(context: str, material: bytes) -> bytes:
    """A 32-byte BLAKE3 key derived from ``material`` in ``context`` (BLAKE3's KDF mode)."""
    return _blake3()(material, derive_key_context=context).digest()
