"""kvtier's CPU load/store copy bandwidth against a plain ``torch.index_select`` gather.

The measurement runs ``--repeats`` times (default 5), each run on freshly allocated memory
(engine pool and CPU-tier slab); every figure is reported as worst / median / best over the
runs, and the summary's plain keys hold the **worst** run (``*_median`` / ``*_best``
beside them). Within a run, per chunk size S in 4 KiB, 16 KiB, 64 KiB, 256 KiB, 1 MiB,
4 MiB:

- Setup: an "engine" KV tensor of ~512 MiB viewed as ``[num_blocks, S]`` uint8 (one region,
  one block = one chunk, ``blocks_per_chunk=1``; filled with distinct data first, so every
  page is touched), wrapped by ``KVRegions.from_tensors([pool], num_blocks)``; a ``CpuSlab``
  over the CPU tier's own kind of memory (``HostBuffer``: anonymous mapping, transparent
  huge pages where the kernel grants them), made ready before measuring;
  ``n = min(4096, num_blocks // 2)`` chunks per batch; random distinct engine block ids (so
  a store *gathers* from random blocks into slab slots ``0..n-1`` and a load *scatters* slab
  slots ``0..n-1`` into random blocks).
- ``engine``: a ``TransferEngine`` job of kind "store" / "load", timed end to end
  (``submit`` + ``wait``): the copy plan built on the caller's thread (``engine.plan``:
  runs of consecutive slab slots), the hand-off to the queue thread, the copies (per region
  and run: one row gather for a store, one row scatter for a load, streaming from 256 KiB
  a call), the completion. Stores run on the calling thread
  (``TransferEngine.inline_stores``: a row store whose lane is idle, as every store here),
  loads on the expedited (sync) queue.
- ``direct``: the data path alone, ``engine.run_plan`` with the plan built beforehand (what
  the queue thread executes), so the plan and thread hand-off costs show.
- ``plan``: building that plan (the part of ``submit`` run on the caller's thread).
- Baselines, same rows, same bytes, **same memory**, same run: ``torch.index_select(pool, 0,
  idx, out=slab_rows)`` (gather; the reference for the ratios) and ``pool.index_copy_(0,
  idx, slab_rows)`` (scatter; the direct analogue of a load, shown for context), where
  ``slab_rows`` is the slab's own slots ``0..n-1``: both sides read and write the same
  pages, so whether the kernel backed the slab with huge pages (it varies with memory
  fragmentation, run to run) cannot favour one side. (The baseline used to write a
  separate ``torch.zeros`` buffer of small pages while kvtier wrote the slab's huge pages:
  a difference of memory, not of copy code, that moved the ratios with the kernel's luck
  in granting huge pages; each run records how much of the slab it got.)

All operations of one size run interleaved (the order reversed every other round),
``--rounds`` timed rounds (default 5) after one warm-up round; a run's figure for an
operation is its best round. Results are checked for byte equality once per size and run.
Python's cyclic GC heap is frozen after setup (``gc.freeze()``, as vLLM does after
start-up); GC stays enabled.
``torch.set_num_threads(1)`` for every copy, kvtier's and the baselines' alike (the queue
threads inherit it), so the comparison is per core: one copying thread on each side (the
baseline on the calling thread, kvtier on its queue thread while the caller waits).

Why kvtier's copies beat the gather by 1.3-1.7x at chunks of 64 KiB and more: they write
with streaming (non-temporal) stores (``src/kvtier/transfer/_rowcopy.c``), which skip
the read of every destination line that ``index_select`` (and memcpy) make before
writing it; below 256 KiB per copy call kvtier uses the plain copies (see
``kvtier.transfer.copy.STREAM_MIN_BYTES``). ``KVTIER_STREAM_COPY=0`` turns streaming off,
for a run of the plain copies against the same baseline.

Headline: kvtier GB/s / gather GB/s, minimum over chunk sizes >= 64 KiB, engine path
(target >= 0.95, in the worst run); the small-chunk ratios are reported as they are.
Run: ``.venv/bin/python benchmarks/copy_bandwidth.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from common import (
    Timing,
    best_rounds,
    by_size,
    fmt_bytes,
    format_table,
    interleaved_rounds,
    machine_info,
    over_runs,
    timed,
    write_json,
)
from kvtier.jobs import JobKind, TransferJob
from kvtier.tiers.cpu import CpuSlab
from kvtier.transfer import KVRegions, TransferEngine
from kvtier.transfer.host_memory import HostBuffer

KiB, MiB = 1 << 10, 1 << 20
CHUNK_SIZES = (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB)
POOL_BYTES = 512 * MiB
MAX_CHUNKS = 4096
TARGET_RATIO = 0.95
HEADLINE_MIN_SIZE = 64 * KiB
OPS = (
    "gather",
    "scatter",
    "plan_store",
    "plan_load",
    "direct_store",
    "direct_load",
    "engine_store",
    "engine_load",
)


class SizeBench:
    """Everything for one chunk size: pool view, slab, engine, jobs and their baselines."""

    def __init__(self, size: int, pool: torch.Tensor, slab_buf: torch.Tensor, seed: int) -> None:
        self.size = size
        self.rows = POOL_BYTES // size
        self.n = min(MAX_CHUNKS, self.rows // 2)
        self.nbytes = self.n * size
        self.pool = pool[: self.rows * size].view(self.rows, size)
        self.slab = CpuSlab(self.n, [size], 1, buffer=slab_buf)
        # The baselines' contiguous side is the slab's own slots 0..n-1: the same pages
        # kvtier's jobs write (store) and read (load).
        self.out = self.slab.flat[: self.nbytes].view(self.n, size)
        self.regions = KVRegions.from_tensors([self.pool], self.rows, block_dim=0)
        self.engine = TransferEngine(self.regions, {"cpu": self.slab}, blocks_per_chunk=1)
        gen = torch.Generator().manual_seed(seed)
        self.store_idx = torch.randperm(self.rows, generator=gen)[: self.n]
        self.load_idx = torch.randperm(self.rows, generator=gen)[: self.n]
        self.keys = [i.to_bytes(16, "little") for i in range(self.n)]
        self.slots = list(range(self.n))
        self._next_id = 1
        self.store_segs = self._plan(self._job("store", self.store_idx))
        self.load_segs = self._plan(self._job("load", self.load_idx))

    def _job(self, kind: JobKind, idx: torch.Tensor) -> TransferJob:
        job_id, self._next_id = self._next_id, self._next_id + 1
        sync = kind == "load"
        blocks = idx.tolist()
        return TransferJob(
            job_id=job_id,
            req_id="bench",
            kind=kind,
            tier="cpu",
            sync=sync,
            keys=self.keys,
            slots=self.slots,
            block_ids=blocks,
        )

    def _plan(self, job: TransferJob) -> tuple[TransferJob, Any]:
        """The copy plan TransferEngine.submit builds on the caller's thread."""
        return job, self.engine.plan(job)

    # -- the timed operations (each returns wall and CPU seconds) ----------------------

    def gather(self) -> Timing:
        return timed(lambda: torch.index_select(self.pool, 0, self.store_idx, out=self.out))[0]

    def scatter(self) -> Timing:
        return timed(lambda: self.pool.index_copy_(0, self.load_idx, self.out))[0]

    def plan_store(self) -> Timing:
        job = self._job("store", self.store_idx)
        return timed(lambda: self._plan(job))[0]

    def plan_load(self) -> Timing:
        job = self._job("load", self.load_idx)
        return timed(lambda: self._plan(job))[0]

    def direct_store(self) -> Timing:
        t, ok = timed(lambda: self.engine.run_plan(*self.store_segs))
        assert all(ok)
        return t

    def direct_load(self) -> Timing:
        t, ok = timed(lambda: self.engine.run_plan(*self.load_segs))
        assert all(ok)
        return t

    def _engine(self, kind: JobKind, idx: torch.Tensor) -> Timing:
        job = self._job(kind, idx)  # ids and block list: engine-independent, untimed
        engine = self.engine

        def run() -> None:
            engine.submit(job)
            engine.wait([job.job_id])

        t = timed(run)[0]
        (res,) = engine.poll()
        assert res.job_id == job.job_id and res.all_ok and res.nbytes == self.nbytes, res
        return t

    def engine_store(self) -> Timing:
        return self._engine("store", self.store_idx)

    def engine_load(self) -> Timing:
        return self._engine("load", self.load_idx)

    # -- correctness ----------------------------------------------------------------------

    def check(self) -> None:
        """Byte equality of every path against plain indexing (untimed)."""
        slab_rows = self.slab.flat[: self.nbytes].view(self.n, self.size)
        for store in (self.direct_store, self.engine_store, self.gather):
            slab_rows.zero_()
            store()
            assert torch.equal(slab_rows, self.pool[self.store_idx]), "store mismatch"
        for load in (self.direct_load, self.engine_load):
            self.pool[self.load_idx] = 0
            load()
            assert torch.equal(self.pool[self.load_idx], slab_rows), "load mismatch"

    def close(self) -> None:
        self.engine.close()


def _ratios(t: dict[str, float]) -> dict[str, float]:
    return {
        "engine_load_vs_gather": t["gather"] / t["engine_load"],
        "engine_store_vs_gather": t["gather"] / t["engine_store"],
        "direct_load_vs_gather": t["gather"] / t["direct_load"],
        "direct_store_vs_gather": t["gather"] / t["direct_store"],
        "engine_load_vs_scatter": t["scatter"] / t["engine_load"],
        "direct_load_vs_scatter": t["scatter"] / t["direct_load"],
    }


def run_size(
    size: int, pool: torch.Tensor, slab_buf: torch.Tensor, rounds: int, run: int
) -> dict[str, Any]:
    """One chunk size in one run: best round per operation."""
    bench = SizeBench(size, pool, slab_buf, seed=size + run)
    try:
        bench.check()
        ops: dict[str, Callable[[], Timing]] = {name: getattr(bench, name) for name in OPS}
        # As vLLM does after start-up: long-lived objects leave the cyclic GC's view, so a
        # full collection (~70 ms over torch's import-time objects on this box) does not
        # land on whichever operation happens to trigger it.
        gc.collect()
        gc.freeze()
        times = interleaved_rounds(ops, rounds)
        best, cpu = best_rounds(times)
        nb = bench.nbytes
        return {
            "chunk_bytes": size,
            "chunks": bench.n,
            "pool_rows": bench.rows,
            "batch_bytes": nb,
            "seconds_best": best,
            "seconds_all": {k: [w for w, _ in v] for k, v in times.items()},
            "cpu_seconds_best": cpu,
            "gbps_best": {k: nb / v / 1e9 for k, v in best.items() if not k.startswith("plan")},
            "ratios_best": _ratios(best),
            "cpu_ratios_best": _ratios(cpu),
        }
    finally:
        gc.unfreeze()
        bench.close()


def huge_page_bytes(address: int) -> int | None:
    """AnonHugePages of the mapping holding ``address`` (from /proc/self/smaps; None where
    it cannot be read): how much of a buffer the kernel backed with huge pages."""
    try:
        with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
            inside = False
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and ":" not in head:
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= address < hi
                elif inside and line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def one_run(run: int, rounds: int) -> dict[str, Any]:
    """Every chunk size on freshly allocated memory (engine pool and CPU-tier slab)."""
    pool = torch.empty(POOL_BYTES, dtype=torch.uint8)
    torch.arange(POOL_BYTES // 8, out=pool.view(torch.int64))  # distinct data, pages touched
    max_batch = max(min(MAX_CHUNKS, (POOL_BYTES // s) // 2) * s for s in CHUNK_SIZES)
    # The CPU tier's own kind of memory (HostBuffer: anonymous mapping, huge pages where
    # the kernel allows), made ready before measuring: the steady state after start-up.
    host = HostBuffer(max_batch)
    host.wait_ready()
    try:
        return {
            "sizes": [run_size(size, pool, host.tensor, rounds, run) for size in CHUNK_SIZES],
            "slab_huge_page_bytes": huge_page_bytes(host.address),
            "pool_huge_page_bytes": huge_page_bytes(pool.data_ptr()),
        }
    finally:
        host.close()


def _by_size(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per chunk size: :func:`common.by_size`, plus the plan and hand-off times."""
    cases = by_size(runs)
    for c in cases:
        best = [p["seconds_best"] for p in c["runs"]]
        c["plan_ms_median_run"] = {
            op: statistics.median(b[f"plan_{op}"] for b in best) * 1e3 for op in ("load", "store")
        }
        c["engine_minus_direct_ms_median_run"] = {
            op: statistics.median(b[f"engine_{op}"] - b[f"direct_{op}"] for b in best) * 1e3
            for op in ("load", "store")
        }
    return cases


def _headline(results: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """One run's figures: each engine / direct ratio's minimum over chunks >= 64 KiB."""
    big = [r for r in results if r["chunk_bytes"] >= HEADLINE_MIN_SIZE]

    def low(key: str, kind: str = "ratios_best") -> float:
        return float(min(r[kind][key] for r in big))

    return {
        "min_load_ratio_ge_64k": low("engine_load_vs_gather"),
        "min_store_ratio_ge_64k": low("engine_store_vs_gather"),
        "min_direct_load_ratio_ge_64k": low("direct_load_vs_gather"),
        "min_direct_store_ratio_ge_64k": low("direct_store_vs_gather"),
        "min_load_cpu_ratio_ge_64k": low("engine_load_vs_gather", "cpu_ratios_best"),
        "min_store_cpu_ratio_ge_64k": low("engine_store_vs_gather", "cpu_ratios_best"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--json", metavar="PATH", help="write the results JSON here")
    ap.add_argument("--quick", action="store_true", help="fewer runs and rounds (smoke test)")
    ap.add_argument("--repeats", type=int, default=0, help="runs of the measurement (default 5)")
    ap.add_argument("--rounds", type=int, default=0, help="timed rounds per size and run")
    args = ap.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 5)
    rounds = args.rounds or (2 if args.quick else 5)

    torch.set_num_threads(1)
    print(
        f"kvtier copy bandwidth: {repeats} runs, each on fresh memory, best of {rounds} rounds "
        f"(+1 warm-up) per size; torch.set_num_threads(1) for kvtier and baselines alike "
        f"(one copying thread each side); pool {fmt_bytes(POOL_BYTES)}; baselines write/read "
        f"the slab's own slots; GB/s = 1e9 bytes/s; gc.freeze() after setup; torch "
        f"{torch.__version__}, {len(os.sched_getaffinity(0))} CPUs usable\n"
    )
    t_start = time.perf_counter()
    runs, memory = [], []
    for run in range(repeats):
        got = one_run(run, rounds)
        runs.append(got.pop("sizes"))
        memory.append(got)
        head = _headline(runs[-1])
        huge = got["slab_huge_page_bytes"]
        print(
            f"  run {run + 1}/{repeats}: load {head['min_load_ratio_ge_64k']:.2f}, store "
            f"{head['min_store_ratio_ge_64k']:.2f}; slab in huge pages: "
            f"{'unknown' if huge is None else fmt_bytes(huge) if huge else '0'} "
            f"({time.perf_counter() - t_start:5.1f} s)"
        )
    cases = _by_size(runs)

    rows = []
    for c in cases:
        g, r = c["gbps_median_run"], c["ratios"]
        for op in ("load", "store"):
            e, d = r[f"engine_{op}_vs_gather"], r[f"direct_{op}_vs_gather"]
            rows.append(
                [
                    fmt_bytes(c["chunk_bytes"]),
                    op,
                    c["chunks"],
                    fmt_bytes(c["batch_bytes"]),
                    f"{g['gather']:.2f}",
                    f"{g['scatter']:.2f}" if op == "load" else "",
                    f"{g[f'direct_{op}']:.2f}",
                    f"{g[f'engine_{op}']:.2f}",
                    f"{e['worst']:.2f} / {e['median']:.2f} / {e['best']:.2f}",
                    f"{d['worst']:.2f} / {d['median']:.2f} / {d['best']:.2f}",
                    f"{c['plan_ms_median_run'][op]:.2f}",
                    f"{c['engine_minus_direct_ms_median_run'][op]:.2f}",
                ]
            )
    print()
    print(
        format_table(
            [
                "chunk",
                "op",
                "chunks",
                "batch",
                "gather",
                "scatter",
                "direct",
                "engine",
                "eng/gather w / m / b",
                "dir/gather w / m / b",
                "plan ms",
                "eng-dir ms",
            ],
            rows,
            title=f"GB/s: median over {repeats} runs of each run's best round. gather = "
            "torch.index_select into the slab's slots (the baseline); scatter =\n"
            "pool.index_copy_ from them (context only: torch's CPU kernel is elementwise); "
            "direct = engine.run_plan with a prebuilt plan; engine = TransferEngine\n"
            "submit + wait; plan = building the plan in submit; eng-dir = engine minus direct "
            "time: plan + hand-off + the queue thread's per-job bookkeeping;\n"
            "w / m / b: worst / median / best run",
        )
    )

    summary: dict[str, Any] = over_runs([_headline(r) for r in runs])
    small = [c for c in cases if c["chunk_bytes"] < HEADLINE_MIN_SIZE]
    summary["small_chunk_ratios"] = {
        fmt_bytes(c["chunk_bytes"]): {
            key: c["ratios"][key]["worst"]
            for key in (
                "engine_load_vs_gather",
                "engine_store_vs_gather",
                "direct_load_vs_gather",
                "direct_store_vs_gather",
            )
        }
        for c in small
    }
    summary["runs"] = repeats
    summary["target_ratio"] = TARGET_RATIO
    summary["threads"] = torch.get_num_threads()
    summary["load_target_met"] = summary["min_load_ratio_ge_64k"] >= TARGET_RATIO
    summary["store_target_met"] = summary["min_store_ratio_ge_64k"] >= TARGET_RATIO

    print()
    print(
        f"summary (engine path, kvtier GB/s / index_select gather GB/s, min over chunks >= "
        f"64 KiB; worst / median / best of {repeats} runs)"
    )

    def wmb(key: str) -> str:
        return f"{summary[key]:.2f} / {summary[key + '_median']:.2f} / {summary[key + '_best']:.2f}"

    for op in ("load", "store"):
        verdict = "MET" if summary[f"{op}_target_met"] else "MISSED"
        print(
            f"  {op:<5} {wmb(f'min_{op}_ratio_ge_64k')} (direct path: "
            f"{wmb(f'min_direct_{op}_ratio_ge_64k')}; CPU seconds: "
            f"{wmb(f'min_{op}_cpu_ratio_ge_64k')}); target >= {TARGET_RATIO} in the worst "
            f"run: {verdict}"
        )
    for name, ratios in summary["small_chunk_ratios"].items():
        print(
            f"  {name:>6} chunks, worst run: load {ratios['engine_load_vs_gather']:.2f}, "
            f"store {ratios['engine_store_vs_gather']:.2f} of gather (direct path: load "
            f"{ratios['direct_load_vs_gather']:.2f}, store {ratios['direct_store_vs_gather']:.2f})"
        )
    write_json(
        args.json,
        {
            "benchmark": "copy_bandwidth",
            "summary": summary,
            "machine": machine_info(torch_threads=torch.get_num_threads()),
            "workload": {
                "chunk_sizes": list(CHUNK_SIZES),
                "pool_bytes": POOL_BYTES,
                "max_chunks_per_batch": MAX_CHUNKS,
                "chunks_per_batch": "min(4096, pool rows // 2)",
                "blocks_per_chunk": 1,
                "regions": 1,
                "repeats": repeats,
                "rounds": rounds,
                "warmup_rounds": 1,
                "statistic": "per run: best round per operation, ratios per chunk size, min "
                "over sizes >= 64 KiB; summary keys: worst run (_median, _best: median and "
                "best run)",
                "gc": "enabled, heap frozen (gc.freeze) after each size's setup",
                "torch_num_threads": torch.get_num_threads(),
                "store": "engine blocks (random, distinct) -> slab slots 0..n-1, normal queue",
                "load": "slab slots 0..n-1 -> engine blocks (random, distinct), expedited queue",
                "gather_baseline": "torch.index_select(pool, 0, idx, out=slab slots 0..n-1)",
                "scatter_baseline": "pool.index_copy_(0, idx, slab slots 0..n-1)",
                "memory": "fresh pool (torch.empty) and slab (HostBuffer) per run; baselines "
                "use the slab's pages",
                "quick": args.quick,
            },
            "memory_per_run": memory,
            "cases": cases,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
