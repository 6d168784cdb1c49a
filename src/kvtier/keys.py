"""Chunk keys: a deterministic chained hash of token ids, seeded by a namespace.

Key of chunk i = xxh3-128(key of chunk i-1 || token ids of chunk i as little-endian int64),
and the key "before" chunk 0 is the request's seed: a digest of the namespace (model
identity, KV geometry and dtype, parallel layout, the deployment's namespace text) plus the
request's cache salt and LoRA. Keys depend on nothing else: not on ``PYTHONHASHSEED``, not on
vLLM's per-process hash seed, not on the process, host or restart. Equal keys therefore mean
equal token prefixes under the same model, geometry and salt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

Key = bytes
"""A chunk key: 16 bytes."""

KEY_BYTES = 16


@dataclass(frozen=True)
class Namespace:
    """What must be equal for two engines to share KV."""

    model: str
    """Model identity (name or path, plus revision if any)."""
    layout_digest: str
    """KVLayout.digest(): geometry and dtype."""
    parallel: str = "tp1"
    """Parallel layout and this worker's shard, e.g. "tp2r0"."""
    extra: str = ""
    """Deployment-chosen namespace text (KVTierConfig.namespace)."""

    def digest(self) -> bytes:
        """16 bytes identifying the namespace; stored in disk/remote headers."""
        text = "\x1f".join(
            ("kvtier-ns-v1", self.model, self.layout_digest, self.parallel, self.extra)
        )
        return hashlib.blake2b(text.encode(), digest_size=KEY_BYTES).digest()

    def seed(self, cache_salt: str | None = None, lora: str | None = None) -> bytes:
        """The chain seed of a request: namespace digest + cache salt + LoRA identity."""
        if not cache_salt and not lora:
            return self.digest()
        text = f"{cache_salt or ''}\x1f{lora or ''}".encode()
        return hashlib.blake2b(self.digest() + text, digest_size=KEY_BYTES).digest()


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
        prev = self.keys[-1] if self.keys else self.seed
        h = xxhash.xxh3_128_digest
        out = self.keys
        for off in range(0, n_new * step, step):
            prev = h(prev + data[off : off + step])
            out.append(prev)
        return n_new
