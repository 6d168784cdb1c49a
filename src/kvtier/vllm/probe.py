"""A vLLM worker extension that reports the CPU binding the model worker computes with,
and waits for kvtier's tier memory to be ready.

Engines started by :mod:`kvtier.vllm.harness.runner` get ``worker_extension_cls`` set to
:class:`BindingProbe` (with or without the connector), and the runner calls
``collective_rpc("kvtier_binding")`` after its program: the answer is measured in the
worker process itself, after it ran the model, not the setting that was asked for.
``collective_rpc("kvtier_settle")`` (the runner's ``settle`` op) waits until the worker's
CPU tier has faulted in its memory, which it does in the background after start-up: a
measurement of the steady state starts after it.
"""

from __future__ import annotations

import os
import time
from typing import Any


def measure() -> dict[str, Any]:
    """This process's compute binding: torch's OpenMP team size, the calling thread's
    cores, and the distinct core sets of all its threads (OpenMP threads bound by vLLM
    carry their own)."""
    import torch

    masks: set[tuple[int, ...]] = set()
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                masks.add(tuple(sorted(os.sched_getaffinity(int(tid)))))
            except OSError:
                continue  # the thread ended meanwhile
    except OSError:
        pass
    return {
        "omp_threads": torch.get_num_threads(),
        "cpus": sorted(os.sched_getaffinity(0)),
        "thread_cpu_sets": sorted(list(m) for m in masks),
        "pid": os.getpid(),
        "env": {
            k: os.environ[k]
            for k in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "OMP_PLACES")
            if k in os.environ
        },
    }


def settle(timeout: float) -> dict[str, Any]:
    """Wait (at most ``timeout`` seconds) until every host buffer of this worker's kvtier
    stores is ready; how long that took, and how long each buffer's warm-up took in all."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    t0 = time.perf_counter()
    warm: list[float | None] = []
    worker = getattr(get_kv_transfer_group(), "worker", None) if has_kv_transfer_group() else None
    if worker is not None:
        for store in worker.engine.stores.values():
            host = getattr(store, "host", None)
            if host is not None:
                host.wait_ready(timeout)
                warm.append(host.ready_seconds)
    return {"waited_seconds": time.perf_counter() - t0, "warm_seconds": warm}


class BindingProbe:
    """Mixed into vLLM's worker class; adds its RPC methods."""

    def kvtier_binding(self) -> dict[str, Any]:
        return measure()

    def kvtier_settle(self, timeout: float = 120.0) -> dict[str, Any]:
        return settle(timeout)
