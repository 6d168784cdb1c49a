"""Run a scripted workload on a real vLLM engine (CPU backend, SmolLM2) and dump JSON.

Used by the vLLM tests in a subprocess per engine configuration, because vLLM keeps
process-global state (the KV connector agent) that one process cannot rebuild.

    python tests/vllm_runner.py SPEC.json OUT.json

SPEC: {"connector": {...kv_connector_extra_config...} | null, "multiprocess": bool,
       "engine": {...LLM kwargs overrides...},
       "phases": [{"prompts": [[token ids], ...], "max_tokens": 12, "reset_before": bool}]}
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def main(spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    if not spec.get("multiprocess"):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    from kvtier.models import smollm2_path

    kw: dict[str, Any] = {
        "model": smollm2_path(),
        "dtype": "bfloat16",
        "max_model_len": 4096,
        "enforce_eager": True,
        "enable_prefix_caching": True,
        "block_size": 32,
        "max_num_seqs": 4,
        "seed": 0,
    }
    kw.update(spec.get("engine", {}))
    if spec.get("connector") is not None:
        kvt: dict[str, Any] = {
            "kv_connector": "KVTierConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": spec["connector"],
        }
        if not spec.get("by_name"):
            kvt["kv_connector_module_path"] = "kvtier.vllm"
        kw["kv_transfer_config"] = KVTransferConfig(**kvt)
    llm = LLM(**kw)
    out: dict[str, Any] = {"phases": []}
    prev: list[list[int]] = []
    for phase in spec["phases"]:
        if phase.get("reset_before"):
            llm.reset_prefix_cache()
        sp = SamplingParams(temperature=0.0, max_tokens=phase.get("max_tokens", 12))
        if "extend_previous" in phase:
            # Multi-turn: previous prompt + its answer + the new turn's tokens.
            last = out["phases"][-1]["outputs"]
            token_lists = [
                p + o + x for p, o, x in zip(prev, last, phase["extend_previous"], strict=True)
            ]
        else:
            token_lists = phase["prompts"]
        prev = token_lists
        prompts = [TokensPrompt(prompt_token_ids=p) for p in token_lists]
        t0 = time.perf_counter()
        if phase.get("sequential"):
            results = [llm.generate([p], sp, use_tqdm=False)[0] for p in prompts]
        else:
            results = llm.generate(prompts, sp, use_tqdm=False)
        out["phases"].append(
            {
                "outputs": [list(r.outputs[0].token_ids) for r in results],
                "request_ids": [r.request_id for r in results],
                "num_cached": [r.num_cached_tokens for r in results],
                "seconds": time.perf_counter() - t0,
            }
        )
    if spec.get("connector") is not None and not spec.get("multiprocess"):
        out["connector"] = connector_state(llm)
    with open(out_path, "w") as f:
        json.dump(out, f)


def connector_state(llm: Any) -> dict[str, Any]:
    """Scheduler- and worker-side state of kvtier after the workload (in-process only)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    core = llm.llm_engine.engine_core.engine_core
    conn = core.scheduler.connector
    # Let in-flight stores and releases finish: step the idle engine a few times.
    for _ in range(200):
        if not conn.manager.has_pending_jobs() and conn.manager.num_requests() == 0:
            break
        core.step()
        time.sleep(0.01)
    conn.get_kv_connector_stats()  # fold the last interval into the totals
    m = conn.manager
    index = m.tiers[0].index
    index.check()
    worker = get_kv_transfer_group().worker
    return {
        "metrics": conn.totals.to_dict(),
        "hit_sources": [
            [rid, {s.label: n for s, n in srcs.items()}] for rid, srcs in m.recent_hit_sources
        ],
        "steps": m.steps,
        "pending_jobs": m.has_pending_jobs(),
        "requests": m.num_requests(),
        "pins": sum(e.pins for e in index._entries.values()),
        "chunks": len(index),
        "chunk_tokens": m.chunk_tokens,
        "budget_limit": m.budget.limit,
        "bandwidth": m.budget.bandwidth,
        "step_seconds": m.budget.step_seconds,
        "worker_inflight": len(worker._inflight),
        "failed_reads": getattr(worker.engine.stores["cpu"], "failed_reads", 0),
    }


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
