"""Scheduler side: lookups, load plans (sync/async), store plans, hit sources, job state.

Engine-agnostic: it speaks token ids, block ids, keys and jobs. The vLLM connector is a
thin adapter over it; ``kvtier sim`` replays traces through it too. Where chunks live and
move is the tier stack's business (:mod:`kvtier.stack`): the lookup across tiers, the edge
rules and the copies between tiers; this class keeps request state and plans the jobs that
touch engine blocks (loads, stores).

Pinning: a load holds only the deepest chunk it reads in each tier. Prefix closure makes
that enough: an ancestor of a held chunk has a child and eviction only takes leaves. A
shared tier cannot hold; a chunk gone by load time fails into recompute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvtier.config import KVTierConfig
from kvtier.errors import ConfigError
from kvtier.hints import NO_HINTS, Hints
from kvtier.jobs import StepPlan, TransferJob, WorkerReport
from kvtier.keyinputs import NO_INPUTS, KeyInputs
from kvtier.keys import Key, Namespace
from kvtier.layout import KVLayout
from kvtier.metrics import Metrics
from kvtier.policies.defaults import admission_policy
from kvtier.sources import HitSource, hit_sources
from kvtier.stack.arrivals import Arrivals
from kvtier.stack.job_table import JobEntry, JobTable
from kvtier.stack.loads import LoadPlanner
from kvtier.stack.movement import Movement
from kvtier.stack.requests import Hit, RequestState
from kvtier.stack.stack import StackTier, TierStack
from kvtier.stack.store_plan import StoreContext, plan_store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScheduledRequest:
    """A request scheduled in a step, as the store planner needs it."""

    req_id: str
    tokens: Sequence[int]
    """All token ids so far (prompt, then outputs)."""
    computed_after_step: int
    """Tokens whose KV exists once this step's forward pass is done."""
    block_ids: Sequence[int]
    """The request's engine blocks, in token order."""
    prompt_len: int


StoreHook = Callable[[str, int, Sequence[Key]], None]
"""Told ``(req_id, first chunk index, keys)`` of every store planned from a request's engine
blocks (:class:`CacheManager.on_store_planned`); ``keys`` is the store's own list, which
nothing changes after (a listener may keep it)."""


def _no_hook(req_id: str, first: int, keys: Sequence[Key]) -> None:
    return None


def resolve_chunk_tokens(config: KVTierConfig, block_tokens: int) -> int:
    """The chunk size in tokens: configured (checked) or automatic."""
    if config.chunk_tokens:
        if config.chunk_tokens % block_tokens:
            raise ConfigError(
                f"chunk_tokens: {config.chunk_tokens} is not a multiple of the engine block "
                f"size {block_tokens}"
            )
        return config.chunk_tokens
    return block_tokens


class CacheManager:
    """Scheduler-side state of kvtier for one engine.

    Call order per request: ``lookup`` -> ``plan_load`` -> ``on_allocated`` -> ``hit_sources``
    (all during scheduling), ``build_step`` once per engine step, ``on_report`` with every
    worker report, ``request_finished`` once. Single-threaded (the scheduler's thread).
    """

    def __init__(
        self,
        config: KVTierConfig,
        layout: KVLayout,
        namespace: Namespace,
        block_tokens: int,
        stack: TierStack,
        *,
        num_workers: int = 1,
        metrics: Metrics | None = None,
        defer_on_inflight_loads: bool = True,
        sync_loads: bool = True,
    ) -> None:
        self.config = config
        self.layout = layout
        self.namespace = namespace
        self.block_tokens = block_tokens
        self.chunk_tokens = resolve_chunk_tokens(config, block_tokens)
        self.blocks_per_chunk = self.chunk_tokens // block_tokens
        self.stack = stack
        self.metrics = metrics or Metrics()
        self.admission = admission_policy(config, _slots(stack[0].index))
        self.defer_on_inflight_loads = defer_on_inflight_loads
        self.jobs = JobTable(num_workers)
        self.movement = Movement(stack, self.jobs, self.metrics)
        self._store_ctx = StoreContext(
            stack, self.movement, self.jobs, self.chunk_tokens, self.blocks_per_chunk
        )
        loads = (config.sync_budget, layout, stack, self.jobs, self.metrics)
        self.loads = LoadPlanner(*loads, self.chunk_tokens, block_tokens)
        self.loads.sync_loads = sync_loads  # False: every hit loads async
        self.budget = self.loads.budget
        self.arrivals = Arrivals(config, layout, self.chunk_tokens, self.movement)
        self.recent_hit_sources = self.loads.recent_hit_sources
        """The last requests' hit sources (inspection and tests)."""
        self.recent_load_modes = self.loads.recent_load_modes
        """The last requests' load modes, "sync" or "async" (inspection and tests)."""
        self._reqs: dict[str, RequestState] = {}
        self._pending_release: dict[str, list[int]] = {}
        # Stores planned when a request finished; its blocks stay allocated until they run.
        self._finish_stores: list[TransferJob] = []
        self.deferred = 0
        """Lookups answered "ask again later" (a tier not ready, or a load in flight)."""
        self.steps = 0
        self.on_store_planned: StoreHook = _no_hook  # tier events learn identities there

    @property
    def tiers(self) -> list[StackTier]:
        return self.stack.tiers

    # -- requests --------------------------------------------------------------------------

    def _request(self, req_id: str, inputs: KeyInputs = NO_INPUTS) -> RequestState:
        req = self._reqs.get(req_id)
        if req is None:
            chain = self.namespace.key_chain(self.chunk_tokens, inputs)
            req = self._reqs[req_id] = RequestState(chain, unkeyable=bool(inputs.unkeyable))
            if inputs.unkeyable:
                self.metrics.inc("unkeyable_requests", 1, inputs.unkeyable)
        return req

    def lookup(
        self,
        req_id: str,
        tokens: Sequence[int],
        num_computed: int,
        *,
        inputs: KeyInputs = NO_INPUTS,
    ) -> Hit | None:
        """The external hit past ``num_computed`` tokens, or None to ask again later (a tier
        cannot answer yet, or a chunk of the hit is still being loaded for another request,
        which will make it a local hit of the engine's own cache).

        ``inputs`` (read at the first lookup): with ``unkeyable`` set, never a hit nor a store.
        Side-effect free apart from computing the request's keys once (and starting a
        shared tier's probe).
        """
        req = self._request(req_id, inputs)
        if req.unkeyable:
            return Hit(num_computed, num_computed, ())
        req.chain.update(tokens)
        keys = req.claimable(req.chain.keys)
        c = self.chunk_tokens
        first = num_computed // c
        if len(keys) <= first:
            req.hit = None
            return Hit(num_computed, num_computed, ())
        if not req.observed:  # once per request: repeated lookups are not reuse
            req.observed = True
            self.admission.observe(keys)
            for t, tier in enumerate(self.stack.tiers):
                tier.index.observe(self.arrivals.observed(req_id, t, keys))
        found = self.stack.lookup(keys, first)
        if found is None or self.arrivals.prefetch.waiting(req_id):
            self.deferred += 1
            return None
        covered = found[-1][2] if found else first
        if covered * c <= num_computed:
            req.hit = None
            return Hit(num_computed, num_computed, ())
        names = self.stack.tiers
        hit = Hit(num_computed, covered * c, tuple((names[t].name, a, b) for t, a, b in found))
        if self.defer_on_inflight_loads and self.loads.overlaps_loading(keys, first, covered):
            self.deferred += 1
            return None
        req.hit = hit
        self.metrics.inc("lookup_tokens", max(0, len(tokens) - num_computed))
        return hit

    def lookup_keys(self, req_id: str, keys: Sequence[Key]) -> Hit | None:
        """:meth:`lookup` for a request whose chunk keys are known already (the simulator,
        whose traces carry block hashes, not tokens): one token per chunk."""
        req = self._request(req_id)
        req.chain.keys[:] = keys
        return self.lookup(req_id, range(len(keys) * self.chunk_tokens), 0)

    def plan_load(self, req_id: str, hit: Hit, num_tokens: int) -> tuple[int, bool]:
        """Decide how a hit loads: ``(external tokens, load asynchronously)`` (see
        :meth:`kvtier.stack.loads.LoadPlanner.plan`)."""
        return self.loads.plan(req_id, hit, num_tokens)

    def on_allocated(
        self, req_id: str, block_ids: Sequence[int], num_external: int, sync: bool
    ) -> None:
        """The engine allocated ``block_ids`` for the request and accepted ``num_external``
        tokens of its hit: build the load job(s) for the next step."""
        req = self._reqs.get(req_id)
        hit = req.hit if req is not None else None
        if req is None or hit is None or num_external <= 0:
            self.budget.release(req_id)
            self.arrivals.prefetch.consumed(req_id, 0)  # admitted: nothing to prefetch
            if req is not None:
                req.load_runs = []
            return
        self.loads.allocate(req_id, req, hit, block_ids, num_external, sync)
        self.arrivals.prefetch.consumed(req_id, -(-(hit.start + num_external) // self.chunk_tokens))

    def hit_sources(self, req_id: str, num_external: int) -> dict[HitSource, int]:
        """Which tier each of the accepted ``num_external`` hit tokens came from."""
        req = self._reqs.get(req_id)
        if req is None or num_external <= 0:
            return {}
        return hit_sources([req.load_runs], req.load_start, req.load_start + num_external)

    # -- steps -----------------------------------------------------------------------------

    def build_step(
        self,
        scheduled: Iterable[ScheduledRequest],
        preempted: Iterable[str] = (),
        batch: int | None = None,
    ) -> StepPlan:
        """The plan for this step: loads accepted since the last step, stores of chunks
        this step completes, copies between tiers, flushes for preempted requests, block
        releases. ``batch``: requests the engine scheduled in the step (default: those in
        ``scheduled``; a caller may leave out those :meth:`store_due` says have nothing to
        store)."""
        self.steps += 1
        plan = StepPlan(
            loads=self.loads.pending, stores=self._finish_stores, release=self._pending_release
        )
        self.loads.pending, self._pending_release, self._finish_stores = [], {}, []
        plan.stores += self.arrivals.copies()
        self.movement.pending = []
        n_batch = 0
        for s in scheduled:
            n_batch += 1
            plan.stores += self._plan_store(
                s.req_id, s.tokens, min(s.computed_after_step, s.prompt_len), s.block_ids
            )
        for req_id in preempted:
            req = self._reqs.get(req_id)
            if req is not None:
                plan.flush.extend(j for j in req.jobs if self.jobs.kind_of(j) == "store")
        if self.budget.used:
            self.metrics.observe("sync_budget_used_bytes", self.budget.used)
        self.budget.begin_step((n_batch if batch is None else batch) + 1)
        self.metrics.set("sync_budget_bytes", self.budget.limit)
        return plan

    def store_due(self, req_id: str, limit: int) -> bool:
        """Whether a step ending with ``limit`` of the request's tokens computed (prompt
        tokens only) may store something; False means :meth:`build_step` would plan no
        store for it, so the caller need not gather its blocks. O(1): by prefix closure the
        entry tier holds the chain up to chunk ``n`` when it holds chunk ``n``."""
        req = self._reqs.get(req_id)
        if req is None:
            return True
        n = limit // self.chunk_tokens
        if req.unkeyable or n <= 0:
            return False
        keys = req.chain.keys
        return len(keys) < n or not self.stack[req.entry].index.has(keys[n - 1])

    def _plan_store(
        self, req_id: str, tokens: Sequence[int], limit: int, block_ids: Sequence[int]
    ) -> list[TransferJob]:
        """:func:`kvtier.stack.store_plan.plan_store` for the request (known or not)."""
        req = self._reqs.get(req_id) or self._request(req_id)
        return plan_store(
            req_id,
            req,
            tokens,
            limit,
            block_ids,
            self._store_ctx,
            self.admission,
            self.on_store_planned,
        )

    def request_finished(
        self, req_id: str, tokens: Sequence[int], num_computed: int, block_ids: Sequence[int]
    ) -> bool:
        """The request is done. Returns True when its blocks must stay allocated until the
        jobs listed in the next plan's ``release`` finish (the worker reports it then)."""
        req = self._reqs.get(req_id)
        if req is None:
            return False
        self.budget.release(req_id)
        if self.config.store_output_tokens:
            self._finish_stores += self._plan_store(req_id, tokens, num_computed, block_ids)
        self.arrivals.finished(req_id, req, tokens, num_computed)
        for tier in self.stack.tiers:  # its stores' deferred ancestor touch: its own cost
            tier.index.settle()
        req.finished = True
        if req.jobs:
            self._pending_release[req_id] = sorted(req.jobs)
            return True
        del self._reqs[req_id]
        return False

    # -- worker reports --------------------------------------------------------------------

    def on_report(self, report: WorkerReport) -> None:
        """Apply a step's worker report: finish jobs, learn bandwidth and step time."""
        if report.load_bandwidth > 0:
            self.budget.observe_bandwidth(report.load_bandwidth)
        if report.forward_seconds > 0:
            self.budget.observe_step(report.forward_seconds)
        self.metrics.inc_tiers(report.counters)
        for result in report.results:
            entry = self.jobs.answer(result)
            if entry is not None:
                self._finish_job(entry)
        if report.results:  # leases hold a chain's new chunks as soon as their stores land
            self.arrivals.retention.step()

    def _finish_job(self, entry: JobEntry) -> None:
        job, result = entry.job, entry.result
        assert result is not None
        failed = result.ok.count(False)
        if job.kind == "load":
            self.loads.finished(job, result, self._reqs.get(job.req_id))
        else:
            dst = job.dst_tier if job.kind == "copy" else job.tier
            if job.kind == "copy":
                self.movement.copied(job, result.ok)
            else:
                t = self.stack.position[dst]
                self.stack[t].index.commit(job.keys, result.ok)
                self.movement.through(t, job.keys, job.slots, job.parents, result.ok, job.req_id)
            self.metrics.inc("store_bytes", result.nbytes, dst)
            self.metrics.inc("store_seconds", result.seconds, dst)
            self.metrics.inc("stored_chunks", len(job.keys) - failed, dst)
        if failed:
            kind = "load" if job.kind == "load" else "store"
            tier = job.dst_tier if job.kind == "copy" else job.tier
            self.metrics.inc("failures", failed, tier, kind)
        req = self._reqs.get(job.req_id)
        if req is not None:
            req.jobs.discard(job.job_id)
            if req.finished and not req.jobs:
                del self._reqs[job.req_id]

    # -- admin -----------------------------------------------------------------------------

    def reset(self) -> bool:
        """Forget every stored chunk that no job is using (vLLM's reset_prefix_cache)."""
        self.arrivals.reset()
        return True

    def has_pending_jobs(self) -> bool:
        return bool(len(self.jobs))

    def num_requests(self) -> int:
        return len(self._reqs)


def knows(manager: CacheManager, req_id: str) -> bool:
    """Whether the manager has state for the request (it read its inputs at its first
    lookup, and reads them no more)."""
    return req_id in manager._reqs


def chain_keys(manager: CacheManager, req_id: str, tokens: Sequence[int] = ()) -> Sequence[Key]:
    """The request's chunk keys computed so far, first extended over ``tokens`` (its
    tokens from the start); empty for a request it does not know."""
    req = manager._reqs.get(req_id)
    if req is None:
        return ()
    if tokens and not req.unkeyable:
        req.chain.update(tokens)
    return req.chain.keys


def set_hit(manager: CacheManager, req_id: str, hit: Hit) -> None:
    """Replace the hit the request's last lookup found with a part of it (recurrent
    states: the prefix whose state is present, :mod:`kvtier.stack.states`)."""
    req = manager._reqs.get(req_id)
    if req is not None:
        req.hit = hit if hit.tokens > 0 else None


def on_new_request(
    manager: CacheManager,
    req_id: str,
    tokens: Sequence[int],
    *,
    inputs: KeyInputs = NO_INPUTS,
    hints: Hints = NO_HINTS,
) -> None:
    """A request arrived (before it is scheduled; vLLM's ``on_new_request``): keep its
    hints, start its prefetch (:mod:`kvtier.stack.prefetch`). Costs nothing without hints
    and with prefetch off or nothing below the first tier; otherwise the key computation
    its first lookup would do anyway, and a lookup in each tier."""
    arrivals = manager.arrivals
    want = hints.prefetch_only or arrivals.prefetching()
    if not want and hints is NO_HINTS:
        return
    req = manager._request(req_id, inputs)
    req.hints = hints
    if want and not req.unkeyable:
        req.chain.update(tokens)
        arrivals.prefetch.arrive(req_id, req.chain.keys, now=hints.prefetch_only)


def _slots(index: object) -> int:
    return int(getattr(index, "num_slots", 0))
