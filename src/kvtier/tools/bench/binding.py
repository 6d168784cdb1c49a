"""CPU binding of engines that are compared: set it explicitly, measure it, check it.

vLLM's CPU backend chooses an engine's OpenMP threads itself, and differently with and
without a KV connector: with one configured it reserves one more core for the engine
process, which on a 2-core machine overflows and falls back to reserving none, so the
connector's engine computes on 2 threads and the baseline on 1. A comparison between
such engines measures the thread count, not kvtier. So every engine a benchmark compares
gets the same explicit binding (:func:`binding_env`), each engine reports what its model
worker actually ran with (``kvtier.vllm.probe``), and :func:`check_equal` refuses a
comparison whose engines differ.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from kvtier.errors import ConfigError


def allowed_cpus() -> list[int]:
    """CPU ids this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def default_threads(multiprocess: bool) -> int:
    """Compute threads for an engine when none are given: every allowed core in process;
    one fewer with a separate model-worker process, whose engine-core process (scheduler,
    kvtier's scheduler side) then keeps a core, as vLLM does without a connector."""
    n = len(allowed_cpus())
    return max(1, n - 1) if multiprocess else n


def binding_env(threads: int, multiprocess: bool) -> dict[str, str]:
    """Environment that pins an engine to ``threads`` OpenMP threads, with or without a
    KV connector (set before vLLM starts).

    Multiprocess: the worker's OpenMP threads are bound to the first ``threads`` allowed
    cores (``VLLM_CPU_OMP_THREADS_BIND``; an explicit list is not reduced by vLLM's
    connector reservation). In process: vLLM binds nothing, so ``OMP_NUM_THREADS`` (and
    the caller's ``torch.set_num_threads``) decide.
    """
    cpus = allowed_cpus()
    if not 1 <= threads <= len(cpus):
        raise ConfigError(f"threads: must be 1..{len(cpus)} on this machine, got {threads}")
    env = {"OMP_NUM_THREADS": str(threads)}
    if multiprocess:
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cpus[:threads])
    return env


def describe(b: Mapping[str, Any]) -> str:
    return f"{b.get('omp_threads')} OpenMP thread(s) on cores {b.get('cpus')}"


def same_binding(bindings: Mapping[str, Mapping[str, Any] | None]) -> bool:
    """Whether every engine reported the same thread count and cores."""
    seen = {
        (b.get("omp_threads"), tuple(b.get("cpus") or ())) if b else None for b in bindings.values()
    }
    return len(seen) == 1 and None not in seen


def check_equal(bindings: Mapping[str, Mapping[str, Any] | None]) -> None:
    """Raise ConfigError (one line) unless every engine ran with the same measured binding."""
    if same_binding(bindings):
        return
    parts = ", ".join(
        f"{mode}: {describe(b) if b else 'not measured'}" for mode, b in bindings.items()
    )
    raise ConfigError(
        f"refusing to compare engines that computed on different CPU bindings ({parts}); "
        "run them with the same --threads"
    )
