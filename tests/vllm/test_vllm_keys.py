"""Chunk keys of real vLLM requests through the connector's scheduler side (no engine).

Multimodal and prompt-embeds requests are vLLM's own ``Request`` objects carrying
``MultiModalFeatureSpec`` / ``PlaceholderRange`` / ``prompt_embeds``, handed to a real
scheduler-side ``KVTierConnector`` (real config, real tier stack): every input kind and
position can be set exactly, with no model that takes it (most of vLLM's vision models
need torchvision, which vLLM's CPU build here lacks; tests/vllm/test_vllm_mm.py runs one that
does not on a real engine). A request's chunks are made present by committing its keys
into the CPU tier's index (what a finished store does), so each check is "does another
request hit them": the oracle is which inputs are equal.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

pytestmark = pytest.mark.vllm

BLOCK = 32
PROMPT = 8 * BLOCK  # 8 chunks
IMAGE_AT, IMAGE_LEN = 3 * BLOCK + 5, 40  # overlaps chunks 3 and 4


def make_connector(**extra):
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    from kvtier.tools.models import smollm2_path
    from kvtier.vllm.connector import KVTierConnector

    cfg = VllmConfig(
        model_config=ModelConfig(model=str(smollm2_path()), dtype="float32", max_model_len=4096),
        cache_config=CacheConfig(block_size=BLOCK),
        kv_transfer_config=KVTransferConfig(
            kv_connector="KVTierConnector",
            kv_connector_module_path="kvtier.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes": "64MiB"} | extra,
        ),
    )
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=3, head_size=64, dtype=torch.float32)
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(30)]
    kv = KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=layers, kv_cache_spec=spec)],
    )
    return KVTierConnector(cfg, KVConnectorRole.SCHEDULER, kv)


@pytest.fixture(scope="module")
def connector():
    return make_connector()


_ids = iter(range(10**6))


def request(tokens: Sequence[int] | None = None, **kw):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    toks = None if tokens is None else list(tokens)
    return Request(f"r{next(_ids)}", toks, SamplingParams(max_tokens=1), None, **kw)


def image(
    identifier: str,
    offset: int = IMAGE_AT,
    length: int = IMAGE_LEN,
    modality="image",
    pixels: str | None = None,
):
    """An image item named ``identifier`` whose processed data (``pixel_values``) is drawn
    from ``pixels`` (default: the identifier, so one name is one content); ``pixels=""``
    leaves the data out (what vLLM sends when the engine is to take it from its cache)."""
    from vllm.multimodal.inputs import (
        MultiModalBatchedField,
        MultiModalFeatureSpec,
        MultiModalFieldElem,
        MultiModalKwargsItem,
        PlaceholderRange,
    )

    seed = identifier if pixels is None else pixels
    data = None
    if seed:
        g = torch.Generator().manual_seed(sum(map(ord, seed)) * 7919 + len(seed))
        values = torch.rand(3, 8, 8, generator=g).to(torch.bfloat16)
        elem = MultiModalFieldElem(data=values, field=MultiModalBatchedField())
        data = MultiModalKwargsItem({"pixel_values": elem})
    pos = PlaceholderRange(offset=offset, length=length)
    return MultiModalFeatureSpec(
        data=data, modality=modality, identifier=identifier, mm_position=pos
    )


def store(connector, req) -> list[bytes]:
    """Look ``req`` up (computing its keys), then make all its chunks present."""
    connector.get_num_new_matched_tokens(req, 0)
    m = connector.manager
    keys = m._reqs[req.request_id].chain.keys
    index = m.stack[0].index
    todo = keys[index.prefix_len(keys, any_state=True) :]
    slots = index.reserve(todo, keys[len(keys) - len(todo) - 1] if len(todo) < len(keys) else None)
    index.commit(todo[: len(slots)], [True] * len(slots))
    return keys


def hit(connector, req) -> int:
    n, _ = connector.get_num_new_matched_tokens(req, 0)
    return n or 0


def text(seed: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 49000 + 1 for i in range(PROMPT)]


def test_image_keyed_requests_sharing_text_do_not_hit_each_other(connector):
    """Same token ids (the image placeholders too), different images: the chunks before
    the image are shared, nothing from the image's first chunk on."""
    toks = text(1)
    keys_a = store(connector, request(toks, mm_features=[image("img-A")]))
    assert len(keys_a) == 8
    # the same image again: a full hit
    assert hit(connector, request(toks, mm_features=[image("img-A")])) == PROMPT
    assert hit(connector, request(toks, mm_features=[image("img-B")])) == 3 * BLOCK
    assert hit(connector, request(toks, mm_features=[image("img-A", IMAGE_AT + 1)])) == 3 * BLOCK
    assert hit(connector, request(toks)) == 3 * BLOCK  # text only: the image is missing
    # the text-only request's own chunks are another chain
    store(connector, request(toks))
    assert hit(connector, request(toks, mm_features=[image("img-C")])) == 3 * BLOCK


def test_images_are_named_by_their_processed_content(connector):
    """``mm_keys: content`` (default): a client that sends other pixels under an item's
    name (vLLM's ``multi_modal_uuids``) gets no hit on that item's chunks, the same pixels
    under another name do hit, and an item whose data is absent is unkeyable."""
    toks = text(6)
    store(connector, request(toks, mm_features=[image("photo")]))
    assert hit(connector, request(toks, mm_features=[image("photo")])) == PROMPT
    forged = request(toks, mm_features=[image("photo", pixels="other pixels")])
    assert hit(connector, forged) == 3 * BLOCK
    renamed = request(toks, mm_features=[image("another-uuid", pixels="photo")])
    assert hit(connector, renamed) == PROMPT
    m = connector.manager
    before = m.metrics.get("unkeyable_requests", "mm-data")
    assert hit(connector, request(toks, mm_features=[image("photo", pixels="")])) == 0
    assert m.metrics.get("unkeyable_requests", "mm-data") == before + 1


def test_identifier_names_trust_the_client():
    """``mm_keys: identifier``: the item's name alone keys it, so other pixels under the
    same name hit (what the option trades for not hashing; docs/security.md)."""
    named = make_connector(mm_keys="identifier")
    toks = text(7)
    store(named, request(toks, mm_features=[image("photo")]))
    forged = request(toks, mm_features=[image("photo", pixels="other pixels")])
    assert hit(named, forged) == PROMPT
    assert hit(named, request(toks, mm_features=[image("photo", pixels="")])) == PROMPT


def test_content_names_are_memoised_per_live_object():
    """One digest per data object while it lives (a second call is answered from the
    memo, not hashed again), equal content under another object gets the same name, a
    changed tensor under a new object a new one, and names stay right past capacity."""
    from kvtier.vllm.mm_content import PREFIX, ContentDigests

    names = ContentDigests(capacity=2)
    a = image("a").data
    first = names.name(a)
    assert first.startswith(PREFIX)
    # Items are never changed in place (the contract); changing one shows the memo answers.
    a["pixel_values"].data[0, 0, 1] += 1
    assert names.name(a) == first
    assert ContentDigests().name(a) != first  # a fresh memo hashes the changed bytes
    assert names.name(image("a").data) == first  # equal content, another object
    changed = image("a").data
    changed["pixel_values"].data[0, 0, 0] += 1
    assert names.name(changed) != first
    assert names.name(None) == "" and names.name({"x": object()}) == ""
    for i in range(5):  # over capacity: the oldest memo entries go, names stay right
        assert names.name(image(f"n{i}").data) == ContentDigests().name(image(f"n{i}").data)


def test_prompt_embeds_key_their_rows(connector):
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn(PROMPT, 576, generator=g)
    other = embeds.clone()
    other[5 * BLOCK + 3, 7] += 1.0  # one value in chunk 5
    store(connector, request(None, prompt_embeds=embeds))
    assert hit(connector, request(None, prompt_embeds=embeds.clone())) == PROMPT
    assert hit(connector, request(None, prompt_embeds=other)) == 5 * BLOCK
    assert hit(connector, request(None, prompt_embeds=embeds.to(torch.bfloat16))) == 0
    # all-zero token ids without embeddings are another prompt
    assert hit(connector, request([0] * PROMPT)) == 0


def test_lora_name_path_and_salt_key_requests(connector):
    from vllm.lora.request import LoRARequest

    toks = text(2)
    lora = LoRARequest("adapter", 1, "/adapters/v1")
    store(connector, request(toks, lora_request=lora, cache_salt="tenant-a"))
    same = request(
        toks, lora_request=LoRARequest("adapter", 1, "/adapters/v1"), cache_salt="tenant-a"
    )
    assert hit(connector, same) == PROMPT
    for variant in (
        request(
            toks, lora_request=LoRARequest("adapter", 1, "/adapters/v2"), cache_salt="tenant-a"
        ),
        request(
            toks, lora_request=LoRARequest("adapter", 2, "/adapters/v1"), cache_salt="tenant-a"
        ),
        request(toks, lora_request=lora, cache_salt="tenant-b"),
        request(toks, lora_request=lora),
        request(toks, cache_salt="tenant-a"),
    ):
        assert hit(connector, variant) == 0


def test_unkeyable_requests_are_neither_loaded_nor_stored(connector):
    from kvtier.manager import ScheduledRequest

    toks = text(3)
    store(connector, request(toks))
    m = connector.manager
    before = m.metrics.get("unkeyable_requests", "mm-modality")
    odd = request(toks, mm_features=[image("x", modality="brainwaves")])
    assert hit(connector, odd) == 0  # its plain-text chunks are present, yet no hit
    assert hit(connector, odd) == 0
    assert m.metrics.get("unkeyable_requests", "mm-modality") == before + 1  # once per request
    no_id = request(toks, mm_features=[image("", pixels="x")])
    assert hit(connector, no_id) == 0
    assert m.metrics.get("unkeyable_requests", "mm-identifier") >= 1
    # a keyable request with new chunks plans a store, the unkeyable one never does
    fresh = request(text(4), mm_features=[image("x")])
    fresh_odd = request(text(5), mm_features=[image("x", modality="brainwaves")])
    for r in (fresh, fresh_odd):
        hit(connector, r)
    blocks = list(range(PROMPT // BLOCK))
    plan = m.build_step(
        [
            ScheduledRequest(r.request_id, r.all_token_ids, PROMPT, blocks, PROMPT)
            for r in (fresh, fresh_odd)
        ]
    )
    stored_by = {j.req_id for j in plan.stores}
    assert fresh.request_id in stored_by and fresh_odd.request_id not in stored_by
