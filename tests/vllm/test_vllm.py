"""kvtier on a real vLLM engine (CPU backend) with the real SmolLM2 model.

Each engine configuration runs on a fresh engine: one after another in the module's engine
host process (tests/support/engine_client.py), or in a process of its own where the test
needs one (a multiprocess engine, an engine restart); the runner, prompts and program are
tests/support/vllm_runs.py's. Every workload is run once without any
connector (the baseline) and the greedy outputs with kvtier must be token-identical,
whatever the budget, the engine mode or the faults injected.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.engine_client import EngineHost
from tests.support.slab_files import corrupt_payloads
from tests.support.vllm_runs import (
    BYTES_PER_TOKEN,
    CHUNK,
    ENGINE,
    PROGRAM,
    PROMPTS,
    assert_clean,
    expected_hit,
    metric,
    num_cached,
    outputs,
    phase,
    phases,
    run,
    sources,
    use_host,
)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module", autouse=True)
def _use_engine_host(engine_host: EngineHost) -> None:
    use_host(engine_host)


@pytest.mark.xdist_group("vllm-hits")
def test_sync_hits_are_exact_and_attributed(tmp_path, baseline):
    r = run(tmp_path, {"cpu_bytes": "512MiB", "sync_budget": "1GiB"})
    assert outputs(r) == outputs(baseline)
    c = r["kvtier"]
    assert c["chunk_tokens"] == CHUNK
    # Phase 2: every prompt is served from the host tier, in the step it is scheduled.
    assert metric(r, "loads", "cpu", "sync") >= 3 and metric(r, "loads", "cpu", "async") == 0
    # Each prompt is cached whole: by the engine's own cache where an earlier prompt of
    # the same step just loaded a shared prefix, by kvtier's host tier for the rest.
    assert num_cached(r, 1) == [expected_hit(len(p), True) for p in PROMPTS]
    phase2 = sources(r, 1)
    assert all(set(s) == {"host"} and s["host"] > 0 for s in phase2)
    assert phase2[0]["host"] == expected_hit(len(PROMPTS[0]), True)
    # Phase 3 (multi-turn): the previous answers were stored when their requests finished,
    # so the hit covers every whole chunk of prompt + answer (the KV of all but the last
    # sampled token exists).
    answers = [len(o) for o in outputs(r)[1]]
    with_answers = [
        (len(p) + n - 1) // CHUNK * CHUNK for p, n in zip(PROMPTS, answers, strict=True)
    ]
    assert num_cached(r, 2) == with_answers
    assert any(w > expected_hit(len(p), False) for w, p in zip(with_answers, PROMPTS, strict=True))
    assert all(s.get("host", 0) > 0 for s in sources(r, 2))
    assert all(n > 0 for n in num_cached(r, 1))
    assert metric(r, "failures", "cpu", "load") == 0
    assert_clean(r)


@pytest.mark.xdist_group("vllm-hits")
def test_async_hits_take_more_steps(tmp_path, baseline):
    sync = run(tmp_path, {"cpu_bytes": "512MiB", "sync_budget": "1GiB"})
    r = run(tmp_path, {"cpu_bytes": "512MiB", "sync_budget": 0})
    assert outputs(r) == outputs(baseline)
    assert metric(r, "loads", "cpu", "sync") == 0 and metric(r, "loads", "cpu", "async") >= 3
    assert [
        n >= expected_hit(len(p), True) for n, p in zip(num_cached(r, 1), PROMPTS, strict=True)
    ] == [True] * 3
    assert sources(r, 1)[0] == {"host": expected_hit(len(PROMPTS[0]), False)}
    assert r["kvtier"]["steps"] > sync["kvtier"]["steps"]
    assert_clean(r)


@pytest.mark.xdist_group("vllm-hits")
def test_per_step_budget_is_never_exceeded(tmp_path, baseline):
    budget = expected_hit(len(PROMPTS[1]), False) * BYTES_PER_TOKEN  # one prompt's hit
    r = run(tmp_path, {"cpu_bytes": "512MiB", "sync_budget": budget})
    assert outputs(r) == outputs(baseline)
    assert metric(r, "loads", "cpu", "sync") >= 1 and metric(r, "loads", "cpu", "async") >= 1
    used = r["kvtier"]["metrics"]["observations"]["sync_budget_used_bytes"]
    assert used and max(used) <= budget
    assert_clean(r)


@pytest.mark.xdist_group("vllm-hits")
def test_auto_budget_needs_no_tuning(tmp_path, baseline):
    r = run(tmp_path, {"cpu_bytes": "512MiB"})
    assert outputs(r) == outputs(baseline)
    c = r["kvtier"]
    # Measured on this machine: a copy bandwidth and a forward-pass time, hence a budget.
    assert c["bandwidth"] > 0 and c["step_seconds"] > 0 and c["budget_limit"] > 0
    assert metric(r, "loads", "cpu", "sync") >= 1
    assert_clean(r)


@pytest.mark.xdist_group("vllm-hits")
def test_failed_loads_recompute(tmp_path, baseline):
    budget = expected_hit(len(PROMPTS[1]), False) * BYTES_PER_TOKEN  # some sync, some async
    r = run(
        tmp_path,
        {"cpu_bytes": "512MiB", "sync_budget": budget, "fault_injection": {"fail_all_reads": True}},
    )
    assert outputs(r) == outputs(baseline)
    assert metric(r, "loads", "cpu", "sync") >= 1 and metric(r, "loads", "cpu", "async") >= 1
    assert metric(r, "failures", "cpu", "load") > 0
    assert r["kvtier"]["failed_reads"] > 0
    assert_clean(r)


@pytest.mark.xdist_group("vllm-hits")
def test_failed_stores_are_future_misses(tmp_path, baseline):
    r = run(
        tmp_path,
        {
            "cpu_bytes": "512MiB",
            "sync_budget": "1GiB",
            "fault_injection": {"seed": 3, "write_fail_rate": 0.5},
        },
    )
    assert outputs(r) == outputs(baseline)
    assert metric(r, "failures", "cpu", "store") > 0
    assert_clean(r)


@pytest.mark.xdist_group("vllm-stacks")
def test_settle_and_stores_ops(tmp_path):
    # Benchmarks measure the steady state after the runner's settle op: it must find the
    # worker's CPU tier and wait for its background warm-up, not return at once.
    # The stores op: with kvtier's stores off the engine serves as before and stores
    # nothing (no host hits after the engine's cache is reset), and on again it does.
    reset = {"op": "reset_prefix_cache"}
    program = [
        {"op": "settle"},
        {"op": "stores", "on": False},
        phase("p1", 2),
        reset,
        phase("p2", 2),
        {"op": "stores", "on": True},
        phase("p3", 2),
        reset,
        phase("p4", 2),
    ]
    r = run(tmp_path, {"cpu_bytes": "256MiB", "sync_budget": "1GiB"}, program=program)
    (settled,) = r["settle"]
    (warm,) = settled["warm_seconds"]
    assert warm is not None and warm > 0
    assert 0 <= settled["waited_seconds"] < 120
    assert all(not s for s in sources(r, 1))  # p2: nothing was stored in p1
    assert all(s.get("host", 0) > 0 for s in sources(r, 3))  # p4: p3 stored again


@pytest.mark.xdist_group("vllm-hits")
def test_multiprocess_engine_by_registered_name(tmp_path, baseline):
    r = run(
        tmp_path, {"cpu_bytes": "512MiB", "sync_budget": "1GiB"}, multiprocess=True, by_name=True
    )
    assert outputs(r) == outputs(baseline)
    # vLLM counts external hits as cached prompt tokens.
    assert [
        n >= expected_hit(len(p), True) for n, p in zip(num_cached(r, 1), PROMPTS, strict=True)
    ] == [True] * 3


@pytest.mark.xdist_group("vllm-stacks")
def test_disk_tier_survives_an_engine_restart(tmp_path, baseline):
    """An engine stores to disk and exits; a new engine process on the same directory
    serves the prompts from disk, token-identical; corrupted payloads become recompute."""
    disk = tmp_path / "disk"
    cfg = {"cpu_bytes": "256MiB", "disk_path": str(disk), "disk_bytes": "1GiB"}
    first = run(tmp_path, cfg, program=PROGRAM[:1])
    assert metric(first, "stored_chunks", "disk") > 0
    assert outputs(first)[0] == outputs(baseline)[0]

    import shutil

    shutil.copytree(disk, tmp_path / "disk-corrupt")
    again = run(tmp_path, cfg, fresh=True, program=[phase("p1", 12)], note="restart")
    assert outputs(again)[0] == outputs(baseline)[0]
    srcs = sources(again, 0)
    assert srcs[0] == {"disk": expected_hit(len(PROMPTS[0]), False)}
    assert all(s.get("disk", 0) > 0 for s in srcs)
    assert metric(again, "loads", "disk", "async") >= 1
    assert_clean(again)

    assert corrupt_payloads(tmp_path / "disk-corrupt") > 0
    bad = run(
        tmp_path,
        {**cfg, "disk_path": str(tmp_path / "disk-corrupt")},
        program=[phase("p1", 12)],
    )
    assert outputs(bad)[0] == outputs(baseline)[0]
    assert metric(bad, "failures", "disk", "load") > 0
    assert_clean(bad)


def _serve(name: str, which: list[int]) -> dict[str, Any]:
    reqs = [{"id": f"{name}-{i}", "prompt": PROMPTS[i], "max_tokens": 12} for i in which]
    return {"op": "serve", "name": name, "requests": reqs, "max_concurrency": 1}


DISK_ONLY = [
    _serve("fill", [0, 1, 2]),
    {"op": "evict", "tier": "cpu"},
    {"op": "reset_prefix_cache"},
    _serve("disk", [0, 1, 2]),
]


@pytest.mark.xdist_group("vllm-stacks")
@pytest.mark.parametrize("faulty", [False, True])
def test_disk_hits_load_within_the_step(tmp_path, baseline, faulty):
    """Disk-only prefixes that fit the step's budget (at the disk's price) load within the
    step, straight from the slab into engine blocks: token-identical to vLLM alone. With a
    quarter of the disk reads failing (seeded), the failed sync loads are recomputed:
    outputs still identical, the engine keeps serving."""
    disk: dict[str, Any] = {"kind": "disk", "path": str(tmp_path / "disk"), "capacity": "1GiB"}
    if faulty:
        disk["faults"] = {"seed": 3, "read_fail_rate": 0.25}
    cfg = {"sync_budget": "1GiB", "tiers": [{"kind": "cpu", "capacity": "256MiB"}, disk]}
    r = run(tmp_path, cfg, program=DISK_ONLY)
    want = outputs(baseline)[0]
    assert outputs(r) == [want, want]
    assert metric(r, "loads", "disk", "async") == 0
    assert metric(r, "loads", "disk", "sync") >= (1 if faulty else 3)
    if not faulty:
        # (later prompts share a prefix with earlier ones: the engine's own cache has it)
        assert sources(r, 1)[0] == {"disk": expected_hit(len(PROMPTS[0]), True)}
        assert all(set(s) == {"disk"} for s in sources(r, 1))
    assert (metric(r, "failures", "disk", "load") > 0) == faulty
    assert_clean(r)


@pytest.mark.xdist_group("vllm-stacks")
def test_write_back_disk_serves_what_the_cpu_tier_evicted(tmp_path, baseline):
    """A 12-chunk CPU tier, write-back: the chunks it evicts are demoted to disk and come
    back from there, token-identical; chunks never evicted are never written to disk."""
    cfg = {
        "cpu_bytes": 12 * CHUNK * BYTES_PER_TOKEN,
        "disk_path": str(tmp_path / "disk"),
        "disk_bytes": "1GiB",
        "disk_write_policy": "write-back",
    }
    r = run(tmp_path, cfg)
    assert outputs(r) == outputs(baseline)
    on_disk, in_cpu = metric(r, "stored_chunks", "disk"), metric(r, "stored_chunks", "cpu")
    assert 0 < on_disk < in_cpu
    assert metric(r, "evictions", "cpu") > 0
    later = sources(r, 1) + sources(r, 2)
    assert any(s.get("disk", 0) > 0 for s in later), later
    assert metric(r, "failures", "disk", "store") == 0
    assert_clean(r)


@pytest.mark.xdist_group("vllm-stacks")
def test_three_tier_stack_by_config_alone(tmp_path, baseline):
    """cpu (12 chunks) -> memory (24 chunks, write-back from cpu) -> disk (write-through
    from memory), given only as a ``tiers`` list: chunks the CPU tier evicts come back from
    memory or disk, token-identical."""
    chunk = CHUNK * BYTES_PER_TOKEN
    cfg = {
        "sync_budget": "1GiB",
        "tiers": [
            {"kind": "cpu", "capacity": 12 * chunk},
            {
                "kind": "memory",
                "capacity": 24 * chunk,
                "source": "p2p",
                "on_store": "skip",
                "on_evict": "demote",
            },
            {"kind": "disk", "path": str(tmp_path / "disk"), "capacity": "1GiB"},
        ],
    }
    r = run(tmp_path, cfg)
    assert outputs(r) == outputs(baseline)
    assert metric(r, "evictions", "cpu") > 0
    assert metric(r, "stored_chunks", "memory") > 0 and metric(r, "stored_chunks", "disk") > 0
    later = sources(r, 1) + sources(r, 2)
    assert any(s.get("p2p", 0) + s.get("disk", 0) > 0 for s in later), later
    assert sorted(r["kvtier"]["tier_chunks"]) == ["cpu", "disk", "memory"]
    assert metric(r, "failures", "memory", "store") == metric(r, "failures", "disk", "store") == 0
    assert_clean(r)


@pytest.mark.xdist_group("vllm-stacks")
def test_slow_shared_tier_lookups_ask_again_later(tmp_path, baseline):
    """A shared tier (in-process memory space) whose probes take 50 ms, under a 12-chunk
    CPU tier: vLLM is told to ask again later (the scheduler never waits on the probe),
    the hits come from the shared tier, token-identical."""
    chunk = CHUNK * BYTES_PER_TOKEN
    cfg = {
        "sync_budget": "1GiB",
        "tiers": [
            {"kind": "cpu", "capacity": 12 * chunk},
            {
                "kind": "memory",
                "shared": True,
                "url": f"memory://vllm-{tmp_path.name}",
                "capacity": "256MiB",
                "lookup_delay_ms": 50,
            },
        ],
    }
    r = run(tmp_path, cfg)
    assert outputs(r) == outputs(baseline)
    assert r["kvtier"]["deferred"] > 0
    later = sources(r, 1) + sources(r, 2)
    assert any(s.get("p2p", 0) > 0 for s in later), later
    assert metric(r, "stored_chunks", "memory") > 0
    assert_clean(r)


TIGHT = {**ENGINE, "num_gpu_blocks_override": 24, "max_model_len": 736}  # 768 tokens


def tight_program() -> list[dict[str, Any]]:
    """Three decodes of 48 tokens in a 768-token engine cache (1,158 prompt tokens): vLLM
    must preempt (the test asserts it did); one request is aborted mid-decode. Then the
    same prompts again, served by kvtier."""
    ops: list[dict[str, Any]] = []
    for name in ("t1", "t2"):
        reqs = [
            {"id": f"{name}-{i}", "prompt": p, "max_tokens": 48, "ignore_eos": True}
            for i, p in enumerate(PROMPTS)
        ]
        reqs[2]["abort_after_tokens"] = 4
        ops += [{"op": "serve", "name": name, "requests": reqs}, {"op": "reset_prefix_cache"}]
    return ops


@pytest.mark.xdist_group("vllm-stacks")
def test_preemption_and_abort_leak_nothing(tmp_path):
    base = run(tmp_path, None, engine=TIGHT, program=tight_program())
    r = run(
        tmp_path,
        {"cpu_bytes": "256MiB", "sync_budget": "1GiB"},
        engine=TIGHT,
        program=tight_program(),
    )
    assert r["kvtier"]["preemptions"] > 0, "the scenario must make vLLM preempt"
    for ours, theirs in zip(phases(r), phases(base), strict=True):
        for a, b in zip(ours[:2], theirs[:2], strict=True):  # the aborted one differs in length
            assert a["output"] == b["output"]
        assert ours[2].get("aborted")
    assert sum(s.get("host", 0) for s in sources(r, 1)) > 0
    assert_clean(r)
