"""Several engine runs in one process, one after another (the model-coverage tests).

``python -m kvtier.vllm.harness.model_matrix SPEC.json OUT.json`` with SPEC ``{"runs": [runner
spec, ...]}`` (see :mod:`kvtier.vllm.harness.runner`) executes each run's program on a fresh
in-process engine and tears it down (engine core, KV connector agent, distributed state)
before the next, so one interpreter start and one torch/vLLM import serve many small
engines. OUT is ``{"runs": [result, ...]}``: the runner's result, or ``{"error": message,
"error_type": name, "seconds": s}`` for an engine that refused to start (a refusal is a
result to check, not a crash). Put runs expected to fail last: a failed start may leave
state behind that a later engine trips over. ``"inspect": "scheduler"`` inspects kvtier's
scheduler side only (its workers run in other processes: tensor parallel).
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any

from kvtier.vllm.harness import runner


def _teardown(llm: Any) -> None:
    from vllm.distributed.kv_transfer.kv_transfer_state import ensure_kv_transfer_shutdown
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    if llm is not None:
        with contextlib.suppress(Exception):  # a half-built engine: nothing more to stop
            llm.llm_engine.engine_core.shutdown()
    ensure_kv_transfer_shutdown()
    cleanup_dist_env_and_memory()
    gc.collect()


def _inspect_scheduler(llm: Any) -> dict[str, Any]:
    """kvtier's scheduler side only: for engines whose workers run in other processes
    (tensor parallel, ``"inspect": "scheduler"``) or that have none (a hybrid
    recurrent-state model, offload off). ``rank_digests``: every rank's namespace digest
    (hex), as its disk and remote envelopes carry it."""
    conn = runner._connector(llm)
    runner.drain(llm)
    conn.get_kv_connector_stats()  # fold the last interval into the totals
    m, s = conn.manager, conn.setup
    return {
        "metrics": conn.totals.to_dict(),
        "tier_chunks": {t.name: len(t.index) for t in m.tiers},
        "pending_jobs": m.has_pending_jobs(),
        "recurrent": s.groups.recurrent,
        "rank_digests": [s.namespace.for_rank(r).digest().hex() for r in range(s.world_size)],
        "worker": False,
    }


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One run (as ``runner.run``), the engine torn down afterwards whatever happened."""
    t0 = time.perf_counter()
    llm = None
    try:
        llm = runner.build_llm(spec)
    except Exception as e:  # the engine refused to start: report what it said
        _teardown(None)
        return {
            "error": str(e),
            "error_type": type(e).__name__,
            "seconds": time.perf_counter() - t0,
        }
    try:
        conn = runner._connector(llm)
        if spec.get("inspect") and conn is not None:
            scheduler_only = conn.setup.groups.recurrent or spec["inspect"] == "scheduler"
            if scheduler_only:  # its workers are in other processes, or it has none
                out = runner.execute(llm, {**spec, "inspect": False}, t0)
                out["kvtier"] = _inspect_scheduler(llm)
            else:
                out = runner.execute(llm, spec, t0)
            out["kvtier"]["kv_groups"] = conn.setup.groups.num_groups
            out["kvtier"]["layout"] = [g.kind.value for g in conn.setup.layout.groups]
            return out
        return runner.execute(llm, spec, t0)
    finally:
        _teardown(llm)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    return {"runs": [run_one(s) for s in spec["runs"]]}


def main(argv: list[str] | None = None) -> int:
    return runner.spec_main("kvtier.vllm.harness.model_matrix", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
