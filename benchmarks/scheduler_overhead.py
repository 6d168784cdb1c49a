"""Scheduler-side cost of an external cache hit in kvtier, against vLLM's sort-and-sweep.

What it measures, per hit of 8k / 32k / 128k tokens with 16-token and 256-token chunks, for a
single-tier hit (all HOST) and a mixed one (first half HOST, second half DISK):

(a) *Hit-source accounting*: splitting the accepted hit tokens by the tier they come from.

    - ``sweep`` (the baseline, written here): vLLM's current algorithm
      (``OffloadingConnectorScheduler.get_external_cache_hit_sources``). Given one loaded
      range ``(lo, hi, key)`` per chunk (8,192 ranges for 128k tokens in 16-token chunks), it
      asks ``get_load_source(key)`` per range (here a method doing a dict lookup key ->
      source), builds ``(end, 0, EXTERNAL_UNSPECIFIED)`` plus ``(lo, +1, src)`` and
      ``(hi, -1, src)`` per range clipped to ``[start, end)``, sorts the events and sweeps
      them with a ``Counter`` of active sources, giving each segment to the outermost active
      source (max by source order) or EXTERNAL_UNSPECIFIED.
    - ``kvtier.sources.hit_sources``: the same question over the *runs* kvtier's lookup
      produces, one ``HitRun`` per tier (1 run single-tier, 2 runs mixed).
    - ``CacheManager.hit_sources(req_id, n)``: what the vLLM connector actually calls, on a
      real manager after a real lookup / plan_load / on_allocated.

    All three must return the same dict (asserted). Median of 200 calls each (20 with
    ``--quick``; the sweep, 40-50 ms a call at 128k, a tenth of that, at least 5);
    speedup = sweep median / kvtier median, both measured in the same run.

(b) *Whole scheduler-side cost of the hit*, keys already computed: a ``CacheManager`` over
    a tier stack built by the tier registry (a CPU tier, plus a disk tier below it in the
    mixed case, index only) whose indexes already hold the request's chunk chain (reserve +
    commit in chain order), SmolLM2's KV layout ``KVLayout.dense(30, 3, 64, "bfloat16")``,
    16-token engine blocks and a fixed, large sync budget. One untimed warm-up lookup
    computes the keys. The timed region of each iteration is exactly

        lookup(req_id, tokens, 0) + plan_load(req_id, hit, len(tokens))
        + on_allocated(req_id, block_ids, n, sync=not is_async) + hit_sources(req_id, n)

    and, untimed, ``build_step([])`` then an ``on_report`` with a successful ``JobResult`` per
    planned load undoes the side effects (pins, in-flight marks, budget reservation). The
    prompt is the hit plus 10 tokens (a partial chunk), so the hit is exactly 8k/32k/128k
    tokens and the single-tier hit loads synchronously; the mixed hit loads asynchronously.

    ``on_allocated`` refreshes the hit's recency in every tier holding it; the index skips
    that touch as the no-op it is when nothing changed the tier's order since the request's
    lookup observed the chain (vLLM allocates right after the lookup). The ``after other``
    column times the same region when the tiers' order changed in between (untimed; any
    other request's store, hit or eviction does that), so the touch runs in full: a request
    that waited for blocks while others were served.

    Not in that region, because it happens once per request (the warm-up lookup does it):
    the eviction policies' ``observe`` of the request's chain (reuse counting); it is timed
    on its own (``observe 1st``: the chain's first reuse, which promotes it; ``observe
    again``: a later reuse), on fresh indexes holding the chain.

(c) *Tier events* (``--kv-events-config`` on; :mod:`kvtier.tier_events`), per case: the (b)
    region with the event log attached to every tier and the connector's per-lookup event
    call (``announce_held``, O(1) unless restored chunks are still unannounced) in the timed
    region, against the same region with no log, in alternate iterations of one loop (both
    see the same load; delta = on median - off median); ``announce`` is the one-time cost
    of announcing a 128k chain the tiers held before the log knew it (a restart's restored
    disk tier, first lookup naming it). Store side, once per request: a 128k-token chain
    stored into an empty CPU index without and with the log, in pairs: ``reserve`` (the
    store's planning; the log hears nothing there, the index being empty) is timed apart,
    and the delta is the median of the pairs' differences of the store's completion
    (``commit``, with the log's ``learn`` before it and ``take`` after it when on). The vLLM
    event objects are built from those runs by :mod:`kvtier.vllm.events`, not timed here.
(d) *Key cost*, once per request: a request's chunk keys from its token ids (a Python list)
    with today's keys (format 3: chained keyed BLAKE3, 20 bytes; native chain, public key and
    with a secret) against the previous keys (format 2: chained xxh3-128, 16 bytes, written in
    ``key_cost.py`` as the baseline), for 16-, 32- and 256-token chunks; at 128k also the
    blake3-package fallback (no native chain). Part (b) at 128k is timed a second time with
    previous-format keys in the indexes (``prev keys`` column), so the scheduler cost with
    the new keys stands next to the cost with today's main's.

(e) *A request's whole life on the scheduler thread* (:mod:`request_lifecycle`): a
    128k-token request's keys, lookup, the policies' observe, load plan, allocation, hit
    sources, its prefill in engine steps of 8,192 tokens (store reservation, job, commit
    of the chunks each step completes), completion and release, all timed, on a fresh
    manager whose CPU tier holds nothing (``cold``), the prompt's first half (``half``:
    it loads that and stores the rest, every phase named above) or all of it (``hit``);
    against vLLM's own block hashing of the same tokens in the same run (its default hash,
    sha256 of pickled blocks, 16-token blocks), with kvtier's keys alone and a keyed
    re-hash of vLLM's block hashes (what reusing them as keys would cost) next to it.
    Ratios are per run (the same prompt, one after the other in each iteration); the
    summary gives the worst of the runs.
(f) *Per step with many requests* (:mod:`connector_step`): ``build_connector_meta`` of a
    real scheduler-side connector bound to a real vLLM ``KVCacheManager`` with 256 running
    requests (2,048-token prompts) in decode, nothing to store, against the same call
    gathering every request's block ids (as before ``CacheManager.store_due``), alternate
    steps. Parts (e) and (f) run after ``gc.freeze()``, as vLLM's engine core freezes its
    startup heap (vLLM's modules are imported by then: without it, a full collection of
    their objects lands in whichever timed region triggers it).
(g) *Prefetch on arrival* (``prefetch`` on; :mod:`kvtier.stack.prefetch`), once per
    request: ``CacheManager.on_new_request`` on a 128k-token prompt (16-token chunks) over a
    CPU + disk stack when nothing of it is on a slow tier only: the whole chain in the CPU
    tier (``held``), or nowhere (``miss``). The request's keys are computed before the
    timed region (untimed warm-up lookup): arrival computes them in place of the first
    lookup, which then finds them made, so that is not work arrival adds. Target <= 0.05 ms
    (the prefetch issue), both cases, worst of the repeats.

The tiers' eviction policy is the connector's default (``--eviction`` picks another, e.g.
``lru`` for the figures before chain-arc became the default).

Repeats: every measurement runs ``--repeats`` times (default 5), each time on a freshly
built case; tables and the summary's keys give the worst run's figure (the highest median;
for speedups, the lowest), with the median and best runs next to it where it matters.

Targets (the design's, the tier-stack and the tier-events issues'): (a) kvtier >= 1,000x
faster than the sweep at 128k; (b) <= 1 ms at 128k (the newer goal: 0.3 ms); (c) events on
add <= 0.1 ms at 128k, to (b) and to a store's bookkeeping (each the worst of the repeats);
(e) the ``half`` request's whole life <= 0.5x vLLM's block hashing; (g) prefetch's arrival
work <= 0.05 ms per 128k-token request with nothing on a slow tier (each the worst of the
repeats).

Python's garbage collector stays enabled (as in a server); medians absorb its pauses. One
thread (the scheduler's), no binding.
Run: ``.venv/bin/python benchmarks/scheduler_overhead.py [--quick] [--repeats N] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common import (
    fmt_time_us,
    format_table,
    machine_info,
    spread,
    stats_ns,
    time_calls,
    worst_run,
    write_json,
)
from connector_step import RUNNING, measure_connector_step
from key_cost import LEGACY_SEED, legacy_chunk_keys, measure_key_cost
from kvtier.budget import SyncBudget
from kvtier.config import KVTierConfig
from kvtier.contract.kind import TierContext
from kvtier.contract.spec import TierSpec
from kvtier.jobs import JobResult, WorkerReport
from kvtier.keys import Key, Namespace, chunk_keys
from kvtier.layout import KVLayout
from kvtier.manager import CacheManager, on_new_request
from kvtier.policies import EvictionPolicy, make_eviction_policy
from kvtier.policies.defaults import tier_eviction_name
from kvtier.sources import HitRun, HitSource, hit_sources
from kvtier.stack.build import build_stack
from kvtier.stack.stack import StackTier, TierStack
from kvtier.tier_events import TierEvents
from kvtier.tiers.disk.kind import DiskOptions
from kvtier.tiers.index import SlotIndex
from request_lifecycle import STEP_TOKENS, VARIANTS, measure_run

HIT_TOKENS = (8 << 10, 32 << 10, 128 << 10)
CHUNK_TOKENS = (16, 256)
MIXES = ("host", "host+disk")
BLOCK_TOKENS = 16
TAIL_TOKENS = 10
"""Prompt tokens after the hit: a partial chunk, so the hit is exactly HIT_TOKENS."""
LAYOUT = KVLayout.dense(30, 3, 64, "bfloat16")  # SmolLM2-135M
SYNC_BUDGET_BYTES = 1 << 40
TARGET_SPEEDUP_128K = 1000.0
TARGET_SCHED_MS_128K = 1.0
TARGET_EVENTS_MS_128K = 0.1
"""Event bookkeeping's budget per 128k-token request (the tier-events issue)."""
REPEATS = 5
"""Runs of every measurement (``--repeats``), each on a freshly built case."""
NEWER_TARGET_SCHED_MS_128K = 0.3
TARGET_ARRIVAL_MS_128K = 0.05
"""Prefetch's arrival-time work per 128k-token request with nothing on a slow tier."""
TARGET_LIFECYCLE_OVER_VLLM_HASH = 0.5
"""A 128k-token request's whole scheduler-thread cost against vLLM's block hashing."""
KEY_CHUNK_TOKENS = (16, 32, 256)
REQ_ID = "req-0"

# -- the baseline: vLLM's sort-and-sweep ---------------------------------------------------

_SOURCE_ORDER = {source: rank for rank, source in enumerate(HitSource)}


def outermost(sources: Sequence[HitSource]) -> HitSource:
    """vLLM's ``CacheHitSource.outermost``: the source farthest from the accelerator."""
    return max(sources, key=_SOURCE_ORDER.__getitem__)


class SourceLookup:
    """Stands in for vLLM's offloading manager: ``get_load_source`` is a dict lookup."""

    def __init__(self, sources: dict[Key, HitSource]) -> None:
        self._sources = sources

    def get_load_source(self, key: Key, req_context: object) -> HitSource:
        return self._sources[key]


def sweep_hit_sources(
    load_key_ranges: Sequence[tuple[int, int, Key]],
    start: int,
    end: int,
    manager: SourceLookup,
    req_context: object = None,
) -> dict[HitSource, int]:
    """vLLM's ``get_external_cache_hit_sources`` body, line for line."""
    sources: dict[HitSource, int] = {}
    if end - start == 0:
        return sources
    events: list[tuple[int, int, HitSource]] = [(end, 0, HitSource.EXTERNAL_UNSPECIFIED)]
    for lo, hi, key in load_key_ranges:
        lo, hi = max(start, lo), min(end, hi)
        if lo >= hi:
            continue
        source = HitSource(manager.get_load_source(key, req_context))
        events.extend(((lo, 1, source), (hi, -1, source)))
    active: Counter[HitSource] = Counter()
    position = start
    for boundary, delta, source in sorted(events):
        if boundary > position:
            tiers = [tier for tier, count in active.items() if count > 0]
            tier = outermost(tiers) if tiers else HitSource.EXTERNAL_UNSPECIFIED
            sources[tier] = sources.get(tier, 0) + boundary - position
        active[source] += delta
        position = boundary
    return sources


# -- kvtier setup ----------------------------------------------------------------------------


def store_chain(index: SlotIndex, keys: Sequence[Key], n: int) -> int:
    """Store ``keys[:n]`` in chain order (reserve + commit), as tests/tiers/test_index.py does."""
    present = index.prefix_len(keys, any_state=True)
    todo = list(keys[present:n])
    slots = index.reserve(todo, keys[present - 1] if present else None)
    index.commit(todo[: len(slots)], [True] * len(slots))
    return present + len(slots)


@dataclass
class Case:
    chunk_tokens: int
    hit_tokens: int
    mix: str
    manager: CacheManager
    tokens: list[int]
    keys: list[Key]
    block_ids: list[int]
    runs: list[HitRun]
    ranges: list[tuple[int, int, Key]]
    lookup: SourceLookup
    expected: dict[HitSource, int]

    @property
    def name(self) -> str:
        return f"{self.hit_tokens // 1024}k/c{self.chunk_tokens}/{self.mix}"


EVICTION = tier_eviction_name(KVTierConfig(), "cpu")
"""The tiers' eviction policy (``--eviction``)."""


def new_policy(n: int) -> EvictionPolicy:
    return make_eviction_policy(EVICTION, n)


def build_case(
    chunk_tokens: int, hit_tokens: int, mix: str, seed: int = 0, *, legacy: bool = False
) -> Case:
    """A manager whose tier(s) hold the request's chain, plus the baseline's inputs.
    ``legacy``: the chain has the previous format's 16-byte keys (the manager's request
    state is given them, as ``lookup_keys`` does)."""
    rng = random.Random(seed)
    tokens = [rng.randrange(49152) for _ in range(hit_tokens + TAIL_TOKENS)]
    namespace = Namespace("HuggingFaceTB/SmolLM2-135M", LAYOUT.digest())
    if legacy:
        keys = legacy_chunk_keys(tokens, chunk_tokens, LEGACY_SEED)
    else:
        keys = chunk_keys(tokens, chunk_tokens, namespace.seed())
    n = len(keys)
    assert n * chunk_tokens == hit_tokens
    half = n // 2
    chunk_bytes = LAYOUT.chunk_bytes(chunk_tokens)
    specs = [TierSpec("cpu", capacity=n * chunk_bytes, eviction=EVICTION)]
    if mix != "host":
        specs.append(
            TierSpec("disk", capacity=n * chunk_bytes, eviction=EVICTION, options=DiskOptions())
        )
    config = KVTierConfig(
        chunk_tokens=chunk_tokens,
        sync_budget=SyncBudget("fixed", SYNC_BUDGET_BYTES),
        tiers=tuple(specs),
    )
    stack = build_stack(config, TierContext(chunk_bytes, namespace, restore=False))
    cpu = stack[0].index
    assert isinstance(cpu, SlotIndex)
    if mix == "host":
        assert store_chain(cpu, keys, n) == n
        runs = [HitRun(0, hit_tokens, HitSource.HOST)]
        per_chunk = [HitSource.HOST] * n
    else:
        disk = stack[1].index
        assert isinstance(disk, SlotIndex)
        assert store_chain(cpu, keys, half) == half
        assert store_chain(disk, keys, n) == n  # write-through: disk holds the whole chain
        split = half * chunk_tokens
        runs = [HitRun(0, split, HitSource.HOST), HitRun(split, hit_tokens, HitSource.DISK)]
        per_chunk = [HitSource.HOST] * half + [HitSource.DISK] * (n - half)
    manager = CacheManager(config, LAYOUT, namespace, BLOCK_TOKENS, stack)
    if legacy:  # the tail (< 1 chunk) adds no key, so lookups use exactly these keys, as
        # other objects than the indexes' (as the manager's own chain makes them): a dict
        # finding the very object it holds skips comparing bytes.
        manager._request(REQ_ID).chain.keys[:] = [bytes(memoryview(k)) for k in keys]
    num_blocks = -(-len(tokens) // BLOCK_TOKENS)
    block_ids = list(range(num_blocks))
    rng.shuffle(block_ids)
    ranges = [(i * chunk_tokens, (i + 1) * chunk_tokens, k) for i, k in enumerate(keys)]
    lookup = SourceLookup(dict(zip(keys, per_chunk, strict=True)))
    expected: dict[HitSource, int] = {}
    for run in runs:
        expected[run.source] = expected.get(run.source, 0) + run.end - run.start
    case = Case(
        chunk_tokens,
        hit_tokens,
        mix,
        manager,
        tokens,
        keys,
        block_ids,
        runs,
        ranges,
        lookup,
        expected,
    )
    # Untimed warm-up lookup: the manager computes (and keeps) the request's keys here.
    hit = manager.lookup(REQ_ID, tokens, 0)
    assert hit is not None and hit.end == hit_tokens, hit
    assert len(hit.runs) == len(runs), hit.runs
    return case


def undo(manager: CacheManager) -> int:
    """Finish the load jobs of the last on_allocated (untimed): releases pins and marks."""
    plan = manager.build_step([])
    results = [
        JobResult(j.job_id, j.req_id, j.kind, j.tier, j.sync, [True] * len(j.keys), 0, 0.0)
        for j in plan.loads
    ]
    manager.on_report(WorkerReport(results))
    return len(results)


# -- timing: one run of each measurement (``main`` repeats them on a fresh case) -------------


def measure_sources(case: Case, iters: int, sweep_iters: int) -> dict[str, Any]:
    """Part (a): sweep vs kvtier.sources.hit_sources vs CacheManager.hit_sources."""
    m = case.manager
    start, end = 0, case.hit_tokens
    # A real lookup -> plan_load -> on_allocated, so the manager holds the request's load runs.
    hit = m.lookup(REQ_ID, case.tokens, 0)
    assert hit is not None
    n, is_async = m.plan_load(REQ_ID, hit, len(case.tokens))
    assert n == case.hit_tokens, (n, case.hit_tokens)
    m.on_allocated(REQ_ID, case.block_ids, n, sync=not is_async)

    sweep = sweep_hit_sources(case.ranges, start, end, case.lookup)
    runs_result = hit_sources([case.runs], start, end)
    mgr_result = m.hit_sources(REQ_ID, n)
    assert sweep == case.expected, (case.name, sweep, case.expected)
    assert runs_result == sweep, (case.name, runs_result, sweep)
    assert mgr_result == sweep, (case.name, mgr_result, sweep)

    ranges, lookup, runs = case.ranges, case.lookup, case.runs
    t_sweep = stats_ns(
        time_calls(lambda: sweep_hit_sources(ranges, start, end, lookup), sweep_iters)
    )
    t_runs = stats_ns(time_calls(lambda: hit_sources([runs], start, end), iters))
    t_mgr = stats_ns(time_calls(lambda: m.hit_sources(REQ_ID, n), iters))
    undo(m)
    return {
        "result": {s.label: v for s, v in sweep.items()},
        "num_ranges": len(case.ranges),
        "num_runs": len(case.runs),
        "sweep": t_sweep,
        "kvtier_hit_sources": t_runs,
        "manager_hit_sources": t_mgr,
        "speedup_hit_sources": t_sweep["median_us"] / t_runs["median_us"],
        "speedup_manager": t_sweep["median_us"] / t_mgr["median_us"],
    }


def measure_observe(case: Case, iters: int) -> dict[str, Any]:
    """What a request's first lookup adds once: every tier's ``observe`` of its chain, on
    fresh indexes holding the chain as ``build_case`` stores it (setup untimed). ``first``
    is the chain's first reuse (the policy promotes it), ``again`` a later one."""
    clock = time.perf_counter_ns
    n = len(case.keys)
    first: list[int] = []
    again: list[int] = []
    for _ in range(max(3, iters // 20)):
        tiers = []
        for t in case.manager.tiers:
            idx = SlotIndex(n, new_policy(n))
            store_chain(idx, case.keys, sum(1 for k in case.keys if t.index.has(k)))
            tiers.append(idx)
        for out in (first, again):
            t0 = clock()
            for idx in tiers:
                idx.observe(case.keys)
            out.append(clock() - t0)
    return {"first": stats_ns(first), "again": stats_ns(again)}


def measure_scheduler(
    case: Case,
    iters: int,
    warmup: int = 3,
    *,
    after_other: bool = False,
    events: TierEvents | None = None,
) -> dict[str, Any]:
    """Part (b): lookup + plan_load + on_allocated + hit_sources, side effects undone.
    ``after_other``: before each call (untimed) every tier is told its order changed (as
    another request's store, hit or eviction would), so ``on_allocated`` cannot skip its
    touch. ``events``: the tier event log attached, and the connector's per-lookup event
    call timed with the lookup."""
    m, tokens, blocks, keys = case.manager, case.tokens, case.block_ids, case.keys
    num_tokens = len(tokens)
    clock = time.perf_counter_ns
    totals: list[int] = []
    parts: dict[str, list[int]] = {"lookup": [], "plan_load": [], "on_allocated": [], "hit": []}
    checks: list[tuple[int, bool, dict[HitSource, int]]] = []
    jobs = 0
    gc.collect()
    for i in range(warmup + iters):
        if after_other:
            for tier in m.tiers:
                assert isinstance(tier.index, SlotIndex)
                tier.index.recency.changed()
        t0 = clock()
        hit = m.lookup(REQ_ID, tokens, 0)
        if events is not None and events.unknown > 0:  # ConnectorEvents.looked_up
            events.announce_held(REQ_ID, keys)
        t1 = clock()
        n, is_async = m.plan_load(REQ_ID, hit, num_tokens)  # type: ignore[arg-type]
        t2 = clock()
        m.on_allocated(REQ_ID, blocks, n, sync=not is_async)
        t3 = clock()
        sources = m.hit_sources(REQ_ID, n)
        t4 = clock()
        jobs = undo(m)
        if i < warmup:
            continue
        totals.append(t4 - t0)
        parts["lookup"].append(t1 - t0)
        parts["plan_load"].append(t2 - t1)
        parts["on_allocated"].append(t3 - t2)
        parts["hit"].append(t4 - t3)
        if len(checks) < 2:
            checks.append((n, is_async, sources))
    for n, is_async, sources in checks:
        assert n == case.hit_tokens and sources == case.expected, (case.name, n, sources)
        assert is_async == (case.mix != "host"), (case.name, is_async)
    # Nothing leaked: no pin, no in-flight job, no in-flight key.
    assert not m.has_pending_jobs(), case.name
    for tier in m.tiers:
        assert all(e.pins == 0 for e in tier.index.entries.values()), case.name
    assert not m.loads.loading, case.name
    return {
        "mode": "async" if checks[0][1] else "sync",
        "load_jobs": jobs,
        "total": stats_ns(totals),
        "parts_median_us": {k: stats_ns(v)["median_us"] for k, v in parts.items()},
    }


def measure_arrival(held: bool, iters: int, warmup: int = 3) -> dict[str, float]:
    """Part (g): ``on_new_request`` with prefetch on, keys already computed; ``held``: the
    chain is in the CPU tier (and on disk), else nowhere. Nothing is prefetched (asserted)."""
    c, hit_tokens = 16, 128 << 10
    rng = random.Random(1)
    tokens = [rng.randrange(49152) for _ in range(hit_tokens + TAIL_TOKENS)]
    namespace = Namespace("HuggingFaceTB/SmolLM2-135M", LAYOUT.digest())
    keys = chunk_keys(tokens, c, namespace.seed())
    n, chunk_bytes = len(keys), LAYOUT.chunk_bytes(c)
    specs = (
        TierSpec("cpu", capacity=n * chunk_bytes, eviction=EVICTION),
        TierSpec("disk", capacity=n * chunk_bytes, eviction=EVICTION, options=DiskOptions()),
    )
    config = KVTierConfig(chunk_tokens=c, tiers=specs, prefetch=True)
    stack = build_stack(config, TierContext(chunk_bytes, namespace, restore=False))
    if held:
        for tier in stack.tiers:
            assert isinstance(tier.index, SlotIndex)
            assert store_chain(tier.index, keys, n) == n
    manager = CacheManager(config, LAYOUT, namespace, BLOCK_TOKENS, stack)
    assert manager.arrivals.prefetching()
    manager.lookup(REQ_ID, tokens, 0)  # untimed: the request's keys
    clock = time.perf_counter_ns
    times: list[int] = []
    gc.collect()
    for i in range(warmup + iters):
        t0 = clock()
        on_new_request(manager, REQ_ID, tokens)
        t1 = clock()
        if i >= warmup:
            times.append(t1 - t0)
    assert manager.arrivals.prefetch.inflight == 0 and not manager.movement.pending
    return stats_ns(times)


def paired_hit_times(case: Case, iters: int, log: TierEvents) -> tuple[list[int], list[int]]:
    """The (b) region timed with events off and on in alternate iterations (so both see the
    same machine load): the log's listeners detached / attached (untimed) and, when on, the
    connector's per-lookup event call in the timed region. Returns (off, on) nanoseconds."""
    m, tokens, blocks, keys = case.manager, case.tokens, case.block_ids, case.keys
    tiers = m.stack.tiers
    listeners = [t.index.listener for t in tiers]
    clock = time.perf_counter_ns
    off: list[int] = []
    on: list[int] = []
    gc.collect()
    for i in range(2 * (iters + 3)):
        events = log if i % 2 else None
        for tier, listener in zip(tiers, listeners, strict=True):
            tier.index.listener = listener if events is not None else None
        t0 = clock()
        hit = m.lookup(REQ_ID, tokens, 0)
        if events is not None and events.unknown > 0:  # ConnectorEvents.looked_up
            events.announce_held(REQ_ID, keys)
        n, is_async = m.plan_load(REQ_ID, hit, len(tokens))  # type: ignore[arg-type]
        m.on_allocated(REQ_ID, blocks, n, sync=not is_async)
        sources = m.hit_sources(REQ_ID, n)
        t1 = clock()
        undo(m)
        assert sources == case.expected, (case.name, sources)
        if i >= 6:
            (on if events is not None else off).append(t1 - t0)
    for tier, listener in zip(tiers, listeners, strict=True):
        tier.index.listener = listener
    return off, on


def measure_events(case: Case, iters: int) -> dict[str, Any]:
    """Part (c): the hit path with the event log attached vs none (paired), the one-time
    announcement of a chain held but never announced, and (128k cases) the store side's
    bookkeeping."""
    stack = case.manager.stack
    log = TierEvents(stack, case.chunk_tokens // BLOCK_TOKENS)
    # The tiers hold the chain and the log has no identity for it yet (a restart's case).
    t0 = time.perf_counter_ns()
    announced = log.announce_held(REQ_ID, case.keys)
    announce_us = (time.perf_counter_ns() - t0) / 1e3
    assert announced == sum(len(t.index) for t in stack.tiers), announced
    assert len(log.take()) == len(stack.tiers) and log.unknown == 0
    a, b = paired_hit_times(case, iters, log)
    assert not log.pending(), "the hit path recorded an event"
    for tier in stack.tiers:
        tier.index.listener = None
    off, on = stats_ns(a)["median_us"], stats_ns(b)["median_us"]
    out: dict[str, Any] = {
        "off_median_us": off,
        "on_median_us": on,
        "delta_us": on - off,
        "announce_held_once_us": announce_us,
    }
    if case.hit_tokens == HIT_TOKENS[-1]:
        out["store_side"] = measure_store_events(case, iters)
    return out


def measure_store_events(case: Case, iters: int) -> dict[str, Any]:
    """A request's whole chain stored into an empty CPU index without and with the event
    log, in pairs (which one goes first alternates), setup untimed. ``reserve`` (the
    store's planning; the log hears nothing there, the index being empty) is timed apart;
    the timed region is the store's completion, ``commit``, with the log's ``learn``
    before it and ``take`` after it when on. ``delta_us``: the median of the pairs'
    differences (drift between pairs cancels); ``delta_us_min``: the difference of the
    fastest of each (what a busy machine disturbs least)."""
    n = len(case.keys)
    keys = case.keys
    clock = time.perf_counter_ns
    reserve: list[int] = []
    plain: list[int] = []
    logged: list[int] = []
    deltas: list[int] = []
    for i in range(max(8, iters // 5)):
        pair: dict[bool, int] = {}
        for with_log in (False, True) if i % 2 else (True, False):
            # Collected before the store's planning, not right before its completion: a
            # collection walks every object and leaves the caches cold for what follows.
            gc.collect()
            index = SlotIndex(n, new_policy(n))
            stack = TierStack([StackTier("cpu", HitSource.HOST, index, TierSpec("cpu"))])
            log = TierEvents(stack, case.chunk_tokens // BLOCK_TOKENS) if with_log else None
            t0 = clock()
            slots = index.reserve(keys, None)
            reserve.append(clock() - t0)
            ok = [True] * len(slots)
            t0 = clock()
            if log is not None:
                log.learn(REQ_ID, 0, keys)
            index.commit(keys, ok)
            runs = log.take() if log is not None else None
            pair[with_log] = clock() - t0
            if runs is not None:
                (run,) = runs
                assert run.stored and run.count == n, run
        plain.append(pair[False])
        logged.append(pair[True])
        deltas.append(pair[True] - pair[False])
    p, q = stats_ns(plain), stats_ns(logged)
    return {
        "reserve": stats_ns(reserve),
        "plain": p,
        "with_events": q,
        "delta_us": statistics.median(deltas) / 1e3,
        "delta_us_min": q["min_us"] - p["min_us"],
    }


# -- repeats ----------------------------------------------------------------------------------


def measure_case(c: int, hit_tokens: int, mix: str, iters: int) -> dict[str, Any]:
    """One run of every measurement of a case, on a freshly built case."""
    case = build_case(c, hit_tokens, mix)
    a = measure_sources(case, iters, max(5, iters // 10))
    b = measure_scheduler(case, iters)
    b["after_other"] = measure_scheduler(case, iters, after_other=True)["total"]
    b["observe"] = measure_observe(case, iters)
    b["events"] = measure_events(case, iters)
    name, chunks = case.name, len(case.keys)
    if hit_tokens == HIT_TOKENS[-1]:
        del case
        gc.collect()
        old = build_case(c, hit_tokens, mix, legacy=True)
        measure_sources(old, 3, 3)  # its own warm-up lookup
        b["legacy_keys"] = measure_scheduler(old, iters)["total"]
        b["legacy_keys_after_other"] = measure_scheduler(old, iters, after_other=True)["total"]
        del old
    gc.collect()
    return {"case": name, "chunks": chunks, "hit_sources": a, "scheduler": b}


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A case's repeated runs as one result: every timing is the worst run's (highest
    median; speedups: the lowest) with its spread over the runs next to it."""
    first = runs[0]
    a = [r["hit_sources"] for r in runs]
    b = [r["scheduler"] for r in runs]
    sources = {k: first["hit_sources"][k] for k in ("result", "num_ranges", "num_runs")}
    for k in ("sweep", "kvtier_hit_sources", "manager_hit_sources"):
        sources[k] = worst_run([x[k] for x in a])
    for k in ("speedup_hit_sources", "speedup_manager"):
        sources[f"{k}_runs"] = spread([x[k] for x in a], lower_is_better=False)
        sources[k] = sources[f"{k}_runs"]["worst"]
    worst_b = max(b, key=lambda x: x["total"]["median_us"])
    sched: dict[str, Any] = {
        "mode": first["scheduler"]["mode"],
        "load_jobs": first["scheduler"]["load_jobs"],
        "total": worst_run([x["total"] for x in b]),
        "parts_median_us": worst_b["parts_median_us"],
        "after_other": worst_run([x["after_other"] for x in b]),
        "observe": {k: worst_run([x["observe"][k] for x in b]) for k in ("first", "again")},
    }
    for k in ("legacy_keys", "legacy_keys_after_other"):
        if k in first["scheduler"]:
            sched[k] = worst_run([x[k] for x in b])
    ev = [x["events"] for x in b]
    deltas = spread([e["delta_us"] for e in ev])
    events: dict[str, Any] = {
        "off_median_us": [e["off_median_us"] for e in ev],
        "on_median_us": [e["on_median_us"] for e in ev],
        "delta_us_best": deltas["best"],
        "delta_us_median": deltas["median"],
        "delta_us_worst": deltas["worst"],
        "announce_held_once_us": max(e["announce_held_once_us"] for e in ev),
        "announce_held_once_us_runs": [e["announce_held_once_us"] for e in ev],
    }
    if "store_side" in ev[0]:
        st = [e["store_side"] for e in ev]
        d = spread([s["delta_us"] for s in st])
        events["store_side"] = {
            "reserve": worst_run([s["reserve"] for s in st]),
            "plain": worst_run([s["plain"] for s in st]),
            "with_events": worst_run([s["with_events"] for s in st]),
            "delta_us": d["worst"],
            "delta_us_best": d["best"],
            "delta_us_median": d["median"],
            "delta_us_runs": d["runs"],
            "delta_us_min": spread([s["delta_us_min"] for s in st]),
        }
    sched["events"] = events
    return {
        "case": first["case"],
        "chunks": first["chunks"],
        "repeats": len(runs),
        "hit_sources": sources,
        "scheduler": sched,
    }


def combine_key_cost(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeated runs of ``measure_key_cost``: each construction's worst run, the worst
    ratios and fallback time, and the spread of the main ratio."""
    out: dict[str, Any] = {"chunks": runs[0]["chunks"]}
    for k in ("legacy_xxh3", "blake3", "blake3_keyed"):
        out[k] = worst_run([r[k] for r in runs])
    out["ratio_vs_legacy_runs"] = spread([r["ratio_vs_legacy"] for r in runs])
    out["ratio_vs_legacy"] = out["ratio_vs_legacy_runs"]["worst"]
    out["ratio_keyed_vs_legacy"] = max(r["ratio_keyed_vs_legacy"] for r in runs)
    if "blake3_python_fallback_ms" in runs[0]:
        fb = spread([r["blake3_python_fallback_ms"] for r in runs])
        out["blake3_python_fallback_ms"] = fb["worst"]
        out["blake3_python_fallback_ms_runs"] = fb["runs"]
    return out


# -- (e), (f): the whole request, and one step of many ---------------------------------------


def measure_lifecycles(repeats: int, iters: int) -> list[dict[str, Any]]:
    """Part (e): ``repeats`` runs of :func:`request_lifecycle.measure_run`."""
    gc.collect()
    gc.freeze()  # as vLLM's engine core does after startup (module docstring)
    return [measure_run(iters, seed=r) for r in range(repeats)]


def measure_steps(repeats: int, iters: int) -> list[dict[str, Any]]:
    """Part (f): one connector with RUNNING requests, ``repeats`` runs of decode steps."""
    return [measure_connector_step(iters) for _ in range(1 if repeats < 3 else 2)]


def lifecycle_summary(life: list[dict[str, Any]], step: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary keys of parts (e) and (f): every figure the worst run's."""
    out: dict[str, Any] = {}
    worst = max(life, key=lambda r: r["half"]["over_vllm_hash"])
    out["request_lifecycle_ms_128k"] = max(r["half"]["total"]["median_us"] for r in life) / 1e3
    out["vllm_block_hash_ms_128k"] = worst["vllm_block_hash"]["median_us"] / 1e3
    out["vllm_block_hash_fn"] = worst["hash"]
    out["request_lifecycle_over_vllm_hash_128k"] = worst["half"]["over_vllm_hash"]
    out["request_lifecycle_over_vllm_hash_128k_runs"] = [r["half"]["over_vllm_hash"] for r in life]
    for v in VARIANTS:
        if v == "half":
            continue
        out[f"request_lifecycle_ms_128k_{v}"] = max(r[v]["total"]["median_us"] for r in life) / 1e3
        out[f"request_lifecycle_over_vllm_hash_128k_{v}"] = max(
            r[v]["over_vllm_hash"] for r in life
        )
    out["kvtier_keys_ms_128k"] = max(r["kvtier_keys"]["median_us"] for r in life) / 1e3
    out["kvtier_keys_over_vllm_hash_128k"] = max(
        r["kvtier_keys"]["median_us"] / r["vllm_block_hash"]["median_us"] for r in life
    )
    out["rekey_vllm_hashes_ms_128k"] = max(r["rekey_vllm_hashes"]["median_us"] for r in life) / 1e3
    out["target_request_lifecycle_over_vllm_hash"] = TARGET_LIFECYCLE_OVER_VLLM_HASH
    out["request_lifecycle_target_met"] = (
        out["request_lifecycle_over_vllm_hash_128k"] <= TARGET_LIFECYCLE_OVER_VLLM_HASH
    )
    out["build_connector_meta_ms_256_running"] = (
        max(s["decode_step"]["median_us"] for s in step) / 1e3
    )
    out["build_connector_meta_ms_256_running_gather_all"] = (
        max(s["decode_step_gathering_every_request"]["median_us"] for s in step) / 1e3
    )
    out["build_connector_meta_prefill_ms_256_running"] = (
        max(s["prefill_step_us"] for s in step) / 1e3
    )
    return out


def print_lifecycles(
    life: list[dict[str, Any]], step: list[dict[str, Any]], summary: dict[str, Any], repeats: int
) -> None:
    rows = []
    for v in VARIANTS:
        ratios = [r[v]["over_vllm_hash"] for r in life]
        worst = max(life, key=lambda r: r[v]["over_vllm_hash"])[v]
        rows.append(
            [
                v,
                fmt_time_us(max(r[v]["total"]["median_us"] for r in life)),
                f"{max(ratios):.2f} / {statistics.median(ratios):.2f} / {min(ratios):.2f}",
                *(
                    fmt_time_us(worst[k]["median_us"])
                    for k in ("lookup", "load", "steps", "finish")
                ),
            ]
        )
    print()
    print(
        format_table(
            [
                "request",
                "whole life",
                "/ vLLM hash",
                "lookup+keys",
                "load",
                "prefill steps",
                "finish",
            ],
            rows,
            title=f"(e) a 128k-token request's whole life on the scheduler thread (median; "
            f"worst / median / best of {len(life)} runs; prefill in {STEP_TOKENS}-token "
            f"steps); vLLM's block hashing ({life[0]['hash']}) of the same tokens "
            f"{summary['vllm_block_hash_ms_128k']:.2f} ms in the worst run",
        )
    )
    print(
        f"  kvtier keys alone {summary['kvtier_keys_ms_128k']:.2f} ms "
        f"({summary['kvtier_keys_over_vllm_hash_128k']:.2f}x vLLM's hashing); a keyed "
        f"re-hash of vLLM's block hashes {summary['rekey_vllm_hashes_ms_128k']:.2f} ms"
    )
    print()
    print(
        f"(f) build_connector_meta, {RUNNING} running requests in decode (nothing to store): "
        f"{summary['build_connector_meta_ms_256_running']:.3f} ms per step (gathering every "
        f"request's block ids, as before: "
        f"{summary['build_connector_meta_ms_256_running_gather_all']:.3f} ms); their prefill "
        f"step, storing every prompt: {summary['build_connector_meta_prefill_ms_256_running']:.1f}"
        f" ms (worst of {len(step)} runs)"
    )
    print(
        f"  request_lifecycle_over_vllm_hash_128k = "
        f"{summary['request_lifecycle_over_vllm_hash_128k']:.2f} (worst of {repeats}); target "
        f"<= {TARGET_LIFECYCLE_OVER_VLLM_HASH}: "
        f"{'MET' if summary['request_lifecycle_target_met'] else 'MISSED'}"
    )


# -- main ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    global EVICTION
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--json", metavar="PATH", help="write the results JSON here")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    ap.add_argument("--iters", type=int, default=0, help="calls per measurement (override)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=REPEATS,
        help=f"runs of every measurement, each on a freshly built case (default {REPEATS})",
    )
    ap.add_argument(
        "--eviction", default=EVICTION, help=f"tiers' eviction policy (default: {EVICTION})"
    )
    args = ap.parse_args(argv)
    EVICTION = args.eviction
    iters = args.iters or (20 if args.quick else 200)
    repeats = max(1, args.repeats)

    print(
        f"kvtier scheduler overhead: median of {iters} calls per figure, each figure the worst "
        f"of {repeats} runs (best and median next to it); KV layout SmolLM2 (30 layers, 3 KV "
        f"heads, head_dim 64, bf16), {BLOCK_TOKENS}-token blocks; eviction {EVICTION}; gc "
        f"enabled; one thread\n"
    )
    results: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    arrival = {
        case: worst_run([measure_arrival(case == "held", iters) for _ in range(repeats)])
        for case in ("held", "miss")
    }
    arrival_ms = max(a["median_us"] for a in arrival.values()) / 1e3
    print(
        "  (g) prefetch on arrival, 128k tokens, nothing on a slow tier: "
        + ", ".join(
            f"{case} {a['median_us']:.2f} us (best {a['median_us_best']:.2f})"
            for case, a in arrival.items()
        )
        + f"; target <= {TARGET_ARRIVAL_MS_128K} ms: "
        + ("MET" if arrival_ms <= TARGET_ARRIVAL_MS_128K else "MISSED")
    )
    for c in CHUNK_TOKENS:
        for mix in MIXES:
            for hit_tokens in HIT_TOKENS:
                runs = [measure_case(c, hit_tokens, mix, iters) for _ in range(repeats)]
                r = combine(runs)
                r.update(chunk_tokens=c, hit_tokens=hit_tokens, mix=mix)
                results.append(r)
                print(f"  measured {r['case']:<22} ({time.perf_counter() - t_start:5.1f} s)")

    rows_a = []
    for r in results:
        a = r["hit_sources"]
        rows_a.append(
            [
                r["case"],
                a["num_ranges"],
                a["num_runs"],
                fmt_time_us(a["sweep"]["median_us"]),
                fmt_time_us(a["kvtier_hit_sources"]["median_us"]),
                fmt_time_us(a["manager_hit_sources"]["median_us"]),
                f"{a['speedup_hit_sources']:,.0f}x",
                f"{a['speedup_hit_sources_runs']['best']:,.0f}x",
                f"{a['speedup_manager']:,.0f}x",
                ", ".join(f"{k}={v}" for k, v in a["result"].items()),
            ]
        )
    print()
    print(
        format_table(
            [
                "hit/chunk/tiers",
                "ranges",
                "runs",
                "sweep",
                "hit_sources",
                "mgr.hit_sources",
                "speedup",
                "best",
                "mgr speedup",
                "result (identical in all 3)",
            ],
            rows_a,
            title=f"(a) hit-source accounting, median per call, worst of {repeats} runs "
            "(sweep = vLLM's sort-and-sweep over per-chunk ranges, baseline; speedups paired "
            "per run, the worst and the best run's)",
        )
    )
    rows_b = []
    for r in results:
        b = r["scheduler"]
        p = b["parts_median_us"]
        rows_b.append(
            [
                r["case"],
                r["chunks"],
                b["mode"],
                fmt_time_us(b["total"]["median_us"]),
                fmt_time_us(b["total"]["median_us_median"]),
                fmt_time_us(b["total"]["median_us_best"]),
                fmt_time_us(b["total"]["p90_us"]),
                fmt_time_us(b["after_other"]["median_us"]),
                fmt_time_us(b["legacy_keys"]["median_us"]) if "legacy_keys" in b else "-",
                fmt_time_us(p["lookup"]),
                fmt_time_us(p["plan_load"]),
                fmt_time_us(p["on_allocated"]),
                fmt_time_us(p["hit"]),
                fmt_time_us(b["observe"]["first"]["median_us"]),
                fmt_time_us(b["observe"]["again"]["median_us"]),
            ]
        )
    print()
    print(
        format_table(
            [
                "hit/chunk/tiers",
                "chunks",
                "load",
                "total worst",
                "median",
                "best",
                "worst's p90",
                "after other",
                "prev keys",
                "lookup",
                "plan_load",
                "on_allocated",
                "hit_sources",
                "observe 1st",
                "observe again",
            ],
            rows_b,
            title="(b) whole scheduler-side cost of the hit, keys already computed "
            "(lookup + plan_load + on_allocated + hit_sources; median per call; worst / "
            f"median / best of {repeats} runs; the other columns the worst run's; prev "
            "keys: the same with the previous 16-byte keys)",
        )
    )
    key_rows, key_cost = [], []
    for c in KEY_CHUNK_TOKENS:
        for hit_tokens in HIT_TOKENS:
            toks = [random.Random(1).randrange(49152) for _ in range(hit_tokens)]
            big = hit_tokens == HIT_TOKENS[-1]
            kc = combine_key_cost(
                [
                    measure_key_cost(toks, c, max(5, iters // 4), fallback=big and c <= 32)
                    for _ in range(repeats)
                ]
            )
            kc.update(chunk_tokens=c, hit_tokens=hit_tokens)
            key_cost.append(kc)
            fb = kc.get("blake3_python_fallback_ms")
            key_rows.append(
                [
                    f"{hit_tokens // 1024}k/c{c}",
                    kc["chunks"],
                    fmt_time_us(kc["legacy_xxh3"]["median_us"]),
                    fmt_time_us(kc["blake3"]["median_us"]),
                    fmt_time_us(kc["blake3_keyed"]["median_us"]),
                    f"{kc['ratio_vs_legacy']:.2f}x",
                    f"{fmt_time_us(kc['legacy_xxh3']['min_us'])} / "
                    f"{fmt_time_us(kc['legacy_xxh3']['p90_us'])}",
                    f"{fmt_time_us(kc['blake3']['min_us'])} / "
                    f"{fmt_time_us(kc['blake3']['p90_us'])}",
                    "-" if fb is None else fmt_time_us(fb * 1e3),
                ]
            )
    print()
    print(
        format_table(
            [
                "hit/chunk",
                "chunks",
                "prev (xxh3)",
                "blake3",
                "blake3 keyed",
                "new/prev",
                "prev best/p90",
                "blake3 best/p90",
                "no native",
            ],
            key_rows,
            title="(d) key cost once per request: token ids -> chunk keys (median, worst of "
            f"{repeats} runs; best/p90: the worst run's; prev = the previous format's "
            "xxh3-128 chain, measured in this run)",
        )
    )
    rows_c = []
    for r in results:
        ev = r["scheduler"]["events"]
        store = ev.get("store_side")
        rows_c.append(
            [
                r["case"],
                fmt_time_us(max(ev["off_median_us"])),
                fmt_time_us(max(ev["on_median_us"])),
                f"{ev['delta_us_worst']:+.1f} us",
                f"{ev['delta_us_best']:+.1f} us",
                fmt_time_us(ev["announce_held_once_us"]),
                fmt_time_us(store["reserve"]["median_us"]) if store else "",
                fmt_time_us(store["plain"]["median_us"]) if store else "",
                fmt_time_us(store["with_events"]["median_us"]) if store else "",
                f"{store['delta_us']:+.1f} us" if store else "",
                f"{store['delta_us_best']:+.1f} us" if store else "",
            ]
        )
    print()
    print(
        format_table(
            [
                "hit/chunk/tiers",
                "(b) events off",
                "(b) events on",
                "delta worst",
                "best",
                "announce once",
                "store: reserve",
                "commit",
                "+ events",
                "store delta worst",
                "best",
            ],
            rows_c,
            title="(c) tier events: (b) with the event log on vs off (paired iterations; worst "
            f"and best of {repeats} runs), one-time announcement of a held chain (worst), "
            "store side: a 128k chain's reserve (untimed in the delta), commit without and "
            "with the log's learn + notifications + take (median of paired differences)",
        )
    )

    def pick(c: int, hit_tokens: int, mix: str) -> dict[str, Any]:
        return next(
            r
            for r in results
            if r["chunk_tokens"] == c and r["hit_tokens"] == hit_tokens and r["mix"] == mix
        )

    k128 = 128 << 10

    def kpick(c: int) -> dict[str, Any]:
        return next(k for k in key_cost if k["chunk_tokens"] == c and k["hit_tokens"] == k128)

    main_case = pick(16, k128, "host")
    speedup = main_case["hit_sources"]["speedup_hit_sources"]
    sched_ms = main_case["scheduler"]["total"]["median_us"] / 1e3
    store = main_case["scheduler"]["events"]["store_side"]
    # A request pays both: its hit's path and its store's bookkeeping (each one's worst).
    request_delta = (
        max(0.0, main_case["scheduler"]["events"]["delta_us_worst"]) + max(0.0, store["delta_us"])
    ) / 1e3
    summary: dict[str, Any] = {
        "hit_sources_speedup_vs_sweep_128k": speedup,
        "scheduler_cost_ms_128k": sched_ms,
        "manager_hit_sources_speedup_vs_sweep_128k": main_case["hit_sources"]["speedup_manager"],
        "hit_sources_speedup_vs_sweep_128k_mixed": pick(16, k128, "host+disk")["hit_sources"][
            "speedup_hit_sources"
        ],
        "hit_sources_speedup_vs_sweep_128k_chunk256": pick(256, k128, "host")["hit_sources"][
            "speedup_hit_sources"
        ],
        "sweep_ms_128k": main_case["hit_sources"]["sweep"]["median_us"] / 1e3,
        "hit_sources_us_128k": main_case["hit_sources"]["kvtier_hit_sources"]["median_us"],
        "manager_hit_sources_us_128k": main_case["hit_sources"]["manager_hit_sources"]["median_us"],
        "scheduler_cost_ms_128k_mixed": pick(16, k128, "host+disk")["scheduler"]["total"][
            "median_us"
        ]
        / 1e3,
        "scheduler_cost_ms_128k_chunk256": pick(256, k128, "host")["scheduler"]["total"][
            "median_us"
        ]
        / 1e3,
        "scheduler_cost_ms_128k_after_other": main_case["scheduler"]["after_other"]["median_us"]
        / 1e3,
        "scheduler_cost_ms_128k_mixed_after_other": pick(16, k128, "host+disk")["scheduler"][
            "after_other"
        ]["median_us"]
        / 1e3,
        "observe_first_reuse_ms_128k": main_case["scheduler"]["observe"]["first"]["median_us"]
        / 1e3,
        "observe_later_reuse_ms_128k": main_case["scheduler"]["observe"]["again"]["median_us"]
        / 1e3,
        "events_hit_delta_ms_128k_best": main_case["scheduler"]["events"]["delta_us_best"] / 1e3,
        "events_hit_delta_ms_128k_worst": main_case["scheduler"]["events"]["delta_us_worst"] / 1e3,
        "events_hit_delta_ms_128k_mixed_worst": pick(16, k128, "host+disk")["scheduler"]["events"][
            "delta_us_worst"
        ]
        / 1e3,
        "scheduler_cost_ms_128k_events_off": max(main_case["scheduler"]["events"]["off_median_us"])
        / 1e3,
        "scheduler_cost_ms_128k_events_on": max(main_case["scheduler"]["events"]["on_median_us"])
        / 1e3,
        "events_store_side_delta_ms_128k": main_case["scheduler"]["events"]["store_side"][
            "delta_us"
        ]
        / 1e3,
        "events_announce_held_once_ms_128k": main_case["scheduler"]["events"][
            "announce_held_once_us"
        ]
        / 1e3,
        "target_events_ms_128k": TARGET_EVENTS_MS_128K,
        "events_target_met": main_case["scheduler"]["events"]["delta_us_worst"] / 1e3
        <= TARGET_EVENTS_MS_128K,
        "eviction": EVICTION,
        "scheduler_cost_ms_128k_legacy_keys": main_case["scheduler"]["legacy_keys"]["median_us"]
        / 1e3,
        "scheduler_cost_ms_128k_mixed_legacy_keys": pick(16, k128, "host+disk")["scheduler"][
            "legacy_keys"
        ]["median_us"]
        / 1e3,
        "key_cost_ms_128k": kpick(16)["blake3"]["median_us"] / 1e3,
        "key_cost_ms_128k_keyed": kpick(16)["blake3_keyed"]["median_us"] / 1e3,
        "key_cost_ms_128k_legacy": kpick(16)["legacy_xxh3"]["median_us"] / 1e3,
        "key_cost_ms_128k_chunk32": kpick(32)["blake3"]["median_us"] / 1e3,
        "key_cost_ms_128k_chunk32_legacy": kpick(32)["legacy_xxh3"]["median_us"] / 1e3,
        "key_cost_ms_128k_no_native": kpick(16).get("blake3_python_fallback_ms"),
        "newer_target_scheduler_ms_128k": NEWER_TARGET_SCHED_MS_128K,
        "newer_scheduler_target_met": sched_ms <= NEWER_TARGET_SCHED_MS_128K,
        "target_speedup_128k": TARGET_SPEEDUP_128K,
        "target_scheduler_ms_128k": TARGET_SCHED_MS_128K,
        "speedup_target_met": speedup >= TARGET_SPEEDUP_128K,
        "scheduler_target_met": sched_ms <= TARGET_SCHED_MS_128K,
        # Added with repeated runs: every figure above is the worst of ``repeats`` runs.
        "repeats": repeats,
        "scheduler_cost_ms_128k_median": main_case["scheduler"]["total"]["median_us_median"] / 1e3,
        "scheduler_cost_ms_128k_best": main_case["scheduler"]["total"]["median_us_best"] / 1e3,
        "events_store_side_delta_ms_128k_median": store["delta_us_median"] / 1e3,
        "events_store_side_delta_ms_128k_best": store["delta_us_best"] / 1e3,
        "events_store_side_delta_min_ms_128k_worst": store["delta_us_min"]["worst"] / 1e3,
        "events_store_side_delta_ms_128k_chunk256": pick(256, k128, "host")["scheduler"]["events"][
            "store_side"
        ]["delta_us"]
        / 1e3,
        "events_store_commit_ms_128k": store["plain"]["median_us"] / 1e3,
        "events_store_reserve_ms_128k": store["reserve"]["median_us"] / 1e3,
        "events_store_target_met": store["delta_us"] / 1e3 <= TARGET_EVENTS_MS_128K,
        "events_request_delta_ms_128k_worst": request_delta,
        "events_request_target_met": request_delta <= TARGET_EVENTS_MS_128K,
        "prefetch_arrival_ms_128k": arrival_ms,
        "prefetch_arrival_ms_128k_held": arrival["held"]["median_us"] / 1e3,
        "prefetch_arrival_ms_128k_miss": arrival["miss"]["median_us"] / 1e3,
        "target_prefetch_arrival_ms_128k": TARGET_ARRIVAL_MS_128K,
        "prefetch_arrival_target_met": arrival_ms <= TARGET_ARRIVAL_MS_128K,
    }
    print()
    print(
        f"summary (128k-token hit, 16-token chunks, single tier unless noted; every figure the "
        f"worst of {repeats} runs)"
    )
    print(
        f"  (a) hit_sources vs sweep: {speedup:,.0f}x faster "
        f"({summary['hit_sources_us_128k']:.2f} us vs {summary['sweep_ms_128k']:.2f} ms); "
        f"target >= {TARGET_SPEEDUP_128K:.0f}x: "
        f"{'MET' if summary['speedup_target_met'] else 'MISSED'}"
    )
    print(
        f"      manager.hit_sources: {summary['manager_hit_sources_speedup_vs_sweep_128k']:,.0f}x;"
        f" mixed host+disk: {summary['hit_sources_speedup_vs_sweep_128k_mixed']:,.0f}x"
    )
    print(
        f"  (b) scheduler cost: {sched_ms:.3f} ms (median run "
        f"{summary['scheduler_cost_ms_128k_median']:.3f}, best "
        f"{summary['scheduler_cost_ms_128k_best']:.3f}; mixed host+disk, async: "
        f"{summary['scheduler_cost_ms_128k_mixed']:.3f} ms; 256-token chunks: "
        f"{summary['scheduler_cost_ms_128k_chunk256']:.3f} ms); "
        f"target <= {TARGET_SCHED_MS_128K:.0f} ms: "
        f"{'MET' if summary['scheduler_target_met'] else 'MISSED'}"
    )
    print(
        f"      after other requests changed the tiers' order in between (the touch runs): "
        f"{summary['scheduler_cost_ms_128k_after_other']:.3f} ms, mixed "
        f"{summary['scheduler_cost_ms_128k_mixed_after_other']:.3f} ms"
    )
    print(
        f"      once per request, outside (b): the policies' observe of the chain "
        f"{summary['observe_first_reuse_ms_128k']:.3f} ms at its first reuse, "
        f"{summary['observe_later_reuse_ms_128k']:.3f} ms later"
    )
    print(
        f"  (c) tier events on the hit path: {summary['events_hit_delta_ms_128k_best']:+.4f} .. "
        f"{summary['events_hit_delta_ms_128k_worst']:+.4f} ms (best .. worst of {repeats}; "
        f"off {summary['scheduler_cost_ms_128k_events_off']:.3f} ms, on "
        f"{summary['scheduler_cost_ms_128k_events_on']:.3f} ms); target <= "
        f"{TARGET_EVENTS_MS_128K} ms: {'MET' if summary['events_target_met'] else 'MISSED'}"
    )
    print(
        f"      store side, once per request: {summary['events_store_side_delta_ms_128k']:+.4f}"
        f" ms worst (median {summary['events_store_side_delta_ms_128k_median']:+.4f}, best "
        f"{summary['events_store_side_delta_ms_128k_best']:+.4f}; fastest vs fastest "
        f"{summary['events_store_side_delta_min_ms_128k_worst']:+.4f}; 256-token chunks "
        f"{summary['events_store_side_delta_ms_128k_chunk256']:+.4f}) for the 128k chain's "
        f"learn + notifications + take, on a commit of "
        f"{summary['events_store_commit_ms_128k']:.3f} ms; target <= {TARGET_EVENTS_MS_128K} "
        f"ms: {'MET' if summary['events_store_target_met'] else 'MISSED'}"
    )
    print(
        f"      per request, hit + store: {summary['events_request_delta_ms_128k_worst']:+.4f} "
        f"ms; target <= {TARGET_EVENTS_MS_128K} ms: "
        f"{'MET' if summary['events_request_target_met'] else 'MISSED'}; announcing a held "
        f"chain once (restored tier): {summary['events_announce_held_once_ms_128k']:.3f} ms"
    )
    print(
        f"      with the previous 16-byte keys in the indexes: "
        f"{summary['scheduler_cost_ms_128k_legacy_keys']:.3f} ms (mixed "
        f"{summary['scheduler_cost_ms_128k_mixed_legacy_keys']:.3f} ms); newer target <= "
        f"{NEWER_TARGET_SCHED_MS_128K} ms: "
        f"{'MET' if summary['newer_scheduler_target_met'] else 'MISSED'}"
    )
    no_native = summary["key_cost_ms_128k_no_native"]
    print(
        f"  (d) key cost once per 128k request (16-token chunks): "
        f"{summary['key_cost_ms_128k']:.2f} ms BLAKE3 ({summary['key_cost_ms_128k_keyed']:.2f} "
        f"keyed) vs {summary['key_cost_ms_128k_legacy']:.2f} ms previous xxh3; 32-token: "
        f"{summary['key_cost_ms_128k_chunk32']:.2f} vs "
        f"{summary['key_cost_ms_128k_chunk32_legacy']:.2f} ms; without the native chain "
        f"{no_native:.2f} ms"
    )
    life = measure_lifecycles(repeats, max(3, iters // 40))
    step = measure_steps(repeats, max(5, iters // 10))
    summary.update(lifecycle_summary(life, step))
    print_lifecycles(life, step, summary, repeats)
    write_json(
        args.json,
        {
            "benchmark": "scheduler_overhead",
            "summary": summary,
            "machine": machine_info(),
            "workload": {
                "hit_tokens": list(HIT_TOKENS),
                "chunk_tokens": list(CHUNK_TOKENS),
                "mixes": {
                    "host": "one CPU tier holds the whole chain (1 run)",
                    "host+disk": "CPU tier holds the first half, DISK tier the whole chain "
                    "(2 runs)",
                },
                "block_tokens": BLOCK_TOKENS,
                "prompt_tokens": "hit_tokens + 10",
                "layout": "KVLayout.dense(30, 3, 64, 'bfloat16') (SmolLM2-135M)",
                "sync_budget_bytes": SYNC_BUDGET_BYTES,
                "iters": iters,
                "repeats": repeats,
                "statistic": "median of per-call times (perf_counter_ns), gc enabled; each "
                "figure the worst of `repeats` runs, each run on a freshly built case",
                "threads": 1,
                "quick": args.quick,
                "eviction": EVICTION,
            },
            "cases": results,
            "key_cost": key_cost,
            "request_lifecycle": life,
            "connector_step": step,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
