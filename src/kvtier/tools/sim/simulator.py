"""Trace-driven simulation of kvtier's tier caches (no engine, no data).

Each request of a trace is replayed in file order through kvtier's own bookkeeping:

1. *Lookup*, as :meth:`kvtier.manager.CacheManager.lookup` does it: the admission policy
   observes the request's keys once, then every tier, innermost first, answers
   :meth:`~kvtier.tiers.index.SlotIndex.prefix_len`; tier t serves the blocks between the
   previous tiers' coverage and its own prefix. Every tier then refreshes the part of the
   hit chain it holds, tail first, as the manager does, so ancestors stay more recent than
   their descendants.
2. *Store*, as the manager's store planner does it, in every tier (tier 0 is the CPU tier;
   a second tier models a write-through disk tier, so it receives the same chunks): the
   chunks after the tier's present prefix, cut at the first one the admission policy
   refuses, are reserved in one call (which evicts as needed and may store a shorter
   prefix) and committed at once as successful. Disk hits are thereby promoted into the CPU
   tier by the same path.

Hits are counted in tokens: the first n blocks of a request cover ``min(n * block_tokens,
input_tokens)`` tokens (the last hash id may cover a partial block). Every block, partial or
not, takes one slot, so a tier of C tokens has ``C // block_tokens`` slots.

Not modelled: the engine's own (GPU) prefix cache, concurrency between requests (each
request's stores complete before the next lookup), output tokens, load failures.

Two reference lines need no kvtier policy:

- ``belady``: offline MIN with bypass. After each request, while the tier holds more than
  its capacity (its old content plus the request's blocks), evict the block whose next use
  is farthest (never used again counts as farthest), ties to the deeper block. Any request
  using a block uses its whole prefix, so a parent's next use is never later than a child's
  and the victim is always a leaf: the bound is prefix-closed by construction (checked
  with ``check=True``). It maximises block hits for the given capacity (token hits up to
  the smaller weight of partial last blocks). For two tiers the total uses one cache of the
  tiers' combined size (an upper bound for any split), the CPU column a cache of the CPU
  size alone.
- ``infinite``: unbounded capacity, everything stored: a block hits iff its prefix was
  seen before. The reuse ceiling of the trace.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.budget import SyncBudget
from kvtier.config import KVTierConfig
from kvtier.contract.kind import TierContext
from kvtier.contract.spec import TierOptions, TierSpec
from kvtier.errors import ConfigError
from kvtier.hints import Hints
from kvtier.jobs import JobResult, StepPlan, WorkerReport
from kvtier.keys import Namespace
from kvtier.layout import KVLayout
from kvtier.manager import CacheManager, ScheduledRequest, on_new_request
from kvtier.policies import eviction_names
from kvtier.stack.build import build_stack
from kvtier.tiers.disk.kind import DiskOptions
from kvtier.tools.sim.bounds import (
    next_uses,
    replay_belady,
    replay_infinite,
    replay_lru_oracle,
    replay_lru_reuse,
)
from kvtier.tools.sim.capacity import (
    SMOLLM2_BYTES_PER_TOKEN,
    CapacityConfig,
    TierCapacity,
    tier_capacities,
)
from kvtier.tools.sim.counts import TICK_EVERY, ReplayCounts, Tick
from kvtier.tools.sim.trace import TRACE_BLOCK_TOKENS, Trace, load_trace

DEFAULT_POLICIES: tuple[str, ...] = (
    "default",
    "lru",
    "lru-seen2",
    "arc",
    "arc-seen2",
    "belady",
    "infinite",
)
"""Policies compared by default: kvtier's evictions with and without admission, and bounds."""

DEFAULT_TIERS: tuple[str, ...] = ("cpu", "disk")
"""Tier names, innermost first; a configuration with k capacities uses the first k."""

"""Progress callback: called with a number of requests just replayed."""

_SIM_LAYOUT = KVLayout.dense(1, 1, 1, "int8")
"""Sizes do not matter to a replay: one-byte chunks, loads never within the step."""


def _policy_re() -> re.Pattern[str]:
    names = "|".join(re.escape(n) for n in eviction_names())
    return re.compile(rf"^({names})(?:-seen(\d+))?$")


# -- policies ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A simulated policy: ``kind`` is "index" (a kvtier eviction policy with admission
    ``min_seen``), "default" (what the connector builds from a default config), "belady"
    or "infinite"."""

    name: str
    kind: str
    eviction: str = ""
    min_seen: int = 1


def parse_policy(name: str) -> PolicySpec:
    """``default`` (the connector's default policies), ``adaptive``, ``chain-arc``, ``lru``,
    ``arc``, ``lru-seen2`` (admission after 2 sightings), ``lru-oracle`` (LRU with offline
    admission) and ``lru-reuse`` (LRU storing exactly the chunks used again), both of
    :mod:`kvtier.tools.sim.bounds`, ``belady``, ``infinite``."""
    text = name.strip().lower()
    if text in ("belady", "infinite", "default"):
        return PolicySpec(text, text)
    if text == "lru-oracle":
        return PolicySpec(text, "oracle")
    if text == "lru-reuse":
        return PolicySpec(text, "reuse")
    m = _policy_re().match(text)
    if m is None:
        raise ConfigError(
            f"policy: unknown policy {name!r}; accepted: default, {', '.join(eviction_names())}, "
            "lru-oracle, lru-reuse, NAME-seenN (admit a chunk once seen N times), belady, "
            "infinite"
        )
    min_seen = int(m.group(2) or 1)
    if min_seen < 1:
        raise ConfigError(f"policy {name!r}: the seen count must be >= 1")
    canonical = m.group(1) if min_seen == 1 else f"{m.group(1)}-seen{min_seen}"
    return PolicySpec(canonical, "index", m.group(1), min_seen)


# -- replays -------------------------------------------------------------------------------


def replay_index(
    trace: Trace,
    slots: Sequence[int],
    eviction: str,
    min_seen: int = 1,
    *,
    tick: Tick | None = None,
    check: bool = False,
    tiers: Sequence[str] = DEFAULT_TIERS,
    config: KVTierConfig | None = None,
    hints: bool = True,
) -> ReplayCounts:
    """Replay ``trace`` through kvtier's own scheduler side: a CacheManager over a tier
    stack built by the tier registry, as the connector builds it.

    ``slots[t]`` is tier t's capacity in blocks (tier 0 a CPU tier, the others disk tiers
    fed write-through, named by ``tiers``). With ``config``, the policies are the ones the
    connector builds from it (``eviction`` and ``min_seen`` are then ignored). Every request
    runs the connector's call sequence (lookup, plan_load, on_allocated, build_step with
    its stores, request_finished) and every job the plans hold succeeds at once. ``check``
    runs the indexes' invariant checks after every request (slow; for tests). ``hints``:
    requests' ``retain_s`` hints take leases (:mod:`kvtier.stack.retain`) on the trace's
    clock (its timestamps); off, they are ignored.
    """
    manager = _replay_manager(slots, eviction, min_seen, tiers, config)
    now = [0.0]
    manager.arrivals.retention.clock = lambda: now[0]
    position = manager.stack.position
    n_tiers = len(slots)
    hit_blocks = [0] * n_tiers
    hit_tokens = [0] * n_tiers
    block = trace.block_tokens
    for i, keys in enumerate(trace.keys):
        req_id = f"r{i}"
        ntok = trace.tokens[i]
        # Traces built from key lists alone (tests, bounds) carry no request records.
        req = trace.requests[i] if i < len(trace.requests) else None
        if req is not None:
            now[0] = req.timestamp / 1000
        if hints and req is not None and req.retain_s:
            on_new_request(manager, req_id, (), hints=Hints(retain_s=req.retain_s))
        hit = manager.lookup_keys(req_id, keys)
        assert hit is not None  # no tier here answers "not yet"
        for name, c0, c1 in hit.runs:
            t = position[name]
            hit_blocks[t] += c1 - c0
            hit_tokens[t] += min(c1 * block, ntok) - min(c0 * block, ntok)
        n = len(keys)
        blocks = range(n)
        # One token past the hit, so a full hit is not trimmed to leave one to compute.
        accepted, is_async = manager.plan_load(req_id, hit, n + 1)
        manager.on_allocated(req_id, blocks, accepted, sync=not is_async)
        _settle(manager, manager.build_step([ScheduledRequest(req_id, blocks, n, blocks, n)]))
        while manager.has_pending_jobs():
            _settle(manager, manager.build_step([]))
        manager.request_finished(req_id, blocks, n, blocks)
        if check:
            for tier in manager.tiers:
                tier.index.check()  # type: ignore[attr-defined]
        if tick is not None and (i + 1) % TICK_EVERY == 0:
            tick(TICK_EVERY)
    if tick is not None:
        tick(len(trace.keys) % TICK_EVERY)
    return ReplayCounts(
        hit_blocks,
        hit_tokens,
        [t.index.evictions for t in manager.tiers],
        [getattr(t.index, "policy", None) for t in manager.tiers],
    )


def _replay_manager(
    slots: Sequence[int],
    eviction: str,
    min_seen: int,
    names: Sequence[str],
    base: KVTierConfig | None = None,
) -> CacheManager:
    """A CacheManager over index-only tiers of ``slots`` one-byte chunks of one token; the
    policies of ``base`` when given (the connector's), else ``eviction`` / ``min_seen``."""
    if len(slots) > len(names):
        raise ConfigError(f"capacities: {len(slots)} tiers given, only {len(names)} named")
    if base is not None:
        evictions = [base.eviction] + [base.disk_eviction or base.eviction] * len(slots)
        min_seen = base.admission_min_seen
        eviction = base.eviction
    else:
        evictions = [eviction] * len(slots)
    specs = tuple(
        TierSpec(
            "cpu" if t == 0 else "disk",
            name=names[t],
            capacity=n,
            eviction=evictions[t],
            options=TierOptions() if t == 0 else DiskOptions(),  # no files: no data to hold
        )
        for t, n in enumerate(slots)
    )
    config = KVTierConfig(
        tiers=specs,
        chunk_tokens=1,
        admission_min_seen=min_seen,
        sync_budget=SyncBudget("off"),
        store_output_tokens=False,
        eviction=eviction,
    )
    ns = Namespace("kvtier-sim", _SIM_LAYOUT.digest())
    stack = build_stack(config, TierContext(1, ns, restore=False))
    return CacheManager(config, _SIM_LAYOUT, ns, 1, stack, defer_on_inflight_loads=False)


def _settle(manager: CacheManager, plan: StepPlan) -> None:
    """Every job of ``plan`` succeeds at once (the simulator has no data to move)."""
    jobs = [*plan.loads, *plan.stores]
    if jobs:
        results = [JobResult.of(j, [True] * len(j.keys), 0, 0.0) for j in jobs]
        manager.on_report(WorkerReport(results))


# -- driver --------------------------------------------------------------------------------


_BOUND_PASSES = {"belady": 1, "oracle": 3, "reuse": 1}
"""Passes over the trace each offline bound replays per size (the oracle's is
:data:`kvtier.tools.sim.bounds.ORACLE_PASSES`; ``tests/tools/test_sim.py`` checks they agree)."""


class _Runner:
    """Runs policies on one trace, caching what several runs share: the next-use table and
    bound replays that depend only on a slot count."""

    def __init__(self, trace: Trace, tick: Tick | None, hints: bool = True) -> None:
        self.trace = trace
        self.tick = tick
        self.hints = hints
        self._future: list[list[int]] | None = None
        self._bounds: dict[tuple[str, int], ReplayCounts] = {}
        self._infinite: ReplayCounts | None = None

    def run(self, spec: PolicySpec, tiers: Sequence[TierCapacity]) -> ReplayCounts:
        """Per-tier hits of ``spec`` on a configuration."""
        slots = [t.slots for t in tiers]
        if spec.kind == "index":
            return replay_index(
                self.trace, slots, spec.eviction, spec.min_seen, tick=self.tick, hints=self.hints
            )
        if spec.kind == "default":
            return replay_index(
                self.trace, slots, "", config=KVTierConfig(), tick=self.tick, hints=self.hints
            )
        if spec.kind in _BOUND_PASSES:
            return self._bound_tiers(slots, lambda n: self._bound_one(spec.kind, n))
        return self._infinite_tiers(len(slots))

    def _future_uses(self) -> list[list[int]]:
        if self._future is None:
            self._future = next_uses(self.trace)
        return self._future

    def _bound_one(self, kind: str, slots: int) -> ReplayCounts:
        """The offline bound ``kind`` at one size, replayed once per size; a repeat still
        advances the progress bar by the passes the replay took."""
        key = (kind, slots)
        if key not in self._bounds:
            replays: dict[str, Callable[..., ReplayCounts]] = {
                "belady": replay_belady,
                "oracle": replay_lru_oracle,
                "reuse": replay_lru_reuse,
            }
            self._bounds[key] = replays[kind](
                self.trace, slots, self._future_uses(), tick=self.tick
            )
        elif self.tick is not None:
            self.tick(_BOUND_PASSES[kind] * len(self.trace.keys))
        return self._bounds[key]

    def _bound_tiers(
        self, slots: Sequence[int], one: Callable[[int], ReplayCounts]
    ) -> ReplayCounts:
        """Tier t's bound: the bound on tiers 0..t together, minus the inner tiers'."""
        blocks: list[int] = []
        tokens: list[int] = []
        evictions: list[int] = []
        prev_b = prev_t = 0
        for t in range(len(slots)):
            r = one(sum(slots[: t + 1]))
            blocks.append(r.hit_blocks[0] - prev_b)
            tokens.append(r.hit_tokens[0] - prev_t)
            evictions.append(r.evictions[0])
            prev_b, prev_t = r.hit_blocks[0], r.hit_tokens[0]
        return ReplayCounts(blocks, tokens, evictions)

    def _infinite_tiers(self, n_tiers: int) -> ReplayCounts:
        if self._infinite is None:
            self._infinite = replay_infinite(self.trace, tick=self.tick)
        elif self.tick is not None:
            self.tick(len(self.trace.keys))
        r = self._infinite
        pad = [0] * (n_tiers - 1)
        return ReplayCounts(r.hit_blocks + pad, r.hit_tokens + pad, [0] * n_tiers)


def run_sim(
    trace_path: str | Path,
    capacities: Sequence[CapacityConfig],
    policies: Sequence[str] = DEFAULT_POLICIES,
    tiers: Sequence[str] = DEFAULT_TIERS,
    limit: int | None = None,
    *,
    block_tokens: int = TRACE_BLOCK_TOKENS,
    trace_block_tokens: int = TRACE_BLOCK_TOKENS,
    bytes_per_token: int = SMOLLM2_BYTES_PER_TOKEN,
    progress: bool = False,
    hints: bool = True,
) -> dict[str, Any]:
    """Simulate every policy on every capacity configuration of a Mooncake trace.

    ``capacities``: one entry per configuration; an entry is one capacity (a single CPU
    tier) or one per tier, innermost first (``("1M", "10M")`` or ``"1M+10M"``): token counts
    (``3000000``, ``"3M"``) or byte sizes (``"8GiB"``, converted with ``bytes_per_token``).
    ``tiers`` names the tiers by position. ``policies``: see :func:`parse_policy`.
    ``progress`` shows a tqdm bar on stderr. ``hints``: honour the requests' ``retain_s``
    hints (kvtier's policies only; the bounds have no leases).

    Returns a JSON-serialisable dict (format it with
    :func:`kvtier.tools.sim.report.format_sim`): trace facts, and under ``"runs"`` one
    entry per (configuration, policy) with per-tier and total ``hit_tokens``,
    ``hit_ratio`` (hit tokens / all input tokens), ``hit_blocks``, ``evictions`` and
    ``seconds``. Raises ConfigError for a bad trace line, capacity or policy name.
    """
    specs = [parse_policy(p) for p in policies]
    if not specs:
        raise ConfigError("policies: at least one policy is needed")
    if not capacities:
        raise ConfigError("capacities: at least one configuration is needed")

    def resolve(unique_tokens: int | None) -> list[tuple[TierCapacity, ...]]:
        return [
            tier_capacities(
                c,
                tiers,
                block_tokens=block_tokens,
                bytes_per_token=bytes_per_token,
                unique_tokens=unique_tokens,
            )
            for c in capacities
        ]

    if not any("%" in str(c) for c in capacities):
        resolve(None)  # a bad capacity fails before the trace is read
    t0 = time.perf_counter()
    trace = load_trace(
        trace_path, limit=limit, block_tokens=block_tokens, trace_block_tokens=trace_block_tokens
    )
    load_seconds = time.perf_counter() - t0
    configs = resolve(trace.unique_blocks * block_tokens)
    # A bound replays once per tier (cumulative sizes), the oracle a few passes each.
    per = _BOUND_PASSES
    work = sum(len(c) * per[s.kind] if s.kind in per else 1 for c in configs for s in specs)
    bar = _progress_bar(work * len(trace.keys), progress)
    runner = _Runner(trace, bar.update if bar is not None else None, hints)
    runs = []
    try:
        for config in configs:
            for spec in specs:
                t1 = time.perf_counter()
                counts = runner.run(spec, config)
                runs.append(_run_entry(trace, config, spec, counts, time.perf_counter() - t1))
    finally:
        if bar is not None:
            bar.close()
    return {
        "trace": trace.path,
        "requests": len(trace.keys),
        "blocks": trace.num_blocks,
        "input_tokens": trace.input_tokens,
        "unique_blocks": trace.unique_blocks,
        "block_tokens": block_tokens,
        "bytes_per_token": bytes_per_token,
        "hints": hints,
        "retain_hints": sum(1 for r in trace.requests if r.retain_s),
        "load_seconds": round(load_seconds, 4),
        "seconds": round(time.perf_counter() - t0, 4),
        "runs": runs,
    }


def _progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar counting replayed requests, or None."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc="kvtier sim", leave=False)


def _run_entry(
    trace: Trace,
    config: Sequence[TierCapacity],
    spec: PolicySpec,
    counts: ReplayCounts,
    seconds: float,
) -> dict[str, Any]:
    """The JSON entry of one (configuration, policy) run."""
    names = [t.name for t in config]
    total_tokens = trace.input_tokens
    hit_tokens = dict(zip(names, counts.hit_tokens, strict=True))
    hit_tokens["total"] = sum(counts.hit_tokens)
    hit_blocks = dict(zip(names, counts.hit_blocks, strict=True))
    hit_blocks["total"] = sum(counts.hit_blocks)
    return {
        "config": " + ".join(t.label() for t in config),
        "capacity": [
            {"tier": t.name, "tokens": t.tokens, "slots": t.slots, "bytes": t.bytes} for t in config
        ],
        "policy": spec.name,
        "hit_tokens": hit_tokens,
        "hit_ratio": {
            k: (v / total_tokens if total_tokens else 0.0) for k, v in hit_tokens.items()
        },
        "hit_blocks": hit_blocks,
        "evictions": dict(zip(names, counts.evictions, strict=True)),
        "seconds": round(seconds, 4),
    }


# -- output --------------------------------------------------------------------------------
