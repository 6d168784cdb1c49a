"""KV layouts from what the engine declares, with block counts equal to other dimensions.

Shapes alone, no engine: the oracle for "block b's bytes" is the tensor indexed at its
block dimension. The vLLM-declared tensors are built by vLLM's own allocator functions
(``create_kv_cache_views``) from real KV cache specs, as the engine hands them over.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import ConfigError
from kvtier.transfer.regions import KVRegions

# (name, logical shape builder from (blocks, block_size, heads, dim), block dim)
LAYOUTS = {
    "cpu [B, H, N, 2D]": (lambda b, n, h, d: (b, h, n, 2 * d), 0),
    "flash-attn [2, B, N, H, D]": (lambda b, n, h, d: (2, b, n, h, d), 1),
    "mla [B, N, D]": (lambda b, n, h, d: (b, n, d), 0),
}


def block_bytes(t: torch.Tensor, dim: int, b: int) -> bytes:
    """Oracle: the bytes of block ``b``, outer index by outer index (region-major)."""
    out = b""
    for idx in itertools.product(*(range(s) for s in t.shape[:dim])):
        out += bytes(t[idx][b].contiguous().reshape(-1).view(torch.uint8).numpy())
    return out


def region_bytes(r: KVRegions, b: int) -> bytes:
    return b"".join(bytes(rows[b].numpy()) for rows in r.rows)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("equal_to", ["block_size", "heads", "dim", "2*dim"])
def test_declared_block_dim_when_blocks_equal_another_dimension(layout, equal_to):
    shape_of, dim = LAYOUTS[layout]
    n, h, d = 16, 4, 8
    blocks = {"block_size": n, "heads": h, "dim": d, "2*dim": 2 * d}[equal_to]
    shape = shape_of(blocks, n, h, d)
    t = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.float32).reshape(shape)
    regions = KVRegions.from_tensors({"l0": t, "l1": t + 1}, blocks, {"l0": dim, "l1": dim})
    assert regions.num_blocks == blocks
    for b in range(blocks):
        assert region_bytes(regions, b) == block_bytes(t, dim, b) + block_bytes(t + 1, dim, b)


@given(
    blocks=st.sampled_from([2, 3, 4, 8]),
    n=st.sampled_from([2, 4]),
    h=st.sampled_from([2, 3, 4]),
    d=st.sampled_from([2, 4]),
    layout=st.sampled_from(list(LAYOUTS)),
)
def test_segments_match_the_oracle(blocks, n, h, d, layout):
    shape_of, dim = LAYOUTS[layout]
    shape = shape_of(blocks, n, h, d)
    t = torch.randn(shape)
    regions = KVRegions.from_tensors([t], blocks, dim)
    ids = [blocks - 1, 0]
    payload = bytearray(2 * regions.block_bytes)
    for off, view in regions.segments(ids, 0, 2):
        payload[off : off + view.numel()] = bytes(view.numpy())
    # Region-major payload: region r holds chunk blocks 0, 1 in order.
    want = bytearray()
    for rows in regions.rows:
        for b in ids:
            want += bytes(rows[b].numpy())
    assert payload == want


def test_guess_is_only_a_checked_fallback():
    t = torch.zeros(128, 3, 32, 128)  # 128 blocks, content 128: ambiguous
    with pytest.raises(ConfigError, match="cannot tell the block dimension"):
        KVRegions.from_tensors([t], 128)
    assert KVRegions.from_tensors([t], 128, 0).block_bytes == 3 * 32 * 128 * 4
    with pytest.raises(ConfigError, match="does not hold 128 blocks"):
        KVRegions.from_tensors([t], 128, 1)
    with pytest.raises(ConfigError, match="no block dimension declared for 'b'"):
        KVRegions.from_tensors({"a": t, "b": t}, 128, {"a": 0})


def _vllm_views(spec, num_blocks: int, num_layers: int, kernel_block_size=None):
    """Per-layer tensors exactly as vLLM's allocator builds them (layer-outermost)."""
    from vllm.v1.kv_cache_interface import KVCacheTensor, create_kv_cache_views
    from vllm.v1.kv_cache_layout import KVCacheLayout

    page = spec.page_size_bytes
    raw = torch.zeros(page * num_blocks * num_layers, dtype=torch.int8)
    tensor = KVCacheTensor(
        size=raw.numel(),
        layers=[f"l{i}" for i in range(num_layers)],
        layer_stride=page * num_blocks,
        block_stride=page,
    )
    views = create_kv_cache_views(
        raw, spec, num_blocks, KVCacheLayout.LBHNC, tensor, kernel_block_size
    )
    return raw, dict(zip(tensor.layers, views, strict=True))


@pytest.mark.parametrize("num_blocks", [3, 32, 128, 64])
@pytest.mark.parametrize("kind", ["full", "mla"])
def test_vllm_page_views_declare_block_dim_zero(num_blocks, kind):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    from kvtier.vllm.kv_layout import page_view_block_dim

    if kind == "full":  # SmolLM2: 3 KV heads of 64, fp32: C = 128 elements
        spec = FullAttentionSpec(block_size=32, num_kv_heads=3, head_size=64, dtype=torch.float32)
    else:
        spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    raw, views = _vllm_views(spec, num_blocks, 2)
    dims = {n: page_view_block_dim(spec, num_blocks, v) for n, v in views.items()}
    assert dims == {"l0": 0, "l1": 0}
    raw.copy_(torch.randint(-128, 127, raw.shape, dtype=torch.int8))
    regions = KVRegions.from_tensors(views, num_blocks, dims)
    page = spec.page_size_bytes
    for b in (0, num_blocks - 1):
        want = b"".join(
            bytes(raw[layer * page * num_blocks + b * page :][:page].numpy()) for layer in range(2)
        )
        assert region_bytes(regions, b) == want


def test_vllm_page_views_with_kernel_blocks():
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from kvtier.vllm.kv_layout import page_view_block_dim

    spec = FullAttentionSpec(block_size=64, num_kv_heads=2, head_size=32, dtype=torch.float32)
    _, views = _vllm_views(spec, 16, 1, kernel_block_size=32)
    (v,) = views.values()
    assert v.shape[0] == 32  # two kernel blocks per engine block
    assert page_view_block_dim(spec, 16, v) == 0
    regions = KVRegions.from_tensors(views, 16, {"l0": 0})
    assert regions.block_bytes == spec.page_size_bytes


def test_backend_shape_probe_on_a_vllm_backend():
    """vLLM backends that declare ``get_kv_cache_shape`` (MLA: [blocks, block_size, dim])."""
    from vllm.v1.attention.backends.mla.flashinfer_mla_sparse_sm90 import (
        FlashInferMLASparseSM90Backend as backend,
    )
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from kvtier.vllm.kv_layout import backend_block_dim

    spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    t = torch.zeros(64, 64, 576)  # 64 blocks = block size: a size guess cannot tell
    assert backend_block_dim(backend, spec, t) == 0
    assert backend_block_dim(backend, spec, torch.zeros(64, 64)) is None  # rank mismatch
