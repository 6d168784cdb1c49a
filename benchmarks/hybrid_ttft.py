"""TTFT of a hybrid recurrent-state model (the tiny Qwen3-Next of
:mod:`kvtier.tools.tiny_models`: gated delta net + full attention, bf16) on vLLM's CPU
backend: recomputing a prompt against a kvtier CPU-tier hit, which restores the attention
chunks and the recurrent state at the last state boundary below the prompt's end.

For each prompt size (default 4k tokens), ``--reps`` distinct random prompts, one request
at a time on an idle engine, every engine in its own process with the same explicit
compute threads (``--threads``, default all cores; a run whose engines measured different
bindings prints one line and compares nothing):

(a) recompute: the prompt seen for the first time (engine without a connector);
(b) prefix hit: the same prompt again, from the engine's own prefix cache (vLLM's Mamba
    "align" mode: it resumes at the state it kept, ``floor((P - 1) / B) * B``);
(c) kvtier hit: an engine with kvtier served the prompt once, its prefix cache was reset,
    the prompt comes again: kvtier loads the attention chunks and the state at that same
    boundary from its CPU tier (always asynchronously: a state cannot load within the
    step), and the engine computes the rest.

``recompute_over_kvtier_hit_<size>`` is the smallest per-prompt ratio (recompute of a
prompt / its kvtier hit), not the best one; the median is beside it. The kvtier engine's
own first-time TTFTs (``kvtier_first``: a recompute with the connector on) give the same
ratio within one engine process (``kvtier_first_over_kvtier_hit_<size>``, smallest).
What bounds it: the hit still computes the prompt's tail past the last state boundary
(64 tokens of 4,096 here: B = 96) over the whole context, and waits for two engine steps
(the async load's, then its own); on the tiny model a whole 4k recompute is itself short.

Run: ``.venv/bin/python benchmarks/hybrid_ttft.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import format_table, machine_info, write_json
from kvtier.errors import ConfigError
from kvtier.tools.bench.binding import check_equal, default_threads, describe, same_binding
from kvtier.tools.bench.engine import run_engine

CONNECTOR = {"cpu_bytes": "1GiB"}
BLOCK = 96
"""vLLM's block size for this model with prefix caching on (see tests/vllm/test_hybrid.py)."""


def _serve(name: str, prompt: list[int], rid: str) -> dict[str, Any]:
    req = {"id": rid, "prompt": prompt, "max_tokens": 1, "ignore_eos": True}
    return {"op": "serve", "name": name, "requests": [req], "max_concurrency": 1}


def _program(prompts: dict[int, list[list[int]]], warm: list[int], kvtier: bool) -> list[Any]:
    ops: list[Any] = [_serve("warmup", warm, "warm"), {"op": "reset_prefix_cache"}]
    if kvtier:
        ops.append({"op": "settle"})
    for size, ps in prompts.items():
        for i, p in enumerate(ps):
            ops.append(_serve(f"first-{size}", p, f"first-{size}-{i}"))
            if kvtier:
                ops += [{"op": "drain"}, {"op": "reset_prefix_cache"}]
            ops.append(_serve(f"again-{size}", p, f"again-{size}-{i}"))
    return ops


def _ttfts(result: dict[str, Any], name: str) -> list[float]:
    return [r["ttft"] for op in result["ops"] if op["name"] == name for r in op["requests"]]


def _hits(result: dict[str, Any], name: str) -> list[int]:
    return [
        sum(r["hit_sources"].values())
        for op in result["ops"]
        if op["name"] == name
        for r in op["requests"]
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--quick", action="store_true", help="2 repetitions")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sizes", default="4096")
    ap.add_argument("--threads", type=int, default=None, help="compute threads of every engine")
    args = ap.parse_args()
    threads = args.threads or default_threads(multiprocess=False)
    reps = 2 if args.quick else args.reps
    sizes = [int(s) for s in args.sizes.split(",")]
    rng = random.Random(0)
    prompts = {s: [[rng.randrange(3, 512) for _ in range(s)] for _ in range(reps)] for s in sizes}
    warm = [rng.randrange(3, 512) for _ in range(max(sizes))]
    with tempfile.TemporaryDirectory(prefix="kvtier-hybrid-") as tmp:
        model = Path(tmp) / "qwen3_next"
        build = (
            "import sys; from kvtier.tools.tiny_models import build; "
            "build('qwen3_next', sys.argv[1])"
        )
        subprocess.run([sys.executable, "-c", build, str(model)], check=True, timeout=600)
        # The tiny checkpoint allows 2,048 positions; RoPE takes longer prompts as they come.
        cfg_path = model / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["max_position_embeddings"] = max(sizes) + 256
        cfg_path.write_text(json.dumps(cfg))
        engine = {
            "dtype": "bfloat16",  # vLLM's CPU gated delta net needs it
            "max_model_len": max(sizes) + 256,
            "max_num_batched_tokens": max(sizes) + 256,
        }
        base = {"model": str(model), "engine": engine, "threads": threads}
        results = {}
        for name, conn in (("off", None), ("kvtier", CONNECTOR)):
            print(f"engine {name} ...", flush=True)
            results[name] = run_engine(
                {
                    **base,
                    "connector": conn,
                    "inspect": conn is not None,
                    "program": _program(prompts, warm, conn is not None),
                }
            )
    binding = {k: r.get("binding") for k, r in results.items()}
    if not same_binding(binding):
        write_json(args.json, {"summary": {"threads_equal": False}, "binding": binding})
        try:
            check_equal(binding)
        except ConfigError as e:
            raise SystemExit(f"hybrid_ttft: error: {e}") from None
    med = statistics.median
    rows, cases, summary = [], {}, {}
    for size in sizes:
        recompute = _ttfts(results["off"], f"first-{size}")
        prefix = _ttfts(results["off"], f"again-{size}")
        first = _ttfts(results["kvtier"], f"first-{size}")
        hit = _ttfts(results["kvtier"], f"again-{size}")
        hit_tokens = _hits(results["kvtier"], f"again-{size}")
        want = (size - 1) // BLOCK * BLOCK
        if hit_tokens != [want] * len(hit_tokens):
            raise SystemExit(f"hybrid_ttft: kvtier hits {hit_tokens}, expected {want} each")
        ratios = sorted(r / h for r, h in zip(recompute, hit, strict=True))
        cases[size] = {
            "recompute": recompute,
            "prefix_hit": prefix,
            "kvtier_first": first,
            "kvtier_hit": hit,
            "kvtier_hit_tokens": want,
        }
        summary[f"recompute_over_kvtier_hit_{size // 1024}k"] = ratios[0]
        summary[f"recompute_over_kvtier_hit_{size // 1024}k_median"] = med(ratios)
        summary[f"kvtier_hit_over_prefix_hit_{size // 1024}k"] = med(hit) / med(prefix)
        # The same engine's own recomputes (its first sight of each prompt): no spread
        # between engine processes.
        same = sorted(f / h for f, h in zip(first, hit, strict=True))
        summary[f"kvtier_first_over_kvtier_hit_{size // 1024}k"] = same[0]
        for case, v in (
            ("recompute", recompute),
            ("prefix hit (vLLM)", prefix),
            ("kvtier first (miss)", first),
            ("kvtier CPU-tier hit", hit),
        ):
            rows.append([size, case, f"{med(v) * 1e3:.1f}", f"{med(recompute) / med(v):.1f}"])
    print()
    print(
        format_table(
            ["prompt", "case", "TTFT ms (median)", "recompute / this"],
            rows,
            title=f"Hybrid TTFT, {reps} prompts (tiny Qwen3-Next bf16, vLLM CPU, "
            f"{describe(next(iter(binding.values())) or {})})",
        )
    )
    for k, v in summary.items():
        print(f"{k}: {v:.2f}")
    write_json(
        args.json,
        {
            "machine": machine_info(threads=threads),
            "summary": {**summary, "threads_equal": True},
            "cases": {str(k): v for k, v in cases.items()},
            "binding": binding,
            "states": results["kvtier"].get("kvtier", {}).get("states"),
        },
    )


if __name__ == "__main__":
    main()
