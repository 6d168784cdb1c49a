"""Prefetch on arrival and request hints on a real vLLM engine (CPU backend, SmolLM2).

A prompt is stored (CPU tier, written through to a disk tier), the CPU tier forgets it
(the ``evict`` op: what other traffic would do) and the engine's own prefix cache is
reset, so the prompt is on disk only. It then arrives behind a long uncached prompt that
keeps the engine busy for several steps (chunked prefill, 384 tokens a step): its prefetch
runs while it waits, and when vLLM schedules it, its hit comes from the CPU tier (hit
source ``host``). Greedy outputs equal vLLM's without kvtier, token for token.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.support.engine_client import EngineHost
from tests.support.vllm_runs import ENGINE, PROMPTS, expected_hit, metric

pytestmark = pytest.mark.vllm

BUSY = [random.Random(5).randrange(100, 20000) for _ in range(1500)]
TARGET = PROMPTS[0]
HINTS = {"kvtier": {"retain_s": 600, "tier_hint": "sideways"}}  # one valid, one not
PROGRAM = [
    {"op": "serve", "name": "fill", "requests": [{"id": "f", "prompt": TARGET, "max_tokens": 4}]},
    {"op": "evict", "tier": "cpu"},
    {"op": "reset_prefix_cache"},
    {
        "op": "serve",
        "name": "replay",
        "max_concurrency": 2,
        "requests": [
            {"id": "busy", "prompt": BUSY, "max_tokens": 4},
            {"id": "target", "prompt": TARGET, "max_tokens": 12, "kv_transfer_params": HINTS},
        ],
    },
]


def run(host: EngineHost, connector: dict[str, Any] | None) -> dict[str, Any]:
    spec = {"connector": connector, "engine": ENGINE, "program": PROGRAM}
    return host.run({**spec, "inspect": connector is not None})


def outputs(result: dict[str, Any]) -> list[list[int]]:
    return [r["output"] for op in result["ops"] for r in op["requests"]]


def test_a_disk_only_prefix_arriving_while_busy_is_a_host_hit(tmp_path, engine_host):
    base = run(engine_host, None)
    cfg = {
        "cpu_bytes": "256MiB",
        "disk_path": str(tmp_path / "disk"),
        "disk_bytes": "1GiB",
        "prefetch": True,
    }
    r = run(engine_host, cfg)
    assert outputs(r) == outputs(base)
    target = r["ops"][1]["requests"][1]
    srcs = target["hit_sources"]
    n = len(TARGET)
    assert set(srcs) == {"host"}, srcs
    assert srcs["host"] in (expected_hit(n, True), expected_hit(n, False))
    chunks = metric(r, "prefetch_chunks", "disk")
    assert chunks == n // 32
    assert metric(r, "prefetch_used_chunks") == chunks
    assert metric(r, "loads", "disk", "async") == 0
    # Hints: the invalid one is counted and ignored; retain_s left one lease holding the
    # target's chain (one pin), nothing else is held or pending.
    assert metric(r, "invalid_hints", "tier_hint") == 1
    assert metric(r, "retained_chunks") > 0
    k = r["kvtier"]
    assert k["leases"] == 1 and k["pins"] == 1
    assert not k["pending_jobs"] and k["requests"] == 0 and k["prefetching"] == 0
    assert k["worker_inflight"] == 0
