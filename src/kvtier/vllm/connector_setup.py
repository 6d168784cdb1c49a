"""What both roles of :class:`kvtier.vllm.connector.KVTierConnector` derive from vLLM's
config (:class:`ConnectorSetup`), and the pieces the connector builds from it: the worker
side (copy regions, transfer engine, layer order) and its start and step log lines.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import torch

from kvtier import timeline
from kvtier.config import KVTierConfig
from kvtier.contract.kind import TierContext
from kvtier.jobs import StepPlan
from kvtier.keyinputs import KeyInputs
from kvtier.keys import Namespace
from kvtier.keysecret import read_key_secret
from kvtier.manager import CacheManager, resolve_chunk_tokens
from kvtier.stack.build import build_stores, tier_files
from kvtier.stack.stack import TierStack
from kvtier.transfer.engine import TransferEngine
from kvtier.transfer.groups import BlockIdCodec, GroupedRegions
from kvtier.transfer.regions import KVRegions
from kvtier.vllm.groups import RECURRENT, read_groups, sink_layers
from kvtier.vllm.hybrid import HybridWorkerSide, attention_ids, state_setup
from kvtier.vllm.key_inputs import key_inputs
from kvtier.vllm.kv_layout import declared_block_dims, require_dims
from kvtier.vllm.mm_content import ContentDigests
from kvtier.worker import WorkerSide

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
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


class ConnectorSetup:
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


def log_start(s: ConnectorSetup, stack: TierStack) -> None:
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
    s: ConnectorSetup,
    kvc: KVCacheConfig,
    kv_caches: dict[str, torch.Tensor],
    dims: dict[str, int] | None,
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


def worker_side(
    s: ConnectorSetup,
    vllm_config: VllmConfig,
    kvc: KVCacheConfig,
    kv_caches: dict[str, torch.Tensor],
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


def log_step(
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
