"""kvtier's CPU load/store copy bandwidth against a plain ``torch.index_select`` gather.

What it measures, per chunk size S in 4 KiB, 16 KiB, 64 KiB, 256 KiB, 1 MiB, 4 MiB:

- Setup: an "engine" KV tensor of ~512 MiB viewed as ``[num_blocks, S]`` uint8 (one region,
  one block = one chunk, ``blocks_per_chunk=1``; filled with distinct data first, so every
  page is touched), wrapped by ``KVRegions.from_tensors([pool], num_blocks)``; a ``CpuSlab``
  whose slots are pre-touched; ``n = min(4096, num_blocks // 2)`` chunks per batch; random
  distinct engine block ids (so a store *gathers* from random blocks into slab slots
  ``0..n-1`` and a load *scatters* slab slots ``0..n-1`` into random blocks).
- ``engine``: a ``TransferEngine`` job of kind "store" / "load", timed end to end
  (``submit`` + ``wait``): the copy plan built on the caller's thread (``engine.plan``:
  runs of consecutive slab slots), the hand-off to the queue thread, the copies (per region
  and run: one ``index_select(out=)`` gather for a store, one NumPy fancy-index scatter for a
  load), the completion. Stores go to the normal queue, loads to the expedited (sync) one.
- ``direct``: the data path alone, ``engine.run_plan`` with the plan built beforehand (what
  the queue thread executes), so the plan and thread hand-off costs show.
- ``plan``: building that plan (the part of ``submit`` run on the caller's thread).
- Baselines, same rows and bytes, same run: ``torch.index_select(pool, 0, idx, out=buf)``
  (gather; the reference for the ratios) and ``pool.index_copy_(0, idx, buf)`` (scatter; the
  direct analogue of a load, shown for context).

All operations of one size run interleaved, ``--repeats`` rounds after one warm-up round;
GB/s (1e9 bytes/s) from the best round, medians kept in the JSON. Results are checked for
byte equality once per size. Python's cyclic GC heap is frozen after setup (``gc.freeze()``,
as vLLM does after start-up); GC stays enabled. ``torch.set_num_threads(1)`` for every
copy, kvtier's and the baselines' alike (the queue threads inherit it), so the comparison is
per core.

Headline: kvtier GB/s / gather GB/s, minimum over chunk sizes >= 64 KiB, engine path
(target >= 0.8); the small-chunk ratios are reported as they are.
Run: ``.venv/bin/python benchmarks/copy_bandwidth.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from common import fmt_bytes, format_table, machine_info, write_json
from kvtier.jobs import JobKind, TransferJob
from kvtier.tiers.cpu import CpuSlab
from kvtier.transfer import KVRegions, TransferEngine
from kvtier.transfer.host_memory import HostBuffer

KiB, MiB = 1 << 10, 1 << 20
CHUNK_SIZES = (4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB)
POOL_BYTES = 512 * MiB
MAX_CHUNKS = 4096
TARGET_RATIO = 0.8
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

    def __init__(
        self, size: int, pool: torch.Tensor, slab_buf: torch.Tensor, out_buf: torch.Tensor
    ) -> None:
        self.size = size
        self.rows = POOL_BYTES // size
        self.n = min(MAX_CHUNKS, self.rows // 2)
        self.nbytes = self.n * size
        self.pool = pool[: self.rows * size].view(self.rows, size)
        self.slab = CpuSlab(self.n, [size], 1, buffer=slab_buf)
        self.out = out_buf[: self.nbytes].view(self.n, size)
        self.regions = KVRegions.from_tensors([self.pool], self.rows, block_dim=0)
        self.engine = TransferEngine(self.regions, {"cpu": self.slab}, blocks_per_chunk=1)
        gen = torch.Generator().manual_seed(size)
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
        return TransferJob(job_id, "bench", kind, "cpu", sync, self.keys, self.slots, blocks)

    def _plan(self, job: TransferJob) -> tuple[TransferJob, Any]:
        """The copy plan TransferEngine.submit builds on the caller's thread."""
        return job, self.engine.plan(job)

    # -- the timed operations (each returns seconds) ------------------------------------

    def gather(self) -> float:
        t0 = time.perf_counter()
        torch.index_select(self.pool, 0, self.store_idx, out=self.out)
        return time.perf_counter() - t0

    def scatter(self) -> float:
        t0 = time.perf_counter()
        self.pool.index_copy_(0, self.load_idx, self.out)
        return time.perf_counter() - t0

    def plan_store(self) -> float:
        job = self._job("store", self.store_idx)
        t0 = time.perf_counter()
        self._plan(job)
        return time.perf_counter() - t0

    def plan_load(self) -> float:
        job = self._job("load", self.load_idx)
        t0 = time.perf_counter()
        self._plan(job)
        return time.perf_counter() - t0

    def direct_store(self) -> float:
        t0 = time.perf_counter()
        ok = self.engine.run_plan(*self.store_segs)
        dt = time.perf_counter() - t0
        assert all(ok)
        return dt

    def direct_load(self) -> float:
        t0 = time.perf_counter()
        ok = self.engine.run_plan(*self.load_segs)
        dt = time.perf_counter() - t0
        assert all(ok)
        return dt

    def _engine(self, kind: JobKind, idx: torch.Tensor) -> float:
        job = self._job(kind, idx)  # ids and block list: engine-independent, untimed
        engine = self.engine
        t0 = time.perf_counter()
        engine.submit(job)
        engine.wait([job.job_id])
        dt = time.perf_counter() - t0
        (res,) = engine.poll()
        assert res.job_id == job.job_id and res.all_ok and res.nbytes == self.nbytes, res
        return dt

    def engine_store(self) -> float:
        return self._engine("store", self.store_idx)

    def engine_load(self) -> float:
        return self._engine("load", self.load_idx)

    # -- correctness ----------------------------------------------------------------------

    def check(self) -> None:
        """Byte equality of every path against plain indexing (untimed)."""
        slab_rows = self.slab.flat[: self.nbytes].view(self.n, self.size)
        for store in (self.direct_store, self.engine_store):
            slab_rows.zero_()
            store()
            assert torch.equal(slab_rows, self.pool[self.store_idx]), "store mismatch"
        self.gather()
        assert torch.equal(self.out, slab_rows), "gather mismatch"
        for load in (self.direct_load, self.engine_load):
            self.pool[self.load_idx] = 0
            load()
            assert torch.equal(self.pool[self.load_idx], slab_rows), "load mismatch"

    def close(self) -> None:
        self.engine.close()


def run_size(
    size: int, pool: torch.Tensor, slab_buf: torch.Tensor, out_buf: torch.Tensor, repeats: int
) -> dict[str, Any]:
    bench = SizeBench(size, pool, slab_buf, out_buf)
    try:
        bench.check()
        ops: dict[str, Callable[[], float]] = {name: getattr(bench, name) for name in OPS}
        times: dict[str, list[float]] = {name: [] for name in OPS}
        # As vLLM does after start-up: long-lived objects leave the cyclic GC's view, so a
        # full collection (~70 ms over torch's import-time objects on this box) does not
        # land on whichever operation happens to trigger it.
        gc.collect()
        gc.freeze()
        for r in range(repeats + 1):  # round 0 is a warm-up
            for name, fn in ops.items():
                dt = fn()
                if r:
                    times[name].append(dt)
        best = {k: min(v) for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in times.items()}
        nb = bench.nbytes

        def gbps(seconds: float) -> float:
            return nb / seconds / 1e9

        out: dict[str, Any] = {
            "chunk_bytes": size,
            "chunks": bench.n,
            "pool_rows": bench.rows,
            "batch_bytes": nb,
            "seconds_best": best,
            "seconds_median": med,
            "gbps_best": {k: gbps(v) for k, v in best.items() if not k.startswith("plan")},
            "gbps_median": {k: gbps(v) for k, v in med.items() if not k.startswith("plan")},
        }
        for stat, t in (("best", best), ("median", med)):
            out[f"ratios_{stat}"] = {
                "engine_load_vs_gather": t["gather"] / t["engine_load"],
                "engine_store_vs_gather": t["gather"] / t["engine_store"],
                "direct_load_vs_gather": t["gather"] / t["direct_load"],
                "direct_store_vs_gather": t["gather"] / t["direct_store"],
                "engine_load_vs_scatter": t["scatter"] / t["engine_load"],
                "direct_load_vs_scatter": t["scatter"] / t["direct_load"],
            }
        return out
    finally:
        gc.unfreeze()
        bench.close()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--json", metavar="PATH", help="write the results JSON here")
    ap.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    ap.add_argument("--repeats", type=int, default=0, help="timed rounds per size (override)")
    args = ap.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 7)

    torch.set_num_threads(1)
    print(
        f"kvtier copy bandwidth: torch.set_num_threads(1) for kvtier and baselines alike; "
        f"pool {fmt_bytes(POOL_BYTES)}; best of {repeats} rounds (+1 warm-up); "
        f"GB/s = 1e9 bytes/s; gc.freeze() after setup; torch {torch.__version__}, "
        f"_foreach_copy_ {'available' if hasattr(torch, '_foreach_copy_') else 'MISSING'}\n"
    )
    t_start = time.perf_counter()
    pool = torch.empty(POOL_BYTES, dtype=torch.uint8)
    torch.arange(POOL_BYTES // 8, out=pool.view(torch.int64))  # distinct data, pages touched
    max_batch = max(min(MAX_CHUNKS, (POOL_BYTES // s) // 2) * s for s in CHUNK_SIZES)
    # The CPU tier's own kind of memory (HostBuffer: anonymous mapping, huge pages where
    # the kernel allows), made ready before measuring: the steady state after start-up.
    host = HostBuffer(max_batch)
    host.wait_ready()
    slab_buf = host.tensor
    out_buf = torch.zeros(max_batch, dtype=torch.uint8)

    results = []
    for size in CHUNK_SIZES:
        res = run_size(size, pool, slab_buf, out_buf, repeats)
        results.append(res)
        print(f"  measured {fmt_bytes(size):>7} ({time.perf_counter() - t_start:5.1f} s)")

    rows = []
    for res in results:
        g, t, r = res["gbps_best"], res["seconds_best"], res["ratios_best"]
        for op in ("load", "store"):
            engine_s, direct_s = t[f"engine_{op}"], t[f"direct_{op}"]
            rows.append(
                [
                    fmt_bytes(res["chunk_bytes"]),
                    op,
                    res["chunks"],
                    fmt_bytes(res["batch_bytes"]),
                    f"{g['gather']:.2f}",
                    f"{g['scatter']:.2f}" if op == "load" else "",
                    f"{g[f'direct_{op}']:.2f}",
                    f"{g[f'engine_{op}']:.2f}",
                    f"{r[f'engine_{op}_vs_gather']:.2f}",
                    f"{r[f'direct_{op}_vs_gather']:.2f}",
                    f"{t[f'plan_{op}'] * 1e3:.2f}",
                    f"{(engine_s - direct_s) * 1e3:.2f}",
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
                "eng/gather",
                "dir/gather",
                "plan ms",
                "eng-dir ms",
            ],
            rows,
            title="GB/s, best round. gather = torch.index_select (the baseline); scatter = "
            "pool.index_copy_ (context only: torch's CPU kernel is elementwise);\n"
            "direct = engine.run_plan with a prebuilt plan; engine = TransferEngine "
            "submit + wait; plan = building the plan in submit;\n"
            "eng-dir = engine minus direct time: plan + hand-off + the queue thread's "
            "per-job bookkeeping",
        )
    )

    big = [r for r in results if r["chunk_bytes"] >= HEADLINE_MIN_SIZE]
    small = {fmt_bytes(r["chunk_bytes"]): r for r in results if r["chunk_bytes"] < 64 * KiB}

    def min_ratio(key: str, stat: str = "best") -> float:
        return min(r[f"ratios_{stat}"][key] for r in big)

    summary: dict[str, Any] = {
        "min_load_ratio_ge_64k": min_ratio("engine_load_vs_gather"),
        "min_store_ratio_ge_64k": min_ratio("engine_store_vs_gather"),
        "min_load_ratio_ge_64k_median": min_ratio("engine_load_vs_gather", "median"),
        "min_store_ratio_ge_64k_median": min_ratio("engine_store_vs_gather", "median"),
        "min_direct_load_ratio_ge_64k": min_ratio("direct_load_vs_gather"),
        "min_direct_store_ratio_ge_64k": min_ratio("direct_store_vs_gather"),
        "small_chunk_ratios": {
            name: {
                "engine_load_vs_gather": r["ratios_best"]["engine_load_vs_gather"],
                "engine_store_vs_gather": r["ratios_best"]["engine_store_vs_gather"],
                "direct_load_vs_gather": r["ratios_best"]["direct_load_vs_gather"],
                "direct_store_vs_gather": r["ratios_best"]["direct_store_vs_gather"],
            }
            for name, r in small.items()
        },
        "target_ratio": TARGET_RATIO,
        "threads": torch.get_num_threads(),
    }
    summary["load_target_met"] = summary["min_load_ratio_ge_64k"] >= TARGET_RATIO
    summary["store_target_met"] = summary["min_store_ratio_ge_64k"] >= TARGET_RATIO

    print()
    print("summary (engine path, kvtier GB/s / index_select gather GB/s, best rounds)")
    for op in ("load", "store"):
        v = summary[f"min_{op}_ratio_ge_64k"]
        verdict = "MET" if summary[f"{op}_target_met"] else "MISSED"
        print(
            f"  {op:<5} min over chunks >= 64 KiB: {v:.2f} (median rounds: "
            f"{summary[f'min_{op}_ratio_ge_64k_median']:.2f}; direct path: "
            f"{summary[f'min_direct_{op}_ratio_ge_64k']:.2f}); target >= {TARGET_RATIO}: "
            f"{verdict}"
        )
    for name, ratios in summary["small_chunk_ratios"].items():
        print(
            f"  {name:>6} chunks: load {ratios['engine_load_vs_gather']:.2f}, "
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
                "warmup_rounds": 1,
                "statistic": "best round (medians also recorded)",
                "gc": "enabled, heap frozen (gc.freeze) after each size's setup",
                "torch_num_threads": torch.get_num_threads(),
                "store": "engine blocks (random, distinct) -> slab slots 0..n-1, normal queue",
                "load": "slab slots 0..n-1 -> engine blocks (random, distinct), expedited queue",
                "gather_baseline": "torch.index_select(pool, 0, idx, out=buf)",
                "scatter_baseline": "pool.index_copy_(0, idx, buf)",
                "quick": args.quick,
            },
            "cases": results,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
