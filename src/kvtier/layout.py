"""KV geometry: how many bytes a token, a chunk and a hit occupy.

A model's KV cache is one or more *groups* of layers that share an attention kind:
full attention (every token's K and V are kept), sliding window (only the last ``window``
tokens matter), or recurrent state (Mamba-style: a fixed-size state per request).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum

from kvtier.errors import ConfigError

_DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "int16": 2,
    "uint8": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name ("bfloat16", "torch.float16", "fp8", ...)."""
    name = str(dtype).removeprefix("torch.").lower()
    try:
        return _DTYPE_BYTES[name]
    except KeyError:
        raise ConfigError(
            f"dtype: unknown KV dtype {dtype!r}; accepted: {', '.join(sorted(_DTYPE_BYTES))}"
        ) from None


class AttentionKind(StrEnum):
    """How a group of layers keeps its KV."""

    FULL = "full"
    SLIDING = "sliding"
    MAMBA = "mamba"


@dataclass(frozen=True)
class KVGroup:
    """One KV-cache group: layers of one attention kind and one shape."""

    kind: AttentionKind
    num_layers: int
    """Layers in the group."""
    num_kv_heads: int = 0
    """KV heads per layer (attention groups)."""
    head_dim: int = 0
    """Elements per head (attention groups)."""
    dtype: str = "bfloat16"
    """Element dtype of the cache."""
    window: int = 0
    """Sliding-window length in tokens (SLIDING only)."""
    state_bytes: int = 0
    """Bytes of recurrent state per layer per request (MAMBA only)."""
    value_dim: int | None = None
    """Elements per head of the second plane (V); None: same as ``head_dim`` (K and V).
    0 for a single latent per token (MLA)."""
    block_tokens: int = 0
    """Tokens per engine block (SLIDING only; 0: unknown). With it a sliding group's load
    is bounded by the blocks a window can touch, not by the whole hit."""

    def __post_init__(self) -> None:
        if self.num_layers <= 0:
            raise ConfigError(f"num_layers: must be > 0, got {self.num_layers}")
        if self.kind is AttentionKind.MAMBA:
            if self.state_bytes <= 0:
                raise ConfigError("state_bytes: a MAMBA group needs state_bytes > 0")
        elif self.num_kv_heads <= 0 or self.head_dim <= 0:
            raise ConfigError("num_kv_heads/head_dim: attention groups need both > 0")
        if self.kind is AttentionKind.SLIDING and self.window <= 0:
            raise ConfigError("window: a SLIDING group needs window > 0")
        dtype_bytes(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        """K and V bytes of one token across the group's layers (0 for MAMBA)."""
        if self.kind is AttentionKind.MAMBA:
            return 0
        dims = self.head_dim + (self.head_dim if self.value_dim is None else self.value_dim)
        return self.num_layers * self.num_kv_heads * dims * dtype_bytes(self.dtype)

    def load_bytes(self, tokens: int) -> int:
        """Upper bound of the bytes a hit of ``tokens`` tokens loads for this group.

        Exact for FULL. SLIDING with ``block_tokens`` known: the engine keeps only the
        blocks that overlap the last ``window`` tokens (a block is dropped only once all
        of it is out of the window), so at most ``window + block_tokens`` tokens; without
        it every token counts. Never below the truth. MAMBA loads its fixed state.
        """
        if self.kind is AttentionKind.MAMBA:
            return self.num_layers * self.state_bytes if tokens > 0 else 0
        if self.kind is AttentionKind.SLIDING and self.block_tokens > 0:
            tokens = min(tokens, self.window + self.block_tokens)
        return tokens * self.bytes_per_token


@dataclass(frozen=True)
class KVLayout:
    """The whole model's KV geometry."""

    groups: tuple[KVGroup, ...]

    def __post_init__(self) -> None:
        if not self.groups:
            raise ConfigError("groups: a KV layout needs at least one group")

    @classmethod
    def dense(
        cls, num_layers: int, num_kv_heads: int, head_dim: int, dtype: str = "bfloat16"
    ) -> KVLayout:
        """A single full-attention group (the common dense transformer)."""
        return cls((KVGroup(AttentionKind.FULL, num_layers, num_kv_heads, head_dim, dtype),))

    @property
    def bytes_per_token(self) -> int:
        """Bytes per token summed over attention groups (MAMBA state excluded)."""
        return sum(g.bytes_per_token for g in self.groups)

    def chunk_bytes(self, chunk_tokens: int) -> int:
        """Bytes of one chunk of ``chunk_tokens`` tokens of attention KV."""
        return chunk_tokens * self.bytes_per_token

    def load_bytes(self, tokens: int) -> int:
        """Upper bound of bytes loaded for a hit of ``tokens`` tokens (see KVGroup.load_bytes).

        This is what the per-step sync budget charges: hit tokens x KV bytes per token, exact
        for full attention and an over-estimate otherwise, so the budget is never exceeded.
        """
        return sum(g.load_bytes(tokens) for g in self.groups)

    def digest(self) -> str:
        """A stable text digest of the geometry, part of every key's namespace."""
        text = ";".join(
            f"{g.kind.value}:{g.num_layers}:{g.num_kv_heads}:{g.head_dim}:"
            f"{str(g.dtype).removeprefix('torch.')}:{g.window}:{g.state_bytes}"
            # Only where it differs from K = V, so dense digests stay what they were.
            + ("" if g.value_dim in (None, g.head_dim) else f":v{g.value_dim}")
            for g in self.groups
        )
        return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
