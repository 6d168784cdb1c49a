"""Model coverage: tiny random models of each attention layout, with and without kvtier.

Each architecture is a checkpoint written by :mod:`kvtier.testing.tiny_models` from its
transformers config class (real random weights at a scale where outputs depend on the
whole prompt; see that module for why not ``load_format="dummy"``). Every engine runs the
same program: round 1 serves four prompts (kvtier stores them), the engine's prefix cache
is reset (eviction alone would keep sliding-window prompts resident), round 2 serves them
again, so with kvtier its KV must come back from kvtier. Greedy outputs must equal the
no-connector run token for token, and the baseline itself must show that the outputs
depend on more than the last tokens (prompts 0 and 1 share their last 16 tokens), or the
comparison would pass with wrong KV.

All engines of a test run in one subprocess (:mod:`kvtier.vllm.model_matrix`), one after
another: one torch/vLLM import for all. The default run covers Gemma 3 (sliding and full
groups with vLLM's hybrid KV-cache manager on), gpt-oss (sliding window with attention
sinks; wrong tokens with HMA off on this backend) and the refusal of a hybrid Mamba model
(dense attention is covered by tests/test_vllm.py with SmolLM2); the rest of the matrix,
including the refusal of MLA on this backend, is ``slow``.
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

DEFAULT = ("gemma3", "gpt_oss")
SLOW = ("llama", "qwen3", "mqa", "mistral_swa")
REFUSED = {"granite_hybrid": "recurrent-state"}
SLOW_REFUSED = {"deepseek_v2_mla": "MLA on vLLM's CPU backend"}
"""vLLM's CPU MLA cannot prefill over cached KV (vLLM itself turns prefix caching off for
it there): with kvtier's hits it gave wrong tokens, so kvtier refuses it on CPU."""
MULTI_GROUP = {"gemma3", "gpt_oss"}
"""Architectures that must run with several KV-cache groups (HMA on)."""


def prompts() -> list[list[int]]:
    rng = random.Random(0)
    docs = [[rng.randrange(3, 512) for _ in range(160)] for _ in range(3)]
    tail = [rng.randrange(3, 512) for _ in range(16)]
    return [
        docs[0][:144] + tail,
        docs[1][:144] + tail,  # same last 16 tokens as prompt 0: the sensitivity check
        docs[0][:96] + docs[2][:70],  # a partial prefix of prompt 0
        docs[2],
    ]


def _phase(name: str) -> dict[str, Any]:
    reqs = [
        {"id": f"{name}-{i}", "prompt": p, "max_tokens": 8, "ignore_eos": True}
        for i, p in enumerate(prompts())
    ]
    return {"op": "serve", "name": name, "requests": reqs}


PROGRAM = [_phase("r1"), {"op": "reset_prefix_cache"}, _phase("r2")]
ENGINE = {
    "dtype": "float32",
    "max_model_len": 1024,
    "max_num_batched_tokens": 128,
    "max_num_seqs": 4,
}
CONNECTOR = {"cpu_bytes": "64MiB", "sync_budget": "1GiB"}


def run_matrix(tmp: Path, archs: tuple[str, ...], refused: tuple[str, ...] = ()) -> dict[str, Any]:
    """Build the checkpoints, run baseline + kvtier per arch (and kvtier alone for the
    refused ones, last) in one subprocess; results keyed "arch/base", "arch/kvtier"."""
    build = [sys.executable, "-c", _BUILD, str(tmp), *archs, *refused]
    subprocess.run(build, check=True, capture_output=True, timeout=600)
    runs, keys = [], []
    for arch in archs:
        for conn in (None, CONNECTOR):
            runs.append(
                {
                    "model": str(tmp / arch),
                    "engine": ENGINE,
                    "connector": conn,
                    "inspect": conn is not None,
                    "program": PROGRAM,
                }
            )
            keys.append(f"{arch}/{'kvtier' if conn else 'base'}")
    for arch in refused:
        runs.append(
            {"model": str(tmp / arch), "engine": ENGINE, "connector": CONNECTOR, "program": PROGRAM}
        )
        keys.append(f"{arch}/kvtier")
    spec, out = tmp / "spec.json", tmp / "out.json"
    spec.write_text(json.dumps({"runs": runs}))
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier.vllm.model_matrix", str(spec), str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = dict(zip(keys, json.loads(out.read_text())["runs"], strict=True))
    results["_stderr"] = proc.stderr
    for k, r in results.items():
        if k != "_stderr":
            print(f"{k}: {r.get('seconds', 0):.1f} s")  # seconds per engine (pytest -s)
    return results


_BUILD = (
    "import sys; from pathlib import Path; from kvtier.testing.tiny_models import build\n"
    "[build(a, Path(sys.argv[1]) / a) for a in sys.argv[2:]]"
)


def outputs(result: dict[str, Any]) -> list[list[list[int]]]:
    assert "error" not in result, result.get("error")
    return [[r["output"] for r in op["requests"]] for op in result["ops"]]


def check_served(results: dict[str, Any], arch: str) -> None:
    base, kv = results[f"{arch}/base"], results[f"{arch}/kvtier"]
    b, k = outputs(base), outputs(kv)
    assert b[0] == b[1], f"{arch}: the baseline itself is not deterministic"
    assert b[0][0] != b[0][1], f"{arch}: outputs do not depend on the prompt beyond its tail"
    assert k == b, f"{arch}: kvtier's outputs differ from no connector"
    for r in kv["ops"][1]["requests"]:  # round 2: every prompt came back from kvtier
        assert sum(r["hit_sources"].values()) >= 64, (arch, r["id"], r["hit_sources"])
    assert kv["kvtier"]["failed_reads"] == 0
    groups = kv["kvtier"]["kv_groups"]
    assert (groups > 1) == (arch in MULTI_GROUP), (arch, groups)


@pytest.fixture(scope="module")
def default_matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_matrix(tmp_path_factory.mktemp("models"), DEFAULT, tuple(REFUSED))


@pytest.mark.parametrize("arch", DEFAULT)
def test_token_identical_with_hits(default_matrix, arch):
    check_served(default_matrix, arch)


def check_refused(results: dict[str, Any], arch: str, needle: str) -> None:
    r = results[f"{arch}/kvtier"]
    assert r.get("error_type") == "UnsupportedLayout", r
    assert r["error"].startswith("kvtier: ") and needle in r["error"]
    # The same line is logged (an operator reads logs, not the exception object).
    assert r["error"] in results["_stderr"]


@pytest.mark.parametrize("arch", list(REFUSED))
def test_refused_with_one_kvtier_line(default_matrix, arch):
    check_refused(default_matrix, arch, REFUSED[arch])


@pytest.mark.slow
def test_slow_matrix_token_identical(tmp_path):
    results = run_matrix(tmp_path, SLOW, tuple(SLOW_REFUSED))
    for arch in SLOW:
        check_served(results, arch)
    for arch, needle in SLOW_REFUSED.items():
        check_refused(results, arch, needle)
