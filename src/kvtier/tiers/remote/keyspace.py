"""Key names of chunks in a remote store.

``kvt4:<tenant>:<model>:{<tag>}<rest>:<rank>`` in ASCII:

- ``<tenant>``: 16 hex digits labelling the deployment's namespace text
  (``KVTierConfig.namespace``), ``<model>`` 16 labelling ``Namespace.model``: a purge
  selects one tenant, one model, or both, with one SCAN MATCH glob (:func:`purge_pattern`).
- ``{<tag>}<rest>``: the chunk, from its key; the chunk key is seeded by the whole
  namespace (model, KV geometry, parallel layout, namespace text, cache salt), so names of
  different layouts never meet. ``<tag>`` is the group tag (:data:`kvtier.keys.TAG_BYTES`):
  in a Redis Cluster each group of :data:`kvtier.keys.GROUP_CHUNKS` consecutive chunks of
  a chain (every rank) lands in one slot, so a probe counts a group with one multi-key
  EXISTS, while a chain's groups spread over every node.
- ``<rank>``: the tensor-parallel shard.

Without a secret, the labels are BLAKE3 hashes and ``<tag><rest>`` is the chunk key's hex.
With a secret (``secret_env`` / ``secret_file``) every part is keyed: the labels are keyed
BLAKE3, the tag and rest AES-CMAC (NIST SP 800-38B) of the group tag and of the key under
a subkey (:func:`kvtier.tiers.remote.auth.subkey`), so a SCAN user (SCAN ignores ACL key
patterns) learns nothing it can test a guessed prompt against, and engines with different
secrets see different names (no hits between them, no errors). Hex keeps the names
printable and keeps ``{``/``}`` bytes from moving the hash tag.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Sequence

import blake3
import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from kvtier.keys import KEY_BYTES, TAG_BYTES, Key, Namespace
from kvtier.tiers.remote.auth import subkey

PREFIX = b"kvt4:"

TAG_CHARS = 2 * TAG_BYTES
"""Hex digits of a name's hash tag: the first TAG_CHARS bytes of its middle part."""

LABEL_BYTES = 8
"""Bytes of a tenant or model label (16 hex digits)."""

_BLOCK = 16
_REST_KEYED = min(_BLOCK, KEY_BYTES - TAG_BYTES)
"""Bytes after the tag of a keyed name (one AES-CMAC output, at most)."""
assert KEY_BYTES < 2 * _BLOCK, "a keyed name hashes a key as one two-block message"


def _label(kind: bytes, text: str, key: bytes | None) -> bytes:
    data = kind + b"\x00" + text.encode()
    h = blake3.blake3(data, key=key) if key else blake3.blake3(data)
    return h.digest(LABEL_BYTES).hex().encode()


_REST_CHARS = 2 * (KEY_BYTES - TAG_BYTES)
assert _REST_CHARS == 2 * _REST_KEYED, "keyed and plain names have one shape"

NAME_RE = re.compile(
    re.escape(PREFIX)
    + rb"(?P<tenant>[0-9a-f]{%d}):(?P<model>[0-9a-f]{%d}):\{[0-9a-f]{%d}\}[0-9a-f]{%d}:[0-9]+"
    % (2 * LABEL_BYTES, 2 * LABEL_BYTES, TAG_CHARS, _REST_CHARS)
)
"""Exactly the names kvtier writes, keyed or not (``fullmatch``); groups ``tenant`` and
``model`` are the labels :func:`purge_pattern` selects by."""


def is_chunk_name(name: bytes) -> bool:
    """Whether ``name`` has the shape of a kvtier chunk name (a purge removes no other)."""
    return NAME_RE.fullmatch(name) is not None


def purge_pattern(namespace_text: str | None, model: str | None, secret: bytes | None) -> bytes:
    """A SCAN MATCH glob of every chunk name of one tenant (``namespace_text``, the engines'
    ``KVTierConfig.namespace``; ``""`` is the default namespace), of one model (the
    engines' ``Namespace.model``), of both, or (both None) of every kvtier chunk. ``secret``
    is the tier's secret as :func:`kvtier.tiers.remote.auth.load_secret` returns it (None
    without one): names written under a secret match only the pattern built with it, and
    the pattern reveals neither the text nor the model. Every rank, every layout, MAC and
    AEAD values alike. Globs only (no ``[``/``]``/``\\`` in a label: they are hex)."""
    key = subkey(secret, "names") if secret else None
    tenant = b"*" if namespace_text is None else _label(b"tenant", namespace_text, key)
    model_part = b"*" if model is None else _label(b"model", model, key)
    return PREFIX + tenant + b":" + model_part + b":*"


class _Cmac:
    """AES-CMAC of many 32-byte messages at once (two ECB passes): a keyed name costs about
    as little as a hex one, where a keyed hash per key costs a Python call each."""

    def __init__(self, key: bytes) -> None:
        self._ecb = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
        top = int.from_bytes(self._ecb.update(bytes(_BLOCK)), "big")
        k1 = ((top << 1) & ((1 << 128) - 1)) ^ (0x87 if top >> 127 else 0)
        self._k1 = np.frombuffer(k1.to_bytes(_BLOCK, "big"), dtype=np.uint8)

    def rows(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """CMAC tags (n x 16) of n 32-byte messages, given as their first and second
        blocks (two contiguous n x 16 uint8 arrays: a strided half cost 10x the AES)."""
        n = len(first)
        c1 = np.frombuffer(self._ecb.update(first.tobytes()), dtype=np.uint8).reshape(n, _BLOCK)
        last = c1 ^ second ^ self._k1
        return np.frombuffer(self._ecb.update(last.tobytes()), dtype=np.uint8).reshape(n, _BLOCK)


class KeySpace:
    """Names of one namespace's chunks (all ranks); keyed when given the tier's secret
    (``encrypt``: the tier's values are AEAD, whose names differ from MAC values')."""

    def __init__(
        self, namespace: Namespace, secret: bytes | None = None, encrypt: bool = False
    ) -> None:
        labels = subkey(secret, "names") if secret else None
        self.prefix = (
            PREFIX
            + _label(b"tenant", namespace.extra, labels)
            + b":"
            + _label(b"model", namespace.model, labels)
            + b":{"
        )
        self._cmac = (
            _Cmac(subkey(secret, "chunks-aead" if encrypt else "chunks-mac")) if secret else None
        )
        rest = _REST_KEYED if secret else KEY_BYTES - TAG_BYTES
        self.width = TAG_CHARS + 1 + 2 * rest
        """Bytes of a name's middle part: tag, closing brace, rest."""

    def name(self, key: Key, rank: int) -> bytes:
        return self.names([key], rank)[0]

    def names(self, keys: Sequence[Key], rank: int) -> list[bytes]:
        p, r, w = self.prefix, b":" + str(rank).encode(), self.width
        mids = self.mids(keys)
        return [p + mids[o : o + w] + r for o in range(0, len(mids), w)]

    def mids(self, keys: Sequence[Key]) -> bytes:
        """The middle parts of the chunks' names, concatenated: chunk i's names are
        ``prefix + mids[i * width : (i + 1) * width] + suffix(rank)``. One call for the
        whole chain (the rows of one array), a few times faster than key by key
        (docs/benchmarks.md, "Measurements behind design choices")."""
        n = len(keys)
        raw = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(n, KEY_BYTES)
        if self._cmac is not None:
            # Two 32-byte messages per key, told apart by their last byte: the group tag
            # (the same for a group's chunks, so they share a slot) and the whole key.
            first = np.zeros((2 * n, _BLOCK), dtype=np.uint8)
            second = np.zeros((2 * n, _BLOCK), dtype=np.uint8)
            first[:n, :TAG_BYTES] = raw[:, :TAG_BYTES]
            second[:n, -1] = 1
            head = min(_BLOCK, KEY_BYTES)
            first[n:, :head] = raw[:, :head]
            second[n:, : KEY_BYTES - head] = raw[:, head:]
            second[n:, -1] = 2
            tags = self._cmac.rows(first, second)
            raw = np.concatenate([tags[:n, :TAG_BYTES], tags[n:, :_REST_KEYED]], axis=1)
        hexed = np.frombuffer(binascii.hexlify(raw.tobytes()), dtype=np.uint8)
        hexed = hexed.reshape(n, self.width - 1)
        rows = np.empty((n, self.width), dtype=np.uint8)
        rows[:, :TAG_CHARS] = hexed[:, :TAG_CHARS]
        rows[:, TAG_CHARS] = ord("}")
        rows[:, TAG_CHARS + 1 :] = hexed[:, TAG_CHARS:]
        return rows.tobytes()

    @staticmethod
    def suffixes(world: int) -> list[bytes]:
        return [b":" + str(r).encode() for r in range(world)]
