"""The conversation-like trace generator (kvtier.tools.sim.generate) and ``kvtier sim`` on it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import KVTierConfig
from kvtier.errors import ConfigError
from kvtier.policies.defaults import tier_eviction_name
from kvtier.tools.cli import main
from kvtier.tools.sim import load_trace, run_sim
from kvtier.tools.sim.generate import SHAPES, generate, parse_shape, write_trace
from kvtier.tools.sim.trace import parse_request

SMALL = "chat:sessions=40,doc_rate=0.05"


def test_trace_is_valid_mooncake_and_deterministic(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    n = write_trace(a, parse_shape(SMALL), seed=4)
    write_trace(b, parse_shape(SMALL), seed=4)
    assert a.read_bytes() == b.read_bytes()
    lines = a.read_text().splitlines()
    assert len(lines) == n > 40
    stamps = []
    for i, line in enumerate(lines, start=1):
        req = parse_request(line, i)  # the simulator's own validation
        assert len(req.hash_ids) == -(-req.input_tokens // 512)
        assert json.loads(line)["output_length"] > 0
        stamps.append(req.timestamp)
    assert stamps == sorted(stamps)
    write_trace(b, parse_shape(SMALL), seed=5)
    assert a.read_bytes() != b.read_bytes()


def prefix_len(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 1000), st.sampled_from(sorted(SHAPES)))
def test_turns_extend_the_previous_prompt_and_ids_mean_prefixes(seed, shape):
    """Every turn after the first shares all the full blocks of an earlier prompt; equal ids
    at position j imply equal ids before j (ids are chained)."""
    reqs = generate(parse_shape(f"{shape}:sessions=25"), seed)
    by_id: dict[int, tuple[int, ...]] = {}
    extended = 0
    for r in reqs:
        for j, h in enumerate(r.hash_ids):
            prev = by_id.setdefault(h, r.hash_ids[:j])
            assert prev == r.hash_ids[:j], "an id with two different prefixes"
    for i, r in enumerate(reqs):
        full = r.input_length // 512
        if any(prefix_len(r.hash_ids, q.hash_ids) >= q.input_length // 512 > 0 for q in reqs[:i]):
            extended += 1
        assert full <= len(r.hash_ids)
    assert extended > 0  # multi-turn sessions exist


def test_shapes_differ_and_overrides_apply():
    chat = parse_shape("chat")
    assert parse_shape("chat:sessions=7,think_s=2.5,system_sizes=100/200").sessions == 7
    assert parse_shape("chat:system_sizes=100/200").system_sizes == (100, 200)
    assert parse_shape("agent").turns_max > chat.turns_max
    for bad, msg in [
        ("nosuch", "unknown shape"),
        ("chat:colour=3", "bad override"),
        ("chat:sessions=x", "not a number"),
        ("chat:sessions=0", "sessions must be >= 1"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            parse_shape(bad)


def test_sim_default_is_the_connectors_policy_and_percent_capacities(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(path, parse_shape(SMALL), seed=1)
    name = tier_eviction_name(KVTierConfig(), "cpu")
    res = run_sim(path, ["5%", "20%+40%"], ["default", name, "lru", "belady"])
    unique = load_trace(path).unique_blocks
    assert res["unique_blocks"] == unique
    by = {(r["config"], r["policy"]): r for r in res["runs"]}
    for (config, policy), r in by.items():
        if policy == "default":  # same code path as the named default: same counts
            assert r["hit_tokens"] == by[(config, name)]["hit_tokens"]
    caps = [r["capacity"] for r in res["runs"] if r["policy"] == "lru"]
    assert caps[0][0]["slots"] == int(0.05 * unique * 512) // 512
    assert [c["slots"] for c in caps[1]] == [int(f * unique * 512) // 512 for f in (0.2, 0.4)]


def test_cli_generate(tmp_path, capsys):
    trace = tmp_path / "g.jsonl"
    out = tmp_path / "g.json"
    args = ["sim", "--generate", SMALL, "--seed", "3", "--save-trace", str(trace)]
    args += ["--capacity", "10%", "--policies", "default,lru", "--json", str(out), "--no-progress"]
    assert main(args) == 0
    assert "generated" in capsys.readouterr().out
    assert trace.exists() and len(json.loads(out.read_text())["runs"]) == 2
    assert main(["sim", "--generate", "chat", "--no-progress"]) == 2
    assert "--save-trace" in capsys.readouterr().err
    assert main(["sim", "--capacity", "5%", "--trace", str(trace), "--policies", "nope"]) == 2


# -- the workload shapes of kvtier.tools.sim.workloads ---------------------------------------------

SMALL_WORKLOADS = {
    "agentloop": "agentloop:sessions=12,steps=6",
    "rag": "rag:requests=150,docs=40",
    "scan": "scan:sessions=6,turns=8",
    "shift": "shift:sessions=20,steps=5",
    "longsys": "longsys:sessions=20",
}


def _ids(reqs) -> list[set[int]]:
    return [set(r.hash_ids) for r in reqs]


@pytest.mark.parametrize("name", sorted(SMALL_WORKLOADS))
def test_workloads_are_valid_deterministic_and_have_their_shape(tmp_path, name):
    from kvtier.tools.sim.workloads import generate_named, write_named_trace

    text = SMALL_WORKLOADS[name]
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    n = write_named_trace(a, text, seed=2)
    write_named_trace(b, text, seed=2)
    assert a.read_bytes() == b.read_bytes() and n > 10
    for i, line in enumerate(a.read_text().splitlines(), start=1):
        req = parse_request(line, i)
        assert len(req.hash_ids) == -(-req.input_tokens // 512)
    reqs = generate_named(text, seed=2)
    ids = _ids(reqs)
    if name == "rag":  # one shared system prompt, documents shared in varying order
        assert len({r.hash_ids[0] for r in reqs}) == 1
        assert len({r.hash_ids[3] for r in reqs}) > 10  # the 4th block already differs
    if name == "scan":  # scans: long requests whose own blocks never come back
        seen: dict[int, int] = {}
        for s in ids:
            for h in s:
                seen[h] = seen.get(h, 0) + 1
        scans = [r for r in reqs if r.output_length == 100]
        assert scans and all(seen[r.hash_ids[-1]] == 1 for r in scans)
    if name == "shift":  # the hot set is replaced: the halves share no block
        cut = next(
            m for m in range(1, len(reqs)) if not set().union(*ids[:m]) & set().union(*ids[m:])
        )
        assert 0.3 < cut / len(reqs) < 0.7
    if name == "agentloop":  # fan-out: some prefix continues in 3+ different ways
        after: dict[int, set[int]] = {}
        for r in reqs:
            for x, y in zip(r.hash_ids, r.hash_ids[1:], strict=False):
                after.setdefault(x, set()).add(y)
        assert max(len(v) for v in after.values()) >= 3


def test_workload_overrides_are_checked():
    from kvtier.tools.sim.workloads import generate_named

    with pytest.raises(ConfigError, match="docz"):
        generate_named("rag:docz=3")
    with pytest.raises(ConfigError, match="'nope'"):
        generate_named("nope")
    with pytest.raises(ConfigError, match="requests"):
        generate_named("rag:requests=x")
