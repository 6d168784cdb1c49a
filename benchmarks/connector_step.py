"""Per-step cost of ``build_connector_meta`` with many running requests (no engine).

Used by ``scheduler_overhead.py`` (part (f)). A real scheduler-side ``KVTierConnector``
(SmolLM2's config, 16-token blocks, its default CPU tier) bound to a real vLLM
``KVCacheManager``; ``RUNNING`` real ``Request`` objects of ``PROMPT`` tokens each are
looked up through the connector, allocated by the KV-cache manager and prefilled in one
step (its ``build_connector_meta`` plans their stores, which are then reported done). The
timed call is ``build_connector_meta`` of a decode step: every request scheduled for one
token, none completing a chunk of its prompt, so nothing is stored: what kvtier adds to
each step of a busy engine in steady state. One token is appended to each request between
steps (untimed), as the engine does. In alternate steps the connector gathers every
request's block ids as it did before ``CacheManager.store_due`` (vLLM builds them as a new
list per call), so both figures see the same machine load.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import time
from typing import Any

import torch

from common import stats_ns

RUNNING = 256
PROMPT = 2048
BLOCK = 16


def _connector_and_requests(running: int, prompt: int) -> tuple[Any, Any, list[Any]]:
    from vllm import SamplingParams
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    from kvtier.tools.models import smollm2_path
    from kvtier.vllm.connector import KVTierConnector

    max_len = prompt + 1024
    cfg = VllmConfig(
        model_config=ModelConfig(model=str(smollm2_path()), max_model_len=max_len),
        cache_config=CacheConfig(block_size=BLOCK),
        kv_transfer_config=KVTransferConfig(
            kv_connector="KVTierConnector",
            kv_connector_module_path="kvtier.vllm",
            kv_role="kv_both",
            # index only on the scheduler side: room for every prompt, no host memory
            kv_connector_extra_config={"cpu_bytes": "32GiB"},
        ),
    )
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=3, head_size=64, dtype=torch.bfloat16)
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(30)]
    num_blocks = running * (max_len // BLOCK) + 16
    kv = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=layers, kv_cache_spec=spec)],
    )
    connector = KVTierConnector(cfg, KVConnectorRole.SCHEDULER, kv)
    kvm = KVCacheManager(kv, max_len, BLOCK, BLOCK, enable_caching=False)
    connector.bind_kv_cache_manager(kvm)
    rng = random.Random(0)
    reqs = []
    for i in range(running):
        toks = [rng.randrange(49152) for _ in range(prompt)]
        req = Request(f"run-{i}", toks, SamplingParams(max_tokens=1024), None)
        n, _ = connector.get_num_new_matched_tokens(req, 0)
        assert n == 0
        blocks = kvm.allocate_slots(req, prompt)
        assert blocks is not None
        connector.update_state_after_alloc(req, blocks, 0)
        reqs.append(req)
    return connector, kvm, reqs


def _output(reqs: list[Any], n: int) -> Any:
    from vllm.v1.core.sched.output import SchedulerOutput

    sched = {r.request_id: n for r in reqs}
    return dataclasses.replace(
        SchedulerOutput.make_empty(),
        num_scheduled_tokens=sched,
        total_num_scheduled_tokens=n * len(reqs),
    )


def _finish_jobs(connector: Any, meta: Any) -> int:
    from kvtier.jobs import JobResult, WorkerReport

    plan = meta.plan
    jobs = [*plan.loads, *plan.stores]
    connector.manager.on_report(
        WorkerReport(
            [
                JobResult(j.job_id, j.req_id, j.kind, j.tier, j.sync, [True] * len(j.keys), 0, 0.0)
                for j in jobs
            ]
        )
    )
    return len(plan.stores)


def measure_connector_step(iters: int, running: int = RUNNING) -> dict[str, Any]:
    """Median ``build_connector_meta`` of ``iters`` decode steps with ``running`` requests,
    and of the prefill step that stores their prompts (one sample)."""
    connector, kvm, reqs = _connector_and_requests(running, PROMPT)
    gc.collect()
    clock = time.perf_counter_ns
    t0 = clock()
    meta = connector.build_connector_meta(_output(reqs, PROMPT))
    prefill_ns = clock() - t0
    stores = _finish_jobs(connector, meta)
    assert stores == running, stores
    for r in reqs:
        r.num_computed_tokens = PROMPT
    times: list[int] = []
    gather_all: list[int] = []
    manager = connector.manager
    due = manager.store_due
    for i in range(2 * (iters + 3)):
        # Odd steps: every request's blocks gathered, as before ``store_due`` (same load).
        manager.store_due = due if i % 2 == 0 else (lambda req_id, limit: True)
        for r in reqs:  # the last step's token (untimed)
            r.append_output_token_ids(7)
            assert kvm.allocate_slots(r, 1) is not None
        out = _output(reqs, 1)
        t0 = clock()
        meta = connector.build_connector_meta(out)
        t1 = clock()
        assert not meta.plan.stores and not meta.plan.loads
        for r in reqs:
            r.num_computed_tokens += 1
        if i >= 6:
            (times if i % 2 == 0 else gather_all).append(t1 - t0)
    manager.store_due = due
    return {
        "running": running,
        "prompt_tokens": PROMPT,
        "decode_step": stats_ns(times),
        "decode_step_gathering_every_request": stats_ns(gather_all),
        "prefill_step_us": prefill_ns / 1e3,
    }
