"""Prefetch on arrival (kvtier.stack.prefetch) on the mini engine: real tier stores (disk
files, a real redis-server), exact KV checked against the oracle for every attended token.

The shape of every test: a prompt is stored, pushed out of the CPU tier by other traffic
(it stays in the slow tier below), then arrives again while the engine is busy; its
prefetch runs while it waits; when it is scheduled its hit comes from the CPU tier.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.budget import SyncBudget
from kvtier.config import KVTierConfig
from kvtier.hints import NO_HINTS, Hints
from kvtier.sources import HitSource
from kvtier.tiers.faulty import FaultPlan
from tests.support.mini_engine import MiniEngine
from tests.support.redis_fixtures import flush, server  # noqa: F401  (fixtures)

C = 8  # tokens per chunk
CFG = KVTierConfig(
    chunk_tokens=C, sync_budget=SyncBudget("fixed", 1 << 30), eviction="lru", prefetch=True
)
PROMPT = [random.Random(1).randrange(1000) for _ in range(5 * C)]


def filler(seed: int, chunks: int = 12) -> list[int]:
    rng = random.Random(1000 + seed)
    return [rng.randrange(1000, 2000) for _ in range(chunks * C)]


def engine(tmp_path, cfg: KVTierConfig = CFG, **kw) -> MiniEngine:
    return MiniEngine(cfg, num_blocks=96, cpu_chunks=12, disk_dir=tmp_path / "disk", **kw)


def on_disk_only(e: MiniEngine) -> None:
    """Store PROMPT, then push it out of the 12-chunk CPU tier (it stays on disk); prefetch
    may hold half of it (six chunks), more than PROMPT's five."""
    e.add("fill", PROMPT + [1])
    e.run()
    e.add("evict", filler(0))
    e.run()
    keys = e.manager.stack[0].index
    assert not keys.has(chain(e)[0]), "the prompt should have left the CPU tier"


def chain(e: MiniEngine, tokens: list[int] = PROMPT) -> list[bytes]:
    from kvtier.keys import KeyChain

    kc = KeyChain(e.manager.namespace.seed(), C)
    kc.update(tokens)
    return list(kc.keys)


def busy(e: MiniEngine, seed: int) -> None:
    """Other traffic keeps the engine busy (the waiting request is not scheduled)."""
    e.add(f"busy{seed}", filler(seed, 2))
    e.run()


def pins(e: MiniEngine) -> int:
    return sum(
        x.pins for t in e.manager.stack.tiers if not t.shared for x in t.index.entries.values()
    )


def metric(e: MiniEngine, name: str, *labels: str) -> float:
    return e.manager.metrics.values.get(name, {}).get(labels, 0.0)


def assert_clean(e: MiniEngine) -> None:
    m = e.manager
    assert e.wrong == 0
    assert not m.has_pending_jobs() and m.num_requests() == 0
    assert pins(e) == 0 and m.arrivals.prefetch.active() == 0 and m.arrivals.prefetch.inflight == 0


def arrive(e: MiniEngine, req_id: str, tokens: list[int], hints: Hints = NO_HINTS) -> None:
    """vLLM's on_new_request: the request is queued, not scheduled yet."""
    e.manager.on_new_request(req_id, tokens, hints=hints)


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_disk_prefix_is_a_host_hit_once_prefetched(tmp_path, prefetch):
    """Prefetch on: the prompt's five disk chunks are copied up while it waits and its hit
    is a sync host hit, counted as used. Off (the control): the same hit loads from disk."""
    import dataclasses

    e = engine(tmp_path, dataclasses.replace(CFG, prefetch=prefetch))
    try:
        on_disk_only(e)
        tokens = PROMPT + [7, 7]
        arrive(e, "r", tokens)
        busy(e, 1)
        r = e.add("r", tokens)
        e.run()
        if prefetch:
            assert r.sources == {HitSource.HOST: 5 * C} and r.sync_hit == 5 * C
            assert metric(e, "prefetch_chunks", "disk") == 5
            assert metric(e, "prefetch_used_chunks") == 5
            assert metric(e, "prefetch_unused_chunks") == 0
        else:
            assert r.sources == {HitSource.DISK: 5 * C} and r.async_hit == 5 * C
            assert metric(e, "prefetch_chunks", "disk") == 0
        assert_clean(e)
    finally:
        e.close()


@pytest.mark.parametrize("disk_slowdown", [1.0, 4.0])
def test_prefetch_only_where_a_hit_cannot_load_about_as_fast_as_host_memory(
    tmp_path, disk_slowdown
):
    """A disk tier measured as fast as the host copy: its hits load within the step anyway,
    so a waiting request is not prefetched (a copy would move its bytes twice); its hit
    loads from disk within the step. Measured four times slower: prefetched, a host hit."""
    e = engine(tmp_path)
    try:
        on_disk_only(e)
        budget = e.manager.loads.budget
        budget.observe_bandwidth(10e9)
        budget.observe_tier_load("disk", 64 << 20, (64 << 20) * disk_slowdown / 10e9)
        tokens = PROMPT + [7, 7]
        arrive(e, "r", tokens)
        busy(e, 1)
        r = e.add("r", tokens)
        e.run()
        if disk_slowdown < 2:
            assert metric(e, "prefetch_chunks", "disk") == 0
            assert r.sources == {HitSource.DISK: 5 * C} and r.sync_hit == 5 * C
        else:
            assert metric(e, "prefetch_chunks", "disk") == 5
            assert r.sources == {HitSource.HOST: 5 * C} and r.sync_hit == 5 * C
        assert_clean(e)
    finally:
        e.close()


def test_a_request_admitted_in_its_arrival_step_reads_its_hit_once(tmp_path):
    """Admitted in the step it arrived in: there is no wait to hide a copy in, so nothing is
    prefetched; its hit loads from where it lies (the disk), read once."""
    e = engine(tmp_path)
    try:
        on_disk_only(e)
        r = e.add("r", PROMPT + [3], arrive=True)
        e.run()
        assert r.sources == {HitSource.DISK: 5 * C}
        assert metric(e, "prefetch_chunks", "disk") == 0
        assert metric(e, "loads", "disk", "async") == 1
        assert_clean(e)
    finally:
        e.close()


def test_a_request_looked_up_but_not_admitted_is_prefetched_at_step_end(tmp_path):
    """Looked up in its arrival step but not admitted (no free blocks, as when vLLM's KV
    cache is full): its prefetch is planned at the step's end; its next lookup waits for
    its own copies (no second read of the same disk chunks), then loads from host memory."""
    e = engine(tmp_path, disk_fault=FaultPlan(slow_rate=1.0, slow_seconds=0.05))
    try:
        on_disk_only(e)
        free, e.free = e.free, []
        r = e.add("r", PROMPT + [3], arrive=True)
        e.step()
        assert not r.blocks and metric(e, "prefetch_chunks", "disk") == 5
        e.free = free
        e.run()
        assert r.sources == {HitSource.HOST: 5 * C}
        assert e.manager.deferred >= 1
        assert metric(e, "loads", "disk", "async") == 0
        assert_clean(e)
    finally:
        e.close()


def test_abort_while_prefetching_pins_nothing(tmp_path):
    e = engine(tmp_path, disk_fault=FaultPlan(slow_rate=1.0, slow_seconds=0.05))
    try:
        on_disk_only(e)
        arrive(e, "r", PROMPT + [3])
        e.step()  # the arrival step's end plans the copies (slow: still running)
        assert metric(e, "prefetch_chunks", "disk") == 5
        e.manager.request_finished("r", PROMPT + [3], 0, [])  # aborted, never scheduled
        e.run()  # the copies land after the abort
        assert metric(e, "prefetch_unused_chunks") == 5
        assert_clean(e)
        # What landed is an ordinary CPU-tier chunk now: the next request hits it.
        r = e.add("again", PROMPT + [4])
        e.run()
        assert r.sources == {HitSource.HOST: 5 * C}
        assert_clean(e)
    finally:
        e.close()


def test_lease_ends_the_hold_of_a_request_never_scheduled(tmp_path):
    e = engine(tmp_path)
    now = [0.0]
    e.manager.arrivals.prefetch.clock = lambda: now[0]
    try:
        on_disk_only(e)
        arrive(e, "r", PROMPT + [3])
        busy(e, 1)
        assert e.manager.arrivals.prefetch.pinned() == 1 and pins(e) == 1
        now[0] += CFG.prefetch_lease_s + 1
        busy(e, 2)  # a step after the lease ended
        assert e.manager.arrivals.prefetch.pinned() == 0 and pins(e) == 0
        assert metric(e, "prefetch_unused_chunks") == 5
        assert e.manager.arrivals.prefetch.inflight == 0
        e.manager.request_finished("r", PROMPT + [3], 0, [])  # vLLM frees it at last
        assert_clean(e)
    finally:
        e.close()


def test_a_prefetch_whose_read_fails_recomputes_and_pins_nothing(tmp_path):
    """Every disk read fails: the prefetch copies fail (nothing lands in the CPU tier), the
    request's disk load fails too, vLLM recomputes, the KV is exact and nothing stays held."""
    e = engine(tmp_path, disk_fault=FaultPlan(fail_all_reads=True))
    try:
        on_disk_only(e)
        arrive(e, "r", PROMPT + [3])
        busy(e, 1)
        assert e.manager.arrivals.prefetch.pinned() == 0
        assert metric(e, "failures", "cpu", "store") == 5
        r = e.add("r", PROMPT + [3])
        e.run()
        assert HitSource.HOST not in r.sources
        assert e.recomputed >= 1 or not r.sources
        assert_clean(e)
    finally:
        e.close()


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_prefetch_and_its_use_count_as_one_use(tmp_path, prefetch):
    """chain-arc promotes chunks to its frequent list (T2) on a second use. After an engine
    restart (the prompt on disk only, never seen by this CPU tier), the prompt's request
    is its first use here: with prefetch on as with it off, its chunks end in T1."""
    import dataclasses

    cfg = dataclasses.replace(CFG, eviction="chain-arc", prefetch=prefetch)
    first = engine(tmp_path, cfg)
    first.add("fill", PROMPT + [1])
    first.run()
    first.close()
    e = engine(tmp_path, cfg)
    try:
        arrive(e, "r", PROMPT + [3])
        busy(e, 1)
        r = e.add("r", PROMPT + [3])
        e.run()
        assert r.sources == {HitSource.HOST if prefetch else HitSource.DISK: 5 * C}
        policy = e.manager.stack[0].index.policy
        keys = chain(e)
        assert all(k in policy.t1 for k in keys), "one use promoted the chain"
        e.add("r2", PROMPT + [4])  # a second request: a second use
        e.run()
        assert all(k in policy.t2 for k in keys)
        assert_clean(e)
    finally:
        e.close()


def test_caps_bound_the_bytes_in_flight_and_the_rest_waits(tmp_path):
    """An in-flight cap of two chunks: two of the prefix's five chunks are prefetched and
    held for the request (the rest waits for room that its own hold keeps taken); its hit
    is those two from host memory, the rest from disk, exact."""
    e = engine(tmp_path)
    try:
        on_disk_only(e)
        p = e.manager.arrivals.prefetch
        p.inflight_cap = 2 * p.chunk_bytes
        arrive(e, "r", PROMPT + [3])
        busy(e, 1)  # the arrival step's end plans what fits; the hold keeps it taken
        assert p.inflight == 2 * p.chunk_bytes == p.inflight_cap
        r = e.add("r", PROMPT + [3])
        e.run()
        assert r.sources.get(HitSource.HOST, 0) >= 2 * C  # the part that was prefetched
        assert sum(r.sources.values()) == 5 * C
        assert_clean(e)
    finally:
        e.close()


def test_prefetch_from_a_real_redis_server(server):  # noqa: F811
    """The slow tier is a real redis-server: engine A stores there; engine B (its own empty
    CPU tier) gets the prompt, prefetches from Redis while busy, hits the CPU tier."""
    flush(server.url)
    cfg = KVTierConfig.from_dict(
        {
            "chunk_tokens": C,
            "sync_budget": "1GiB",
            "prefetch": True,
            "tiers": [
                {"kind": "cpu", "capacity": 16 * 256},
                {"kind": "redis", "url": server.url, "timeout_ms": 500},
            ],
        }
    )
    a = MiniEngine(cfg, cpu_chunks=16)
    try:
        a.add("a", PROMPT + [1])
        a.run()
    finally:
        a.close()
    b = MiniEngine(cfg, cpu_chunks=16)
    try:
        arrive(b, "r", PROMPT + [3])  # the probe starts; the copies follow in a step
        for i in range(4):
            busy(b, i)
        r = b.add("r", PROMPT + [3])
        b.run()
        assert r.sources == {HitSource.HOST: 5 * C}
        assert metric(b, "prefetch_chunks", "redis") == 5
        assert_clean(b)
    finally:
        b.close()


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(["write-through", "write-back"]),
    read_fail=st.sampled_from([0.0, 0.3]),
    aborts=st.booleans(),
)
def test_random_traffic_with_prefetch_serves_exact_kv(seed, policy, read_fail, aborts):
    """Random prompts sharing prefixes through a 6-chunk CPU tier over a 24-chunk disk tier
    whose reads may fail, every request prefetched at arrival (some aborted before they
    run): every hit carries the right KV, and nothing stays held or in flight."""
    import dataclasses
    import tempfile
    from pathlib import Path

    rng = random.Random(seed)
    cfg = dataclasses.replace(CFG, disk_write_policy=policy, eviction="adaptive")
    fault = FaultPlan(seed=seed, read_fail_rate=read_fail) if read_fail else None
    with tempfile.TemporaryDirectory() as d:
        e = MiniEngine(
            cfg, num_blocks=128, cpu_chunks=6, disk_dir=Path(d), disk_chunks=24, disk_fault=fault
        )
        try:
            prefixes = [[rng.randrange(50) for _ in range(rng.randrange(8, 40))] for _ in range(5)]
            for i in range(16):
                toks = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(12))]
                if aborts and rng.random() < 0.2:
                    arrive(e, f"x{i}", toks)  # arrives, never scheduled, aborted
                    if rng.random() < 0.5:
                        e.step()
                    e.manager.request_finished(f"x{i}", toks, 0, [])
                    continue
                e.add(f"q{i}", toks, arrive=True)
                if rng.random() < 0.5:
                    e.step()
            e.run()
            assert_clean(e)
            assert not e.manager.movement.demoting
            for view in e.manager.tiers:
                view.index.check()
        finally:
            e.close()
