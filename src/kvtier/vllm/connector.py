"""``KVTierConnector``: kvtier as a vLLM v1 KV connector (scheduler and worker roles).

A thin adapter. The scheduler role maps vLLM's calls onto :class:`kvtier.manager.CacheManager`
(keys, lookups, sync/async load plans, stores, hit sources); the worker role maps them onto
:class:`kvtier.worker.WorkerSide` (copies). What crosses between them is kvtier's own
plain-data ``StepPlan`` and ``WorkerReport``.

Step timeline on a worker:

- ``handle_preemptions``: finish stores that read blocks of preempted requests;
- ``bind_connector_metadata``: the step's plan arrives;
- ``start_load_kv``: sync loads run to completion on the expedited queue (vLLM calls this
  before the forward pass whenever the step has sync loads); async loads are queued on the
  normal queue. With layer-wise loads (``layer_loads``), only each sync load's last block
  is copied here: vLLM's CPU backend writes the step's new KV into the cache in an op of
  its own, before the attention op that ``wait_for_layer_load`` wraps, and that block is
  the only loaded one it can write (see :mod:`kvtier.worker`); the other blocks are
  copied one layer at a time during the forward;
- the forward pass: ``wait_for_layer_load(layer)`` before each layer's attention waits
  until that layer's KV is whole (a no-op without layer-wise loads);
- ``wait_for_save``: layer-wise loads finish; this step's stores are queued (they read KV
  this forward wrote), or, CPU-tier row copies from host KV, run here (between forwards:
  ``TransferEngine.inline_stores``);
- ``get_finished``: async loads done (``finished_recving``), finished requests whose blocks
  kvtier held until their stores ran (``finished_sending``);
- ``get_transfer_results``: ``get_finished``'s sets, and with several KV-cache groups the
  requests whose load failed (``failed_recving``: vLLM recomputes each from scratch);
- ``get_block_ids_with_load_errors``: with one KV-cache group, the engine blocks whose
  load failed; vLLM recomputes from the first of them (kvtier sets
  ``kv_load_failure_policy="recompute"``: a cache miss is never an error).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from kvtier import timeline
from kvtier.keyinputs import NO_INPUTS
from kvtier.manager import CacheManager, ScheduledRequest, knows
from kvtier.metrics import Metrics
from kvtier.stack.build import build_stack
from kvtier.vllm.arrivals import ArrivalHooks
from kvtier.vllm.events import ConnectorEvents, events_enabled
from kvtier.vllm.groups import UnsupportedLayout
from kvtier.vllm.hybrid import HybridScheduler
from kvtier.vllm.metadata import KVTierMetadata, KVTierWorkerMetadata
from kvtier.vllm.stats import KVTierPromMetrics, KVTierStats
from kvtier.worker import WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.distributed.kv_events import KVCacheEvent
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

from kvtier.vllm.connector_setup import ConnectorSetup, log_start, log_step, worker_side

log = logging.getLogger("kvtier")


class KVTierConnector(ArrivalHooks, KVConnectorBase_V1, SupportsHMA):
    """Tiered KV offloading for vLLM (see the module docstring). ``SupportsHMA``: vLLM
    keeps its hybrid KV-cache manager on, and kvtier serves every KV-cache group (per-group
    block ids, :mod:`kvtier.transfer.groups`; recurrent states: :mod:`kvtier.vllm.hybrid`),
    refuses the layout at start, or runs with offload off (:mod:`kvtier.vllm.groups`)."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        try:
            self.setup = ConnectorSetup(vllm_config, kv_cache_config)
        except UnsupportedLayout as e:
            log.error("%s", e)  # the one line an operator sees above vLLM's traceback
            raise
        self.manager: CacheManager | None = None
        self.worker: WorkerSide | None = None
        self.states: HybridScheduler | None = None
        """Scheduler side of recurrent states (hybrid models kvtier serves)."""
        self.events: ConnectorEvents | None = None
        """Tier events for KV-aware routers; only while the engine publishes KV events."""
        self._requests: dict[str, Request] = {}
        self._planned_async: dict[str, bool] = {}
        self.preemptions = 0
        """Requests vLLM preempted while kvtier was serving it (inspection and tests)."""
        self.totals = Metrics()
        """Everything reported since start (the interval metrics go to vLLM's stats)."""
        if role == KVConnectorRole.SCHEDULER:
            s = self.setup
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
            if s.states is not None:  # linked to the tiers after the events' listeners
                self.states = HybridScheduler(s.states, self.manager, stack)
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
            kvt = self._kv_transfer_config
            if kvt.kv_load_failure_policy != "recompute":
                # A tier miss or failed copy must mean "recompute", never a failed request.
                log.info("kvtier: setting kv_load_failure_policy='recompute'")
                kvt.kv_load_failure_policy = "recompute"
            log_start(s, stack)

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a dropped store is a future miss

    # == scheduler side ===================================================================

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        assert self.manager is not None
        # The manager reads a request's inputs at its first lookup only; a multimodal one's
        # cost a digest of each item's mask, so later lookups do not build them again.
        known = knows(self.manager, request.request_id)
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
        assert self.manager is not None
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
        assert self.manager is not None
        got = self.manager.hit_sources(request.request_id, num_external_tokens)
        return {CacheHitSource(src.label): n for src, n in got.items()}

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self.manager is not None and self._kv_cache_manager is not None
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
            per_group = self._kv_cache_manager.get_block_ids(req_id)
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
        assert self.manager is not None
        meta = connector_output.kv_connector_worker_meta
        if timeline.enabled():
            timeline.event("sched.output", recving=sorted(connector_output.finished_recving or ()))
        if isinstance(meta, KVTierWorkerMetadata):
            self.manager.on_report(meta.report)
            if self.states is not None:
                self.states.on_report(meta.report)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        assert self.manager is not None
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
        return self.manager is not None and self.manager.has_pending_jobs()

    def take_events(self) -> Iterable[KVCacheEvent]:
        # vLLM drains this every step, events on or off: with them off there is no log.
        return self.events.take() if self.events is not None else ()

    def reset_cache(self) -> bool | None:
        if self.states is not None:
            self.states.cache.cache.reset()
        return self.manager.reset() if self.manager is not None else None

    def get_kv_connector_stats(self) -> KVTierStats | None:
        if self.manager is None:
            return None
        m = self.manager.metrics.take()
        if m.is_empty():
            return None
        self.totals.merge(m)
        return KVTierStats.of(m)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVTierStats | None:
        return KVTierStats(data=data) if data is not None else KVTierStats()

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: VllmConfig,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KVTierPromMetrics:
        return KVTierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # == worker side ======================================================================

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        timeline.event("worker.register", phase="start")
        if self.setup.groups.recurrent:
            return  # offload off (the scheduler logged why): no regions, no tier memory
        self.worker = worker_side(self.setup, self._vllm_config, self._kv_cache_config, kv_caches)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        if self.worker is not None and isinstance(kv_connector_metadata, KVTierMetadata):
            self.worker.flush(kv_connector_metadata.plan.flush)
            if self.setup.groups.frees_blocks:
                # Blocks that left a sliding window were freed when this step was
                # scheduled and may be zeroed or rewritten from here on.
                self.worker.flush_stores()

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self.worker is not None and isinstance(connector_metadata, KVTierMetadata):
            timeline.event("worker.bind", loads=len(connector_metadata.plan.loads))
            self.worker.begin_step(connector_metadata.plan)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        if self.worker is not None:
            timeline.event("worker.start_load")
            self.worker.start_loads()

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self.worker is not None:
            self.worker.wait_layer(layer_name)  # at once unless loading layer by layer

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # stores are whole chunks, queued once per step in wait_for_save

    def wait_for_save(self) -> None:
        if self.worker is not None:
            timeline.event("worker.wait_for_save")
            self.worker.end_forward()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self.worker is None:
            return None, None
        sending, recving = self.worker.transfer_results()
        timeline.event("worker.get_finished", recving=sorted(recving))
        return sending or None, recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        sending, recving = self.get_finished(finished_req_ids)
        out = KVConnectorTransferResults(set(sending or ()), set(recving or ()))
        if self.worker is not None and self.setup.request_failures:
            out.failed_recving = self.worker.failed_requests(out.finished_recving)
        return out

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self.worker is None or self.setup.request_failures:
            return set()  # reported per request in get_transfer_results
        failed = self.worker.load_errors()
        return self.setup.codec.real_blocks(list(failed)) if self.setup.grouped else failed

    def build_connector_worker_meta(self) -> KVTierWorkerMetadata | None:
        if self.worker is None:
            return None
        return KVTierWorkerMetadata(self.worker.report())

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None
