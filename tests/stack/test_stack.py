"""The tier stack by configuration alone: edge rules, a three-tier stack, a shared tier that
evicts behind kvtier's back, lookups that answer "not yet", per-rank presence."""

from __future__ import annotations

import random
import time
import uuid

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvtier.budget import SyncBudget
from kvtier.config import KVTierConfig
from kvtier.contract import PENDING
from kvtier.errors import ConfigError
from kvtier.keys import KeyChain, Namespace, chunk_keys, rank_key
from kvtier.sources import HitSource
from kvtier.tiers.shared import ProbeIndex, SharedSpace, SharedStore, drop_shared_space
from tests.support.mini_engine import MiniEngine

CHUNK_BYTES = 8 * 32  # 8-token chunks of the mini engine's 32 B/token layout
FAST = SyncBudget("fixed", 1 << 30)


def cfg(tiers: list[dict], **kw) -> KVTierConfig:
    return KVTierConfig.from_dict({"chunk_tokens": 8, "tiers": tiers, **kw})


def keys_of(engine: MiniEngine, tokens: list[int]) -> list[bytes]:
    chain = KeyChain(engine.manager.namespace.seed(), engine.manager.chunk_tokens)
    chain.update(tokens)
    return chain.keys


def run_one(engine: MiniEngine, req_id: str, tokens: list[int]):
    r = engine.add(req_id, tokens)
    engine.run()
    return r


# -- configuration ---------------------------------------------------------------------------


def test_flat_keys_are_shorthand_for_a_stack():
    flat = KVTierConfig.from_dict(
        {"cpu_bytes": "1GiB", "disk_path": "/tmp/d", "disk_write_policy": "write-back"}
    )
    cpu, disk = flat.tier_specs()
    assert (cpu.kind, cpu.capacity) == ("cpu", 1 << 30)
    assert (disk.kind, disk.options.path, disk.on_store, disk.on_evict) == (
        "disk",
        "/tmp/d",
        "skip",
        "demote",
    )
    listed = KVTierConfig.from_dict(
        {
            "tiers": [
                {"kind": "cpu", "capacity": "1GiB"},
                {
                    "kind": "disk",
                    "path": "/tmp/d",
                    "capacity": "16GiB",
                    "on_store": "skip",
                    "on_evict": "demote",
                },
            ]
        }
    )
    assert listed.tier_specs() == flat.tier_specs()
    assert KVTierConfig.from_dict(listed.to_dict()) == listed


@pytest.mark.parametrize(
    ("tiers", "extra", "message"),
    [
        ([{"kind": "tape"}], {}, r"tiers\[0\]\.kind: got 'tape'; accepted values: cpu, disk"),
        ([{"kind": "cpu", "size": 1}], {}, r"tiers\[0\]: unknown key\(s\) 'size'"),
        ([{"kind": "cpu", "on_store": "skip"}], {}, r"tiers\[0\]: on_store: edge rules"),
        ([{"kind": "cpu"}, {"kind": "disk"}], {}, r"tiers\[1\]\.path: a disk tier needs"),
        ([{"kind": "cpu"}, {"kind": "cpu"}], {}, r"tiers\[1\]\.name: 'cpu' is used twice"),
        ([{"kind": "cpu"}, {"kind": "memory", "on_evict": "keep"}], {}, r"on_evict: got 'keep'"),
        ([{"kind": "cpu", "capacity": "lots"}], {}, r"tiers\[0\]\.capacity"),
        ([{"kind": "cpu", "eviction": "fifo"}], {}, r"tiers\[0\]\.eviction: got 'fifo'"),
        ([{"kind": "cpu"}], {"cpu_bytes": "1GiB"}, r"not both \(also given: cpu_bytes\)"),
        ([{"kind": "memory", "shared": True}], {}, r"tiers\[0\]: the first tier cannot be shared"),
        ([{"kind": "cpu"}, {"kind": "memory", "lookup_delay_ms": 5}], {}, r"only a shared tier"),
        ({"kind": "cpu"}, {}, r"tiers: expected a list"),
    ],
)
def test_bad_tiers_are_refused_in_one_line_naming_them(tiers, extra, message):
    with pytest.raises(ConfigError, match=message) as e:
        KVTierConfig.from_dict({"tiers": tiers, **extra})
    assert "\n" not in str(e.value)


def test_a_shared_tier_must_be_last():
    with pytest.raises(ConfigError, match=r"tiers\[1\]: a shared tier must be the last"):
        MiniEngine(
            cfg(
                [
                    {"kind": "cpu"},
                    {"kind": "memory", "shared": True, "url": "memory://x"},
                    {"kind": "memory", "name": "m2"},
                ]
            )
        )


# -- three tiers by config alone ----------------------------------------------------------------


def three_tiers(tmp_path, memory_on_hit="fill"):
    """cpu (4 chunks) -> memory (8 chunks, write-back from cpu) -> disk (write-through from
    memory): chunks reach memory only when the CPU tier evicts them, and disk from there."""
    return cfg(
        [
            {"kind": "cpu", "capacity": 4 * CHUNK_BYTES},
            {
                "kind": "memory",
                "capacity": 8 * CHUNK_BYTES,
                "source": "p2p",
                "on_store": "skip",
                "on_evict": "demote",
            },
            {
                "kind": "disk",
                "path": str(tmp_path / "disk"),
                "capacity": 64 * CHUNK_BYTES,
                "on_store": "through",
                "on_hit": memory_on_hit,
            },
        ],
        sync_budget="1GiB",
    )


def test_three_tier_stack_by_config_moves_chunks_by_edge_rules(tmp_path):
    e = MiniEngine(three_tiers(tmp_path), num_blocks=96)
    try:
        m = e.manager
        assert [t.name for t in m.tiers] == ["cpu", "memory", "disk"]
        cpu, memory, disk = (t.index for t in m.tiers)
        prompts = [[i] * 32 + [100 + i] for i in range(4)]  # 4 chunks each
        run_one(e, "w0", prompts[0])
        assert cpu.prefix_len(keys_of(e, prompts[0])) == 4
        assert len(memory) == 0 and len(disk) == 0, "skip edge: nothing below the CPU tier yet"
        for i in (1, 2, 3):
            run_one(e, f"w{i}", prompts[i])
        # The CPU tier evicted prompts 0-2: demoted to memory, written through to disk.
        assert memory.prefix_len(keys_of(e, prompts[2])) == 4
        for i in (0, 1, 2):
            assert disk.prefix_len(keys_of(e, prompts[i])) == 4, i
        assert disk.prefix_len(keys_of(e, prompts[3])) == 0  # still only in the CPU tier
        assert m.metrics.get("stored_chunks", "memory") >= 12
        # Prompt 0 fell out of memory too (8 chunks); it comes back from disk, async.
        assert memory.prefix_len(keys_of(e, prompts[0])) == 0
        back = run_one(e, "again0", prompts[0])
        assert back.sources == {HitSource.DISK: 32} and back.async_hit == 32
        # Filled into the CPU tier: next time a sync host hit.
        again = run_one(e, "again0b", prompts[0])
        assert again.sources == {HitSource.HOST: 32} and again.sync_hit == 32
        # Prompt 2 is in memory (the p2p source): async, never within the step.
        two = run_one(e, "again2", prompts[2])
        assert two.sources.get(HitSource.P2P, 0) > 0 and two.sync_hit == 0
        assert e.wrong == 0
        e.run()
        assert not m.has_pending_jobs() and not m.movement.demoting
        for index in (cpu, memory, disk):
            index.check()
            assert all(not ent.pins for ent in index.entries.values()), "a pin leaked"
    finally:
        e.close()


def test_on_hit_none_leaves_a_disk_hit_where_it_is(tmp_path):
    """Edge memory -> disk says none: a disk hit is not filled into memory nor the CPU
    tier; the request's own new chunks continue on disk."""
    e = MiniEngine(three_tiers(tmp_path, memory_on_hit="none"), num_blocks=96)
    try:
        m = e.manager
        cpu, memory, disk = (t.index for t in m.tiers)
        prompts = [[i] * 32 + [100 + i] for i in range(5)]
        for i, p in enumerate(prompts):
            run_one(e, f"w{i}", p)
        k0 = keys_of(e, prompts[0])
        assert disk.prefix_len(k0) == 4 and memory.prefix_len(k0) == 0
        longer = prompts[0][:32] + [7] * 16 + [1]
        r = run_one(e, "again0", longer)
        assert r.sources == {HitSource.DISK: 32}
        assert cpu.prefix_len(k0) == 0 and memory.prefix_len(k0) == 0
        assert disk.prefix_len(keys_of(e, longer)) == 6  # the new chunks went to disk
        assert e.wrong == 0
    finally:
        e.close()


# -- a shared tier that evicts on its own -------------------------------------------------------


def shared_cfg(url: str, delay_ms: float = 0.0, budget: str = "1GiB") -> KVTierConfig:
    shared = {"kind": "memory", "shared": True, "url": url, "capacity": 24 * CHUNK_BYTES}
    if delay_ms:
        shared["lookup_delay_ms"] = delay_ms
    return cfg([{"kind": "cpu", "capacity": 8 * CHUNK_BYTES}, shared], sync_budget=budget)


@pytest.fixture
def url():
    name = f"memory://test-{uuid.uuid4().hex}"
    yield name
    drop_shared_space(name)


def test_shared_tier_serves_a_second_engine(url):
    """Engine A stores through its CPU tier into the shared tier; engine B, with an empty
    CPU tier, finds A's chunks there (one probe per lookup) with exact KV."""
    a = MiniEngine(shared_cfg(url), num_blocks=96)
    b = MiniEngine(shared_cfg(url), num_blocks=96, seed=1)
    try:
        prompt = list(range(40)) + [1]
        run_one(a, "a", prompt)
        a.run()
        space = a.manager.tiers[1].index.space
        assert len(space) == 5
        probes = space.probes
        r = run_one(b, "b", prompt)
        assert r.sources == {HitSource.P2P: 40} and r.async_hit == 40
        assert space.probes == probes + 1
        assert b.wrong == 0 and a.wrong == 0
    finally:
        a.close()
        b.close()


def test_shared_tier_keys_vanishing_become_recompute(url):
    a = MiniEngine(shared_cfg(url), num_blocks=96)
    b = MiniEngine(shared_cfg(url), num_blocks=96, seed=2)
    try:
        prompt = list(range(40)) + [1]
        run_one(a, "a", prompt)
        space = a.manager.tiers[1].index.space
        # Garbage under the right key, and a value under the wrong key's name: both misses.
        victims = [rank_key(k, 0) for k in keys_of(b, prompt)]
        space.overwrite(victims[2], b"\x00" * 100)
        space.overwrite(victims[3], space.get_many([victims[0]])[0])
        r = run_one(b, "b", prompt)
        assert r.async_hit == 40 and b.recomputed >= 1 and b.wrong == 0
        assert b.stores["memory"].bad_reads >= 1
        assert b.manager.metrics.get("failures", "memory", "load") > 0
    finally:
        a.close()
        b.close()


def test_random_traffic_with_a_store_evicting_behind_our_back():
    """Random prompts sharing prefixes through an 8-chunk CPU tier over a 24-value shared
    tier that a second engine also writes and that drops random keys between steps: every
    hit carries the oracle KV, nothing leaks, and the examples did load from the shared
    tier (a run that only missed would prove nothing)."""
    shared_hits: list[int] = []
    random_traffic_with_evictions(shared_hits)
    assert sum(shared_hits) > 0, f"no example hit the shared tier: {shared_hits}"


@settings(max_examples=15, deadline=None)
@example(seed=0, evict=0.0)  # always one example without evictions
@given(seed=st.integers(0, 10_000), evict=st.sampled_from([0.0, 0.3, 1.0]))
def random_traffic_with_evictions(shared_hits: list[int], seed: int, evict: float) -> None:
    rng = random.Random(seed)
    name = f"memory://hyp-{seed}-{uuid.uuid4().hex}"
    a = MiniEngine(shared_cfg(name, budget="off"), num_blocks=128, seed=seed)
    b = MiniEngine(shared_cfg(name), num_blocks=128, seed=seed + 1)
    space = a.manager.tiers[1].index.space
    try:
        prefixes = [[rng.randrange(50) for _ in range(rng.randrange(8, 40))] for _ in range(4)]
        for i in range(14):
            engine = a if rng.random() < 0.5 else b
            toks = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(12))]
            engine.add(f"q{i}", toks)
            for _ in range(rng.randrange(1, 3)):
                engine.step()
                if rng.random() < evict:
                    space.evict_random(rng.randrange(1, 6))
        a.run()
        b.run()
        assert a.wrong == 0 and b.wrong == 0
        for e in (a, b):
            assert not e.held and not e.manager.has_pending_jobs()
            cpu = e.manager.tiers[0].index
            cpu.check()
            assert all(not ent.pins for ent in cpu.entries.values()), "a pin leaked"
        shared_hits.append(
            sum(r.sources.get(HitSource.P2P, 0) for e in (a, b) for r in e.reqs.values())
        )
    finally:
        a.close()
        b.close()
        drop_shared_space(name)


# -- lookups that answer "not yet" -------------------------------------------------------------


def test_delayed_lookups_ask_again_and_never_block(url):
    """A shared tier whose probe takes 300 ms: the lookup answers "ask again later" (the
    request waits, the engine keeps stepping), then the hit loads with exact KV."""
    a = MiniEngine(shared_cfg(url), num_blocks=96)
    b = MiniEngine(shared_cfg(url, delay_ms=300), num_blocks=96, seed=3)
    try:
        prompt = list(range(40)) + [1]
        run_one(a, "a", prompt)
        r = b.add("b", prompt)
        b.step()  # a lookup that waited for the probe would have found the hit: blocks allocated
        assert r in b.waiting and not r.blocks, "the request was scheduled before its lookup"
        b.run()
        index = b.manager.tiers[1].index
        assert index.pending_answers >= 1 and b.manager.deferred >= 1
        assert r.sources == {HitSource.P2P: 40} and b.wrong == 0
        assert b.steps >= 2
    finally:
        a.close()
        b.close()


# -- per-rank keys (tensor parallel) ----------------------------------------------------------


def test_a_chunk_counts_only_once_every_rank_stored_it():
    ns = Namespace("m", "g", "tp2pp1")
    keys = chunk_keys(list(range(32)), 8, ns.seed())
    assert ns.for_rank(0).seed() == ns.for_rank(1).seed(), "ranks share chunk keys"
    assert ns.for_rank(0).digest() != ns.for_rank(1).digest(), "but not their bytes' identity"
    space = SharedSpace(64)
    index = ProbeIndex(space, ranks=2)
    stores = [SharedStore(space, 16, ns.for_rank(r).digest(), r) for r in (0, 1)]
    for r in (0, 1):
        chunks = [[(0, torch.full((16,), 10 * r + i, dtype=torch.uint8))] for i in range(4)]
        n = 4 if r == 0 else 2
        assert stores[r].write([-1] * n, keys[:n], chunks[:n]) == [True] * n
    assert index.leading(keys) == 2  # rank 1 stored only two chunks
    assert ProbeIndex(space, ranks=1).leading(keys) == 4
    # Each rank reads its own shard; rank 1's namespace never validates rank 0's bytes.
    out = [[(0, torch.zeros(16, dtype=torch.uint8))] for _ in range(2)]
    assert stores[1].read([-1, -1], keys[:2], out) == [True, True]
    assert int(out[1][0][1][0]) == 11
    space.overwrite(rank_key(keys[0], 1), space.get_many([rank_key(keys[0], 0)])[0])
    assert stores[1].read([-1], keys[:1], out[:1]) == [False]
    assert index.leading(keys, 1) == 2 and index.leading(keys, 3) == 3
    slow = ProbeIndex(space, ranks=1, delay_s=0.05)
    assert slow.leading(keys) is PENDING and slow.leading(keys) is PENDING
    time.sleep(0.06)
    assert slow.leading(keys) == 4


class OlderIndex:
    """A plugin's index written before ``admit_chain`` and ``settle`` joined the protocol:
    the memory kind's, with those two hidden."""

    def __init__(self, index: object) -> None:
        self._index = index

    def __getattr__(self, name: str) -> object:
        if name in ("admit_chain", "settle"):
            raise AttributeError(name)
        return getattr(self._index, name)


def test_a_plugin_index_without_the_newer_methods_is_refused_at_build(monkeypatch):
    """The manager settles every tier's index when a request ends: an index that cannot is
    refused when the stack is built, naming the tier and the method, not mid-serving."""
    from dataclasses import replace

    from kvtier.contract import TierContext
    from kvtier.errors import TierError
    from kvtier.stack import registry
    from kvtier.stack.build import make_index
    from kvtier.stack.parse import tier_spec

    memory = registry.tier_kind("memory")
    name = f"older-{uuid.uuid4().hex[:8]}"
    older = replace(memory, name=name, make_index=lambda s, c: OlderIndex(memory.make_index(s, c)))
    monkeypatch.setitem(registry._KINDS, name, older)  # registered for this test only
    ctx = TierContext(1024, Namespace("m", b"layout"))
    assert make_index(tier_spec({"kind": "memory", "capacity": 1 << 20}), ctx) is not None
    with pytest.raises(TierError, match=rf"tier '{name}'.*no admit_chain\(\)"):
        make_index(tier_spec({"kind": name, "capacity": 1 << 20}), ctx)
