"""kvtier's tier events on real vLLM engines: what a KV-aware router would see.

Two engines run one after the other (each in its own subprocess, the runner of
tests/vllm/test_vllm.py), publishing vLLM's KV events over ZMQ to one subscriber this test
binds (vLLM connects out to a ``tcp://127.0.0.1:PORT`` endpoint). Batches are decoded with
msgspec and vLLM's own event classes. The oracle is independent of kvtier's event code: vLLM's hash
function over the known token sequences gives each block's hash, kvtier's key function each
chunk's key, and the engine reports which chunk keys each tier's index holds at the end.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from tests.support.kv_events import BLOCK, Subscriber, block_hashes, replay
from tests.support.vllm_runs import run_in_process

pytestmark = pytest.mark.vllm

CHUNK = 64  # two engine blocks per kvtier chunk: the block <-> chunk mapping is exercised
BYTES_PER_CHUNK = CHUNK * 46_080  # SmolLM2 in fp32
ENGINE = {"dtype": "float32", "max_num_batched_tokens": 384, "max_model_len": 4096}
MEDIUM = {"cpu": "CPU", "disk": "STORAGE"}


def make_prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 40_000) for _ in range(n)]


PA = [make_prompt(i, 6 * CHUNK + 5) for i in range(4)]
"""Engine A: 4 prompts of 6 chunks; the CPU tier holds 8 chunks, the disk 16: both evict."""
PB = [make_prompt(100 + i, 5 * CHUNK + 3) for i in range(2)]
"""Engine B: other prompts."""
QUERY = PB[1][: 4 * CHUNK] + make_prompt(999, 100)
"""A new prompt sharing 4 chunks (8 blocks) with one of engine B's."""


def serve(name: str, prompts: list[list[int]], max_tokens: int = 6) -> dict[str, Any]:
    reqs = [
        {"id": f"{name}-{i}", "prompt": p, "max_tokens": max_tokens} for i, p in enumerate(prompts)
    ]
    return {"op": "serve", "name": name, "requests": reqs, "max_concurrency": 1}


def run_engine(tmp: Path, name: str, endpoint: str, program: list[Any]) -> dict[str, Any]:
    spec = {
        "connector": {
            "chunk_tokens": CHUNK,
            "cpu_bytes": 8 * BYTES_PER_CHUNK,
            "disk_path": str(tmp / f"disk-{name}"),
            "disk_bytes": 16 * BYTES_PER_CHUNK,
            "eviction": "lru",
        },
        "engine": ENGINE,
        "program": program,
        "inspect": True,
        "inspect_keys": True,
        "kv_events": {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": endpoint,
            "topic": f"kv@{name}@smollm2",
        },
    }
    return run_in_process(spec, tmp / f"spec-{name}.json")


PROGRAM_B = [serve("b1", PB), {"op": "reset_prefix_cache"}, serve("b2", [PB[0]])]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("events")
    sub = Subscriber()
    try:
        a = run_engine(
            tmp,
            "A",
            sub.endpoint,
            [
                serve("a1", PA),  # fills CPU (8 chunks) and disk (16): both evict
                {"op": "reset_prefix_cache"},  # the engine's own cache: hits come from kvtier
                serve("a2", [PA[3], PA[1]]),  # PA[3] from CPU, PA[1] from disk
                {"op": "reset_prefix_cache"},
            ],
        )
        b = run_engine(tmp, "B", sub.endpoint, PROGRAM_B)
        b["batches"] = sub.batches(b"kv@B@smollm2")
        a["batches"] = sub.batches(b"kv@A@smollm2")
    finally:
        sub.close()
    for out in (a, b):
        assert out["events_last_seq"] == len(out["batches"]) - 1, "batches missing at the end"
    return {"A": a, "B": b}


# -- the oracle: vLLM's block hashes and kvtier's chunk keys of every known sequence --------


def sequences(out: dict[str, Any], prompts: dict[str, list[int]]) -> list[list[int]]:
    """Every token sequence the engine saw: prompt + output of each request."""
    return [prompts[r["id"]] + r["output"] for op in out["ops"] for r in op["requests"]]


def oracle(out: dict[str, Any], prompts: dict[str, list[int]]) -> dict[str, Any]:
    from kvtier.keys import chunk_keys

    seed = bytes.fromhex(out["kvtier"]["key_seed"])
    key_blocks: dict[str, list[int]] = {}
    block_tokens: dict[int, tuple[list[int], int | None]] = {}
    k = CHUNK // BLOCK
    for seq in sequences(out, prompts):
        hashes = block_hashes(seq)
        for i, h in enumerate(hashes):
            block_tokens[h] = (seq[i * BLOCK : (i + 1) * BLOCK], hashes[i - 1] if i else None)
        for i, key in enumerate(chunk_keys(seq, CHUNK, seed)):
            key_blocks[key.hex()] = hashes[i * k : (i + 1) * k]
    return {"key_blocks": key_blocks, "block_tokens": block_tokens}


def prompt_map(out: dict[str, Any], by_phase: dict[str, list[list[int]]]) -> dict[str, list[int]]:
    return {
        r["id"]: by_phase[op["name"]][i] for op in out["ops"] for i, r in enumerate(op["requests"])
    }


def kvtier_events(batches: list[Any]) -> list[Any]:
    media = set(MEDIUM.values())
    return [ev for b in batches for ev in b.events if getattr(ev, "medium", None) in media]


PHASES_A = {"a1": PA, "a2": [PA[3], PA[1]]}
PHASES_B = {"b1": PB, "b2": [PB[0]]}


def test_replayed_events_equal_every_tier_index(engines: dict[str, Any]) -> None:
    from vllm.distributed.kv_events import BlockRemoved, BlockStored

    for name, phases_ in (("A", PHASES_A), ("B", PHASES_B)):
        out = engines[name]
        assert out["kvtier"]["events"]["dropped_runs"] == 0
        o = oracle(out, prompt_map(out, phases_))
        state = replay(out["batches"])
        for tier, keys in out["kvtier"]["tier_keys"].items():
            want = {h for key in keys for h in o["key_blocks"][key]}
            assert want, (name, tier)
            assert state[MEDIUM[tier]] == want, (name, tier)
        # The bookkeeping is what the tiers hold: every readable chunk announced, and names
        # kept only where a held chunk's transfer started.
        ev = out["kvtier"]["events"]
        held = {key for keys in out["kvtier"]["tier_keys"].values() for key in keys}
        assert ev["announced"] == {t: len(k) for t, k in out["kvtier"]["tier_keys"].items()}
        assert 0 < ev["starts"] <= len(held)
    # Engine A's program stored, evicted and loaded through both tiers.
    a = engines["A"]
    evs = kvtier_events(a["batches"])
    for medium in ("CPU", "STORAGE"):
        assert any(isinstance(e, BlockStored) and e.medium == medium for e in evs), medium
        assert any(isinstance(e, BlockRemoved) and e.medium == medium for e in evs), medium
    srcs = [r.get("hit_sources", {}) for r in a["ops"][1]["requests"]]
    assert srcs[0].get("host", 0) > 0 and srcs[1].get("disk", 0) > 0, srcs


def test_events_describe_blocks_as_the_engine_does(engines: dict[str, Any]) -> None:
    """Self-describing payloads: every kvtier BlockStored lists whole chunks (2 blocks
    each) with their vLLM hashes, tokens and parent; the engine's own GPU events use the
    same hashes for the same blocks."""
    from vllm.distributed.kv_events import BlockStored

    out = engines["A"]
    o = oracle(out, prompt_map(out, PHASES_A))
    bt = o["block_tokens"]
    n = 0
    for ev in kvtier_events(out["batches"]):
        if not isinstance(ev, BlockStored):
            continue
        n += 1
        assert len(ev.block_hashes) % (CHUNK // BLOCK) == 0
        assert ev.block_size == BLOCK and ev.group_idx == 0
        assert ev.kv_cache_spec_kind == "full_attention" and ev.lora_name is None
        assert len(ev.token_ids) == BLOCK * len(ev.block_hashes)
        parent = ev.parent_block_hash
        for j, h in enumerate(ev.block_hashes):
            tokens, want_parent = bt[h]
            assert ev.token_ids[j * BLOCK : (j + 1) * BLOCK] == tokens
            assert parent == want_parent
            parent = h
    assert n > 0
    gpu = {
        h
        for b in out["batches"]
        for ev in b.events
        if isinstance(ev, BlockStored) and ev.medium in (None, "GPU")
        for h in ev.block_hashes
    }
    ours = {h for ev in kvtier_events(out["batches"]) for h in ev.block_hashes}
    assert ours <= gpu  # every block kvtier announces, the engine announced on GPU first


def longest_prefix(held: set[int], hashes: list[int]) -> int:
    n = 0
    while n < len(hashes) and hashes[n] in held:
        n += 1
    return n


def test_events_alone_route_a_new_prompt_to_the_engine_holding_its_prefix(
    engines: dict[str, Any],
) -> None:
    """A router-style lookup from the events only: both engines dropped their own caches
    (AllBlocksCleared), so only kvtier's CPU/STORAGE announcements can tell which engine
    holds the query's prefix."""
    q = block_hashes(QUERY)
    scores, gpu_scores = {}, {}
    for name, out in engines.items():
        state = replay(out["batches"])
        scores[name] = longest_prefix(state["CPU"] | state["STORAGE"] | state["GPU"], q)
        gpu_scores[name] = longest_prefix(state["GPU"], q)
    assert gpu_scores == {"A": 0, "B": 0}
    assert scores["A"] == 0 and scores["B"] == 4 * CHUNK // BLOCK, scores
    assert max(scores, key=scores.__getitem__) == "B"


@pytest.mark.slow
def test_nobody_subscribing_changes_nothing(tmp_path: Path, engines: dict[str, Any]) -> None:
    """Events published to an endpoint nobody binds: the engine serves the same tokens as
    with a subscriber, publishes every batch into the void and drops no event."""
    import socket

    with socket.socket() as s:  # a free port, closed again: nobody listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = run_engine(tmp_path, "C", f"tcp://127.0.0.1:{port}", PROGRAM_B)
    outputs = [[r["output"] for r in op["requests"]] for op in out["ops"]]
    want = [[r["output"] for r in op["requests"]] for op in engines["B"]["ops"]]
    assert outputs == want
    assert out["events_last_seq"] > 0 and out["kvtier"]["events"]["dropped_runs"] == 0
