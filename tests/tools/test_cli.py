"""The kvtier command: bench end to end on a tiny configuration, sim, inspect, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from kvtier.keys import chunk_keys
from kvtier.tools.bench.workloads import DEFAULT_TRACE as TRACE
from kvtier.tools.cli import main


def kvtier(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvtier.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["bench", "--workload", "chat"], "--workload: unknown 'chat'"),
        (["bench", "--modes", "fast"], "--modes: unknown 'fast'"),
        (["bench", "--cpu-bytes", "8 parsecs"], "--cpu-bytes: cannot parse"),
        (["bench", "--model", "/no/such/model"], "not a local model directory"),
        (
            ["bench", "--workload", "two-engines", "--remote", "http://127.0.0.1:1"],
            "--remote: the value (not shown, 18 characters) has a scheme that is not accepted",
        ),
        (
            ["bench", "--workload", "two-engines", "--remote", "redis://127.0.0.1:1"],
            "--remote: cannot reach redis://127.0.0.1:1",
        ),
        (["bench", "--remote", "redis://127.0.0.1:1"], "--remote: only the two-engines workload"),
        (["inspect", "/no/such/dir"], "/no/such/dir"),
        (["sim", "--trace", "/no/such/trace.jsonl"], "trace.jsonl"),
    ],
)
def test_user_mistakes_are_one_clear_line(args, needle, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvtier: error:") and needle in err
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_comparison_of_unequal_bindings_is_refused():
    from kvtier.errors import ConfigError
    from kvtier.tools.bench.binding import check_equal, same_binding

    one = {"omp_threads": 1, "cpus": [0]}
    two = {"omp_threads": 2, "cpus": [0, 1]}
    check_equal({"baseline": one, "sync": dict(one)})
    assert not same_binding({"baseline": one, "sync": two})
    with pytest.raises(ConfigError) as e:
        check_equal({"baseline": one, "sync": two})
    msg = str(e.value)
    assert "\n" not in msg and "baseline: 1 OpenMP thread(s) on cores [0]" in msg
    with pytest.raises(ConfigError, match="async: not measured"):
        check_equal({"baseline": one, "async": None})


@pytest.mark.vllm
def test_bench_end_to_end(tmp_path):
    out = tmp_path / "bench"
    proc = kvtier(
        "bench",
        "--requests",
        "4",
        "--workload",
        "multi-turn,no-reuse",
        "--modes",
        "baseline,async,sync,sync-layers",
        "--max-tokens",
        "6",
        "--doc-tokens",
        "200",
        "--device-blocks",
        "16",
        "--concurrency",
        "1",
        "--repeats",
        "1",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert {"machine", "config", "workloads", "kvtier", "binding"} <= res.keys()
    # Every mode's engine measured its own binding, and they are equal (the connector's
    # engines would otherwise get another thread count than the baseline).
    binding = res["binding"]
    assert set(binding) == {"baseline", "async", "sync", "sync-layers"}
    assert len({(b["omp_threads"], tuple(b["cpus"])) for b in binding.values()}) == 1
    assert all(b["omp_threads"] == res["config"]["threads"] for b in binding.values())
    assert res["threads_equal"] is True
    raw = json.loads((out / "requests.json").read_text())
    for wl in ("multi-turn", "no-reuse"):
        modes = res["workloads"][wl]["modes"]
        assert set(modes) == {"baseline", "async", "sync", "sync-layers"}
        for mode, m in modes.items():
            for key in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "throughput_tok_s"):
                assert m[key] > 0
            assert m["ttft_p50_s"] <= m["ttft_p90_s"] <= m["ttft_p99_s"]
            h = m["hit_tokens"]
            assert set(h) == {"device", "host", "disk", "remote", "recomputed"}
            assert sum(h.values()) == m["prompt_tokens"]
            if mode != "baseline":
                assert m["outputs_match_baseline"] is True
            for r in raw[wl][mode]["requests"]:
                # kvtier's hit tokens by source are part of what vLLM counts as cached.
                assert sum(r.get("hit_sources", {}).values()) <= r["num_cached"]
    # No request of no-reuse has a kvtier hit: each is compared with itself in the baseline.
    nr = res["workloads"]["no-reuse"]["modes"]
    assert nr["sync"]["cold_requests"] == nr["sync"]["requests"] > 0
    assert nr["sync"]["cold_ttft_p99_over_baseline"] > 0
    assert "cold_ttft_p50_over_baseline" not in nr["baseline"]
    assert res["workloads"]["no-reuse"]["modes"]["async"]["hit_tokens"]["host"] == 0
    assert res["workloads"]["no-reuse"]["modes"]["sync"]["hit_tokens"]["host"] == 0
    mt = res["workloads"]["multi-turn"]["modes"]
    assert mt["sync"]["hit_tokens"]["host"] > 0 and mt["sync"]["loads"]["sync"] > 0
    assert mt["sync-layers"]["loads"]["sync"] > 0  # layer by layer, outputs still identical
    assert mt["async"]["hit_tokens"]["host"] > 0 and mt["async"]["loads"]["async"] > 0
    assert mt["baseline"]["hit_tokens"]["host"] == 0
    assert sorted(p.name for p in out.glob("*.png")) == [
        "hit_sources_multi-turn.png",
        "hit_sources_no-reuse.png",
        "ttft_cdf_multi-turn.png",
        "ttft_cdf_no-reuse.png",
    ]


def test_shared_prefix_counts_each_chunk_a_computed_once():
    from kvtier.tools.bench.two_engines import shared_prefix_tokens

    # Chunks of 4. Conversation 0: A computed 1..8 (its last output token, 9, has no KV),
    # B's prompt extends it: two chunks. Conversation 1 starts with conversation 0's first
    # chunk and adds one partial chunk: nothing new. The long prompt, sent again as it was:
    # both its chunks (kvtier may load a whole prompt).
    first = [
        {"id": "c0", "prompt": [1, 2, 3, 4, 5, 6, 7]},
        {"id": "c1", "prompt": [1, 2, 3, 4, 20, 21]},
        {"id": "long", "prompt": [40, 41, 42, 43, 44, 45, 46, 47]},
    ]
    a = {"requests": [{"id": "c0", "output": [8, 9]}, {"id": "c1", "output": [22]}]}
    a["requests"].append({"id": "long", "output": [0]})
    second = [
        {"prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]},
        {"prompt": [1, 2, 3, 4, 20, 21, 22, 30]},
        {"prompt": [40, 41, 42, 43, 44, 45, 46, 47]},
    ]
    assert shared_prefix_tokens(first, a, second, 4) == 4 * 4


@pytest.mark.vllm
def test_bench_two_engines_on_a_users_store(tmp_path):
    """Engine A stores, a fresh engine B hits it in the remote store, outputs equal the
    no-kvtier baseline; on a store kvtier did not start only this run's keys go."""
    import redis

    from kvtier.tools.redis_server import RedisServer

    out = tmp_path / "bench"
    with RedisServer() as server:
        theirs = redis.Redis(host="127.0.0.1", port=server.port)
        theirs.set(b"someone-elses", b"data")
        proc = kvtier(
            "bench",
            "--workload",
            "two-engines",
            "--remote",
            server.url,
            *("--requests", "4", "--doc-tokens", "200", "--max-tokens", "4"),
            *("--device-blocks", "16", "--concurrency", "1", "--out", str(out)),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert theirs.keys() == [b"someone-elses"]  # the run's chunks deleted, nothing else
        theirs.close()
    res = json.loads((out / "results.json").read_text())
    wl = res["workloads"]["two-engines"]
    s = wl["summary"]
    assert wl["params"]["conversations"] == 2 and "two-engines:" in proc.stdout
    assert s["remote_hit_tokens"] > 0
    assert s["remote_hit_tokens"] >= 0.9 * s["shared_prefix_tokens"] > 0
    assert s["outputs_match_baseline"] is True
    rows = wl["modes"]
    assert set(rows) == {"A", "B", "baseline first", "baseline"}
    assert rows["A"]["hit_tokens"]["remote"] == rows["baseline"]["hit_tokens"]["remote"] == 0
    assert rows["B"]["hit_tokens"]["recomputed"] < rows["baseline"]["hit_tokens"]["recomputed"]
    assert rows["B"]["outputs_match_baseline"] and rows["A"]["outputs_match_baseline"]
    binding = res["binding"]  # every engine on the bench's threads, measured
    assert set(binding) == {"two-engines A", "two-engines B", "two-engines baseline"}
    assert {(b["omp_threads"], tuple(b["cpus"])) for b in binding.values()} == {
        (res["config"]["threads"], tuple(binding["two-engines A"]["cpus"]))
    }
    assert res["threads_equal"] is True


def test_sim_cli_matches_brute_force_lru(tmp_path):
    from kvtier.tools.sim import load_trace
    from tests.support.sim_oracles import as_requests, brute_force_lru

    out = tmp_path / "sim.json"
    assert (
        main(
            [
                "sim",
                "--trace",
                str(TRACE),
                "--limit",
                "300",
                "--capacity",
                "51200,204800",
                "--policies",
                "lru",
                "--json",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    reqs = as_requests(load_trace(TRACE, limit=300))
    assert len(res["runs"]) == 2
    for run in res["runs"]:
        slots = run["capacity"][0]["slots"]
        blocks, tokens = brute_force_lru(reqs, slots)
        assert (run["hit_blocks"]["total"], run["hit_tokens"]["total"]) == (blocks, tokens)


def test_inspect_reports_a_disk_tier(tmp_path, capsys):
    from kvtier.tools.slot_tier import DiskTier

    ns = bytes(range(16))
    tier = DiskTier(tmp_path / "d", 16 * 4096, 4096, ns)
    assert (
        tier.put(chunk_keys(list(range(12)), 4, b"s"), torch.zeros(3, 4096, dtype=torch.uint8)) == 3
    )
    tier.close()
    assert main(["inspect", str(tmp_path / "d"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert json.dumps(info).count(ns.hex()) >= 1
