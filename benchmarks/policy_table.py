"""Token hit ratio of kvtier's default cache policy against LRU, the admission-oracle bound
and Belady, on traces of several shapes.

Traces: the bundled Mooncake synthetic trace and generated ones, each with its generator in
the repository (fixed seeds): ``longsys`` (multi-turn chat behind long system prompts),
``agentloop`` (tool-call loops, fan-out branches off one prefix, long idle gaps), ``rag``
(shared documents in varying order), ``scan`` (one-off long documents mixed into a hot set
of conversations), ``shift`` (the hot set is replaced half way), plus the chat generator's
``chat`` and ``docs``. Each is replayed by ``kvtier.tools.sim.run_sim`` at 1 %, 5 %, 20 % and 50 %
of the trace's unique KV (one CPU tier). Per trace and capacity: ``lru``, ``default``
(exactly what the connector builds), ``lru-oracle`` (LRU with offline admission, the bound
for an admission rule next to LRU's order), ``lru-reuse`` (LRU storing exactly the chunks
used again: an admission rule that predicts reuse perfectly), ``belady``, ``infinite``,
``default - lru`` and the share of the LRU -> Belady gap the default, the oracle and the
reuse bound close, plus any ``--extra`` policies (default: arc, adaptive-arc,
lru-doorkeeper).

Targets (issue 30): never more than 0.5 points below LRU in any cell; at the two smallest
capacities, >= 25 % of the gap where the oracle closes >= 25 % itself. Every miss is listed;
nothing is tuned per trace.

Run: ``.venv/bin/python benchmarks/policy_table.py [--json PATH] [--markdown]
[--traces rag,scan]`` (``--markdown``: the same table in Markdown, for docs/policy.md).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from common import format_table, machine_info, write_json
from kvtier.tools.bench.workloads import DEFAULT_TRACE
from kvtier.tools.sim import run_sim
from kvtier.tools.sim.report import gap_rows
from kvtier.tools.sim.workloads import write_named_trace

CAPACITIES = ("1%", "5%", "20%", "50%")
GENERATED = (
    ("longsys", 1),
    ("agentloop", 1),
    ("rag", 1),
    ("scan", 1),
    ("shift", 1),
    ("chat", 1),
    ("docs", 1),
)
GAP_TARGET = 0.25
BELOW_LRU_POINTS = 0.5
BOUNDS = ("lru", "default", "lru-oracle", "lru-reuse", "belady", "infinite")


def measure(path: str, label: str, extra: list[str]) -> list[dict[str, Any]]:
    result = run_sim(path, list(CAPACITIES), [*BOUNDS, *extra])
    table = {r["config"]: r for r in gap_rows(result, label)}
    by = {(r["config"], r["policy"]): r["hit_ratio"]["total"] for r in result["runs"]}
    rows = []
    for i, config in enumerate(dict.fromkeys(r["config"] for r in result["runs"])):
        g = table[config]
        gap, oracle_gap = g["gap_closed"], g["oracle_gap_closed"]
        misses = []
        small = i < 2
        oracle_allows = oracle_gap is not None and oracle_gap >= GAP_TARGET
        lru, belady = by[(config, "lru")], by[(config, "belady")]
        reuse = by[(config, "lru-reuse")]
        reuse_gap = (reuse - lru) / (belady - lru) if gap is not None else None
        if small and oracle_allows and gap is not None and gap < GAP_TARGET:
            misses.append(
                f"gap {100 * gap:.0f}% < 25% (oracle {100 * (oracle_gap or 0):.0f}%, "
                f"reuse {100 * (reuse_gap or 0):.0f}%)"
            )
        if -g["default_minus_lru"] > BELOW_LRU_POINTS:
            misses.append(f"{-g['default_minus_lru']:.2f} pt below LRU")
        tokens = next(r["capacity"][0]["tokens"] for r in result["runs"] if r["config"] == config)
        rows.append(
            {
                "trace": label,
                "capacity": CAPACITIES[i],
                "tokens": tokens,
                "default": by[(config, "default")],
                "lru": lru,
                "belady": belady,
                "oracle": by[(config, "lru-oracle")],
                "reuse": reuse,
                "infinite": by[(config, "infinite")],
                "gap_closed": gap,
                "oracle_gap_closed": oracle_gap,
                "reuse_gap_closed": reuse_gap,
                "default_minus_lru_points": g["default_minus_lru"],
                "extra": {p: by[(config, p)] for p in extra},
                "misses": misses,
                "requests": result["requests"],
                "unique_blocks": result["unique_blocks"],
                "gap_row": g,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--markdown", action="store_true", help="print the table in Markdown")
    ap.add_argument(
        "--extra", default="arc,adaptive-arc,lru-doorkeeper", help="more policies to list"
    )
    ap.add_argument("--traces", default="", help="comma list of trace labels to run (all)")
    args = ap.parse_args()
    only = {t for t in args.traces.split(",") if t}
    extra = [p for p in args.extra.split(",") if p]
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    traces: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        sources: list[tuple[str, str, Any]] = [("mooncake", DEFAULT_TRACE, None)]
        for shape, seed in GENERATED:
            if only and shape not in only:
                continue
            path = str(Path(tmp) / f"{shape}-{seed}.jsonl")
            write_named_trace(path, shape, seed)
            sources.append((shape, path, (shape, seed)))
        for label, path, gen in sources:
            if only and label not in only:
                continue
            got = measure(path, label, extra)
            rows += got
            traces.append(
                {
                    "trace": label,
                    "generated": gen,
                    "requests": got[0]["requests"],
                    "unique_blocks": got[0]["unique_blocks"],
                }
            )
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}"  # noqa: E731
    share = lambda v: "-" if v is None else f"{100 * v:.0f}%"  # noqa: E731
    headers = ["trace", "cap", "LRU", "default", "oracle bound", "reuse bound", "Belady"]
    headers += ["inf", "default-LRU", "gap", "oracle gap", "reuse gap", *extra, "target"]
    table = [
        [
            r["trace"],
            r["capacity"],
            pct(r["lru"]),
            pct(r["default"]),
            pct(r["oracle"]),
            pct(r["reuse"]),
            pct(r["belady"]),
            pct(r["infinite"]),
            f"{r['default_minus_lru_points']:+.2f}",
            share(r["gap_closed"]),
            share(r["oracle_gap_closed"]),
            share(r["reuse_gap_closed"]),
            *(pct(r["extra"][p]) for p in extra),
            "; ".join(r["misses"]) or "met",
        ]
        for r in rows
    ]
    print(
        format_table(
            headers, table, "token hit ratio % (one CPU tier, capacity = share of unique KV)"
        )
    )
    misses = [
        f"{r['trace']} @ {r['capacity']}: {'; '.join(r['misses'])}" for r in rows if r["misses"]
    ]
    print(f"\n{len(misses)} of {len(rows)} cells miss a target" + (":" if misses else ""))
    for m in misses:
        print("  " + m)
    worst = min(rows, key=lambda r: r["default_minus_lru_points"])
    print(
        f"worst cell of the default against LRU: {worst['default_minus_lru_points']:+.2f} "
        f"points ({worst['trace']} @ {worst['capacity']})"
    )
    if args.markdown:
        print()
        print("| " + " | ".join(headers) + " |")
        print("|" + "---|" * len(headers))
        for cells in table:
            print("| " + " | ".join(cells) + " |")
    for r in rows:
        r.pop("gap_row", None)
    write_json(
        args.json,
        {
            "machine": machine_info(),
            "workload": {"capacities": CAPACITIES, "traces": traces, "extra": extra},
            "rows": rows,
            "summary": {
                "cells": len(rows),
                "misses": misses,
                "worst_vs_lru_points": round(max(100 * (r["lru"] - r["default"]) for r in rows), 2),
                "worst_cell": f"{worst['trace']} @ {worst['capacity']}",
                "seconds": round(time.perf_counter() - t0, 1),
            },
        },
    )


if __name__ == "__main__":
    main()
