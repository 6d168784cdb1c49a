import random
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvtier.budget import SyncBudget
from kvtier.config import KVTierConfig
from kvtier.keys import KeyChain
from kvtier.layout import KVLayout
from kvtier.sources import HitSource
from kvtier.tiers.faulty import FaultPlan
from tests.support.mini_engine import HD2, HEADS, LAYERS, MiniEngine

CFG = KVTierConfig(chunk_tokens=8, cpu_bytes=1 << 20, sync_budget=SyncBudget("fixed", 1 << 30))


def run_one(engine, req_id, tokens):
    r = engine.add(req_id, tokens)
    engine.run()
    return r


def test_second_request_hits_host_sync_and_kv_is_exact():
    e = MiniEngine(CFG)
    try:
        prompt = list(range(50))
        first = run_one(e, "a", prompt)
        assert first.sync_hit == first.async_hit == 0
        e.run()  # let stores land
        second = run_one(e, "b", prompt + [99, 98])
        assert second.sync_hit == 48  # 6 chunks of 8 tokens
        assert second.sources == {HitSource.HOST: 48}
        assert e.wrong == 0
    finally:
        e.close()


def test_budget_zero_loads_async():
    e = MiniEngine(KVTierConfig(chunk_tokens=8, sync_budget=SyncBudget("off")))
    try:
        run_one(e, "a", list(range(40)))
        r = run_one(e, "b", list(range(40)) + [1])
        assert r.async_hit == 40 and r.sync_hit == 0
        assert e.wrong == 0
    finally:
        e.close()


def test_idle_step_reports_its_async_load_in_the_same_step():
    """An engine with nothing else to compute waits for the async load it just started
    (a 50 ms read), so the request is schedulable after one step, not after the engine
    spun through empty steps polling for it."""
    cfg = KVTierConfig(chunk_tokens=8, sync_budget=SyncBudget("off"))
    e = MiniEngine(cfg, fault=FaultPlan(slow_rate=1.0, slow_seconds=0.05))
    try:
        run_one(e, "a", list(range(40)))
        r = e.add("b", list(range(40)) + [1])
        e.step()
        assert r.async_hit == 40 and not r.waiting_load
        e.run()
        assert e.wrong == 0
    finally:
        e.close()


def test_idle_steps_wait_for_a_long_async_load_instead_of_spinning(monkeypatch):
    """A load longer than one idle wait: every idle step waits again (until a load
    finishes or the bound), so the engine takes a handful of steps, not one per poll."""
    import kvtier.worker

    monkeypatch.setattr(kvtier.worker, "IDLE_WAIT_SECONDS", 0.02)
    cfg = KVTierConfig(chunk_tokens=8, sync_budget=SyncBudget("off"))
    e = MiniEngine(cfg, fault=FaultPlan(slow_rate=1.0, slow_seconds=0.2))
    try:
        run_one(e, "a", list(range(40)))
        r = e.add("b", list(range(40)) + [1])
        steps = 0
        while r.waiting_load or steps == 0:
            e.step()
            steps += 1
            assert steps < 40, "the engine spun through idle steps"
        assert r.async_hit == 40 and steps >= 5  # 0.2 s in waits of at most 0.02 s
        e.run()
        assert e.wrong == 0
    finally:
        e.close()


def test_full_hit_sync_is_trimmed_by_one_token():
    e = MiniEngine(CFG)
    try:
        run_one(e, "a", list(range(32)))
        r = run_one(e, "b", list(range(32)))
        assert r.sync_hit == 31
        assert r.sources == {HitSource.HOST: 31}
        assert e.wrong == 0
    finally:
        e.close()


def test_per_step_budget_splits_a_batch():
    # 16 tokens x 16 B/token... budget fits exactly one 16-token hit per step.
    layout_bytes_per_token = 2 * 2 * 2 * 2 * 2  # layers*heads*head_dim*2(KV)*2B
    cfg = KVTierConfig(chunk_tokens=8, sync_budget=SyncBudget("fixed", 16 * layout_bytes_per_token))
    e = MiniEngine(cfg)
    try:
        for i in range(3):
            run_one(e, f"warm{i}", [i] * 16 + [100 + i])
        rs = [e.add(f"r{i}", [i] * 16 + [200 + i]) for i in range(3)]
        e.step()
        used = e.manager.metrics.observations.get("sync_budget_used_bytes", [])
        assert [r.sync_hit for r in rs].count(16) == 1
        assert [r.async_hit for r in rs].count(16) == 2
        assert all(u <= 16 * layout_bytes_per_token for u in used)
        e.run()
        assert e.wrong == 0
    finally:
        e.close()


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from(["off", "fixed", "tiny"]),
    st.sampled_from([0.0, 0.2]),
    st.sampled_from([0.0, 0.2]),
    st.sampled_from(["lru", "arc", "chain-arc", "adaptive"]),
)
def test_random_workloads_never_use_wrong_kv(seed, budget, read_fail, write_fail, policy):
    rng = random.Random(seed)
    sb = {
        "off": SyncBudget("off"),
        "fixed": SyncBudget("fixed", 1 << 30),
        "tiny": SyncBudget("fixed", 8 * 32),
    }[budget]
    cfg = KVTierConfig(chunk_tokens=8, sync_budget=sb, eviction=policy)
    fault = (
        FaultPlan(seed=seed, read_fail_rate=read_fail, write_fail_rate=write_fail)
        if (read_fail or write_fail)
        else None
    )
    e = MiniEngine(cfg, num_blocks=96, cpu_chunks=10, fault=fault, seed=seed)
    try:
        prefixes = [[rng.randrange(50) for _ in range(rng.randrange(8, 40))] for _ in range(4)]
        for i in range(14):
            toks = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(0, 12))]
            e.add(f"q{i}", toks)
            if rng.random() < 0.5:
                e.step()
        e.run()
        assert e.wrong == 0
        assert not e.held and not e.manager.has_pending_jobs()
        idx = e.manager.tiers[0].index
        idx.check()
        assert all(not ent.pins for ent in idx.entries.values()), "a pin leaked"
        failed_loads = sum(
            n
            for (_tier, op), n in e.manager.metrics.values.get("failures", {}).items()
            if op == "load"
        )
        # A failed load is recomputed (the engine truncates or resends the request), and
        # nothing fails or recomputes without read faults.
        assert (e.recomputed > 0) == (failed_loads > 0), (e.recomputed, failed_loads)
        if not read_fail:
            assert failed_loads == 0 and e.recomputed == 0
    finally:
        e.close()


def test_write_through_disk_serves_what_the_cpu_tier_evicted(tmp_path):
    """CPU holds 4 chunks, disk 64: older prompts come back from disk, loaded async
    straight into engine blocks, with exact KV; corrupt disk bytes become recompute."""
    cfg = KVTierConfig(chunk_tokens=8, sync_budget=SyncBudget("fixed", 1 << 30))
    e = MiniEngine(cfg, num_blocks=96, cpu_chunks=4, disk_dir=tmp_path / "disk")
    try:
        prompts = [[i] * 32 + [100 + i] for i in range(4)]  # 4 chunks each
        for i, p in enumerate(prompts):
            run_one(e, f"w{i}", p)
        m = e.manager
        first_keys = _keys(e, prompts[0])
        assert m.tiers[0].index.prefix_len(first_keys) == 0  # the CPU tier evicted it
        assert m.tiers[1].index.prefix_len(first_keys) == 4  # the disk tier holds it
        first = run_one(e, "again0", prompts[0])  # evicted from CPU long ago
        assert first.sources == {HitSource.DISK: 32} and first.async_hit == 32
        # The disk hit was stored back into the CPU tier: next time it is a sync host hit.
        promoted = run_one(e, "again0b", prompts[0])
        assert promoted.sources == {HitSource.HOST: 32} and promoted.sync_hit == 32
        assert e.wrong == 0
        corrupt_disk(tmp_path / "disk")  # disk hits fail their checksum: recompute
        again = run_one(e, "again1", prompts[1])
        assert again.sources == {HitSource.DISK: 32}
        assert e.recomputed >= 1 and e.wrong == 0
        assert e.disk.corrupt_reads > 0
    finally:
        e.close()


def corrupt_disk(path: Path) -> None:
    """Flip a byte every 512 past the first 8 KiB of every slab file: payloads fail their
    checksum."""
    for f in path.glob("slab-*.kvt"):
        data = bytearray(f.read_bytes())
        for off in range(8192, len(data), 512):
            data[off] ^= 0xFF
        f.write_bytes(bytes(data))


def stored_on_disk(tmp_path: Path, budget: SyncBudget) -> tuple[MiniEngine, list[list[int]]]:
    """A 4-chunk CPU tier over a disk tier, and four 4-chunk prompts stored (the first
    ones evicted from the CPU tier, all on disk)."""
    cfg = KVTierConfig(chunk_tokens=8, sync_budget=budget)
    e = MiniEngine(cfg, num_blocks=96, cpu_chunks=4, disk_dir=tmp_path / "disk")
    prompts = [[i] * 32 + [100 + i] for i in range(4)]
    for i, p in enumerate(prompts):
        run_one(e, f"w{i}", p)
    return e, prompts


def _measured(e: MiniEngine, disk_bw: float) -> None:
    """The bandwidths a real engine measures (its worker calibrates the host copy at start,
    the disk tier's loads price it); the mini engine's tiny loads are under the size that
    refines them."""
    budget = e.manager.loads.budget
    budget.observe_bandwidth(10e9)
    budget.observe_tier_load("disk", 64 << 20, (64 << 20) / disk_bw)


@pytest.mark.parametrize("corrupt", [False, True])
def test_a_measured_disk_tier_loads_within_the_step(tmp_path, corrupt):
    """Once the disk tier's load bandwidth is known, a disk hit that fits the step's budget
    (at the disk's price) loads within the step, straight from the slab into engine
    blocks: exact KV. A sync disk read that fails its checksum is recomputed, never a
    wrong token."""
    e, prompts = stored_on_disk(tmp_path, SyncBudget("fixed", 1 << 30))
    try:
        _measured(e, 5e9)
        if corrupt:
            corrupt_disk(tmp_path / "disk")
        r = run_one(e, "again0", prompts[0])  # evicted from CPU long ago
        assert r.sources == {HitSource.DISK: 32} and r.sync_hit == 32 and r.async_hit == 0
        assert e.manager.metrics.get("loads", "disk", "sync") == 1
        assert e.wrong == 0
        assert e.recomputed == (1 if corrupt else 0)
        assert (e.disk.corrupt_reads > 0) == corrupt
    finally:
        e.close()


def test_a_disk_hit_costs_the_budget_at_the_disk_s_price(tmp_path):
    """The budget is counted in host-copy bytes: a disk run costs its bytes times how much
    slower the disk tier's loads measured (four times before any was measured), so the
    same hit loads within the step or not as the disk's price moves."""
    chunk = KVLayout.dense(LAYERS, HEADS, HD2 // 2, "int16").chunk_bytes(8)
    e, prompts = stored_on_disk(tmp_path, SyncBudget("fixed", 16 * chunk))
    try:
        budget = e.manager.loads.budget
        no_host = run_one(e, "n", prompts[0])  # the host copy not calibrated: no price
        assert no_host.async_hit == 32 and no_host.sync_hit == 0
        budget.observe_bandwidth(10e9)
        guessed = run_one(e, "g", prompts[1])  # 4 chunks at 4x: 16, fits
        assert guessed.sources == {HitSource.DISK: 32} and guessed.sync_hit == 32
        _measured(e, 1.25e9)  # 8x: 32 chunks, over
        slow = run_one(e, "slow", prompts[2])
        assert slow.sources == {HitSource.DISK: 32} and slow.async_hit == 32
        _measured(e, 40e9)  # averaged in (0.8 x 1.25 + 0.2 x 40 = 9 GB/s): 4.4 chunks
        fast = run_one(e, "fast", prompts[3])
        assert fast.sources == {HitSource.DISK: 32} and fast.sync_hit == 32
        assert e.wrong == 0
    finally:
        e.close()


def _keys(engine, tokens):
    chain = KeyChain(engine.manager.namespace.seed(), engine.manager.chunk_tokens)
    chain.update(tokens)
    return chain.keys


def test_write_back_demotes_only_what_the_cpu_tier_evicts(tmp_path):
    """CPU holds 4 chunks, disk 64, write-back: a prompt reaches disk only once the CPU
    tier evicts it (with exact KV), a prompt still in CPU costs no disk write, stores into
    freed slots wait for the demotion that reads them, and everything settles clean."""
    cfg = KVTierConfig(
        chunk_tokens=8, sync_budget=SyncBudget("fixed", 1 << 30), disk_write_policy="write-back"
    )
    e = MiniEngine(cfg, num_blocks=96, cpu_chunks=4, disk_dir=tmp_path / "disk")
    try:
        m = e.manager
        cpu, disk = m.tiers[0].index, m.tiers[1].index
        prompts = [[i] * 32 + [100 + i] for i in range(4)]  # 4 chunks each
        run_one(e, "w0", prompts[0])
        assert cpu.prefix_len(_keys(e, prompts[0])) == 4
        assert len(disk) == 0, "write-back wrote a chunk the CPU tier still holds"
        waited = []
        for i in (1, 2, 3):
            r = e.add(f"w{i}", prompts[i])
            while not r.done:
                plan_stores = e.manager.movement.pending  # write-through only: stays empty
                assert not plan_stores
                e.step()
                waited += [x.job for x in e.manager.jobs if x.job.after]
            e.run()
        assert waited, "no store waited for a demotion of the slots it reuses"
        for i in (0, 1, 2):
            assert disk.prefix_len(_keys(e, prompts[i])) == 4, f"prompt {i} was not demoted"
        assert disk.prefix_len(_keys(e, prompts[3])) == 0  # still only in CPU memory
        assert m.metrics.get("stored_chunks", "disk") == 12
        back = run_one(e, "again0", prompts[0])
        assert back.sources == {HitSource.DISK: 32} and back.async_hit == 32
        assert e.wrong == 0
        # Evicting a chunk that is on disk already writes nothing more.
        run_one(e, "again3", prompts[3])
        assert m.metrics.get("stored_chunks", "disk") <= 16
        e.run()
        assert not m.movement.demoting and not m.has_pending_jobs()
        cpu.check()
        disk.check()
        assert all(not ent.pins for ent in cpu.entries.values()), "a pin leaked"
    finally:
        e.close()


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_write_back_random_traffic_serves_exact_kv(seed):
    """Random prompts sharing prefixes through a 6-chunk CPU tier and a 24-chunk disk
    tier, write-back: every hit, from either tier, carries the right KV."""
    import tempfile

    rng = random.Random(seed)
    cfg = KVTierConfig(
        chunk_tokens=8, sync_budget=SyncBudget("fixed", 1 << 30), disk_write_policy="write-back"
    )
    with tempfile.TemporaryDirectory() as d:
        e = MiniEngine(cfg, num_blocks=128, cpu_chunks=6, disk_dir=Path(d), disk_chunks=24)
        try:
            prefixes = [[rng.randrange(50) for _ in range(rng.randrange(8, 40))] for _ in range(5)]
            for i in range(16):
                toks = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(12))]
                e.add(f"q{i}", toks)
                if rng.random() < 0.5:
                    e.step()
            e.run()
            assert e.wrong == 0
            assert not e.manager.has_pending_jobs() and not e.manager.movement.demoting
            for view in e.manager.tiers:
                view.index.check()
        finally:
            e.close()


def _over_shared_memory(fault: FaultPlan | None) -> KVTierConfig:
    """A small CPU tier over a shared memory tier (the stand-in for a remote tier, shared
    by every engine of this process); ``fault`` on the shared tier's reads."""
    import dataclasses

    from kvtier.contract.spec import TierSpec
    from kvtier.tiers.memory import MemoryOptions

    shared = TierSpec(
        "memory",
        name="shared",
        capacity=1 << 20,
        options=MemoryOptions(shared=True, url="memory://fail"),
    )
    if fault is not None:
        shared = dataclasses.replace(shared, faults=fault)
    cpu = TierSpec("cpu", capacity=1 << 20)
    return KVTierConfig(chunk_tokens=8, tiers=(cpu, shared))


@pytest.mark.parametrize("request_failures", [False, True])
def test_a_hit_that_cannot_load_is_never_claimed_twice_by_one_request(request_failures):
    """A shared tier keeps answering "present" for chunks whose every read fails (a planted
    value, a dead link): the request's next lookups claim nothing, so with
    request-level failures (vLLM with several KV-cache groups: the request recomputes from
    scratch and is looked up again) it is rescheduled once, not forever."""
    writer = MiniEngine(_over_shared_memory(None))
    e = MiniEngine(
        _over_shared_memory(FaultPlan(fail_all_reads=True)), request_failures=request_failures
    )
    try:
        run_one(writer, "w", list(range(64)))
        writer.run()
        r = e.add("a", list(range(64)) + [7])
        e.run(max_steps=200)
        assert r.done and e.wrong == 0
        assert e.manager.metrics.total("load_failed_requests") == 1
        assert r.failed_loads == (1 if request_failures else 0)
        assert e.recomputed == 1
    finally:
        writer.close()
        e.close()


@settings(max_examples=15, deadline=None)
@given(
    rate=st.sampled_from([0.2, 0.5, 1.0]),
    seed=st.integers(0, 1000),
    request_failures=st.booleans(),
)
def test_random_read_failures_recompute_exact_kv_in_either_failure_mode(
    rate, seed, request_failures
):
    """Random read failures on the CPU tier, block-level (one KV-cache group) or per
    request (several): every request finishes on exact KV (the oracle), and no request is
    sent back more often than it has chunks."""
    rng = random.Random(seed)
    cfg = KVTierConfig(chunk_tokens=8, cpu_bytes=1 << 20, sync_budget=SyncBudget("fixed", 1 << 30))
    e = MiniEngine(
        cfg,
        fault=FaultPlan(seed=seed, read_fail_rate=rate),
        request_failures=request_failures,
    )
    try:
        docs = [[rng.randrange(1000) for _ in range(48)] for _ in range(3)]
        reqs = []
        for i in range(12):
            reqs.append(e.add(f"r{i}", rng.choice(docs) + [rng.randrange(1000)]))
            if i % 3 == 2:
                e.run()
        e.run()
        assert all(r.done for r in reqs) and e.wrong == 0
        assert all(r.failed_loads <= len(r.tokens) // 8 for r in reqs)
        if request_failures:
            assert all(r.sync_hit == 0 for r in reqs), "several groups: every load async"
    finally:
        e.close()


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 14), st.booleans(), st.booleans()),
        max_size=40,
    )
)
@example([(0, 2, False, True), (0, 3, False, False), (0, 3, False, True)])
def test_store_due_false_means_the_step_stores_nothing_for_the_request(ops):
    """The connector skips gathering a request's blocks when ``store_due`` says so; that
    must only happen when the step would plan no store for it anyway. Four requests whose
    prompts share prefixes, a tier of 10 chunks (so stores evict each other's chunks),
    random limits, lookups or none, stores that succeed or fail."""
    from kvtier.contract.kind import TierContext
    from kvtier.jobs import JobResult, WorkerReport
    from kvtier.keys import Namespace
    from kvtier.layout import KVLayout
    from kvtier.manager import CacheManager, ScheduledRequest
    from kvtier.stack.build import build_stack

    layout = KVLayout.dense(2, 1, 8, "float32")
    ns = Namespace("m", layout.digest())
    cfg = KVTierConfig(chunk_tokens=8, cpu_bytes=10 * layout.chunk_bytes(8))
    m = CacheManager(
        cfg, layout, ns, 8, build_stack(cfg, TierContext(layout.chunk_bytes(8), ns, False))
    )
    prompts = [[r % 2] * 24 + [r] * 88 for r in range(4)]  # 14 chunks each
    blocks = list(range(14))
    for r, chunks, looked_up, ok in ops:
        rid, toks = f"r{r}", prompts[r]
        if looked_up and not m.requests.knows(rid):
            m.lookup(rid, toks, 0)
        limit = chunks * 8 + r  # a partial chunk too
        due = m.store_due(rid, limit)
        plan = m.build_step([ScheduledRequest(rid, toks, limit, blocks, len(toks))])
        mine = [j for j in plan.stores if j.kind == "store" and j.req_id == rid]
        if not due:
            assert not mine, (rid, limit)
        results = [
            JobResult(j.job_id, j.req_id, j.kind, j.tier, j.sync, [ok] * len(j.keys), 0, 0.0)
            for j in (*plan.loads, *plan.stores)
        ]
        m.on_report(WorkerReport(results))
