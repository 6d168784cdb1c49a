"""The engine side of ``kvtier soak``: a runner program plus faults, memory and leak checks.

``python -m kvtier.vllm.harness.soak SPEC.json OUT.json`` runs a :mod:`kvtier.vllm.harness.runner`
spec whose program is a list of ``serve`` ops (rounds), with two additions under
``"soak"``:

- ``"disk_faults"``: ``{"seed", "kinds", "interval", "enospc_seconds"}`` starts a
  :class:`~kvtier.tools.soak.disk_faults.DiskFaultInjector` on the disk tier's directory for the
  whole program (real corrupt / truncated slab files, a full filesystem);
- ``"step_warmup": N`` first runs one prefill of every step size from 1 to N tokens
  (the engine keeps native state per new step size; see ``SoakOptions.step_warmup``);
- after every round the process's resident memory (``VmRSS``) is recorded (the first
  figure before the first round, after the step-size warm-up).

After the last round the engine is drained and kvtier's state is checked for leaks: jobs
still tracked (scheduler, worker, transfer queues), requests still tracked, pins left,
slots neither free nor holding a ready chunk, index invariants. OUT holds the rounds'
results (as the runner writes them), ``rss_bytes`` per round, ``faults`` (what the stores
and the injector did, by kind), ``leaks`` and kvtier's metrics.
"""

from __future__ import annotations

import time
from typing import Any

from kvtier.vllm.harness import runner


def rss_bytes() -> int:
    """Resident set size of this process, from /proc (0 where unavailable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _stores(llm: Any) -> dict[str, Any]:
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    worker: Any = getattr(get_kv_transfer_group(), "worker", None)
    return dict(worker.engine.stores) if worker is not None else {}


def fault_counts(llm: Any) -> dict[str, int]:
    """What the stores injected or detected, by kind (FaultyStore wrappers and DiskSlab)."""
    out: dict[str, int] = {}
    for name, store in _stores(llm).items():
        inner = getattr(store, "inner", None)
        if inner is not None:  # a FaultyStore
            out[f"{name}_read_error"] = store.failed_reads
            out[f"{name}_write_error"] = store.failed_writes
            out[f"{name}_slow_copy"] = store.slow_ops
            store = inner
        for attr in ("corrupt_reads", "io_errors", "stale_reads"):
            if hasattr(store, attr):
                out[f"{name}_detected_{attr}"] = int(getattr(store, attr))
    return out


def leaks(llm: Any) -> dict[str, Any]:
    """kvtier's leftovers once the engine is drained (all zero when nothing leaked)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    from kvtier.tiers.index import SlotIndex
    from kvtier.tiers.index_entry import STORING

    conn = runner._connector(llm)
    runner.drain(llm)
    m = conn.manager
    group: Any = get_kv_transfer_group()
    worker: Any = group.worker
    out: dict[str, Any] = {
        "jobs": len(m.jobs) + len(m.loads.loading) + len(m.movement.pending),
        "worker_jobs": len(worker._inflight) + len(worker.engine.pending()),
        "requests": m.num_requests(),
        "pins": 0,
        "slots": 0,
        "index_errors": [],
        "tiers": {},
    }
    for tier in m.tiers:
        index = tier.index
        if not isinstance(index, SlotIndex):
            continue  # a shared tier holds no pins or slots of this engine
        entries = index.entries.values()
        pins = sum(e.pins for e in entries)
        storing = sum(e.state == STORING for e in entries)
        lost = index.num_slots - len(index.entries) - index.free_slots
        try:
            index.check()
        except AssertionError as e:
            out["index_errors"].append(f"{tier.name}: {e}")
        out["pins"] += pins
        out["slots"] += storing + max(0, lost)
        out["tiers"][tier.name] = {
            "chunks": len(index),
            "free": index.free_slots,
            "storing": storing,
            "pins": pins,
        }
    return out


def warm_step_sizes(llm: Any, max_tokens: int) -> None:
    """One prefill of each step size 1..``max_tokens`` (one prompt that many tokens long,
    never seen before nor again: ids from a range of its own, seeded by the size)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0)
    vocab = int(llm.llm_engine.model_config.get_vocab_size())
    for n in range(1, max_tokens + 1):
        ids = [40_000 + (n * 7919 + i * 104_729) % 9_000 for i in range(n)]
        if vocab <= 49_000:  # a tiny model: the ids folded into its vocabulary as the soak's
            ids = [3 + t % (vocab - 3) for t in ids]
        llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    llm = runner.build_llm(spec)
    out: dict[str, Any] = {"startup_seconds": time.perf_counter() - t0, "ops": []}
    soak = spec.get("soak") or {}
    if soak.get("step_warmup"):
        t1 = time.perf_counter()
        warm_step_sizes(llm, int(soak["step_warmup"]))
        out["step_warmup_seconds"] = time.perf_counter() - t1
    conn = runner._connector(llm)
    injector = None
    df = soak.get("disk_faults")
    if df and conn is not None:
        from kvtier.tools.soak.disk_faults import DiskFaultInjector

        disk_dir = conn.setup.disk_dir(0)
        injector = DiskFaultInjector(
            disk_dir,
            int(df.get("seed", 0)),
            tuple(df.get("kinds", ("corrupt", "truncate", "enospc"))),
            float(df.get("interval", 1.0)),
            float(df.get("enospc_seconds", 1.0)),
        ).start()
    history: dict[str, list[int]] = {}
    out["rss_bytes"] = [rss_bytes()]
    try:
        for op in spec["program"]:
            if op["op"] != "serve":
                raise ValueError(f"soak runner: only serve ops, got {op['op']!r}")
            out["ops"].append(runner.serve(llm, op, history))
            out["rss_bytes"].append(rss_bytes())
    finally:
        if injector is not None:
            injector.stop()
    if conn is not None:
        out["leaks"] = leaks(llm)
        conn.get_kv_connector_stats()  # fold the last interval into the totals
        out["metrics"] = conn.totals.to_dict()
        out["faults"] = fault_counts(llm)
        out["preemptions"] = conn.preemptions
        if injector is not None:
            out["faults"].update({f"disk_{k}": n for k, n in injector.counts.items()})
            out["faults_not_possible"] = dict(injector.misses)
    return out


def main(argv: list[str] | None = None) -> int:
    return runner.spec_main("kvtier.vllm.harness.soak", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
