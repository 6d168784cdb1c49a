"""The serving path: vLLM's OpenAI server with kvtier, driven over HTTP.

Two servers on free loopback ports, one with kvtier and one without, with the same
explicit CPU binding and an engine cache of 128 blocks of 32 tokens (a block count equal
to the CPU KV layout's content dimension, which once stopped the connector at start-up).
Three users chat round-robin, streaming; each first turn carries a ~1,400-token document,
so by a user's second turn the engine's own cache has dropped that user's prefix and
kvtier serves it. Greedy outputs must be identical to the server without the connector.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

USERS = 3
ARGS = [
    "--dtype",
    "float32",  # greedy tokens must not flip on rounding between batch shapes
    "--enforce-eager",
    "--block-size",
    "32",
    "--num-gpu-blocks-override",
    "128",
    "--max-model-len",
    "2048",
    "--max-num-seqs",
    "2",
    "--seed",
    "0",
]


def chat(url: str, messages: list[dict[str, str]]) -> tuple[str, float]:
    """One streamed, greedy chat turn: (answer, seconds to the first content chunk)."""
    import httpx

    body = {
        "model": "model",
        "messages": messages,
        "max_tokens": 8,
        "temperature": 0.0,
        "stream": True,
    }
    text, first = "", None
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as resp:
        assert resp.status_code == 200, resp.read()[:300]
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line.endswith("[DONE]"):
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                delta = choice.get("delta", {}).get("content") or ""
                if delta and first is None:
                    first = time.perf_counter() - t0
                text += delta
    assert first is not None, "no streamed content"
    return text, first


def conversation(url: str) -> list[list[str]]:
    """Two turns per user, round-robin; returns each user's answers."""
    from kvtier.tools.bench.prompts import document_text
    from kvtier.tools.bench.text import SYSTEM, question
    from kvtier.tools.models import smollm2_path

    model = smollm2_path()
    history: list[list[dict[str, str]]] = []
    for u in range(USERS):
        doc = document_text(model, 40 + u, 1400)
        history.append(
            [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"{doc}\n\n{question(u)}"},
            ]
        )
    answers: list[list[str]] = [[] for _ in range(USERS)]
    for turn in range(2):
        for u in range(USERS):
            if turn:
                history[u].append({"role": "user", "content": question(10 + u)})
            text, _ = chat(url, history[u])
            answers[u].append(text)
            history[u].append({"role": "assistant", "content": text})
    return answers


def run_server(tmp_path: Path, connector: dict[str, Any] | None) -> dict[str, Any]:
    from kvtier.tools.bench.server import Server, ServerSpec, kvtier_hit_tokens, metrics
    from kvtier.tools.models import smollm2_path

    spec = ServerSpec(smollm2_path(), connector, threads=1, args=ARGS)
    name = "kvtier" if connector else "baseline"
    server = Server(spec, tmp_path / f"{name}.log")
    try:
        assert server.url.startswith("http://127.0.0.1:")
        answers = conversation(server.url)
        binding = server.binding()
        bench = bench_over_http(server.url, tmp_path / f"bench-{name}") if connector else None
        hits = kvtier_hit_tokens(metrics(server.url))
        children = [p for p in os.listdir("/proc") if p.isdigit()]
        pids = {server.proc.pid, *(int(p) for p in children if _parent(int(p)) == server.proc.pid)}
    finally:
        code = server.stop()
    assert code == 0, server.log_tail()
    # Its engine-core and worker processes follow it out (they watch their parent).
    deadline = time.monotonic() + 30
    while [p for p in pids if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)], "server processes left running"
    return {"answers": answers, "binding": binding, "hits": hits, "bench": bench}


def bench_over_http(url: str, out: Path) -> dict[str, Any]:
    """``kvtier bench --server URL`` on a tiny multi-turn workload."""
    from kvtier.tools.cli import main

    args = ["bench", "--server", url, "--workload", "multi-turn", "--requests", "4"]
    args += ["--max-tokens", "4", "--doc-tokens", "200", "--concurrency", "1", "--out", str(out)]
    assert main(args) == 0
    return json.loads((out / "results.json").read_text())


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_openai_server_with_kvtier_multi_turn_chat(tmp_path):
    base = run_server(tmp_path, None)
    ours = run_server(tmp_path, {"cpu_bytes": "512MiB"})
    assert ours["answers"] == base["answers"]
    assert all(a for user in ours["answers"] for a in user)
    # The second turns found their prefix in kvtier's host tier, not the engine's cache.
    assert ours["hits"].get("host", 0) >= USERS * 1024, ours["hits"]
    assert base["hits"] == {}
    # Same measured compute binding for both servers' model workers.
    b, o = base["binding"], ours["binding"]
    assert b and o and b["omp_threads"] == o["omp_threads"] == 1
    assert b["thread_cpu_sets"] == o["thread_cpu_sets"]
    # kvtier bench over HTTP: client-side TTFT from the first streamed token.
    mt = ours["bench"]["workloads"]["multi-turn"]["modes"]["server"]
    assert mt["requests"] >= 4 and 0 < mt["ttft_p50_s"] <= mt["ttft_p99_s"]
    assert mt["output_tokens"] > 0 and sum(mt["hit_tokens"].values()) == mt["prompt_tokens"]
