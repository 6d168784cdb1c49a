"""Tests of the trace-driven cache simulator (kvtier.tools.sim).

The central test replays a sample of the Mooncake synthetic trace through kvtier's
SlotIndex + LRUPolicy (via the simulator) and through a brute-force LRU written here from
scratch, and requires *exactly* the same hits. The brute force works on block-prefix tuples
(no keys, no hashing, no SlotIndex) with these rules, which are kvtier's:

- lookup: the hit is the longest prefix of the request's blocks that is stored; the whole
  hit chain is touched, deepest block first, so the root ends up the most recent;
- store: the blocks after the hit are stored under the deepest hit block. If the tier lacks
  ``need`` free slots, ``need`` victims are chosen first (the deepest hit block is
  protected), then as many blocks as fit are stored, inserted deepest first, and the
  existing ancestors are touched again (parent first, root last);
- victims: repeatedly, the least recently used block without stored children.

Both touch rules keep every ancestor more recent than its descendants, which is what
lets kvtier pick victims in a single scan of the recency order.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.keys import KEY_BYTES
from kvtier.tools.bench.workloads import DEFAULT_TRACE
from kvtier.tools.sim import (
    format_sim,
    load_trace,
    next_uses,
    parse_capacity,
    parse_policy,
    replay_belady,
    replay_index,
    replay_infinite,
    run_sim,
    tier_capacities,
)
from kvtier.tools.sim.trace import Trace
from tests.support.sim_oracles import BLOCK, as_requests, brute_force_lru, reuse_bound

TRACE = DEFAULT_TRACE
SAMPLE = 800
"""Requests of the synthetic trace used by the replay tests (keeps the brute force fast)."""


@pytest.fixture(scope="module")
def sample() -> Trace:
    return load_trace(TRACE, limit=SAMPLE)


# -- brute force -----------------------------------------------------------------------------


def write_trace(path: Path, chains: list[list[int]]) -> Path:
    """A JSONL trace of full 512-token blocks."""
    lines = [
        json.dumps({"timestamp": i, "input_length": BLOCK * len(ids), "hash_ids": ids})
        for i, ids in enumerate(chains)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


# -- exactness against the brute force ---------------------------------------------------------


@pytest.mark.parametrize("slots", [0, 1, 40, 150, 400, 1000, 3000])
def test_lru_equals_brute_force(sample: Trace, slots: int) -> None:
    r = replay_index(sample, [slots], "lru", 1)
    assert (r.hit_blocks[0], r.hit_tokens[0]) == brute_force_lru(as_requests(sample), slots)


def test_eviction_frees_what_is_needed(tmp_path: Path) -> None:
    """3 slots. [1,2] then [1,3] fill the tier; [4,5,6] needs all three slots. Leaves go
    first (2, then 3), which leaves 1 childless, so it goes too and the whole chain fits."""
    chains = [[1, 2], [1, 3], [4, 5, 6], [4, 5, 6]]
    trace = load_trace(write_trace(tmp_path / "t.jsonl", chains))
    r = replay_index(trace, [3], "lru", check=True)
    assert (r.hit_blocks[0], r.hit_tokens[0]) == brute_force_lru(as_requests(trace), 3)
    assert r.hit_blocks == [1 + 3]


# -- sanity ---------------------------------------------------------------------------------


def test_lru_hit_ratio_monotone_in_capacity(sample: Trace) -> None:
    hits = [replay_index(sample, [s], "lru").hit_tokens[0] for s in range(0, 5001, 500)]
    assert hits == sorted(hits)
    assert hits[-1] > hits[0] == 0


@pytest.mark.parametrize("slots", [40, 400, 2000])
def test_belady_bounds_online_policies(sample: Trace, slots: int) -> None:
    future = next_uses(sample)
    belady = replay_belady(sample, slots, future, check=True)
    for policy in ("lru", "arc", "lru-seen2", "arc-seen2"):
        spec = parse_policy(policy)
        online = replay_index(sample, [slots], spec.eviction, spec.min_seen)
        assert belady.hit_blocks[0] >= online.hit_blocks[0], policy
    assert belady.hit_blocks[0] <= replay_infinite(sample).hit_blocks[0]


def test_infinite_equals_reuse_bound(sample: Trace) -> None:
    expected = reuse_bound(as_requests(sample))
    r = replay_infinite(sample)
    assert (r.hit_blocks[0], r.hit_tokens[0]) == expected
    # Enough slots for every block: LRU and Belady reach the same bound.
    big = sample.num_blocks
    assert replay_index(sample, [big], "lru").hit_blocks[0] == expected[0]
    assert replay_belady(sample, big, next_uses(sample)).hit_blocks[0] == expected[0]


def test_next_uses() -> None:
    trace = Trace("t", BLOCK, [], [[b"a", b"b"], [b"a"], [b"a", b"b"]], [1024, 512, 1024])
    assert next_uses(trace) == [[1, 2], [2], [3, 3]]


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_two_tiers_keep_invariants_and_cpu_column(sample: Trace, policy: str) -> None:
    """The CPU tier sees the same operations with or without a disk tier below it."""
    small = load_trace(TRACE, limit=300)
    two = replay_index(small, [60, 400], policy, check=True)
    one = replay_index(small, [60], policy)
    assert two.hit_blocks[0] == one.hit_blocks[0]
    assert two.hit_blocks[1] > 0
    assert sum(two.hit_blocks) <= replay_infinite(small).hit_blocks[0]


def test_seen2_admission_stores_on_second_sighting(tmp_path: Path) -> None:
    trace = load_trace(write_trace(tmp_path / "t.jsonl", [[1, 2], [1, 2], [1, 2]]))
    assert replay_index(trace, [10], "lru", 2).hit_blocks == [2]
    assert replay_index(trace, [10], "lru", 1).hit_blocks == [4]


# -- run_sim / format_sim ---------------------------------------------------------------------


def test_run_sim_result_and_table() -> None:
    result = run_sim(TRACE, ["100k", ("50k", "1GiB")], limit=300, progress=True)
    json.dumps(result)  # JSON-serialisable
    assert result["requests"] == 300
    runs = result["runs"]
    assert len(runs) == 2 * 7  # DEFAULT_POLICIES
    by = {(r["config"].count("+"), r["policy"]): r for r in runs}
    inf = by[(0, "infinite")]["hit_ratio"]["total"]
    for (_, policy), r in by.items():
        assert 0.0 <= r["hit_ratio"]["total"] <= inf + 1e-12, policy
        tiers = [c["tier"] for c in r["capacity"]]
        assert r["hit_tokens"]["total"] == sum(r["hit_tokens"][t] for t in tiers)
    assert by[(1, "belady")]["hit_ratio"]["total"] >= by[(1, "lru")]["hit_ratio"]["total"]
    disk = by[(1, "lru")]["capacity"][1]
    assert disk["tokens"] == (1 << 30) // 23040 and disk["slots"] == disk["tokens"] // BLOCK
    table = format_sim(result)
    assert "belady" in table and "arc-seen2" in table and "disk hit" in table
    assert format_sim(json.loads(json.dumps(result))) == table


def test_block_scaling_keeps_ratios() -> None:
    a = run_sim(TRACE, [400 * 512], ["lru"], limit=300)["runs"][0]["hit_ratio"]["total"]
    b = run_sim(TRACE, [400 * 32], ["lru"], limit=300, block_tokens=32)["runs"][0]
    assert b["capacity"][0]["slots"] == 400
    assert b["hit_ratio"]["total"] == pytest.approx(a, abs=1e-3)


# -- parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "tokens"),
    [
        (3_000_000, 3_000_000),
        ("3M", 3_000_000),
        ("1.5M tokens", 1_500_000),
        ("500k tok", 500_000),
        ("4096", 4096),
        ("8GiB", (8 << 30) // 23040),
        ("23040B", 1),
        ("1GB", 10**9 // 23040),
    ],
)
def test_parse_capacity(value: str | int, tokens: int) -> None:
    assert parse_capacity(value, bytes_per_token=23040) == tokens


@pytest.mark.parametrize("value", ["lots", "-1", "3 parsecs", -5, True])
def test_parse_capacity_rejects(value: str | int) -> None:
    with pytest.raises(ConfigError, match="capacity"):
        parse_capacity(value, bytes_per_token=23040)


def test_tier_capacities() -> None:
    cpu, disk = tier_capacities("1M+10M", ("cpu", "disk"), block_tokens=512, bytes_per_token=2)
    assert (cpu.name, cpu.tokens, cpu.slots, cpu.bytes) == ("cpu", 10**6, 10**6 // 512, 2 * 10**6)
    assert disk.tokens == 10**7
    with pytest.raises(ConfigError, match="3 tiers"):
        tier_capacities(("1M", "2M", "3M"), ("cpu", "disk"), block_tokens=512, bytes_per_token=2)


def test_parse_policy() -> None:
    assert parse_policy("LRU").name == "lru"
    spec = parse_policy("arc-seen3")
    assert (spec.kind, spec.eviction, spec.min_seen) == ("index", "arc", 3)
    assert parse_policy("lru-seen1").name == "lru"
    assert parse_policy("belady").kind == "belady"
    for bad in ("fifo", "lru-seen0", "lru2"):
        with pytest.raises(ConfigError, match="policy"):
            parse_policy(bad)


GOOD = {"timestamp": 5, "input_length": 1000, "output_length": 3, "hash_ids": [7, 8]}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({**GOOD, "input_length": None}), "field 'input_length' must be an"),
        (
            json.dumps({k: v for k, v in GOOD.items() if k != "hash_ids"}),
            "missing field 'hash_ids'",
        ),
        (json.dumps({**GOOD, "hash_ids": "7,8"}), "field 'hash_ids' must be an array"),
        (json.dumps({**GOOD, "hash_ids": [7, "8"]}), "field 'hash_ids' item 1 must be an integer"),
        (json.dumps({**GOOD, "hash_ids": [7, 2**64]}), "item 1 does not fit in 64 bits"),
        (json.dumps({**GOOD, "hash_ids": [1, 2, 3]}), "field 'hash_ids' has 3 ids"),
        (json.dumps({**GOOD, "timestamp": "now"}), "field 'timestamp' must be a number"),
        (json.dumps({**GOOD, "output_length": -1}), "field 'output_length' must be >= 0"),
    ],
)
def test_bad_trace_line_names_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    with pytest.raises(ConfigError, match=rf"bad\.jsonl line 2: (.*){re.escape(message)}"):
        load_trace(path)


def test_trace_limit_blank_lines_and_partial_block(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(GOOD) + "\n{broken\n")
    trace = load_trace(path, limit=2)  # the broken line after the limit is never read
    assert [r.line for r in trace.requests] == [1, 3]
    assert trace.prefix_tokens(0, 1) == 512 and trace.prefix_tokens(0, 2) == 1000
    assert trace.num_blocks == 4 and trace.input_tokens == 2000
    assert len(trace.keys[0][0]) == KEY_BYTES and trace.keys[0] == trace.keys[1]
    with pytest.raises(ConfigError, match="cannot open"):
        load_trace(tmp_path / "missing.jsonl")


def test_keys_are_chained(tmp_path: Path) -> None:
    """Equal ids after different prefixes are different blocks."""
    trace = load_trace(write_trace(tmp_path / "t.jsonl", [[1, 2], [3, 2], [1, 2]]))
    assert trace.keys[0][1] != trace.keys[1][1] and trace.keys[0] == trace.keys[2]
    assert replay_infinite(trace).hit_blocks == [2]
    assert math.isclose(
        run_sim(trace.path, [100], ["infinite"])["runs"][0]["hit_ratio"]["total"], 2 / 6
    )


def test_cli_sim_prints_the_policy_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default policy list gives the issue's columns per capacity and the worst cell."""
    from kvtier.tools.cli import main

    out = tmp_path / "sim.json"
    args = ["sim", "--trace", str(TRACE), "--limit", "200", "--capacity", "2%,20%"]
    assert main([*args, "--json", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "oracle bound" in text and "default-LRU" in text
    assert "worst cell of the default against LRU" in text
    res = json.loads(out.read_text())
    rows = res["policy_table"]
    assert [r["config"] for r in rows] == list(dict.fromkeys(r["config"] for r in res["runs"]))
    for r in rows:
        hit = r["hit"]
        assert set(hit) == {"lru", "default", "lru-oracle", "belady", "infinite"}
        assert hit["lru"] <= hit["lru-oracle"] <= hit["belady"] <= hit["infinite"] + 1e-9
        assert r["default_minus_lru"] == pytest.approx(hit["default"] - hit["lru"], abs=1e-3)


def test_the_oracle_progress_passes_match_its_replay():
    from kvtier.tools.sim.bounds import ORACLE_PASSES
    from kvtier.tools.sim.simulator import _BOUND_PASSES

    assert _BOUND_PASSES["oracle"] == ORACLE_PASSES


def test_retain_hints_keep_an_agent_chain_through_background_traffic(tmp_path: Path) -> None:
    """An agent's turn carries retain_s; 20 background chains flood a 12-block tier before
    its next turn. With the hint (leases on the trace's clock) the next turn hits what the
    lease covers (a quarter of the tier: 3 blocks); without it, or once the lease expired,
    nothing."""

    def trace(retain: float, gap_ms: int) -> Trace:
        lines = [{"timestamp": 0, "input_length": 4 * BLOCK, "hash_ids": [1, 2, 3, 4]}]
        if retain:
            lines[0]["kvtier"] = {"retain_s": retain}
        for j in range(20):
            ids = [100 + 10 * j + i for i in range(4)]
            lines.append({"timestamp": 600 + j, "input_length": 4 * BLOCK, "hash_ids": ids})
        lines.append({"timestamp": gap_ms, "input_length": 5 * BLOCK, "hash_ids": [1, 2, 3, 4, 5]})
        path = tmp_path / f"agent-{retain}-{gap_ms}.jsonl"
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
        return load_trace(path)

    def agent_hit(t: Trace, hints: bool = True) -> int:
        return replay_index(t, [12], "lru", hints=hints, check=True).hit_blocks[0]

    assert agent_hit(trace(0, 1000)) == 0
    assert agent_hit(trace(60, 1000)) == 3
    assert agent_hit(trace(60, 1000), hints=False) == 0
    assert agent_hit(trace(0.5, 1000)) == 0  # expired before the flood began
