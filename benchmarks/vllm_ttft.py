"""TTFT of a kvtier CPU-tier hit on vLLM (CPU backend, SmolLM2) against the engine's own
prefix cache and against recomputing, plus the connector's cost on a miss-only workload.

For each prompt size (default 1k and 4k tokens), median of ``--reps`` requests, each a
distinct document (no shared prefix), one request at a time on an idle engine:

(a) recompute: the prompt seen for the first time (engine without a connector);
(b) prefix hit: the same prompt again, served by the engine's own prefix cache;
(c) kvtier sync: the prompt was served once, the engine's prefix cache was reset, the
    prompt comes again and kvtier loads it from the CPU tier within the step, before the
    forward (``layer_loads="off"``);
(c') kvtier sync layer-wise: as (c) with ``layer_loads="on"``: the load is copied layer
    by layer while the forward runs (``ttft_sync_hit_layerwise_*``, and its ratio to (c));
(d) kvtier async: as (c) with ``sync_budget=0``, so the load runs between steps;
(e) kvtier disk hit (every size, when 4k is one of them): engine (d) also wrote every chunk to
    a disk tier; a new engine process on the same directory (page cache hot, CPU tier
    empty) serves the prompts from disk. ``ttft_recompute_over_disk_hit_4k`` is the
    smallest per-prompt ratio (recompute of a prompt / its disk hit), not the best one.
    This engine's ``sync_budget`` is 0, so its disk hits load between steps (the async
    reference; disk hits within the step, where a budget allows, are measured by
    ``benchmarks/prefetch.py``), and layer-wise loading, which applies to loads within the
    step, cannot change them: (e') is (e) on an engine with ``layer_loads="on"``,
    measured to show that (``ttft_disk_hit_layerwise_*``).

Every engine runs in process with the same explicit compute threads (``--threads``,
default all cores): vLLM would otherwise give the connector's engines another thread
count than the baseline. Each engine measures its binding; a run whose engines differ
prints one line and no comparison (``threads_equal`` false in the JSON).

Miss path: 12 distinct 1k-token prompts, 32 output tokens each, 4 at a time; throughput
(prompt + output tokens per second) with the connector on (0% reuse: every chunk is stored,
nothing is ever hit) and off. ``--miss-repeats`` pairs (default 5) of fresh engines, one
without and one with the connector, the order swapped every other pair, each serving the
same prompts once after a short warm-up and after kvtier's CPU tier faulted its memory in
(the runner's ``settle`` op: a one-time start-up cost of about 0.75 s per GiB of one core
here, done by a background thread at nice 10, which otherwise lands on the first requests
of a fresh engine; ``benchmarks/startup.py`` measures start-up). Each pair gives one ratio;
the summary's ``miss_path_throughput_ratio`` is the worst pair (median and best beside it).
Fresh engines of one configuration differ by several percent between processes (the
summary's ``miss_path_off_slowest_over_fastest``), so the miss path is also measured
within one engine with the connector: the same prompts ``2 x --miss-repeats`` times, its
stores on and off in turn (the runner's ``stores`` op), tiers and prefix cache emptied
before each run (``miss_path_stores_on_over_off_one_engine``, worst pair; median and best
beside it). That isolates what storing costs; the connector's hooks run in both halves
(with stores off it looks up and keys every request; that alone measured the same as no
connector: 899 / 874 against 883 / 897 tok/s).

Each engine configuration runs in its own process (``kvtier.vllm.harness.runner``); the engines
run one after another on the same machine, so ratios are taken within this run.
Run: ``.venv/bin/python benchmarks/vllm_ttft.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from typing import Any

from common import format_table, machine_info, write_json
from kvtier.errors import ConfigError
from kvtier.tools.bench.binding import check_equal, default_threads, describe, same_binding
from kvtier.tools.bench.engine import run_engine
from kvtier.tools.bench.machine import preferred_dtype
from kvtier.tools.bench.prompts import exact_document
from kvtier.tools.models import smollm2_path

MISS_PROMPTS, MISS_TOKENS, MISS_OUT, MISS_CONC = 12, 1024, 32, 4


def serve(
    name: str, prompts: list[list[int]], max_tokens: int = 1, conc: int = 1, prefix: str = ""
) -> dict[str, Any]:
    reqs = [
        {"id": f"{prefix or name}-{i}", "prompt": p, "max_tokens": max_tokens, "ignore_eos": True}
        for i, p in enumerate(prompts)
    ]
    return {"op": "serve", "name": name, "requests": reqs, "max_concurrency": conc}


def one_by_one(name: str, prompts: list[list[int]]) -> list[dict[str, Any]]:
    """Each prompt as its own op, so every request finds an idle engine."""
    return [serve(f"{name}", [p], prefix=f"{name}{i}") for i, p in enumerate(prompts)]


def program(
    kind: str, sizes: list[int], reps: int, docs: dict[int, list[list[int]]]
) -> list[dict[str, Any]]:
    # Measured once kvtier's CPU tier has faulted its memory in (as the miss path is).
    warm = [serve("warmup", [docs[sizes[0]][-1][:256]]), {"op": "settle"}]
    ops: list[dict[str, Any]] = list(warm)
    for size in sizes:
        prompts = docs[size][:reps]
        for i, p in enumerate(prompts):
            ops.append(serve(f"first-{size}", [p], prefix=f"first-{size}-{i}"))
            if kind == "off":
                ops.append(serve(f"again-{size}", [p], prefix=f"again-{size}-{i}"))
            else:
                ops.append({"op": "reset_prefix_cache"})
                ops.append(serve(f"again-{size}", [p], prefix=f"again-{size}-{i}"))
    return ops


MISS_CONNECTOR = {"cpu_bytes": "1GiB", "sync_budget": "4GiB"}
"""The miss path's engine with the connector: a CPU tier that holds every prompt's chunks
(12 x 1k tokens, ~0.3 GB): stores only, nothing evicted, nothing hit."""


def miss_program(prompts: list[list[int]], warm: list[int]) -> list[dict[str, Any]]:
    """One measurement of the miss path on a fresh engine (see the module docstring)."""
    return [
        serve("warmup", [warm], prefix="miss-warmup"),
        {"op": "settle"},
        serve("miss", prompts, MISS_OUT, MISS_CONC),
    ]


def disk_program(prompts: dict[int, list[list[int]]], warm: list[int]) -> list[dict[str, Any]]:
    """A restarted engine on the disk tier: each prompt once, served from disk.

    Warmed like the other engines before their first measured 4k hit, which each follows a
    4k recompute: here one 4k-token prompt the disk tier does not hold is computed first
    (without it, the first disk hit paid the engine's first 4k-context forward, ~1.5 s)."""
    ops = [serve("warmup", [warm], prefix="disk-warmup"), {"op": "settle"}]
    for size, ps in prompts.items():
        ops += [serve(f"disk-{size}", [p], prefix=f"disk-{size}-{i}") for i, p in enumerate(ps)]
    return ops


def ttfts(result: dict[str, Any], name: str) -> list[float]:
    return [r["ttft"] for op in result["ops"] if op["name"] == name for r in op["requests"]]


def throughput(result: dict[str, Any], name: str = "miss") -> list[float]:
    """Prompt + output tokens per second of each of the result's ops called ``name``."""
    return [
        sum(r["prompt_len"] + len(r["output"]) for r in op["requests"]) / op["seconds"]
        for op in result["ops"]
        if op["name"] == name
    ]


def stores_program(repeats: int, prompts: list[list[int]], warm: list[int]) -> list[dict[str, Any]]:
    """One engine with the connector serving the miss prompts ``2 * repeats`` times, its
    stores on and off in turn (the order swapped every other pair), both tiers and the
    engine's cache emptied before each: what the stores cost, without the spread between
    engine processes."""
    ops = [serve("warmup", [warm], prefix="stores-warmup"), {"op": "settle"}]
    for r in range(repeats):
        for side in ("on", "off") if r % 2 == 0 else ("off", "on"):
            ops.append({"op": "stores", "on": side == "on"})
            ops.append({"op": "reset_prefix_cache", "connector": True})
            ops.append(serve(f"miss-{side}", prompts, MISS_OUT, MISS_CONC, prefix=f"s{r}{side}"))
    return ops


def miss_pairs(
    repeats: int, prompts: list[list[int]], warm: list[int], spec: dict[str, Any]
) -> list[dict[str, Any]]:
    """``repeats`` pairs of fresh engines without / with the connector (order swapped
    every other pair); each pair's throughputs, settle waits and bindings."""
    pairs = []
    for r in range(repeats):
        pair: dict[str, Any] = {}
        order = ("off", "on") if r % 2 == 0 else ("on", "off")
        for side in order:
            connector = MISS_CONNECTOR if side == "on" else None
            res = run_engine(
                {**spec, "connector": connector, "program": miss_program(prompts, warm)}
            )
            pair[side] = {
                "tok_s": throughput(res)[0],
                "settle": res.get("settle"),
                "binding": res.get("binding"),
            }
        pair["ratio"] = pair["on"]["tok_s"] / pair["off"]["tok_s"]
        print(
            f"  miss pair {r + 1}/{repeats} ({order[0]} first): on {pair['on']['tok_s']:.0f}, "
            f"off {pair['off']['tok_s']:.0f} tok/s, ratio {pair['ratio']:.3f}",
            flush=True,
        )
        pairs.append(pair)
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--quick", action="store_true", help="1k only, 3 repetitions")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", default="1024,4096")
    ap.add_argument("--threads", type=int, default=None, help="compute threads of every engine")
    ap.add_argument(
        "--miss-repeats",
        type=int,
        default=0,
        help="engine pairs measuring the miss path (default 5; 2 with --quick)",
    )
    args = ap.parse_args()
    threads = args.threads or default_threads(multiprocess=False)
    sizes = [1024] if args.quick else [int(x) for x in args.sizes.split(",")]
    reps = 3 if args.quick else args.reps
    args.miss_repeats = args.miss_repeats or (2 if args.quick else 5)
    model = smollm2_path()
    docs = {s: [exact_document(model, 100 * s + i, s) for i in range(reps + 1)] for s in sizes}
    miss = [exact_document(model, 7000 + i, MISS_TOKENS) for i in range(MISS_PROMPTS)]
    miss_warm = exact_document(model, 6999, 256)
    # bf16 only where the CPU has bf16 matrix instructions (otherwise fp32 is ~3x faster).
    engine = {"max_model_len": 8192, "dtype": preferred_dtype()}
    disk_dir = tempfile.mkdtemp(prefix="kvtier-ttft-disk-")
    disk = {"disk_path": disk_dir, "disk_bytes": "4GiB"} if 4096 in sizes else {}
    configs = {
        "off": None,
        "sync": {"cpu_bytes": "2GiB", "sync_budget": "4GiB", "layer_loads": "off"},
        "sync_layers": {"cpu_bytes": "2GiB", "sync_budget": "4GiB", "layer_loads": "on"},
        "async": {"cpu_bytes": "2GiB", "sync_budget": 0, **disk},
    }
    if disk:
        configs["disk"] = {"cpu_bytes": "2GiB", "sync_budget": 0, "layer_loads": "off", **disk}
        configs["disk_layers"] = {**configs["disk"], "layer_loads": "on"}
    results: dict[str, Any] = {}
    try:
        for kind, connector in configs.items():
            t0 = time.perf_counter()
            print(f"engine '{kind}' ...", flush=True)
            prog = (
                disk_program({s: docs[s][:reps] for s in sizes}, docs[4096][-1])
                if kind.startswith("disk")
                else program(kind, sizes, reps, docs)
            )
            results[kind] = run_engine(
                {
                    "connector": connector,
                    "engine": engine,
                    "inspect": connector is not None,
                    "program": prog,
                    "threads": threads,
                }
            )
            print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        shutil.rmtree(disk_dir, ignore_errors=True)
    t0 = time.perf_counter()
    print(f"miss path: {args.miss_repeats} engine pairs ...", flush=True)
    pairs = miss_pairs(args.miss_repeats, miss, miss_warm, {"engine": engine, "threads": threads})
    print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
    t0 = time.perf_counter()
    print(f"miss path, stores on / off in one engine: {args.miss_repeats} pairs ...", flush=True)
    in_one = run_engine(
        {
            "connector": MISS_CONNECTOR,
            "engine": engine,
            "program": stores_program(args.miss_repeats, miss, miss_warm),
            "threads": threads,
        }
    )
    stores_on, stores_off = throughput(in_one, "miss-on"), throughput(in_one, "miss-off")
    store_ratios = sorted(a / b for a, b in zip(stores_on, stores_off, strict=True))
    print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
    results["stores_on_off"] = in_one
    binding = {k: r.get("binding") for k, r in results.items()}
    for i, pair in enumerate(pairs):
        for side in ("off", "on"):
            binding[f"miss-{side}-{i + 1}"] = pair[side]["binding"]
    threads_equal = same_binding(binding)
    if not threads_equal:
        write_json(args.json, {"summary": {"threads_equal": False}, "binding": binding})
        try:
            check_equal(binding)
        except ConfigError as e:
            raise SystemExit(f"vllm_ttft: error: {e}") from None

    med = statistics.median
    rows, cases = [], {}
    for size in sizes:
        t = {
            "recompute": med(ttfts(results["off"], f"first-{size}")),
            "prefix_hit": med(ttfts(results["off"], f"again-{size}")),
            "kvtier_sync": med(ttfts(results["sync"], f"again-{size}")),
            "kvtier_sync_layerwise": med(ttfts(results["sync_layers"], f"again-{size}")),
            "kvtier_async": med(ttfts(results["async"], f"again-{size}")),
        }
        cases[size] = {k: {"median_s": v} for k, v in t.items()}
        for k in cases[size]:
            src = {
                "recompute": ("off", "first"),
                "prefix_hit": ("off", "again"),
                "kvtier_sync": ("sync", "again"),
                "kvtier_sync_layerwise": ("sync_layers", "again"),
                "kvtier_async": ("async", "again"),
            }[k]
            cases[size][k]["samples_s"] = ttfts(results[src[0]], f"{src[1]}-{size}")
        for k, v in t.items():
            rows.append(
                [
                    f"{size}",
                    k,
                    f"{v * 1e3:.1f}",
                    f"{v / t['prefix_hit']:.2f}",
                    f"{t['recompute'] / v:.1f}",
                ]
            )
    disk_ratios: list[float] = []
    for size in sizes if "disk" in results else []:
        c = cases[size]
        for case, kind in (("kvtier_disk", "disk"), ("kvtier_disk_layerwise", "disk_layers")):
            hits = ttfts(results[kind], f"disk-{size}")
            if case == "kvtier_disk" and size == 4096:
                recomputes = ttfts(results["off"], "first-4096")
                disk_ratios = [r / h for r, h in zip(recomputes, hits, strict=True)]
            c[case] = {"median_s": med(hits), "samples_s": hits}
            rows.append(
                [
                    f"{size}",
                    f"{case} (restart)",
                    f"{med(hits) * 1e3:.1f}",
                    f"{med(hits) / c['prefix_hit']['median_s']:.2f}",
                    f"{c['recompute']['median_s'] / med(hits):.1f}",
                ]
            )
    print()
    print(
        format_table(
            ["prompt", "case", "TTFT ms", "x prefix hit", "recompute / this"],
            rows,
            title=f"TTFT, median of {reps} (SmolLM2-135M {engine['dtype']}, vLLM CPU)",
        )
    )
    first = next(iter(binding.values()))
    assert first is not None
    print(f"every engine computed on {describe(first)} (measured)")
    miss_ratios = sorted(p["ratio"] for p in pairs)
    worst = pairs[min(range(len(pairs)), key=lambda i: pairs[i]["ratio"])]
    tput_on, tput_off = worst["on"]["tok_s"], worst["off"]["tok_s"]
    print(
        f"\nmiss path ({MISS_PROMPTS} x {MISS_TOKENS}-token prompts, {MISS_OUT} out, "
        f"{MISS_CONC} at a time, {len(pairs)} engine pairs): connector on / off worst "
        f"{miss_ratios[0]:.3f} ({tput_on:.0f} vs {tput_off:.0f} tok/s), median "
        f"{statistics.median(miss_ratios):.3f}, best {miss_ratios[-1]:.3f} "
        f"(target >= 0.99 in the worst pair)"
    )
    print(
        f"  stores on / off within one engine with the connector ({len(store_ratios)} pairs, "
        f"same prompts, tiers emptied before each run): worst {store_ratios[0]:.3f}, median "
        f"{statistics.median(store_ratios):.3f}, best {store_ratios[-1]:.3f}"
    )
    offs = [p["off"]["tok_s"] for p in pairs]
    print(
        f"  the same engine without the connector, slowest / fastest of its {len(offs)} runs: "
        f"{min(offs) / max(offs):.3f} (the measurement's own spread)"
    )

    def ratio(size: int, a: str, b: str) -> float | None:
        if size not in cases or a not in cases[size] or b not in cases[size]:
            return None
        return float(cases[size][a]["median_s"] / cases[size][b]["median_s"])

    def ms(size: int, case: str) -> float | None:
        got = cases.get(size, {}).get(case)
        return None if got is None else float(got["median_s"] * 1e3)

    summary = {
        "ttft_sync_hit_over_prefix_hit_1k": ratio(1024, "kvtier_sync", "prefix_hit"),
        "ttft_sync_hit_over_prefix_hit_4k": ratio(4096, "kvtier_sync", "prefix_hit"),
        "ttft_async_over_sync_1k": ratio(1024, "kvtier_async", "kvtier_sync"),
        "ttft_recompute_over_sync_4k": ratio(4096, "recompute", "kvtier_sync"),
        "miss_path_throughput_ratio": miss_ratios[0],
        "miss_path_throughput_ratio_median": statistics.median(miss_ratios),
        "miss_path_throughput_ratio_best": miss_ratios[-1],
        "miss_path_off_slowest_over_fastest": min(offs) / max(offs),
        "miss_path_stores_on_over_off_one_engine": store_ratios[0],
        "miss_path_stores_on_over_off_one_engine_median": statistics.median(store_ratios),
        "miss_path_stores_on_over_off_one_engine_best": store_ratios[-1],
        "ttft_disk_hit_over_sync_hit_4k": ratio(4096, "kvtier_disk", "kvtier_sync")
        if disk_ratios
        else None,
        "ttft_recompute_over_disk_hit_4k": min(disk_ratios) if disk_ratios else None,
        "ttft_recompute_over_disk_hit_4k_median": statistics.median(disk_ratios)
        if disk_ratios
        else None,
        "ttft_sync_hit_1k_ms": ms(1024, "kvtier_sync"),
        "ttft_sync_hit_4k_ms": ms(4096, "kvtier_sync"),
        "ttft_sync_hit_layerwise_1k_ms": ms(1024, "kvtier_sync_layerwise"),
        "ttft_sync_hit_layerwise_4k_ms": ms(4096, "kvtier_sync_layerwise"),
        "ttft_sync_hit_layerwise_over_whole_1k": ratio(
            1024, "kvtier_sync_layerwise", "kvtier_sync"
        ),
        "ttft_sync_hit_layerwise_over_whole_4k": ratio(
            4096, "kvtier_sync_layerwise", "kvtier_sync"
        ),
        "ttft_disk_hit_1k_ms": ms(1024, "kvtier_disk"),
        "ttft_disk_hit_4k_ms": ms(4096, "kvtier_disk"),
        "ttft_disk_hit_layerwise_1k_ms": ms(1024, "kvtier_disk_layerwise"),
        "ttft_disk_hit_layerwise_4k_ms": ms(4096, "kvtier_disk_layerwise"),
        "ttft_disk_hit_layerwise_over_whole_1k": ratio(
            1024, "kvtier_disk_layerwise", "kvtier_disk"
        ),
        "ttft_disk_hit_layerwise_over_whole_4k": ratio(
            4096, "kvtier_disk_layerwise", "kvtier_disk"
        ),
        "threads_equal": threads_equal,
    }
    print(
        "\nsummary:",
        ", ".join(
            f"{k}={v}" if isinstance(v, bool) else f"{k}={v:.3f}" if v is not None else f"{k}=n/a"
            for k, v in summary.items()
        ),
    )
    write_json(
        args.json,
        {
            "summary": summary,
            "machine": machine_info(threads=threads),
            "binding": binding,
            "workload": {
                "sizes": sizes,
                "reps": reps,
                "model": f"SmolLM2-135M-Instruct {engine['dtype']}",
                "engine": engine,
                "configs": configs,
                "miss": {
                    "prompts": MISS_PROMPTS,
                    "tokens": MISS_TOKENS,
                    "output": MISS_OUT,
                    "concurrency": MISS_CONC,
                    "connector": MISS_CONNECTOR,
                    "pairs": len(pairs),
                },
            },
            "cases": {str(k): v for k, v in cases.items()},
            "throughput_tok_s": {"connector_on": tput_on, "connector_off": tput_off},
            "miss_stores_one_engine_tok_s": {"on": stores_on, "off": stores_off},
            "miss_pairs": [
                {k: v for k, v in p.items() if k in ("ratio", "on", "off")} for p in pairs
            ],
            "kvtier": {k: r.get("kvtier") for k, r in results.items()},
        },
    )


if __name__ == "__main__":
    main()
