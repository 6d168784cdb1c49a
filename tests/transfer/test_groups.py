"""KV-cache groups: layouts read from vLLM's own spec classes, refusals, per-group copies.

No engine: the specs are vLLM's real classes, the tensors real CPU tensors; the oracle for
a chunk's payload is each group's block read directly from its tensor.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvtier.layout import AttentionKind
from kvtier.tiers.cpu import CpuSlab
from kvtier.transfer import KVRegions, TransferEngine
from kvtier.transfer.groups import NULL_BLOCK, BlockIdCodec, GroupedRegions
from tests.support.jobs import make_job


def _config(*specs_and_layers):
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    groups = [
        KVCacheGroupSpec([f"g{i}.l{j}" for j in range(n)], spec)
        for i, (spec, n) in enumerate(specs_and_layers)
    ]
    return KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=groups)


def test_layouts_from_vllm_specs():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

    from kvtier.vllm.groups import read_groups

    f32 = torch.float32
    full = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=f32)
    swa = SlidingWindowSpec(
        block_size=32, num_kv_heads=2, head_size=32, dtype=f32, sliding_window=64
    )
    mla = MLAAttentionSpec(block_size=32, num_kv_heads=1, head_size=96, dtype=torch.bfloat16)
    # Dense: one full group; bytes per token as vLLM's page size says.
    g = read_groups(_config((full, 3)))
    assert (g.num_groups, g.frees_blocks) == (1, False)
    assert g.layout.bytes_per_token == 3 * full.page_size_bytes // 32
    # MLA: a single latent per token, no V plane.
    g = read_groups(_config((mla, 2)))
    assert g.layout.bytes_per_token == 2 * mla.page_size_bytes // 32 == 2 * 96 * 2
    # On vLLM's CPU platform MLA cannot prefill over cached KV: refused there.
    from kvtier.vllm.groups import UnsupportedLayout

    with pytest.raises(UnsupportedLayout, match=r"^kvtier: MLA on vLLM's CPU backend"):
        read_groups(_config((mla, 2)), cpu=True)
    # Gemma-3-like HMA groups: sliding groups free blocks; the budget bound uses the window.
    g = read_groups(_config((full, 1), (swa, 1), (swa, 1)))
    assert (g.num_groups, g.frees_blocks) == (3, True)
    kinds = [x.kind for x in g.layout.groups]
    assert kinds == [AttentionKind.FULL, AttentionKind.SLIDING, AttentionKind.SLIDING]
    per = full.page_size_bytes // 32
    assert g.layout.load_bytes(1000) == 1000 * per + 2 * (64 + 32) * per
    assert g.layout.load_bytes(50) == 3 * 50 * per
    # HMA off: vLLM promotes sliding layers to full specs that keep every token.
    promoted = FullAttentionSpec(
        block_size=32, num_kv_heads=2, head_size=32, dtype=f32, sliding_window=64
    )
    g = read_groups(_config((promoted, 2)))
    assert g.layout.groups[0].kind is AttentionKind.FULL and not g.frees_blocks


def test_refusals_name_the_layout_and_start_with_kvtier():
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        KVQuantMode,
        MambaSpec,
    )

    from kvtier.vllm.groups import UnsupportedLayout, read_groups

    full = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32)
    mamba = MambaSpec(block_size=32, shapes=((4, 8), (8, 16)), dtypes=(torch.float32,) * 2)
    local = ChunkedLocalAttentionSpec(
        block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32, attention_chunk_size=64
    )
    quant = FullAttentionSpec(
        block_size=32,
        num_kv_heads=2,
        head_size=32,
        dtype=torch.int8,
        kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD,
    )
    cases = {
        "recurrent-state model without attention": _config((mamba, 2)),
        "ChunkedLocalAttentionSpec": _config((full, 1), (local, 1)),
        "INT8_PER_TOKEN_HEAD": _config((quant, 2)),
    }
    for needle, cfg in cases.items():
        with pytest.raises(UnsupportedLayout) as e:
            read_groups(cfg)
        msg = str(e.value)
        assert msg.startswith("kvtier: ") and needle in msg and "\n" not in msg
        assert "--kv-transfer-config" in msg


def test_sliding_window_with_sinks_and_hma_off_refused_on_cpu_only():
    """gpt-oss with HMA off: one group whose spec is full attention with a sliding window
    (vLLM promoted the sliding layers) and whose layers have attention sinks. vLLM's CPU
    backend gives wrong tokens for it, so kvtier refuses it there; a promoted group without
    sinks (Gemma 3 with HMA off), sinks on full attention only, a real SlidingWindowSpec
    (HMA on) and any GPU are served."""
    from types import SimpleNamespace

    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    from kvtier.vllm.groups import UnsupportedLayout, read_groups, sink_layers

    f32 = torch.float32
    promoted = FullAttentionSpec(
        block_size=32, num_kv_heads=2, head_size=32, dtype=f32, sliding_window=64
    )
    full = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=f32)
    swa = SlidingWindowSpec(
        block_size=32, num_kv_heads=2, head_size=32, dtype=f32, sliding_window=64
    )
    layers = {
        "g0.l0": SimpleNamespace(has_sink=True),
        "g0.l1": SimpleNamespace(has_sink=True),
        "g0.mlp": SimpleNamespace(),  # not an attention layer: no has_sink at all
    }
    vllm_config = SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context=layers))
    sinks = sink_layers(vllm_config)
    assert sinks == {"g0.l0", "g0.l1"}
    with pytest.raises(UnsupportedLayout) as e:
        read_groups(_config((promoted, 2)), cpu=True, sinks=sinks)
    msg = str(e.value)
    assert msg.startswith("kvtier: sliding window with attention sinks and HMA off")
    assert "--disable-hybrid-kv-cache-manager" in msg and "\n" not in msg
    assert read_groups(_config((promoted, 2)), cpu=False, sinks=sinks).num_groups == 1
    assert read_groups(_config((promoted, 2)), cpu=True).num_groups == 1
    assert read_groups(_config((full, 2)), cpu=True, sinks=sinks).num_groups == 1
    g = read_groups(_config((full, 1), (swa, 1)), cpu=True, sinks=frozenset({"g1.l0"}))
    assert g.frees_blocks
    # A process without the model registers no layer: it cannot tell, and does not refuse.
    empty = SimpleNamespace(compilation_config=SimpleNamespace(static_forward_context={}))
    assert sink_layers(empty) == frozenset()


def test_hybrid_recurrent_model_groups_and_refusals():
    """Attention + Mamba groups: in vLLM's "align" mode the Mamba group is a state group
    (served, no ``recurrent`` line); the Mamba group enters the layout (and its digest)
    with its state bytes, never the chunk bytes. Where the states cannot be served (another
    cache mode, speculative Mamba blocks, tensor parallel) the model starts with offload
    off and one ``kvtier:`` line naming why."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    from kvtier.vllm.groups import read_groups

    full = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32)
    shapes = {"shapes": ((4, 8), (8, 16)), "dtypes": (torch.float32,) * 2}
    align = MambaSpec(block_size=32, mamba_cache_mode="align", **shapes)
    g = read_groups(_config((full, 1), (align, 3)), cpu=True)
    assert (g.num_groups, g.state_groups, g.attention_groups, g.recurrent) == (2, (1,), 1, "")
    kinds = [(x.kind, x.num_layers) for x in g.layout.groups]
    assert kinds == [(AttentionKind.FULL, 1), (AttentionKind.MAMBA, 3)]
    assert g.layout.groups[1].state_bytes == (4 * 8 + 8 * 16) * 4
    assert g.layout.chunk_bytes(32) == read_groups(_config((full, 1))).layout.chunk_bytes(32)
    assert g.layout.digest() != read_groups(_config((full, 1))).layout.digest()
    assert read_groups(_config((full, 1))).recurrent == ""
    cases = {
        "Mamba cache mode 'none'": (MambaSpec(block_size=32, **shapes), 1),
        "speculative Mamba blocks": (
            MambaSpec(block_size=32, mamba_cache_mode="align", num_speculative_blocks=1, **shapes),
            1,
        ),
        "tensor parallel size 2": (align, 2),
    }
    for needle, (spec, world) in cases.items():
        g = read_groups(_config((full, 1), (spec, 3)), cpu=True, world=world)
        assert g.recurrent.startswith("kvtier: hybrid recurrent-state model (group 1: MambaSpec")
        assert needle in g.recurrent and "offload is off" in g.recurrent
        assert "\n" not in g.recurrent


@given(
    groups=st.integers(1, 5),
    blocks=st.integers(1, 5000),
    data=st.data(),
)
def test_codec_round_trips(groups, blocks, data):
    codec = BlockIdCodec(groups, blocks)
    n = data.draw(st.integers(0, 8))
    ids = [
        data.draw(st.lists(st.integers(0, blocks - 1), min_size=n, max_size=n))
        for _ in range(groups)
    ]
    enc = codec.encode(ids)
    assert [codec.decode(v) for v in enc] == [tuple(g[j] for g in ids) for j in range(n)]
    if groups == 1:
        assert enc == ids[0]  # dense models: ids unchanged
    assert codec.real_blocks(enc) == {b for g in ids for b in g if b != NULL_BLOCK}


def _group_tensors(num_blocks, layers, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(num_blocks, 2, 4, 8, generator=g) for _ in range(layers)]


def _block(kv, b):
    return b"".join(bytes(t[b].contiguous().view(torch.uint8).reshape(-1).numpy()) for t in kv)


def test_grouped_store_and_load_move_each_groups_blocks():
    """Two groups (full, sliding) in a real CPU slab through the real TransferEngine: what a
    load writes is each group's own block of the stored position; a sliding group's null
    positions are neither read into a chunk (the chunk is refused) nor written by a load."""
    nb, bpc = 16, 2
    full, swa = _group_tensors(nb, 2, 0), _group_tensors(nb, 1, 1)
    codec = BlockIdCodec(2, nb)
    regions = GroupedRegions(
        [KVRegions.from_tensors(full, nb, 0), KVRegions.from_tensors(swa, nb, 0)], codec
    )
    slab = CpuSlab(4, regions.row_bytes, bpc)
    eng = TransferEngine(regions, {"cpu": slab}, bpc)
    try:
        src = list(codec.encode([[3, 4, 5, 6], [7, 8, 9, 10]]))
        want = [(_block(full, f), _block(swa, s)) for f, s in ((3, 7), (4, 8), (5, 9), (6, 10))]
        eng.submit(make_job("store", "cpu", [b"a", b"b"], [0, 1], src))
        # A chunk whose sliding block was freed (null) cannot be stored, nor what follows.
        freed = list(codec.encode([[3, 4, 5, 6], [NULL_BLOCK, 8, 9, 10]]))
        eng.submit(make_job("store", "cpu", [b"c", b"d"], [2, 3], freed, job_id=2))
        assert eng.wait([1, 2], timeout=10)
        res = {r.job_id: r for r in eng.poll()}
        assert res[1].ok == [True, True] and res[2].ok == [False, False]
        # Load into new blocks; the sliding group's first position is out of the window.
        null_before = _block(swa, NULL_BLOCK)
        dst = list(codec.encode([[11, 12, 13, 14], [NULL_BLOCK, 1, 2, 15]]))
        eng.submit(make_job("load", "cpu", [b"a", b"b"], [0, 1], dst, job_id=3, sync=True))
        assert eng.wait([3], timeout=10)
        assert eng.poll()[0].all_ok
        for (f, s), (wf, ws) in zip(((11, None), (12, 1), (13, 2), (14, 15)), want, strict=True):
            assert _block(full, f) == wf
            if s is not None:
                assert _block(swa, s) == ws
        assert _block(swa, NULL_BLOCK) == null_before
    finally:
        eng.close()
