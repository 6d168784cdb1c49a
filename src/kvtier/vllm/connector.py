"""``KVTierConnector``: kvtier as a vLLM v1 KV connector (scheduler and worker roles).

A thin adapter. In the scheduler role it forwards vLLM's calls to
:class:`kvtier.vllm.scheduler_role.SchedulerRole`, which maps them onto
:class:`kvtier.manager.CacheManager` (keys, lookups, sync/async load plans, stores, hit
sources); in the worker role it maps them onto :class:`kvtier.worker.WorkerSide` (copies).
What crosses between them is kvtier's own plain-data ``StepPlan`` and ``WorkerReport``.

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
from kvtier.manager import CacheManager
from kvtier.metrics import Metrics
from kvtier.vllm.events import ConnectorEvents
from kvtier.vllm.groups import UnsupportedLayout
from kvtier.vllm.hybrid import HybridScheduler
from kvtier.vllm.metadata import KVTierMetadata, KVTierWorkerMetadata
from kvtier.vllm.scheduler_role import SchedulerRole
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

from kvtier.vllm.connector_setup import ConnectorSetup, worker_side

log = logging.getLogger("kvtier")


class KVTierConnector(KVConnectorBase_V1, SupportsHMA):
    """Tiered KV offloading for vLLM (see the module docstring). ``SupportsHMA``: vLLM
    keeps its hybrid KV-cache manager on, and kvtier serves every KV-cache group (per-group
    block ids, :mod:`kvtier.transfer.groups`; recurrent states: :mod:`kvtier.vllm.hybrid`),
    refuses the layout at start, or runs with offload off (:mod:`kvtier.vllm.groups`).

    The scheduler-side calls are forwarded to :attr:`scheduler` (a
    :class:`~kvtier.vllm.scheduler_role.SchedulerRole`, None on a worker), the worker-side
    ones to :attr:`worker` (a :class:`~kvtier.worker.WorkerSide`, made when vLLM registers
    the KV caches)."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        try:
            self.setup = ConnectorSetup(vllm_config, kv_cache_config)
        except UnsupportedLayout as e:
            log.error("%s", e)  # the one line an operator sees above vLLM's traceback
            raise
        self.scheduler: SchedulerRole | None = None
        self.worker: WorkerSide | None = None
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler = SchedulerRole(self.setup, vllm_config, kv_cache_config)
            kvt = self._kv_transfer_config
            if kvt.kv_load_failure_policy != "recompute":
                # A tier miss or failed copy must mean "recompute", never a failed request.
                log.info("kvtier: setting kv_load_failure_policy='recompute'")
                kvt.kv_load_failure_policy = "recompute"

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: a dropped store is a future miss

    # -- the scheduler role's parts, for inspection and tests (None on a worker) ---------

    @property
    def manager(self) -> CacheManager | None:
        return self.scheduler.manager if self.scheduler is not None else None

    @property
    def states(self) -> HybridScheduler | None:
        return self.scheduler.states if self.scheduler is not None else None

    @property
    def events(self) -> ConnectorEvents | None:
        return self.scheduler.events if self.scheduler is not None else None

    @property
    def preemptions(self) -> int:
        """Requests vLLM preempted while kvtier was serving it."""
        return self.scheduler.preemptions if self.scheduler is not None else 0

    @property
    def totals(self) -> Metrics:
        """Everything reported since start (the interval metrics go to vLLM's stats)."""
        return self.scheduler.totals if self.scheduler is not None else Metrics()

    # == scheduler side ===================================================================

    def _sched(self) -> SchedulerRole:
        assert self.scheduler is not None, "a scheduler-side call on a worker"
        return self.scheduler

    def on_new_request(self, request: Request) -> None:
        if self.scheduler is not None:
            self.scheduler.on_new_request(request)

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return self._sched().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self._sched().update_state_after_alloc(request, blocks, num_external_tokens)

    def get_external_cache_hit_sources(
        self, request: Request, num_external_tokens: int
    ) -> dict[CacheHitSource, int]:
        return self._sched().get_external_cache_hit_sources(request, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        assert self._kv_cache_manager is not None
        return self._sched().build_connector_meta(scheduler_output, self._kv_cache_manager)

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self._sched().update_connector_output(connector_output)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._sched().request_finished_all_groups(request, block_ids)

    def has_pending_push_work(self) -> bool:
        return self.scheduler is not None and self.scheduler.has_pending_push_work()

    def take_events(self) -> Iterable[KVCacheEvent]:
        # vLLM drains this every step, events on or off: with them off there is no log.
        return self.scheduler.take_events() if self.scheduler is not None else ()

    def reset_cache(self) -> bool | None:
        return self.scheduler.reset_cache() if self.scheduler is not None else None

    def get_kv_connector_stats(self) -> KVTierStats | None:
        return self.scheduler.get_kv_connector_stats() if self.scheduler is not None else None

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
