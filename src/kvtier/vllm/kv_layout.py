"""Where the block dimension of each KV tensor is, as vLLM declares it.

Guessing it from sizes ("the dimension of size num_blocks") breaks whenever the block
count equals another dimension (e.g. 128 blocks of a ``[blocks, heads, 32, 128]`` cache).
vLLM knows the layout it allocated, through one of two interfaces depending on its
version:

1. *Logical page views* (vLLM with ``vllm.v1.kv_cache_layout``): every per-layer tensor is
   a ``[B, H, N, C]`` view (blocks, head slots, states per block, content) whatever the
   physical order; ``compute_layer_kv_cache_shape_bytes`` gives that shape from the KV
   cache spec. Blocks are dimension 0, possibly split into equal kernel blocks.
2. *Backend shapes* (earlier vLLM): the attention backend's ``get_kv_cache_shape`` gives
   the logical shape of a layer (``[2, blocks, block_size, heads, dim]`` for flash
   attention, ``[blocks, block_size, dim]`` for MLA, ...); the tensors handed to the
   connector are in that logical order (``get_kv_cache_stride_order`` only permutes
   memory). Probing it with two distinct block counts finds the block dimension.

Each answer is checked against the tensor's actual shape; where neither applies, the
size guess is used only when exactly one dimension matches (see ``KVRegions``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from kvtier.errors import ConfigError

log = logging.getLogger("kvtier")

_PROBES = (7919, 7907)
"""Two block counts no other KV dimension takes (primes far above any head count)."""


def page_view_block_dim(spec: Any, num_blocks: int, t: torch.Tensor) -> int | None:
    """0 when ``t`` is vLLM's logical ``[B, H, N, C]`` page view of ``spec``, else None."""
    try:
        from vllm.v1.kv_cache_interface import compute_layer_kv_cache_shape_bytes
    except ImportError:
        return None
    if t.dim() != 4 or t.shape[0] % num_blocks:
        return None
    ratio = t.shape[0] // num_blocks
    if ratio < 1 or spec.block_size % ratio:
        return None
    try:
        want = compute_layer_kv_cache_shape_bytes(spec, num_blocks, spec.block_size // ratio)
    except (AttributeError, AssertionError, TypeError):
        return None
    got = (t.shape[0], t.shape[1], t.shape[2], t.shape[3] * t.element_size())
    return 0 if tuple(want) == got else None


def backend_block_dim(backend: Any, spec: Any, t: torch.Tensor) -> int | None:
    """The block dimension from ``backend.get_kv_cache_shape``, checked against ``t``."""
    shape_of = getattr(backend, "get_kv_cache_shape", None)
    if shape_of is None:
        return None
    cache_dtype = getattr(spec, "cache_dtype_str", None) or "auto"
    try:
        a, b = (
            tuple(shape_of(n, spec.block_size, spec.num_kv_heads, spec.head_size, cache_dtype))
            for n in _PROBES
        )
    except (AttributeError, NotImplementedError, TypeError, ValueError, AssertionError):
        return None
    dims = [d for d, (x, y) in enumerate(zip(a, b, strict=True)) if (x, y) == _PROBES]
    if len(dims) != 1 or len(a) != t.dim():
        return None
    return dims[0]


def declared_block_dims(
    vllm_config: Any, kv_cache_config: Any, kv_caches: Mapping[str, torch.Tensor]
) -> dict[str, int | None]:
    """Per layer name, the block dimension vLLM declares (None: vLLM declares none that
    matches the tensor; the caller falls back to the checked size guess)."""
    specs: dict[str, Any] = {}
    for group in kv_cache_config.kv_cache_groups:
        per_layer = getattr(group.kv_cache_spec, "kv_cache_specs", None)  # uniform-type group
        for name in group.layer_names:
            specs[name] = per_layer[name] if per_layer else group.kv_cache_spec
    backends = _backends(vllm_config, list(kv_caches))
    out: dict[str, int | None] = {}
    for name, t in kv_caches.items():
        spec = specs.get(name)
        dim = None
        if spec is not None:
            dim = page_view_block_dim(spec, kv_cache_config.num_blocks, t)
            if dim is None and name in backends:
                dim = backend_block_dim(backends[name], spec, t)
        out[name] = dim
    undeclared = [n for n, d in out.items() if d is None]
    if undeclared:
        log.warning(
            "kvtier: vLLM declares no KV layout for %d tensor(s) (%s, ...); guessing from sizes",
            len(undeclared),
            undeclared[0],
        )
    return out


def _backends(vllm_config: Any, names: list[str]) -> dict[str, Any]:
    """The attention backend class of each named layer (empty where vLLM has no registry)."""
    try:
        from vllm.config import get_layers_from_vllm_config
        from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    except ImportError:
        return {}
    layer_type: Any = AttentionLayerBase
    try:
        layers = get_layers_from_vllm_config(vllm_config, layer_type, names)
    except (KeyError, AttributeError):
        return {}
    return {n: layer.get_attn_backend() for n, layer in layers.items()}


def require_dims(dims: Mapping[str, int | None]) -> dict[str, int] | None:
    """The mapping for ``KVRegions.from_tensors``: all declared, or None (guess all)."""
    if all(d is not None for d in dims.values()):
        return {n: d for n, d in dims.items() if d is not None}
    if any(d is not None for d in dims.values()):
        raise ConfigError("KV layout: vLLM declares the layout of some KV tensors but not all")
    return None
