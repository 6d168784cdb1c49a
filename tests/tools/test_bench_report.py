"""``kvtier bench``'s statistics of repeated runs and of requests without a kvtier hit.

The engine runs are covered end to end in tests/tools/test_cli.py; here the arithmetic on the
runner's per-request records, against direct computations (hypothesis varies them).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kvtier.tools.bench.report import cold_ttft, merge_runs, percentile, summarize
from kvtier.tools.bench.workloads import repetition


def rec(rid: str, ttft: float, hit: int = 0, prompt: int = 100) -> dict[str, Any]:
    return {
        "id": rid,
        "ttft": ttft,
        "e2e": ttft + 0.1,
        "prompt_len": prompt,
        "num_cached": hit,
        "output": [1, 2],
        "hit_sources": {"host": hit} if hit else {},
    }


records = st.lists(
    st.tuples(st.floats(0.01, 5.0), st.floats(0.01, 5.0), st.sampled_from([0, 0, 16, 64])),
    min_size=1,
    max_size=30,
)


@given(records)
def test_cold_ratios_compare_the_same_requests(rows):
    """Cold = no kvtier hit in this mode; the baseline side is the same request ids
    (whatever the baseline's own prefix cache did), each side's percentile on its own."""
    op = {"requests": [rec(f"r{i}", t, hit) for i, (t, _, hit) in enumerate(rows)]}
    base = {"requests": [rec(f"r{i}", b) for i, (_, b, _) in enumerate(rows)]}
    got = cold_ttft(op, base)
    cold = [i for i, (_, _, hit) in enumerate(rows) if hit == 0]
    assert got["cold_requests"] == len(cold)
    if not cold:
        assert got["cold_ttft_p50_over_baseline"] is None
        return
    mine = [rows[i][0] for i in cold]
    theirs = [rows[i][1] for i in cold]
    for q in (50, 99):
        assert got[f"cold_ttft_p{q}_s"] == percentile(mine, q)
        assert got[f"baseline_cold_ttft_p{q}_s"] == percentile(theirs, q)
        assert got[f"cold_ttft_p{q}_over_baseline"] == percentile(mine, q) / percentile(theirs, q)
    assert got["cold_ttft_p99_s"] == max(mine) or len(mine) > 50


def test_cold_ratios_are_unknown_over_http_and_absent_for_the_baseline():
    op = {"requests": [rec("a", 1.0)], "kvtier_hit_tokens": {"host": 5}}
    assert cold_ttft(op, {"requests": [rec("a", 1.0)]})["cold_ttft_p99_over_baseline"] is None
    base = {"requests": [rec("a", 1.0), rec("b", 2.0, hit=50)], "seconds": 1.0}
    s = summarize(base, None)
    assert "cold_ttft_p50_over_baseline" not in s
    k = summarize({"requests": [rec("a", 1.5), rec("b", 0.2, hit=50)], "seconds": 1.0}, base)
    assert k["cold_requests"] == 1 and k["cold_ttft_p50_over_baseline"] == 1.5


def test_repeated_runs_keep_their_requests_apart_and_add_up():
    reqs = [{"id": "u0t0", "prompt": [1]}, {"id": "u0t1", "prompt": [2], "extend": "u0t0"}]
    runs = [repetition(reqs, k) for k in range(3)]
    ids = [r["id"] for run in runs for r in run]
    assert len(set(ids)) == 6 and runs[2][1]["extend"] == "u0t0#2" == runs[2][0]["id"]
    assert reqs[1]["extend"] == "u0t0"  # the workload itself is unchanged
    ops = [
        {"name": "w", "seconds": 1.0 + k, "requests": [rec(r["id"], 0.1 * k) for r in run]}
        for k, run in enumerate(runs)
    ]
    merged = merge_runs(ops)
    assert merged["seconds"] == 6.0 and merged["runs"] == 3
    assert [r["id"] for r in merged["requests"]] == ids
    assert percentile([r["ttft"] for r in merged["requests"]], 50) == 0.1
    http = [{**op, "kvtier_hit_tokens": {"host": 4, "disk": k}} for k, op in enumerate(ops)]
    assert merge_runs(http)["kvtier_hit_tokens"] == {"host": 12, "disk": 3}
