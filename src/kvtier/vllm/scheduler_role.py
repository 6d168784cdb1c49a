"""The connector's scheduler role: vLLM's scheduler-side calls, in vLLM's types, onto
kvtier's :class:`~kvtier.manager.CacheManager` (keys, lookups, sync/async load plans,
stores, hit sources), the recurrent states of hybrid models (:mod:`kvtier.vllm.hybrid`)
and the tier events (:mod:`kvtier.vllm.events`).

vLLM calls ``on_new_request`` when a request is added, before it is scheduled: kvtier's
hints are read from the request's ``kv_transfer_params`` (:mod:`kvtier.hints`) and the
manager starts the prefetch of its slow-tier prefix (without hints and with prefetch off,
it returns at once). The other calls follow a request through scheduling: the lookup
(``get_num_new_matched_tokens``), the blocks vLLM allocated (``update_state_after_alloc``),
each step's plan (``build_connector_meta``), the workers' reports
(``update_connector_output``) and its end (``request_finished_all_groups``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtier import timeline
from kvtier.hints import NO_HINTS, parse_hints
from kvtier.keyinputs import NO_INPUTS
from kvtier.manager import CacheManager, ScheduledRequest
from kvtier.metrics import Metrics
from kvtier.stack.build import build_stack
from kvtier.vllm.connector_setup import ConnectorSetup, log_start, log_step
from kvtier.vllm.events import ConnectorEvents, events_enabled
from kvtier.vllm.hybrid import HybridScheduler
from kvtier.vllm.metadata import KVTierMetadata, KVTierWorkerMetadata
from kvtier.vllm.stats import KVTierStats

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks, KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


class SchedulerRole:
    """The scheduler half of :class:`~kvtier.vllm.connector.KVTierConnector`: one method
    per scheduler-side call of vLLM's ``KVConnectorBase_V1``, same name, same answer; the
    connector forwards to it. Owns the manager, the recurrent states' scheduler (hybrid
    models kvtier serves), the tier events (only while the engine publishes KV events),
    the requests vLLM allocated blocks for, and whether each lookup planned an async load
    until vLLM allocates. vLLM's scheduler thread only."""

    def __init__(
        self, setup: ConnectorSetup, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig
    ) -> None:
        s = self.setup = setup
        stack = build_stack(s.config, s.context(), s.specs)
        self.manager = CacheManager(
            s.config,
            s.layout,
            s.namespace,
            s.block_tokens,
            stack,
            num_workers=s.world_size,
            defer_on_inflight_loads=vllm_config.cache_config.enable_prefix_caching,
            sync_loads=not s.request_failures,
        )
        self.states: HybridScheduler | None = None
        """Scheduler side of recurrent states (hybrid models kvtier serves)."""
        if s.states is not None:  # linked to the tiers after the events' listeners
            self.states = HybridScheduler(s.states, self.manager, stack)
        self.events: ConnectorEvents | None = None
        """Tier events for KV-aware routers; only while the engine publishes KV events."""
        self._requests: dict[str, Request] = {}
        if events_enabled(vllm_config):
            self.events = ConnectorEvents(
                self.manager,
                self._requests,
                kv_cache_config,
                s.block_tokens,
                remote=s.config.events_remote,
                states=self.states.cache if self.states is not None else None,
            )
        if self.states is not None:
            self.states.link()
        self._planned_async: dict[str, bool] = {}
        self.preemptions = 0
        """Requests vLLM preempted while kvtier was serving it (inspection and tests)."""
        self.totals = Metrics()
        """Everything reported since start (the interval metrics go to vLLM's stats)."""
        log_start(s, stack)

    def on_new_request(self, request: Request) -> None:
        m = self.manager
        hints = parse_hints(request.kv_transfer_params, m.metrics)
        if hints is NO_HINTS and not m.arrivals.prefetching():
            return
        inputs = self.setup.key_inputs(request)
        m.on_new_request(request.request_id, request.all_token_ids, inputs=inputs, hints=hints)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        # The manager reads a request's inputs at its first lookup only; a multimodal one's
        # cost a digest of each item's mask, so later lookups do not build them again.
        known = self.manager.requests.knows(request.request_id)
        inputs = NO_INPUTS if known else self.setup.key_inputs(request)
        hit = self.manager.lookup(
            request.request_id, request.all_token_ids, num_computed_tokens, inputs=inputs
        )
        if hit is None:
            return None, False
        if self.states is not None:
            hit = self.states.trim(request.request_id, hit, request.num_tokens)
            if hit is None:
                return None, False
        if self.events is not None:
            self.events.looked_up(request)
        n, is_async = self.manager.plan_load(request.request_id, hit, request.num_tokens)
        self._planned_async[request.request_id] = is_async
        timeline.event("sched.lookup", req=request.request_id, tokens=n, is_async=is_async)
        return n, is_async and n > 0

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        req_id = request.request_id
        self._requests[req_id] = request
        is_async = self._planned_async.pop(req_id, False)
        if num_external_tokens > 0:
            per_group = blocks.get_block_ids()
            block_ids = self.setup.codec.encode(self.setup.attention(per_group))
            self.manager.on_allocated(req_id, block_ids, num_external_tokens, sync=not is_async)
            if self.states is not None:
                self.states.cache.allocated(req_id, per_group, num_external_tokens)

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[CacheHitSource, int]:
        got = self.manager.hit_sources(request.request_id, num_external_tokens)
        return {CacheHitSource(src.label): n for src, n in got.items()}

    def build_connector_meta(
        self, scheduler_output: SchedulerOutput, kv_cache_manager: KVCacheManager
    ) -> KVTierMetadata:
        scheduled = []
        num_sched = scheduler_output.num_scheduled_tokens
        batch = 0
        for req_id, n in num_sched.items():
            request = self._requests.get(req_id)
            if request is None:
                continue
            batch += 1
            # Most steps of a running request store nothing (decode): skip gathering its
            # block ids, which vLLM builds as a new list per call (O(its blocks)).
            limit = min(request.num_computed_tokens + n, request.num_prompt_tokens)
            if not self.manager.store_due(req_id, limit):
                continue
            per_group = kv_cache_manager.get_block_ids(req_id)
            block_ids = self.setup.codec.encode(self.setup.attention(per_group))
            scheduled.append(
                ScheduledRequest(
                    req_id,
                    request.all_token_ids,
                    request.num_computed_tokens + n,
                    block_ids,
                    request.num_prompt_tokens,
                )
            )
        preempted = scheduler_output.preempted_req_ids or ()
        self.preemptions += len(preempted)
        plan = self.manager.build_step(scheduled, preempted, batch=batch)
        plan.idle = scheduler_output.total_num_scheduled_tokens == 0
        if self.states is not None:
            plan.states = self.states.step(scheduler_output, self._requests)
        log_step(self.manager, plan, dict(num_sched), preempted)
        return KVTierMetadata(plan)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        meta = connector_output.kv_connector_worker_meta
        if timeline.enabled():
            timeline.event("sched.output", recving=sorted(connector_output.finished_recving or ()))
        if isinstance(meta, KVTierWorkerMetadata):
            self.manager.on_report(meta.report)
            if self.states is not None:
                self.states.on_report(meta.report)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        ids = self.setup.codec.encode(self.setup.attention(block_ids))
        req_id = request.request_id
        if self.states is not None:
            self.states.cache.forget(req_id)
        self._planned_async.pop(req_id, None)
        delay = self.manager.request_finished(
            req_id, request.all_token_ids, request.num_computed_tokens, ids
        )
        self._requests.pop(req_id, None)  # after its last stores are planned (tier events)
        if self.events is not None:
            self.events.finished(req_id)
        return delay, None

    def has_pending_push_work(self) -> bool:
        # Keep the engine stepping while stores are in flight, so their completion reaches
        # the scheduler (and the chunks become hits) even when no request is running.
        if self.events is not None and self.events.pending():
            return True  # events left over by a bounded take: publish them on later steps
        if self.states is not None and self.states.pending():
            return True
        return self.manager.has_pending_jobs()

    def take_events(self) -> Iterable[KVCacheEvent]:
        return self.events.take() if self.events is not None else ()

    def reset_cache(self) -> bool:
        if self.states is not None:
            self.states.cache.cache.reset()
        return self.manager.reset()

    def get_kv_connector_stats(self) -> KVTierStats | None:
        m = self.manager.metrics.take()
        if m.is_empty():
            return None
        self.totals.merge(m)
        return KVTierStats.of(m)
