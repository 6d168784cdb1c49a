"""The SmolLM2 engine runs shared by the tests in tests/vllm/: one engine configuration,
deterministic chat prompts, a three-phase program (two rounds with the prefix cache reset
between them, then a multi-turn round), a runner memoized per configuration (in the
worker's engine host, or in a process of its own) and readers of its results.

Modules in one xdist group share the memo, so a configuration two modules run starts one
engine (tests/vllm/test_vllm.py and tests/vllm/test_vllm_layers.py share ``vllm-hits``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.engine_client import EngineHost

CHUNK = 32  # default chunk size: the engine block size (vLLM CPU needs multiples of 32)
BYTES_PER_TOKEN = 46_080  # 30 layers x 3 KV heads x 64 x 2 (K, V) x 4 bytes


def prompts() -> tuple[list[list[int]], list[list[int]]]:
    """Chat prompts over deterministic documents, as token ids (exact lengths matter)."""
    from transformers import AutoTokenizer

    from kvtier.tools.bench.text import SYSTEM, document, question
    from kvtier.tools.models import smollm2_path

    tok = AutoTokenizer.from_pretrained(smollm2_path())

    def chat(doc: str, q: str) -> list[int]:
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{doc}\n\n{q}"}]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        return list(tok.encode(text, add_special_tokens=False))

    doc = document(1, 28)
    out = [chat(doc, question(1)), chat(doc + " " + document(2, 6), question(2))]
    whole = chat(document(3, 60), question(3))
    out.append(whole[: 6 * CHUNK - 8] + whole[-8:])  # exactly 6 chunks, ends like a prompt
    turns = [
        list(
            tok.encode(
                f"<|im_end|>\n<|im_start|>user\n{question(10 + i)}<|im_end|>\n"
                "<|im_start|>assistant\n",
                add_special_tokens=False,
            )
        )
        for i in range(3)
    ]
    return out, turns


PROMPTS, TURNS = prompts()
# fp32 so that greedy tokens do not flip on rounding when the batch shapes differ.
# Chunked prefill: long prompts span several steps.
ENGINE = {"dtype": "float32", "max_num_batched_tokens": 384, "max_model_len": 4096}


def phase(name: str, max_tokens: int, extend: str | None = None) -> dict[str, Any]:
    reqs = []
    for i, p in enumerate(PROMPTS):
        r: dict[str, Any] = {"id": f"{name}-{i}", "prompt": p, "max_tokens": max_tokens}
        if extend:
            r.update(prompt=TURNS[i], extend=f"{extend}-{i}")
        reqs.append(r)
    return {"op": "serve", "name": name, "requests": reqs}


PROGRAM = [
    phase("p1", 12),
    {"op": "reset_prefix_cache"},
    phase("p2", 24),
    {"op": "reset_prefix_cache"},
    # Multi-turn: the previous prompt + its answer + a new question.
    phase("p3", 12, extend="p2"),
]
_RESULTS: dict[str, dict[str, Any]] = {}
_HOST: list[EngineHost] = []


def use_host(host: EngineHost) -> None:
    """Send the runs that need no process of their own to ``host`` (the worker's engine host,
    the ``engine_host`` fixture); a module using :func:`run` calls it before its first run."""
    _HOST[:] = [host]


def run(
    tmp_path: Path, connector: dict[str, Any] | None, fresh: bool = False, **extra: Any
) -> dict[str, Any]:
    """Run the program on a fresh engine (memoized per configuration): in the engine host,
    or with ``fresh`` (or a multiprocess engine) in a subprocess of its own."""
    spec = {
        "connector": connector,
        "engine": ENGINE,
        "program": PROGRAM,
        "inspect": connector is not None,
        **extra,
    }
    note = spec.pop("note", None)  # tells apart runs of equal specs (e.g. a restart)
    key = json.dumps([spec, note], sort_keys=True)
    if key in _RESULTS:
        return _RESULTS[key]
    if not (fresh or spec.get("multiprocess")):
        _RESULTS[key] = _HOST[0].run(spec)
        return _RESULTS[key]
    _RESULTS[key] = run_in_process(spec, tmp_path / f"spec-{len(_RESULTS)}.json")
    return _RESULTS[key]


def run_in_process(spec: dict[str, Any], spec_path: Path) -> dict[str, Any]:
    """Run one runner spec (:mod:`kvtier.vllm.harness.runner`) in a process of its own; the
    spec is written to ``spec_path``, the result next to it (``.out.json``)."""
    out_path = spec_path.with_suffix(".out.json")
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier.vllm.harness.runner", str(spec_path), str(out_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out: dict[str, Any] = json.loads(out_path.read_text())
    return out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory, engine_host: EngineHost) -> dict[str, Any]:
    use_host(engine_host)  # for modules that import this fixture and run()
    return run(tmp_path_factory.mktemp("baseline"), None)


def phases(result: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [op["requests"] for op in result["ops"]]


def outputs(result: dict[str, Any]) -> list[list[list[int]]]:
    return [[r["output"] for r in p] for p in phases(result)]


def num_cached(result: dict[str, Any], i: int) -> list[int]:
    return [r["num_cached"] for r in phases(result)[i]]


def sources(result: dict[str, Any], i: int) -> list[dict[str, int]]:
    """Per request of a phase, the hit tokens by source kvtier recorded for it."""
    return [r.get("hit_sources", {}) for r in phases(result)[i]]


def metric(result: dict[str, Any], name: str, *labels: str) -> float:
    for key, value in result["kvtier"]["metrics"]["values"].get(name, []):
        if tuple(key) == labels:
            return float(value)
    return 0.0


def assert_clean(result: dict[str, Any]) -> None:
    c = result["kvtier"]
    assert not c["pending_jobs"] and c["requests"] == 0 and c["pins"] == 0
    assert c["worker_inflight"] == 0


def expected_hit(prompt_len: int, sync: bool) -> int:
    hit = prompt_len // CHUNK * CHUNK
    return hit - 1 if sync and hit == prompt_len else hit
