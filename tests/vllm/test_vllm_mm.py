"""Multimodal chunk keys on a real engine: a tiny vision-language model, two images.

tests/vllm/test_vllm_keys.py checks the keys of multimodal requests through the connector's
scheduler side with vLLM's own ``Request`` objects; this test checks the same end to end,
on a real vLLM engine that runs a vision encoder. The model is a tiny Idefics3 (SmolVLM's
architecture) written by :func:`kvtier.tools.tiny_models.build_vision` from its
transformers config class, with random weights at a scale where the outputs depend on the
image, and a processor built locally (nothing is downloaded).

Program, on one engine with kvtier (CPU tier) and one without a connector, the engine's
prefix cache reset between rounds so that every hit comes from kvtier:

1. text + image A (kvtier stores it);
2. the same text + image B: the chunks before the image hit, no chunk from the image's
   first token on does (a hit there would be A's KV for B's image);
3. text + image A again: a hit past the image.

Every output equals the no-connector run token for token, and the baseline shows that the
image changes the output (A and B differ), or a wrong hit in round 2 could pass unseen.

It runs where vLLM can import the model's vision stack (Idefics3 needs no torchvision: its
image processor falls back to PIL); where that import fails, the test skips, and the
reason names the missing module.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

PRE, POST = 100, 60
"""Text tokens before and after the image placeholder: the image starts inside the
fourth 32-token block, so three whole chunks of text precede it."""
ENGINE = {
    "dtype": "float32",
    "max_model_len": 1024,
    "max_num_batched_tokens": 256,
    "max_num_seqs": 4,
    "limit_mm_per_prompt": {"image": 1},
}
CONNECTOR = {"cpu_bytes": "64MiB", "sync_budget": "1GiB"}


@pytest.fixture(scope="module")
def vision_stack() -> None:
    """Skip unless the vision stack imports: vLLM's Idefics3 model module, and the image
    processor transformers picks for it (its torchvision backend where torchvision imports,
    PIL elsewhere). The skip reason carries the ImportError, which names the missing module;
    any other failure is a test failure."""
    pytest.importorskip("vllm.model_executor.models.idefics3")
    from transformers import Idefics3ImageProcessor

    try:
        Idefics3ImageProcessor()
    except ImportError as e:
        why = " ".join(str(e).split())  # transformers' message spans lines
        pytest.skip(f"transformers' Idefics3 image processor cannot be built: {why}")


def _program(image_token: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    prompt = [rng.randrange(3, 512) for _ in range(PRE)]
    prompt += [image_token] + [rng.randrange(3, 512) for _ in range(POST)]

    def serve(name: str, seed: int) -> dict[str, Any]:
        req = {"id": f"{name}-0", "prompt": prompt, "max_tokens": 8, "ignore_eos": True}
        return {"op": "serve", "name": name, "requests": [req | {"image": {"seed": seed}}]}

    reset = {"op": "reset_prefix_cache"}
    return [serve("a", 1), reset, serve("b", 2), reset, serve("a_again", 1)]


def test_images_key_chunks_on_a_real_engine(vision_stack, tmp_path: Path):
    from kvtier.tools.tiny_models import VISION_TOKENS
    from tests.support.model_runs import outputs, run_specs

    model = tmp_path / "idefics3"
    build = (
        "import sys; from kvtier.tools.tiny_models import build_vision; build_vision(sys.argv[1])"
    )
    subprocess.run([sys.executable, "-c", build, str(model)], check=True, timeout=600)
    image_token = json.loads((model / "config.json").read_text())["image_token_id"]
    run = {"model": str(model), "engine": ENGINE, "program": _program(image_token)}
    # Both engines in one subprocess (tests/vllm/test_models.py's harness).
    results = run_specs(
        tmp_path, {"base": run | {"connector": None}, "kvtier": run | {"connector": CONNECTOR}}
    )
    base, kv = outputs(results["base"]), outputs(results["kvtier"])
    assert base[0] == base[2], "the baseline is not deterministic"
    assert base[0] != base[1], "the image does not change the output: the test cannot see"
    assert kv == base, "kvtier's outputs differ from no connector"

    (a,), (b,), (again,) = (op["requests"] for op in results["kvtier"]["ops"])
    expanded = a["engine_prompt"]
    at = [i for i, t in enumerate(expanded) if t == image_token]
    assert len(at) == VISION_TOKENS and b["engine_prompt"] == expanded  # same token ids
    # vLLM put the image's run (<fake_token_around_image><global-img><image>... ) where
    # the prompt's one <image> was: position PRE, after the unchanged text.
    first = PRE
    assert first < at[0] and at[-1] < first + VISION_TOKENS + 3
    hit = {
        name: sum(r["hit_sources"].values()) for name, r in (("a", a), ("b", b), ("again", again))
    }
    print(f"hit tokens: {hit}, image tokens at {at[0]}..{at[-1]}")  # pytest -s
    assert hit["a"] == 0, hit
    # B shares A's text before the image (three whole chunks) and nothing from the image on.
    assert 0 < hit["b"] <= first, hit
    assert hit["again"] > at[-1], hit


def _serve(prompt: list[int], name: str, seed: int, uuid: str | None) -> dict[str, Any]:
    req = {"id": f"{name}-0", "prompt": prompt, "max_tokens": 8, "ignore_eos": True}
    return {
        "op": "serve",
        "name": name,
        "requests": [req | {"image": {"seed": seed, "uuid": uuid}}],
    }


def test_a_client_uuid_cannot_bind_other_pixels_across_engines(vision_stack, tmp_path: Path):
    """Issue 45, finding 7, on real engines sharing a disk tier. An "attacker" engine serves
    image A under the client uuid ``photo``; a fresh "victim" engine then serves image B
    under the same uuid. With ``mm_keys: content`` (default) the victim hits only the text
    before the image and its output is B's (vLLM alone on a fresh engine); with
    ``mm_keys: identifier`` the same program serves A's KV for B (the hit runs past the
    image and the output differs), which shows the test can see the attack."""
    from kvtier.tools.tiny_models import VISION_TOKENS
    from tests.support.model_runs import outputs, run_specs

    model = tmp_path / "idefics3"
    build = (
        "import sys; from kvtier.tools.tiny_models import build_vision; build_vision(sys.argv[1])"
    )
    subprocess.run([sys.executable, "-c", build, str(model)], check=True, timeout=600)
    image_token = json.loads((model / "config.json").read_text())["image_token_id"]
    rng = random.Random(1)
    prompt = [rng.randrange(3, 512) for _ in range(PRE)]
    prompt += [image_token] + [rng.randrange(3, 512) for _ in range(POST)]
    attack = [_serve(prompt, "a_as_photo", 1, "photo")]
    victim = [_serve(prompt, "b_as_photo", 2, "photo")]
    base = {"model": str(model), "engine": ENGINE, "connector": None}
    runs: dict[str, dict[str, Any]] = {
        # B under the uuid on a fresh engine, then A without one: the oracle and the check
        # that A's and B's outputs differ.
        "base": base | {"program": victim + [_serve(prompt, "a", 1, None)]},
    }
    for mode in ("content", "identifier"):
        conn = {"cpu_bytes": "64MiB", "disk_path": str(tmp_path / mode), "mm_keys": mode}
        runs[f"{mode}/attacker"] = base | {"connector": conn, "program": attack}
        runs[f"{mode}/victim"] = base | {"connector": conn, "program": victim}
    results = run_specs(tmp_path, runs)
    (b_out, a_out) = outputs(results["base"])
    assert b_out != a_out, "the image does not change the output: the test cannot see"

    def victim_of(mode: str) -> tuple[list[list[int]], int]:
        (req,) = results[f"{mode}/victim"]["ops"][0]["requests"]
        return outputs(results[f"{mode}/victim"])[0], sum(req["hit_sources"].values())

    out, hit = victim_of("content")
    assert out == b_out, "a client uuid bound other pixels' KV through the disk tier"
    assert 0 < hit <= PRE, hit  # the text before the image came from the disk tier
    out, hit = victim_of("identifier")
    assert hit > PRE + VISION_TOKENS, hit
    assert out != b_out, "identifier names should have served A's KV for B"
