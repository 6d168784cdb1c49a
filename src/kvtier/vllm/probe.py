"""A vLLM worker extension that reports the CPU binding the model worker computes with.

Engines started by :mod:`kvtier.vllm.harness.runner` get ``worker_extension_cls`` set to
:class:`BindingProbe` (with or without the connector), and the runner calls
``collective_rpc("kvtier_binding")`` after its program: the answer is measured in the
worker process itself, after it ran the model, not the setting that was asked for.
"""

from __future__ import annotations

import os
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


class BindingProbe:
    """Mixed into vLLM's worker class; adds one RPC method."""

    def kvtier_binding(self) -> dict[str, Any]:
        return measure()
