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

import dataclasses
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
from kvtier.config import KVTierConfig
from kvtier.contract.kind import TierContext
from kvtier.jobs import StepPlan
from kvtier.keyinputs import NO_INPUTS, KeyInputs
from kvtier.keys import Namespace
from kvtier.keysecret import read_key_secret
from kvtier.manager import CacheManager, ScheduledRequest, knows, resolve_chunk_tokens
from kvtier.metrics import Metrics
from kvtier.stack.build import build_stack, build_stores, tier_files
from kvtier.stack.stack import TierStack
from kvtier.transfer.engine import TransferEngine
from kvtier.transfer.groups import BlockIdCodec, GroupedRegions
from kvtier.transfer.regions import KVRegions
from kvtier.vllm.arrivals import ArrivalHooks
from kvtier.vllm.events import ConnectorEvents, events_enabled
from kvtier.vllm.groups import RECURRENT, UnsupportedLayout, read_groups, sink_layers
from kvtier.vllm.hybrid import HybridScheduler, HybridWorkerSide, attention_ids, state_setup
from kvtier.vllm.key_inputs import key_inputs
from kvtier.vllm.kv_layout import declared_block_dims, require_dims
from kvtier.vllm.metadata import KVTierMetadata, KVTierWorkerMetadata
from kvtier.vllm.mm_content import ContentDigests
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

log = logging.getLogger("kvtier")


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except (ImportError, AssertionError, RuntimeError):
        return 0


class _Setup:
    """What both roles derive identically from the vLLM config."""

    def __init__(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> None:
        assert vllm_config.kv_transfer_config is not None
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        self.config = KVTierConfig.from_dict(extra)
        par = vllm_config.parallel_config
        self.world_size = par.tensor_parallel_size * par.pipeline_parallel_size
        self.groups = read_groups(
            kv_cache_config, cpu=_on_cpu(), sinks=sink_layers(vllm_config), world=self.world_size
        )
        self.layout = self.groups.layout
        self.codec = BlockIdCodec(self.groups.attention_groups, kv_cache_config.num_blocks)
        """Per-group block ids <-> the one id per position the manager and jobs carry
        (attention groups only: states go their own path)."""
        self.grouped = self.groups.attention_groups > 1 or self.groups.frees_blocks
        self.request_failures = self.groups.num_groups > 1
        """Failed loads are reported per request (``failed_recving``: vLLM recomputes it
        from scratch), not per block: with several KV-cache groups a block id does not name
        a request, and vLLM 0.32 stops the engine on block-level reports. Loads are then
        all asynchronous, since only a request still waiting for its KV can be sent back
        to recompute (a sync load's failure would be found after the forward used it)."""
        self.block_tokens = vllm_config.cache_config.block_size
        self.chunk_tokens = resolve_chunk_tokens(self.config, self.block_tokens)
        self.blocks_per_chunk = self.chunk_tokens // self.block_tokens
        self.chunk_bytes = self.layout.chunk_bytes(self.chunk_tokens)
        model = vllm_config.model_config
        self.namespace = Namespace(
            model=f"{model.model}@{model.revision or ''}",
            layout_digest=self.layout.digest(),
            parallel=f"tp{par.tensor_parallel_size}pp{par.pipeline_parallel_size}",
            extra=self.config.namespace,
            secret=read_key_secret(self.config),
        )
        self.specs, self.states = state_setup(self, kv_cache_config)
        """The attention chunks' tier specs; the recurrent states' setup (hybrid models
        kvtier serves; None for the others)."""
        self.mm_content = ContentDigests() if self.config.mm_keys == "content" else None

    def key_inputs(self, request: Request) -> KeyInputs:
        """The request's key inputs; unkeyable (never a hit nor a store) for every request
        of a hybrid recurrent-state model whose states kvtier cannot serve."""
        inputs = key_inputs(request, self.mm_content)
        if self.groups.recurrent and not inputs.unkeyable:
            return dataclasses.replace(inputs, unkeyable=RECURRENT)
        return inputs

    def attention(self, per_group: Any) -> Any:
        """The attention groups' block lists of vLLM's per-group lists."""
        return attention_ids(per_group, self.groups.state_groups)

    def context(
        self, rank: int = 0, row_bytes: tuple[int, ...] = (), chunk_bytes: int = 0
    ) -> TierContext:
        """What the tier registry needs: rank 0 on the scheduler, the worker's own rank
        (and its engine's row and chunk sizes) on a worker."""
        return TierContext(
            chunk_bytes or self.chunk_bytes,
            self.namespace.for_rank(rank),
            self.blocks_per_chunk,
            row_bytes,
            world=self.world_size,
            sizing_bytes=self.chunk_bytes,
        )

    def disk_dir(self, rank: int) -> str | None:
        """The files of one tensor-parallel rank (each rank owns its shard's slab files) of
        the first tier that keeps files here (a disk tier); None without one."""
        return tier_files(self.config, self.context(rank), rank)


def _log_start(s: _Setup, stack: TierStack) -> None:
    if s.groups.recurrent:
        log.warning("%s", s.groups.recurrent)
    elif s.states is not None:
        log.info("%s", s.states.log_line())
    log.info(
        "kvtier: namespace %s; `kvtier purge %s` selects its chunks",
        s.namespace.chain_digest().hex(),
        s.namespace.purge_selector(),
    )
    log.info(
        "kvtier: tiers %s, chunks of %d tokens (%d bytes), sync budget %s",
        ", ".join(f"{t.name} ({len(t.index)} chunks held)" for t in stack.tiers),
        s.chunk_tokens,
        s.chunk_bytes,
        s.config.sync_budget,
    )


def _regions(
    s: _Setup, kvc: KVCacheConfig, kv_caches: dict[str, torch.Tensor], dims: dict[str, int] | None
) -> KVRegions | GroupedRegions:
    """The engine's KV memory as copy regions: one set per KV-cache group with HMA on."""
    if not s.grouped:
        return KVRegions.from_tensors(kv_caches, kvc.num_blocks, dims)
    # One region set per group: layers of different groups alias the same memory (a block
    # id belongs to one group at a time), so they must not be merged.
    per_group = [
        KVRegions.from_tensors(
            {n: kv_caches[n] for n in g.layer_names if n in kv_caches}, kvc.num_blocks, dims
        )
        for i, g in enumerate(kvc.kv_cache_groups)
        if i not in s.groups.state_groups
    ]
    return GroupedRegions(per_group, s.codec)


def _layer_loads(mode: str, regions: KVRegions | GroupedRegions) -> bool:
    """Whether sync loads go layer by layer (config ``layer_loads``). Only where the
    worker can: one KV-cache group whose KV is in host memory (a host-side wait would not
    order a GPU stream), with named layers."""
    able = isinstance(regions, KVRegions) and bool(regions.arrays and regions.layer_regions)
    if mode == "on" and not able:
        log.warning("kvtier: layer_loads='on' needs one KV group in host memory; off here")
    return able and mode == "on"  # "auto": off (docs/configuration.md: measurements)


def _layer_order(regions: KVRegions | GroupedRegions) -> list[tuple[list[str], list[int]]]:
    """Each KV tensor's layer names and region indices, in the forward's layer order
    (by the layer index in the name; tensors shared by several layers once)."""
    from vllm.model_executor.models.utils import extract_layer_index

    assert isinstance(regions, KVRegions)

    def index(name: str) -> int:
        try:
            return int(extract_layer_index(name))
        except (AssertionError, ValueError):
            return 1 << 30  # unknown: last (its wait then waits for every layer before it)

    names = sorted(regions.layer_regions, key=index)  # stable: the engine's order on ties
    out: dict[tuple[int, ...], list[str]] = {}
    for name in names:
        out.setdefault(tuple(regions.layer_regions[name]), []).append(name)
    return [(n, list(r)) for r, n in out.items()]


def _worker_side(
    s: _Setup, vllm_config: VllmConfig, kvc: KVCacheConfig, kv_caches: dict[str, torch.Tensor]
) -> WorkerSide:
    """A worker's side over the engine's KV tensors (the recurrent states' too, on a
    hybrid model): copy regions, the tiers' stores, the transfer engine."""
    mover = None
    if s.states is not None:
        mover = HybridWorkerSide.mover_for(s.states, kvc, kv_caches, _tp_rank())
        names = {n for i in s.groups.state_groups for n in kvc.kv_cache_groups[i].layer_names}
        kv_caches = {n: t for n, t in kv_caches.items() if n not in names}
    dims = require_dims(declared_block_dims(vllm_config, kvc, kv_caches))
    regions = _regions(s, kvc, kv_caches, dims)
    slot_bytes = regions.chunk_bytes(s.blocks_per_chunk)
    if slot_bytes != s.chunk_bytes:
        log.warning(
            "kvtier: engine chunk is %d bytes, geometry says %d; using the engine's",
            slot_bytes,
            s.chunk_bytes,
        )
    ctx = s.context(_tp_rank(), tuple(regions.row_bytes), slot_bytes)
    stores = build_stores(s.config, ctx, s.specs)  # fault wrappers included, if configured
    timeline.event("worker.register", phase="stores")
    engine = TransferEngine(regions, stores, s.blocks_per_chunk)
    layers = _layer_order(regions) if _layer_loads(s.config.layer_loads, regions) else []
    worker = (
        WorkerSide(engine, layers=layers)
        if mover is None
        else HybridWorkerSide(engine, mover, layers=layers)
    )
    timeline.event("worker.register", phase="ready", load_bandwidth=engine.load_bandwidth)
    log.info(
        "kvtier worker: %d KV regions, %d-byte chunks, load bandwidth %.1f GB/s, sync loads %s",
        len(regions.regions),
        slot_bytes,
        (engine.load_bandwidth or 0) / 1e9,
        f"layer by layer ({len(layers)} layers)" if layers else "before the forward",
    )
    return worker


def _log_step(
    manager: CacheManager, plan: StepPlan, scheduled: dict[str, int], preempted: Any
) -> None:
    """A step's plan on the timeline (``KVTIER_TIMELINE``) and in debug logs."""
    if timeline.enabled():
        timeline.event(
            "sched.step",
            step=manager.steps,
            scheduled=scheduled,
            loads=[(j.req_id, j.tier, j.sync) for j in plan.loads],
            stores=len(plan.stores),
            preempted=sorted(preempted),
        )
    if log.isEnabledFor(logging.DEBUG) and not plan.is_empty():
        log.debug(
            "kvtier step: loads sync=%d async=%d stores=%d flush=%d budget %d/%d B",
            sum(j.sync for j in plan.loads),
            sum(not j.sync for j in plan.loads),
            len(plan.stores),
            len(plan.flush),
            manager.budget.used,
            manager.budget.limit,
        )


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
            self.setup = _Setup(vllm_config, kv_cache_config)
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
            _log_start(s, stack)

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
        _log_step(self.manager, plan, dict(num_sched), preempted)
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
        self.worker = _worker_side(self.setup, self._vllm_config, self._kv_cache_config, kv_caches)

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
