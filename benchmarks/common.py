"""Shared helpers of the kvtier benchmarks: machine info, timing statistics, tables, JSON.

Imported as ``common`` by the benchmark scripts, which are run as files
(``.venv/bin/python benchmarks/<name>.py``), so this directory is on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo ("unknown" where it is not readable)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(**extra: Any) -> dict[str, Any]:
    """Platform, Python, torch and CPU facts for the results JSON."""
    import torch

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
    }
    with contextlib.suppress(AttributeError, OSError):
        info["cpu_affinity"] = len(os.sched_getaffinity(0))
    info.update(extra)
    return info


def time_calls(fn: Callable[[], Any], iters: int, warmup: int = 3) -> list[int]:
    """Nanoseconds of each of ``iters`` calls of ``fn`` (after ``warmup`` untimed calls and
    a garbage collection, so one run's garbage is not charged to the next)."""
    for _ in range(warmup):
        fn()
    gc.collect()
    clock = time.perf_counter_ns
    out = []
    for _ in range(iters):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


Timing = tuple[float, float]
"""Wall-clock and CPU seconds (all threads of the process) of one operation."""


def timed(fn: Callable[[], Any]) -> tuple[Timing, Any]:
    """``fn()``'s wall and process CPU seconds, and its result. CPU seconds count every
    thread of the process: a figure less sensitive to other work on the machine than
    wall time (though not to its effect on caches)."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0, time.process_time() - c0), out


def stats_ns(samples: Sequence[int]) -> dict[str, float]:
    """Median / min / p90 / mean of nanosecond samples, in microseconds."""
    xs = sorted(samples)
    p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
    return {
        "median_us": statistics.median(xs) / 1e3,
        "min_us": xs[0] / 1e3,
        "p90_us": p90 / 1e3,
        "mean_us": statistics.fmean(xs) / 1e3,
        "n": float(len(xs)),
    }


def worst_run(runs: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Repeated runs of one timing (``stats_ns`` dicts): the run with the highest median,
    which is what a summary reports, with every run's median and their best / median /
    worst (``median_us_best`` ...)."""
    meds = [r["median_us"] for r in runs]
    out: dict[str, Any] = dict(max(runs, key=lambda r: r["median_us"]))
    out.update(
        runs_median_us=meds,
        median_us_best=min(meds),
        median_us_median=statistics.median(meds),
        median_us_worst=max(meds),
    )
    return out


def spread(values: Sequence[float], *, lower_is_better: bool = True) -> dict[str, Any]:
    """Worst / median / best of one figure over repeated runs, and every run's value."""
    xs = sorted(values)
    best, worst = (xs[0], xs[-1]) if lower_is_better else (xs[-1], xs[0])
    return {"worst": worst, "median": statistics.median(xs), "best": best, "runs": list(values)}


def fmt_time_us(us: float) -> str:
    """A duration given in microseconds, in a readable unit."""
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.3f} ms"
    return f"{us:.2f} us"


def fmt_bytes(n: int) -> str:
    """1024-based size text: 4 KiB, 1 MiB, ..."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> str:
    """A plain aligned text table (first column left-aligned, the others right-aligned)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        parts = [
            row[i].ljust(widths[i]) if i == 0 else row[i].rjust(widths[i]) for i in range(len(row))
        ]
        return "  ".join(parts).rstrip()

    out = []
    if title:
        out.append(title)
    out.append(line(cells[0]))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells[1:])
    return "\n".join(out)


def write_json(path: str | None, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON to ``path`` (no-op when ``path`` is None)."""
    if not path:
        return
    p = Path(path)
    if p.parent != Path():
        p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    print(f"\nresults written to {p}")


def over_runs(runs: Sequence[dict[str, float | None]]) -> dict[str, float | None]:
    """Higher-is-better figures measured once per run, summarized over the runs: ``key``
    holds the worst run, ``key_median`` the median and ``key_best`` the best (None where a
    run did not measure it)."""
    out: dict[str, float | None] = {}
    for key in runs[0]:
        values = [r[key] for r in runs]
        if any(v is None for v in values):
            out[key] = out[f"{key}_median"] = out[f"{key}_best"] = None
            continue
        s = spread([float(v) for v in values if v is not None], lower_is_better=False)
        out[key], out[f"{key}_median"], out[f"{key}_best"] = s["worst"], s["median"], s["best"]
    return out


def interleaved_rounds(
    ops: dict[str, Callable[[], Timing]], rounds: int
) -> dict[str, list[Timing]]:
    """Every operation once per round, one warm-up round then ``rounds`` timed ones; the
    order of the operations is reversed every other round, so a drift within a round (a
    neighbour's load, the kernel's background work) favours no side of a comparison."""
    times: dict[str, list[Timing]] = {name: [] for name in ops}
    names = list(ops)
    for r in range(rounds + 1):  # round 0 is a warm-up
        for name in names if r % 2 == 0 else names[::-1]:
            t = ops[name]()
            if r:
                times[name].append(t)
    return times


def best_rounds(times: dict[str, list[Timing]]) -> tuple[dict[str, float], dict[str, float]]:
    """Per operation, its best round's wall and CPU seconds (each the minimum)."""
    wall = {k: min(w for w, _ in v) for k, v in times.items()}
    cpu = {k: min(c for _, c in v) for k, v in times.items()}
    return wall, cpu


def by_size(runs: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per chunk size (the i-th result of every run): every ratio of ``ratios_best`` as
    worst / median / best over the runs, the median run's GB/s per operation, and each
    run's figures."""
    cases = []
    for k in range(len(runs[0])):
        per_run = [r[k] for r in runs]
        first = per_run[0]
        cases.append(
            {
                "chunk_bytes": first["chunk_bytes"],
                "chunks": first["chunks"],
                "batch_bytes": first["batch_bytes"],
                "ratios": {
                    key: spread([p["ratios_best"][key] for p in per_run], lower_is_better=False)
                    for key in first["ratios_best"]
                },
                "gbps_median_run": {
                    op: statistics.median(p["gbps_best"][op] for p in per_run)
                    for op in first["gbps_best"]
                },
                "runs": per_run,
            }
        )
    return cases
