"""Chunk keys: a deterministic chained hash of token ids, seeded by a namespace.

Let h(i) = xxh3-128(key of chunk i-1 || token ids of chunk i as little-endian int64), the key
"before" chunk 0 being the request's seed: a digest of the namespace (model identity, KV
geometry and dtype, parallel layout, the deployment's namespace text) plus the request's
cache salt and LoRA. The key of chunk i is h(i), except that its first TAG_BYTES are the
*group tag*: those of h(g), g the first chunk of i's group of GROUP_CHUNKS (g = i - i mod
GROUP_CHUNKS). Keys depend on nothing else: not on ``PYTHONHASHSEED``, not on vLLM's
per-process hash seed, not on the process, host or restart. Equal keys therefore mean equal
token prefixes under the same model, geometry and salt (the last 12 bytes alone are a 96-bit
chained hash).

The tag lets a shared store place a chain's neighbours together from the key alone: a Redis
Cluster hashes a chunk's name by its tag, so each group of GROUP_CHUNKS chunks lives in one
slot and a lookup counts a group with one multi-key EXISTS, while a chain's groups spread
over every node.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

Key = bytes
"""A chunk key: 16 bytes."""

KEY_BYTES = 16

GROUP_CHUNKS = 16
"""Consecutive chunks of a chain that share a group tag (512 tokens of 32-token chunks)."""

TAG_BYTES = 4
"""Leading bytes of a key that are its group's tag."""


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

    def chain_digest(self) -> bytes:
        """16 bytes identifying what every rank shares: the seed of every chain."""
        text = "\x1f".join(
            ("kvtier-ns-v2", self.model, self.layout_digest, self.parallel, self.extra)
        )
        return hashlib.blake2b(text.encode(), digest_size=KEY_BYTES).digest()

    def digest(self) -> bytes:
        """16 bytes identifying this rank's shard of the namespace; stored in disk and
        remote envelopes, so one rank's bytes never validate as another's."""
        text = f"{self.parallel}/rank{self.rank}".encode()
        return hashlib.blake2b(self.chain_digest() + text, digest_size=KEY_BYTES).digest()

    def for_rank(self, rank: int) -> Namespace:
        return dataclasses.replace(self, rank=rank)

    def seed(self, cache_salt: str | None = None, lora: str | None = None) -> bytes:
        """The chain seed of a request: namespace (rank-free) + cache salt + LoRA identity."""
        if not cache_salt and not lora:
            return self.chain_digest()
        text = f"{cache_salt or ''}\x1f{lora or ''}".encode()
        return hashlib.blake2b(self.chain_digest() + text, digest_size=KEY_BYTES).digest()


def rank_key(key: Key, rank: int) -> bytes:
    """The key of one rank's bytes of a chunk in a shared store (18 bytes): under tensor
    parallelism every rank stores its own shard, and a chunk is present only when every
    rank's key is."""
    return key + rank.to_bytes(2, "little")


def chunk_keys(tokens: Sequence[int], chunk_tokens: int, seed: bytes) -> list[Key]:
    """Keys of every full chunk of ``tokens`` (the trailing partial chunk has no key)."""
    chain = KeyChain(seed, chunk_tokens)
    chain.update(tokens)
    return chain.keys


class KeyChain:
    """Keys of one token sequence, extended incrementally as tokens arrive.

    ``update`` hashes only chunks that became full since the last call, so a request's keys
    cost O(new tokens) per step and are computed once per request.
    """

    __slots__ = ("chunk_tokens", "keys", "seed")

    def __init__(self, seed: bytes, chunk_tokens: int) -> None:
        if chunk_tokens <= 0:
            raise ValueError(f"chunk_tokens must be > 0, got {chunk_tokens}")
        self.seed = seed
        self.chunk_tokens = chunk_tokens
        self.keys: list[Key] = []

    @property
    def num_tokens(self) -> int:
        """Tokens covered by the keys so far."""
        return len(self.keys) * self.chunk_tokens

    def update(self, tokens: Sequence[int]) -> int:
        """Extend the chain over ``tokens`` (the whole sequence so far); return #new keys.

        ``tokens`` must extend the sequence seen before (same prefix); only the part after
        the last full chunk is read.
        """
        c = self.chunk_tokens
        start = len(self.keys) * c
        n_new = (len(tokens) - start) // c
        if n_new <= 0:
            return 0
        data = np.asarray(tokens[start : start + n_new * c], dtype="<i8").tobytes()
        step = c * 8
        out = self.keys
        prev = out[-1] if out else self.seed
        tag = prev[:TAG_BYTES]
        h, g, t = xxhash.xxh3_128_digest, GROUP_CHUNKS, TAG_BYTES
        for pos, off in enumerate(range(0, n_new * step, step), len(out)):
            prev = h(prev + data[off : off + step])
            if pos % g:
                prev = tag + prev[t:]
            else:
                tag = prev[:t]
            out.append(prev)
        return n_new
