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
from kvtier.sources import HitSource
from kvtier.stack.arrivals import Arrivals
from kvtier.stack.job_table import JobTable
from kvtier.stack.loads import LoadPlanner
from kvtier.stack.movement import Movement
from kvtier.stack.outcomes import JobOutcomes
from kvtier.stack.requests import Hit, Requests
from kvtier.stack.stack import StackTier, TierStack
from kvtier.stack.store_plan import StorePlanner

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
    It keeps the order of things; its collaborators do them: ``requests``
    (:class:`~kvtier.stack.requests.Requests`), ``loads``, ``stores``, ``movement``,
    ``arrivals`` (prefetch, leases) and ``outcomes`` (what a job's end changes).
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
        self.admission = admission_policy(config, stack.slots(0))
        self.defer_on_inflight_loads = defer_on_inflight_loads
        self.jobs = JobTable(num_workers)
        self.movement = Movement(stack, self.jobs, self.metrics)
        self.stores = StorePlanner(
            stack, self.movement, self.jobs, self.chunk_tokens, self.blocks_per_chunk
        )
        loads = (config.sync_budget, layout, stack, self.jobs, self.metrics)
        self.loads = LoadPlanner(*loads, self.chunk_tokens, block_tokens)
        self.loads.sync_loads = sync_loads  # False: every hit loads async
        self.budget = self.loads.budget
        self.arrivals = Arrivals(
            config, layout, self.chunk_tokens, self.movement, self.loads.sync_slowdown
        )
        self.outcomes = JobOutcomes(stack, self.loads, self.movement, self.metrics)
        self.recent_hit_sources = self.loads.recent_hit_sources
        """The last requests' hit sources (inspection and tests)."""
        self.recent_load_modes = self.loads.recent_load_modes
        """The last requests' load modes, "sync" or "async" (inspection and tests)."""
        self.requests = Requests(namespace, self.chunk_tokens, self.metrics)
        """The requests with state (read by the connector, recurrent states, tier events)."""
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

    def on_new_request(
        self,
        req_id: str,
        tokens: Sequence[int],
        *,
        inputs: KeyInputs = NO_INPUTS,
        hints: Hints = NO_HINTS,
    ) -> None:
        """A request arrived (before it is scheduled; vLLM's ``on_new_request``): keep its
        hints, queue its prefetch (:meth:`kvtier.stack.arrivals.Arrivals.arrive`). Costs
        nothing without hints and with prefetch off or nothing below the first tier."""
        if self.arrivals.wants(hints):
            self.arrivals.arrive(req_id, self.requests.open(req_id, inputs), tokens, hints)

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
        req = self.requests.open(req_id, inputs)
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
            self.arrivals.observe(req_id, keys)
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
        self.requests.open(req_id).chain.keys[:] = keys
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
        end = self.loads.allocate(req_id, self.requests.get(req_id), block_ids, num_external, sync)
        self.arrivals.prefetch.consumed(req_id, end)  # admitted: its prefetch is done with

    def hit_sources(self, req_id: str, num_external: int) -> dict[HitSource, int]:
        """Which tier each of the accepted ``num_external`` hit tokens came from."""
        req = self.requests.get(req_id)
        return {} if req is None else req.hit_sources(num_external)

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
            req = self.requests.get(req_id)
            if req is not None:
                plan.flush.extend(j for j in req.jobs if self.jobs.kind_of(j) == "store")
        self.loads.begin_step((n_batch if batch is None else batch) + 1)
        return plan

    def store_due(self, req_id: str, limit: int) -> bool:
        """Whether a step ending with ``limit`` of the request's tokens computed (prompt
        tokens only) may store something; False means :meth:`build_step` would plan no
        store for it, so the caller need not gather its blocks
        (:meth:`kvtier.stack.store_plan.StorePlanner.due`, O(1))."""
        req = self.requests.get(req_id)
        return req is None or self.stores.due(req, limit)

    def _plan_store(
        self, req_id: str, tokens: Sequence[int], limit: int, block_ids: Sequence[int]
    ) -> list[TransferJob]:
        """:meth:`kvtier.stack.store_plan.StorePlanner.plan` for the request (known or not)."""
        req, admission, hook = self.requests.open(req_id), self.admission, self.on_store_planned
        return self.stores.plan(req_id, req, tokens, limit, block_ids, admission, hook)

    def request_finished(
        self, req_id: str, tokens: Sequence[int], num_computed: int, block_ids: Sequence[int]
    ) -> bool:
        """The request is done. Returns True when its blocks must stay allocated until the
        jobs listed in the next plan's ``release`` finish (the worker reports it then)."""
        req = self.requests.get(req_id)
        if req is None:
            return False
        self.budget.release(req_id)
        if self.config.store_output_tokens:
            self._finish_stores += self._plan_store(req_id, tokens, num_computed, block_ids)
        self.arrivals.finished(req_id, req, tokens, num_computed)
        for tier in self.stack.tiers:  # its stores' deferred ancestor touch: its own cost
            tier.index.settle()
        running = self.requests.finish(req_id, req)
        if running:
            self._pending_release[req_id] = running
        return bool(running)

    # -- worker reports --------------------------------------------------------------------

    def on_report(self, report: WorkerReport) -> None:
        """Apply a step's worker report: finish jobs, learn bandwidth and step time."""
        self.loads.observe_workers(report.load_bandwidth, report.forward_seconds)
        self.metrics.inc_tiers(report.counters)
        for result in report.results:
            entry = self.jobs.answer(result)
            if entry is not None:
                job = entry.job
                self.outcomes.apply(entry, self.requests.get(job.req_id))
                self.requests.job_ended(job.req_id, job.job_id)
        if report.results:  # leases hold a chain's new chunks as soon as their stores land
            self.arrivals.retention.step()

    # -- admin -----------------------------------------------------------------------------

    def reset(self) -> bool:
        """Forget every stored chunk that no job is using (vLLM's reset_prefix_cache)."""
        self.arrivals.reset()
        return True

    def has_pending_jobs(self) -> bool:
        return bool(len(self.jobs))

    def num_requests(self) -> int:
        return len(self.requests)
