"""Hybrid recurrent-state models on a real engine: kvtier stores the recurrent state at
the chunk boundaries vLLM offers and hits restore attention KV and state together.

The model is the tiny Qwen3-Next of :mod:`kvtier.tools.tiny_models` (gated delta net +
full attention, bf16, weights re-initialised at a scale where outputs depend on the whole
prompt: the baseline's outputs for two prompts that end alike differ, asserted), on vLLM's
CPU backend with prefix caching on (Mamba "align" mode, 96-token blocks here). Every run
serves round 1 (kvtier stores), resets the engine's own prefix cache, and serves round 2,
whose hits must come from kvtier: exactly the longest boundary whose state was stored
(asserted in tokens), and outputs token-identical to the engine without kvtier.

Prompts (``d0``, ``d1``, ``d2``: random documents; B = 96):

- ``a = d0[:300]``: state at 288 (vLLM keeps the state at ``floor((P - 1) / B) * B``);
- ``b = d0[:200]``: shares part of ``a``'s prefix; its own state at 192;
- ``c = d0[:250] + d2[:50]``: shares 250 tokens with ``a``; state at 288 of its own chain;
- ``d = d1[:60]``: shorter than one block, never a hit;
- ``e = d1[:400]``: state at 384;
- ``f = d1[:350]`` (round 2 only): ``e``'s attention chunks cover 288 tokens of it, but
  no state lies at or below 288 on that chain: the hit ends between boundaries, at zero.

Negative cases: the states' tier fails every read (every hit of round 2 is claimed, its
load fails, the request recomputes: identical outputs); states dropped after round 2,
then a reset and round 3 (``a``'s at 288: ``a`` falls back to ``b``'s state at 192 on
the same chain; ``e``'s all: zero, with its attention chunks present).

The disk tier (a second engine on the first one's files: a restart) and the Redis tier (a
second engine on the same server) give the CPU tier's round-2 hits.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kv_events import Subscriber, block_hashes, replay
from tests.support.model_runs import ENGINE, ENGINE_FOR, outputs, run_specs

pytestmark = pytest.mark.vllm

B = 96
"""vLLM's block size for the tiny Qwen3-Next with prefix caching on (the attention block
enlarged until a gated-delta-net state fits a page)."""


def _prompts() -> dict[str, list[int]]:
    rng = random.Random(7)
    d0, d1, d2 = ([rng.randrange(3, 512) for _ in range(400)] for _ in range(3))
    return {
        "a": d0[:300],
        "b": d0[:200],
        "c": d0[:250] + d2[:50],
        "d": d1[:60],
        "e": d1[:400],
        "f": d1[:350],
        "g": d2[:284] + d0[284:300],  # ends like a: the sensitivity check
    }


ROUND1 = ("a", "b", "c", "d", "e", "g")
ROUND2 = ("a", "b", "c", "d", "e", "f", "g")
ROUND3 = ("a", "e", "f")
CONNECTOR = {"cpu_bytes": "64MiB"}


def _phase_of(name: str, keys: tuple[str, ...]) -> dict[str, Any]:
    p = _prompts()
    reqs = [
        {"id": f"{name}-{k}", "prompt": p[k], "max_tokens": 8, "ignore_eos": True} for k in keys
    ]
    return {"op": "serve", "name": name, "requests": reqs, "max_concurrency": 1}


def _program(kvtier: bool = True, rounds: str = "123") -> list[dict[str, Any]]:
    """Round 1, the reset, round 2, then (kvtier: a's state at 288 and all of e's dropped)
    the reset and round 3; ``rounds`` "1": round 1 and a drain only (the first of two
    engines), "2": round 2 only (the second)."""
    p = _prompts()
    if rounds == "1":
        return [_phase_of("r1", ROUND1), {"op": "drain"}]
    if rounds == "2":
        return [_phase_of("r2", ROUND2)]
    reset = {"op": "reset_prefix_cache"}
    drop = [
        {"op": "drain"},
        {"op": "drop_states", "prompt": p["a"], "from": 288},
        {"op": "drop_states", "prompt": p["e"], "from": 1},
    ]
    return [
        _phase_of("r1", ROUND1),
        reset,
        _phase_of("r2", ROUND2),
        *(drop if kvtier else []),
        reset,
        _phase_of("r3", ROUND3),
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    import subprocess
    import sys

    from kvtier.tools.redis_server import RedisServer

    tmp = tmp_path_factory.mktemp("hybrid")
    build = (
        "import sys; from kvtier.tools.tiny_models import build; build('qwen3_next', sys.argv[1])"
    )
    subprocess.run([sys.executable, "-c", build, str(tmp / "m")], check=True, timeout=600)
    engine = ENGINE | ENGINE_FOR["qwen3_next"]

    def spec(conn: dict[str, Any] | None, rounds: str = "123") -> dict[str, Any]:
        return {
            "model": str(tmp / "m"),
            "engine": engine,
            "connector": conn,
            "inspect": conn is not None,
            "program": _program(conn is not None, rounds),
        }

    sub = Subscriber()

    def with_events(s: dict[str, Any], name: str) -> dict[str, Any]:
        topic = f"kv@{name}@qwen3next"
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": topic}
        return s | {"kv_events": cfg | {"endpoint": sub.endpoint}, "inspect_keys": True}

    failing = CONNECTOR | {"fault_injection": {"states": {"fail_all_reads": True}}}
    cpu = {"kind": "cpu", "capacity": "64MiB"}
    disk = {"tiers": [cpu, {"kind": "disk", "path": str(tmp / "disk"), "capacity": "64MiB"}]}
    try:
        with RedisServer() as server:
            remote = {"tiers": [cpu, {"kind": "redis", "url": server.url, "timeout_ms": 3000}]}
            results = run_specs(
                tmp,
                {
                    "base": spec(None),
                    # Tier events on (states included): what a KV-aware router would see.
                    "cpu": with_events(spec(CONNECTOR), "cpu"),
                    "failed": spec(failing),
                    # A second engine on the first one's disk files (a restart)...
                    "disk1": spec(disk, rounds="1"),
                    "disk2": with_events(spec(disk, rounds="2"), "disk2"),
                    # ... and on the Redis server the first one stored into.
                    "redis1": spec(remote, rounds="1"),
                    "redis2": spec(remote, rounds="2"),
                },
            )
        for name in ("cpu", "disk2"):
            results[name]["batches"] = sub.batches(f"kv@{name}@qwen3next".encode())
    finally:
        sub.close()
    yield results


def _external(result: dict[str, Any], phase: int) -> dict[str, int]:
    reqs = result["ops"][phase]["requests"]
    return {r["id"].split("-")[1]: sum(r["hit_sources"].values()) for r in reqs}


def _sources(result: dict[str, Any], phase: int) -> set[str]:
    return {s for r in result["ops"][phase]["requests"] for s in r["hit_sources"]}


def _cached(result: dict[str, Any], phase: int) -> dict[str, int]:
    return {r["id"].split("-")[1]: r["num_cached"] for r in result["ops"][phase]["requests"]}


def _names(phase: int) -> tuple[str, ...]:
    return ROUND1 if phase == 0 else ROUND2


def test_baseline_depends_on_whole_prompt(runs):
    base = outputs(runs["base"])
    r1 = dict(zip(ROUND1, base[0], strict=True))
    assert r1["a"] != r1["g"], "outputs do not depend on more than the prompt's tail"
    r2 = dict(zip(ROUND2, base[1], strict=True))
    assert all(r2[k] == r1[k] for k in ROUND1), "the baseline is not deterministic"
    assert base[2] == [r2[k] for k in ROUND3]


def test_cpu_tier_hits_exact_state_boundaries_token_identical(runs):
    kv = runs["cpu"]
    assert outputs(kv) == outputs(runs["base"])
    hits = _cached(kv, 1)
    # Every round-2 prompt resumes at the longest boundary whose state kvtier stored,
    # from kvtier or from what round 2 loaded before it into the engine's own cache.
    assert hits == {"a": 288, "b": 192, "c": 288, "d": 0, "e": 384, "f": 0, "g": 288}, hits
    ext = _external(kv, 1)
    assert ext == {"a": 288, "b": 192, "c": 96, "d": 0, "e": 384, "f": 0, "g": 288}, ext
    # Round 1: c's prefix is b's (local cache, state at 192); nothing else hits.
    assert _external(kv, 0) == dict.fromkeys(ROUND1, 0)
    st = kv["kvtier"]["states"]
    assert st["stored"] >= 5 and st["tier_states"]["cpu"] >= 5, st
    assert not st["pending_jobs"]
    values = kv["kvtier"]["metrics"]["values"]
    assert "unkeyable_requests" not in values, values


def test_failed_state_loads_recompute_token_identical(runs):
    kv = runs["failed"]
    assert outputs(kv) == outputs(runs["base"])
    # The hits were claimed (the lookup found the states) and their loads failed.
    assert sum(_external(kv, 1).values()) >= 288 + 384, _external(kv, 1)
    failures = kv["kvtier"]["metrics"]["values"].get("failures", [])
    assert sum(n for labels, n in failures if labels[-1] == "load") >= 3, failures


def test_dropped_states_fall_back_to_earlier_boundary_or_zero(runs):
    kv = runs["cpu"]
    assert outputs(kv) == outputs(runs["base"])
    # e's chain holds e's state at 384 and f's at 288 (f is e's first 350 tokens).
    assert kv["dropped_states"] == [1, 2], kv["dropped_states"]
    ext = _external(kv, 2)
    assert ext["a"] == 192, ext  # b's state on a's chain; a's own at 288 is gone
    assert ext["e"] == 0 and ext["f"] == 0, ext  # e's attention chunks alone give nothing
    assert kv["kvtier"]["tier_chunks"]["cpu"] > 0


@pytest.mark.parametrize(
    ("first", "second", "source"), [("disk1", "disk2", "disk"), ("redis1", "redis2", "p2p")]
)
def test_second_engine_hits_states_from_disk_and_redis(runs, first, second, source):
    """A restarted engine (disk files) and a second engine (the Redis server) hit what the
    first stored, states included, at the same boundaries as the CPU tier's round 2."""
    base = outputs(runs["base"])
    assert outputs(runs[first])[0] == base[0]
    kv = runs[second]
    assert outputs(kv)[0] == base[1]
    assert _cached(kv, 0) == _cached(runs["cpu"], 1), _cached(kv, 0)
    ext = _external(kv, 0)
    assert ext["a"] == 288 and ext["e"] == 384 and ext["d"] == ext["f"] == 0, ext
    # a's chunks and state come from the second tier; later prompts may find the
    # attention chunks a's load filled into the (empty) CPU tier: host.
    first = kv["ops"][0]["requests"][0]
    assert first["hit_sources"] == {source: 288}, first
    assert source in _sources(kv, 0) <= {source, "host"}, _sources(kv, 0)


# -- tier events: states announced as vLLM announces its own recurrent groups -------------


def _hashes(tokens: list[int]) -> list[int]:
    return block_hashes(tokens, B)


def _state_oracle(kv: dict[str, Any]) -> dict[str, tuple[int, list[int], int | None]]:
    """State key (hex) -> (hash, tokens, parent hash) of the block that ends at its
    boundary, for every boundary of every sequence the engine saw (prompt + output)."""
    from kvtier.keys import chunk_keys
    from kvtier.stack.states import state_key

    seed = bytes.fromhex(kv["kvtier"]["key_seed"])
    p = _prompts()
    out = {}
    for op in kv["ops"]:
        for r in op["requests"]:
            seq = p[r["id"].split("-")[1]] + r["output"]
            hashes = _hashes(seq)
            for i, key in enumerate(chunk_keys(seq, B, seed)):
                parent = hashes[i - 1] if i else None
                out[state_key(key).hex()] = (hashes[i], seq[i * B : (i + 1) * B], parent)
    return out


def _split(kv: dict[str, Any], medium: str) -> tuple[list[Any], list[Any]]:
    """kvtier's events of ``medium``: (the attention group's, the recurrent groups')."""
    group = kv["kvtier"]["events"]["group"]
    evs = [ev for b in kv["batches"] for ev in b.events if getattr(ev, "medium", None) == medium]
    return [ev for ev in evs if ev.group_idx == group], [ev for ev in evs if ev.group_idx != group]


def test_state_events_name_boundary_blocks_in_the_engines_recurrent_groups(runs):
    """Each stored state is a BlockStored per recurrent group of the one block ending at
    its boundary (hash, tokens, parent, kind "mamba"), in the groups and with the hashes
    the engine's own GPU events use; the attention chunks keep the attention group."""
    from vllm.distributed.kv_events import BlockRemoved, BlockStored

    kv = runs["cpu"]
    gpu = [
        ev
        for b in kv["batches"]
        for ev in b.events
        if isinstance(ev, BlockStored) and ev.medium in (None, "GPU")
    ]
    attn_groups = {ev.group_idx for ev in gpu if ev.kv_cache_spec_kind == "full_attention"}
    rec_groups = {ev.group_idx for ev in gpu if ev.kv_cache_spec_kind == "mamba"}
    assert len(attn_groups) == 1 and rec_groups and not attn_groups & rec_groups, (
        attn_groups,
        rec_groups,
    )
    gpu_states = {
        (ev.group_idx, h) for ev in gpu for h in ev.block_hashes if ev.group_idx in rec_groups
    }
    assert kv["kvtier"]["events"]["dropped_runs"] == 0
    assert kv["kvtier"]["events"]["group"] in attn_groups
    attn, state = _split(kv, "CPU")
    assert attn and all(ev.group_idx in attn_groups for ev in attn)
    assert all(
        ev.kv_cache_spec_kind == "full_attention" for ev in attn if isinstance(ev, BlockStored)
    )
    oracle = {h: (tokens, parent) for h, tokens, parent in _state_oracle(kv).values()}
    stored = [ev for ev in state if isinstance(ev, BlockStored)]
    assert stored and {ev.group_idx for ev in stored} == rec_groups
    for ev in stored:
        assert ev.kv_cache_spec_kind == "mamba" and ev.block_size == B, ev
        (h,) = ev.block_hashes
        assert (ev.token_ids, ev.parent_block_hash) == oracle[h], ev
        assert (ev.group_idx, h) in gpu_states  # the engine held that state on GPU first
    # Every stored state, in every recurrent group (one event each).
    per_group = {
        g: sorted(h for ev in stored if ev.group_idx == g for h in ev.block_hashes)
        for g in rec_groups
    }
    assert len({tuple(v) for v in per_group.values()}) == 1, per_group
    assert any(isinstance(ev, BlockRemoved) for ev in state)


def test_replayed_state_events_equal_the_state_tier(runs):
    """Replaying the CPU medium's events per group gives exactly what kvtier's tiers hold
    at the end: attention blocks in the attention group, and in each recurrent group the
    boundary blocks of the states held; the dropped states (a's at 288, e's chain) were
    announced removed."""
    from vllm.distributed.kv_events import BlockRemoved

    kv = runs["cpu"]
    attn, state = _split(kv, "CPU")
    oracle = _state_oracle(kv)
    held = {oracle[k][0] for k in kv["kvtier"]["states"]["tier_keys"]["cpu"]}
    assert held and len(held) == kv["kvtier"]["states"]["tier_states"]["cpu"]
    for g in {ev.group_idx for ev in state}:
        mine = [ev for ev in state if ev.group_idx == g]
        got = replay([type("Batch", (), {"events": mine})()])["CPU"]
        assert got == held, g
    # The attention blocks held (as tests/vllm/test_vllm_events.py checks for dense models).
    attn_held = replay([type("Batch", (), {"events": attn})()])["CPU"]
    assert len(attn_held) == len(kv["kvtier"]["tier_keys"]["cpu"])
    removed = {h for ev in state if isinstance(ev, BlockRemoved) for h in ev.block_hashes}
    p = _prompts()
    dropped = {_hashes(p["a"])[2], _hashes(p["e"])[3], _hashes(p["e"])[2]}  # 288, 384, 288
    assert dropped <= removed, (dropped, removed)


def test_restored_states_are_announced_when_a_lookup_names_them(runs):
    """A restarted engine announces no disk state at start; a lookup that finds one
    announces it (medium STORAGE), as it does the attention chunks."""
    from vllm.distributed.kv_events import BlockStored

    kv = runs["disk2"]
    assert kv["kvtier"]["events"]["dropped_runs"] == 0
    _, state = _split(kv, "STORAGE")
    announced = {h for ev in state if isinstance(ev, BlockStored) for h in ev.block_hashes}
    p = _prompts()
    assert {_hashes(p["a"])[2], _hashes(p["e"])[3]} <= announced, announced
    oracle = _state_oracle(kv)
    on_disk = {oracle[k][0] for k in kv["kvtier"]["states"]["tier_keys"]["disk"] if k in oracle}
    assert announced <= on_disk
