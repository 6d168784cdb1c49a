"""Chunk keys: a cryptographic chained hash of a request's inputs, seeded by a namespace.

Construction (format 3). With ``H(m) = BLAKE3(m)`` in keyed mode under the deployment's
*hash key* (see below), ``frame`` the length-prefixed encoding of :mod:`kvtier.keyinputs`
and token ids as 4-byte little-endian unsigned integers:

- seed ``s = H("kvtier-seed-v3" || frame(namespace.chain_digest(), request inputs))``,
  where the request inputs are the cache salt and the LoRA name, path and int id
  (:meth:`KeyInputs.seed_text`); the namespace covers model identity, KV geometry and
  dtype, parallel layout and the deployment's namespace text;
- ``d(-1) = H("kvtier-chain-v3" || s)``; ``d(i) = H(d(i-1) || x(i) || tokens of chunk i)``,
  32 bytes each, where ``x(i)`` is 32 zero bytes, or, when chunk i has inputs of its own
  (multimodal items overlapping it: identifier, offset relative to the chunk's first
  token, length, modality, embed-mask digest; the digest of its prompt embeddings),
  ``H("kvtier-chunk-v3" || those inputs framed)``. Everything after an image depends on it
  through the chain.
- key ``i`` = ``d(g)[0:4] || d(i)[4:20]`` (KEY_BYTES = 20): a TAG_BYTES group tag (``g``
  the first chunk of i's group of GROUP_CHUNKS) and 128 bits of ``d(i)``.

Equal keys therefore mean equal inputs (token prefix, images, embeddings, LoRA, salt) under
the same model, geometry, layout and hash key, up to 128-bit collision resistance of
BLAKE3: 2^64 work for a birthday collision and 2^128 to hit a given key, where the former
xxh3-128 chain (16-byte keys, 96 bits after the tag) was not designed to resist a chosen
collision at all. The tensor-parallel rank is not in the key (every rank shares the
scheduler's keys); it is in :meth:`Namespace.digest`, which every envelope carries, and in
:func:`rank_key` for shared stores.

Hash key: ``derive_key("kvtier 2026-12 chunk-key hash v3", secret)``, the secret being the
deployment's ``key_secret_env``/``key_secret_file`` (empty when not configured: a public key,
so anyone can compute keys). With a secret, keys are a PRF of the inputs: someone who can
read key names in a shared store (a SCAN user, a disk-directory reader) but lacks the
secret can neither test a guessed prompt against them nor place a value under a key a
victim will look up. It does not protect against a holder of the secret, nor hide the
existence of a hit from request timing.

Keys depend on nothing else: not on ``PYTHONHASHSEED``, not on vLLM's per-process hash
seed, not on the process, host or restart; the native and Python paths of
:mod:`kvtier.keyhash` give the same bytes.

The tag lets a shared store place a chain's neighbours together from the key alone: a Redis
Cluster hashes a chunk's name by its tag, so each group of GROUP_CHUNKS chunks lives in one
slot and a lookup counts a group with one multi-key EXISTS, while a chain's groups spread
over every node.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from kvtier import keyhash
from kvtier.keyinputs import NO_INPUTS, KeyInputs, frame

Key = bytes
"""A chunk key: KEY_BYTES bytes."""

TAG_BYTES = 4
"""Leading bytes of a key that are its group's tag."""

HASH_BYTES = 16
"""Bytes of a key after its tag: 128 bits of the chained hash."""

KEY_BYTES = TAG_BYTES + HASH_BYTES

GROUP_CHUNKS = 16
"""Consecutive chunks of a chain that share a group tag (512 tokens of 32-token chunks)."""

NS_BYTES = 16
"""Bytes of :meth:`Namespace.chain_digest` and :meth:`Namespace.digest`."""

KEY_FORMAT = 3
"""Version of the key construction (in the module docstring); stored formats that hold keys
(disk slots, envelopes) change their own version with it."""

HASH_KEY_CONTEXT = "kvtier 2026-12 chunk-key hash v3"
PUBLIC_HASH_KEY = bytes.fromhex("47c77dd796491b71dd6728bb9cfc1ec8d03106334a73c4d6475b7dd6e3aaf6fe")
"""The hash key without a secret: ``derive_key(HASH_KEY_CONTEXT, b"")``, written out (a
test checks it) so that importing kvtier needs no blake3 (the worker-side data path on a
machine without the package: ``benchmarks/gpu_check.py``)."""

_CHAIN_START = b"kvtier-chain-v3"
_SEED = b"kvtier-seed-v3"
_CHUNK = b"kvtier-chunk-v3"


def hash_key_of(secret: bytes) -> bytes:
    """The 32-byte hash key for a secret (b"": :data:`PUBLIC_HASH_KEY`)."""
    return keyhash.derive_key(HASH_KEY_CONTEXT, secret) if secret else PUBLIC_HASH_KEY


@dataclass(frozen=True)
class Namespace:
    """What must be equal for two engines to share KV."""

    model: str
    """Model identity (name or path, plus revision if any)."""
    layout_digest: str
    """KVLayout.digest(): geometry and dtype."""
    parallel: str = "tp1"
    """Parallel layout, e.g. "tp2pp1"; with :attr:`rank` it names this worker's shard
    ("tp2pp1/rank1" in :meth:`digest`)."""
    extra: str = ""
    """Deployment-chosen namespace text (KVTierConfig.namespace)."""
    rank: int = 0
    """This worker's shard (tensor-parallel rank). Chunk keys are the same on every rank
    (the scheduler computes them once); the bytes differ, so envelopes carry the rank's
    :meth:`digest` and shared stores keep one value per rank (:func:`rank_key`)."""
    secret: bytes = dataclasses.field(default=b"", repr=False)
    """The deployment's key secret (b"": none); keys the chunk-key hash (module docstring)."""

    @cached_property
    def hash_key(self) -> bytes:
        """The 32-byte BLAKE3 key of every chunk-key hash of this namespace."""
        return hash_key_of(self.secret)

    def chain_digest(self) -> bytes:
        """NS_BYTES identifying what every rank shares: the seed of every chain."""
        text = frame("kvtier-ns-v3", self.model, self.layout_digest, self.parallel, self.extra)
        return keyhash.keyed_hash(self.hash_key, text)[:NS_BYTES]

    def purge_selector(self) -> str:
        """The ``kvtier purge`` arguments that select this namespace (the engine logs them
        at start so an operator can copy them)."""
        model, _, revision = self.model.rpartition("@")
        args = ["--model", model, "--layout", self.layout_digest, "--parallel", self.parallel]
        if revision:
            args += ["--revision", revision]
        if self.extra:
            args += ["--namespace", self.extra]
        return " ".join(shlex.quote(a) for a in args)

    def digest(self) -> bytes:
        """NS_BYTES identifying this rank's shard of the namespace; stored in disk and
        remote envelopes, so one rank's bytes never validate as another's."""
        text = frame(self.chain_digest(), f"{self.parallel}/rank{self.rank}")
        return keyhash.keyed_hash(self.hash_key, text)[:NS_BYTES]

    def for_rank(self, rank: int) -> Namespace:
        return dataclasses.replace(self, rank=rank)

    def seed(self, inputs: KeyInputs = NO_INPUTS) -> bytes:
        """The chain seed of a request: namespace (rank-free) + its per-request inputs."""
        return keyhash.keyed_hash(
            self.hash_key, _SEED + frame(self.chain_digest(), inputs.seed_text())
        )

    def key_chain(self, chunk_tokens: int, inputs: KeyInputs = NO_INPUTS) -> KeyChain:
        """A request's :class:`KeyChain` (seed, hash key and per-chunk inputs)."""
        return KeyChain(self.seed(inputs), chunk_tokens, hash_key=self.hash_key, inputs=inputs)


def rank_key(key: Key, rank: int) -> bytes:
    """The key of one rank's bytes of a chunk in a shared store (KEY_BYTES + 2 bytes):
    under tensor parallelism every rank stores its own shard, and a chunk is present only
    when every rank's key is."""
    return key + rank.to_bytes(2, "little")


def chunk_keys(
    tokens: Sequence[int],
    chunk_tokens: int,
    seed: bytes,
    *,
    hash_key: bytes = PUBLIC_HASH_KEY,
    inputs: KeyInputs = NO_INPUTS,
) -> list[Key]:
    """Keys of every full chunk of ``tokens`` (the trailing partial chunk has no key)."""
    chain = KeyChain(seed, chunk_tokens, hash_key=hash_key, inputs=inputs)
    chain.update(tokens)
    return chain.keys


class KeyChain:
    """Keys of one token sequence, extended incrementally as tokens arrive.

    ``update`` hashes only chunks that became full since the last call (one native call
    for all of them, from the token ids to the keys), so a request's keys cost O(new
    tokens) per step and are computed once per request. ``seed``: any bytes
    (:meth:`Namespace.seed` for a request).
    """

    __slots__ = ("_last", "chunk_tokens", "hash_key", "inputs", "keys", "seed")

    def __init__(
        self,
        seed: bytes,
        chunk_tokens: int,
        *,
        hash_key: bytes = PUBLIC_HASH_KEY,
        inputs: KeyInputs = NO_INPUTS,
    ) -> None:
        if chunk_tokens <= 0:
            raise ValueError(f"chunk_tokens must be > 0, got {chunk_tokens}")
        self.seed = seed
        self.chunk_tokens = chunk_tokens
        self.hash_key = hash_key
        self.inputs = inputs
        self.keys: list[Key] = []
        self._last = keyhash.keyed_hash(hash_key, _CHAIN_START + seed)

    @property
    def num_tokens(self) -> int:
        """Tokens covered by the keys so far."""
        return len(self.keys) * self.chunk_tokens

    def update(self, tokens: Sequence[int], end: int | None = None) -> int:
        """Extend the chain over ``tokens[:end]`` (the whole sequence so far, or its first
        ``end`` tokens); return #new keys.

        ``tokens`` must extend the sequence seen before (same prefix); only the part after
        the last full chunk is read. Token ids must lie in [0, 2**32) (ValueError).
        """
        c = self.chunk_tokens
        base = len(self.keys)
        start = base * c
        n_tok = len(tokens) if end is None else min(end, len(tokens))
        n_new = (n_tok - start) // c
        if n_new <= 0:
            return 0
        extras = self._extras(base, n_new) if self.inputs.per_chunk else None
        native = keyhash.native_keys()
        if native is not None:
            if type(tokens) is not list:  # vLLM's ConstantList slices into a list
                tokens, start = list(tokens[start : start + n_new * c]), 0
            tag = self.keys[base - base % GROUP_CHUNKS][:TAG_BYTES] if base % GROUP_CHUNKS else None
            last = bytearray(self._last)
            try:
                new = native.keys(tokens, start, n_new, c, self.hash_key, last, extras, tag, base)
            except (OverflowError, TypeError) as e:
                raise ValueError(f"token ids must be ints in [0, 2**32) to be keyed: {e}") from e
            self._last = bytes(last)
            self.keys += new
            return n_new
        self._update_python(tokens, base, n_new, extras)
        return n_new

    def _update_python(
        self, tokens: Sequence[int], base: int, n_new: int, extras: bytes | None
    ) -> None:
        """:meth:`update` without the native keys: ids to bytes, the chain, tags."""
        c = self.chunk_tokens
        start = base * c
        try:  # array() converts a list 3x faster than NumPy and range-checks every id
            ids = array("I", tokens[start : start + n_new * c])
        except (OverflowError, TypeError) as e:
            raise ValueError(f"token ids must be ints in [0, 2**32) to be keyed: {e}") from e
        if sys.byteorder == "big":
            ids.byteswap()
        out = keyhash.chain(self.hash_key, self._last, ids.tobytes(), c * 4, extras)
        d = keyhash.DIGEST_BYTES
        self._last = out[-d:]
        rows = np.frombuffer(out, dtype=np.uint8).reshape(n_new, d)
        pos = np.arange(base, base + n_new)
        group = pos - pos % GROUP_CHUNKS
        keyed = np.empty((n_new, KEY_BYTES), dtype=np.uint8)
        keyed[:, TAG_BYTES:] = rows[:, TAG_BYTES:KEY_BYTES]
        keyed[:, :TAG_BYTES] = rows[np.maximum(group - base, 0), :TAG_BYTES]
        if group[0] < base:  # the first new chunks continue a group begun by an earlier call
            head = int(np.count_nonzero(group < base))
            tag = np.frombuffer(self.keys[int(group[0])][:TAG_BYTES], dtype=np.uint8)
            keyed[:head, :TAG_BYTES] = tag
        blob, k = keyed.tobytes(), KEY_BYTES
        self.keys.extend([blob[o : o + k] for o in range(0, n_new * k, k)])

    def _extras(self, base: int, n: int) -> bytes | None:
        """The ``x(i)`` of chunks ``base .. base + n - 1`` (module docstring); None when
        none of them has inputs of its own."""
        c, inp = self.chunk_tokens, self.inputs
        hit: set[int] = set(range(base, min(base + n, -(-inp.embeds_tokens // c))))
        for item in inp.mm:
            lo, hi = item.offset // c, (item.offset + max(item.length, 1) - 1) // c
            hit.update(range(max(lo, base), min(hi + 1, base + n)))
        if not hit:
            return None
        out = bytearray(n * keyhash.DIGEST_BYTES)
        for i in hit:
            text = inp.chunk_text(i * c, (i + 1) * c)
            if text:
                o = (i - base) * keyhash.DIGEST_BYTES
                out[o : o + keyhash.DIGEST_BYTES] = keyhash.keyed_hash(self.hash_key, _CHUNK + text)
        return bytes(out)
