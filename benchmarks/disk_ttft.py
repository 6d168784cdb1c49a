"""The vLLM part of ``benchmarks/disk_tier.py``: TTFT of a 4k-token prompt recomputed, then
served from the disk tier by a new engine process (imported by it)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any


def vllm_disk_ttft(n_prompts: int, parent_dir: str | None) -> dict[str, Any]:
    """TTFT of a 4k-token prompt on vLLM CPU + SmolLM2: computed the first time (engine 1,
    which writes it through to the disk tier), then served from disk by a new engine
    process on the same directory (engine 2, empty CPU tier). Each prompt gives one ratio
    (its recompute TTFT over its own disk-hit TTFT); ``ratio`` is the worst of them,
    ``ratio_median`` / ``ratio_best`` the others, and the TTFTs are medians over prompts."""
    import statistics

    from kvtier.tools.bench.binding import check_equal, default_threads
    from kvtier.tools.bench.engine import run_engine
    from kvtier.tools.bench.machine import preferred_dtype
    from kvtier.tools.bench.prompts import exact_document
    from kvtier.tools.models import smollm2_path

    model = smollm2_path()
    prompts = [exact_document(model, 4200 + i, 4096) for i in range(n_prompts)]
    disk = Path(tempfile.mkdtemp(prefix="kvtier-disk-ttft-", dir=parent_dir))
    conn = {"cpu_bytes": "512MiB", "disk_path": str(disk), "disk_bytes": "2GiB"}
    engine = {"dtype": preferred_dtype(), "max_model_len": 8192}

    def program(tag: str) -> list[dict[str, Any]]:
        ops: list[dict[str, Any]] = [
            {
                "op": "serve",
                "name": "warmup",
                "requests": [{"id": f"{tag}-w", "prompt": prompts[0][:64][::-1], "max_tokens": 1}],
            }
        ]
        for i, p in enumerate(prompts):
            ops.append(
                {
                    "op": "serve",
                    "name": tag,
                    "requests": [{"id": f"{tag}{i}", "prompt": p, "max_tokens": 1}],
                }
            )
        return ops

    try:
        print("  vLLM: engine 1 computes and writes through to disk ...", flush=True)
        # Both engines with the same explicit compute threads (kvtier.tools.bench.binding).
        threads = default_threads(multiprocess=False)
        first = run_engine(
            {
                "connector": conn,
                "engine": engine,
                "program": program("c"),
                "inspect": True,
                "threads": threads,
            }
        )
        print("  vLLM: engine 2 (a new process) serves from disk ...", flush=True)
        second = run_engine(
            {
                "connector": conn,
                "engine": engine,
                "program": program("d"),
                "inspect": True,
                "threads": threads,
            }
        )
    finally:
        shutil.rmtree(disk, ignore_errors=True)

    def ttfts(result: dict[str, Any], tag: str) -> list[float]:
        return [r["ttft"] for op in result["ops"] if op["name"] == tag for r in op["requests"]]

    binding = {"compute": first.get("binding"), "restart": second.get("binding")}
    check_equal(binding)
    computed, served = ttfts(first, "c"), ttfts(second, "d")
    ratios = [c / d for c, d in zip(computed, served, strict=True)]
    recompute = statistics.median(computed)
    disk_hit = statistics.median(served)
    hits = [
        r.get("hit_sources", {})
        for op in second["ops"]
        if op["name"] == "d"
        for r in op["requests"]
    ]
    print(
        f"  vLLM 4k-token prompt TTFT: recompute {recompute:.2f} s, disk hit {disk_hit:.2f} s "
        f"(medians); per prompt x{min(ratios):.1f} worst / x{statistics.median(ratios):.1f} "
        f"median / x{max(ratios):.1f} best of {len(ratios)}; disk hit tokens per request: "
        f"{[h.get('disk', 0) for h in hits]}"
    )
    return {
        "recompute_s": recompute,
        "disk_hit_s": disk_hit,
        "recompute_s_each": computed,
        "disk_hit_s_each": served,
        "ratio": min(ratios),
        "ratio_median": statistics.median(ratios),
        "ratio_best": max(ratios),
        "hit_sources": hits,
        "prompts": n_prompts,
        "dtype": engine["dtype"],
        "binding": binding,
    }
