"""kvtier's tier events on real vLLM engines: what a KV-aware router would see.

Two engines run one after the other (each in its own subprocess, tests/test_vllm.py's
runner), publishing vLLM's KV events over ZMQ to one subscriber this test binds (vLLM
connects out to a ``tcp://127.0.0.1:PORT`` endpoint). Batches are decoded with msgspec and
vLLM's own event classes. The oracle is independent of kvtier's event code: vLLM's hash
function over the known token sequences gives each block's hash, kvtier's key function each
chunk's key, and the engine reports which chunk keys each tier's index holds at the end.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.vllm

BLOCK = 32  # the runner's engine block size
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


class Subscriber:
    """A SUB socket bound where the engines connect, collecting every message."""

    def __init__(self) -> None:
        import zmq

        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.setsockopt(zmq.RCVTIMEO, 200)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.messages: list[tuple[bytes, int, bytes]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import zmq

        while not self._stop.is_set():
            try:
                topic, seq, payload = self.sock.recv_multipart()
            except zmq.Again:
                continue
            self.messages.append((topic, int.from_bytes(seq, "big"), payload))

    def batches(self, topic: bytes) -> list[Any]:
        """The decoded batches of one topic, checked gap-free from sequence 0."""
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        mine = [(seq, payload) for t, seq, payload in self.messages if t == topic]
        assert [seq for seq, _ in mine] == list(range(len(mine))), "a batch was lost"
        return [decoder.decode(payload) for _, payload in mine]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close(linger=0)
        self.ctx.term()


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
    spec_path = tmp / f"spec-{name}.json"
    out_path = tmp / f"out-{name}.json"
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


def block_hashes(tokens: list[int], block: int = BLOCK) -> list[int]:
    """vLLM's hashes (as its events carry them) of every full ``block``-token block of
    ``tokens``."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as kcu

    fn = get_hash_fn_by_name("sha256")  # vLLM's default prefix_caching_hash_algo
    kcu.init_none_hash(fn)
    out, parent = [], None
    for i in range(len(tokens) // block):
        parent = kcu.hash_block_tokens(fn, parent, tokens[i * block : (i + 1) * block])
        out.append(kcu.maybe_convert_block_hash(parent))
    return out


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


def replay(batches: list[Any], strict: bool = True) -> dict[str, set[int]]:
    """Per medium, the block hashes the events say are held (AllBlocksCleared: the engine's
    own cache). ``strict``: a kvtier medium never announces a held block again, nor
    removes one it did not announce."""
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    state: dict[str, set[int]] = {"GPU": set(), "CPU": set(), "STORAGE": set()}
    for batch in batches:
        for ev in batch.events:
            if isinstance(ev, AllBlocksCleared):
                state["GPU"].clear()
                continue
            medium = ev.medium or "GPU"
            assert medium in state, medium
            held = state[medium]
            for h in ev.block_hashes:
                if isinstance(ev, BlockStored):
                    assert not (strict and medium != "GPU" and h in held), (medium, h)
                    held.add(h)
                else:
                    assert isinstance(ev, BlockRemoved)
                    assert not (strict and medium != "GPU" and h not in held), (medium, h)
                    held.discard(h)
    return state


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
