"""The tiny-model engine runs shared by tests/vllm/test_models.py and the modules built on its
program (tests/vllm/test_hybrid.py, tests/vllm/test_load_failures.py): the engine settings per
architecture, four prompts whose outputs depend on the whole prompt, the two-round program
(the engine's prefix cache reset between the rounds, so round 2 must come back from kvtier),
and one :mod:`kvtier.vllm.harness.model_matrix` subprocess that runs the named specs."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

ENGINE_FOR: dict[str, dict[str, Any]] = {
    # vLLM's CPU Mamba2 cannot run with prefix caching on (its "align" mode): the first
    # prefill fails in mamba_mixer2 with "IndexError: index 1 is out of bounds for
    # dimension 0 with size 1" (the CPU chunk scan ignores return_intermediate_states),
    # with or without kvtier. Without prefix caching vLLM's Mamba cache mode is "none".
    "granite_hybrid": {"enable_prefix_caching": False},
    "falcon_h1": {"enable_prefix_caching": False},
    # vLLM's CPU gated delta net needs bf16 ("CPU GDN attention requires BF16").
    "qwen3_next": {"dtype": "bfloat16"},
    # On CPUs with AMX, vLLM's CPU MLA backend (amx_mla) loads bf16 weights only ("expect
    # weight to be bfloat16, ..."), before kvtier is asked: the refusal needs an engine
    # that gets as far as its KV connector.
    "deepseek_v2_mla": {"dtype": "bfloat16"},
}
"""Per-architecture engine settings (on top of ENGINE), the same with and without kvtier."""


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


def phase(name: str) -> dict[str, Any]:
    reqs = [
        {"id": f"{name}-{i}", "prompt": p, "max_tokens": 8, "ignore_eos": True}
        for i, p in enumerate(prompts())
    ]
    return {"op": "serve", "name": name, "requests": reqs}


PROGRAM = [phase("r1"), {"op": "reset_prefix_cache"}, phase("r2")]
ENGINE = {
    "dtype": "float32",
    "max_model_len": 1024,
    "max_num_batched_tokens": 128,
    "max_num_seqs": 4,
}
CONNECTOR = {"cpu_bytes": "64MiB", "sync_budget": "1GiB"}


def run_specs(
    tmp: Path, runs: dict[str, dict[str, Any]], env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run the named runner specs in one model_matrix subprocess; results by name, and
    its stderr as "_stderr"."""
    spec, out = tmp / "spec.json", tmp / "out.json"
    spec.write_text(json.dumps({"runs": list(runs.values())}))
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier.vllm.harness.model_matrix", str(spec), str(out)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=None if env is None else os.environ | env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = dict(zip(runs, json.loads(out.read_text())["runs"], strict=True))
    results["_stderr"] = proc.stderr
    for k, r in results.items():
        if k != "_stderr":
            print(f"{k}: {r.get('seconds', 0):.1f} s")  # seconds per engine (pytest -s)
    return results


BUILD = (
    "import sys; from pathlib import Path; from kvtier.tools.tiny_models import build\n"
    "[build(a, Path(sys.argv[1]) / a) for a in sys.argv[2:]]"
)


def outputs(result: dict[str, Any]) -> list[list[list[int]]]:
    assert "error" not in result, result.get("error")
    return [[r["output"] for r in op["requests"]] for op in result["ops"]]
