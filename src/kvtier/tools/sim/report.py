"""Tables of a ``kvtier sim`` run: every run's hit ratios (:func:`format_sim`), and the
policy table, the default against LRU and the bounds (described below).

The policy table: the default against LRU and the bounds.

One row per capacity configuration of a :func:`kvtier.tools.sim.run_sim` result: total token hit
ratio (%) of ``lru``, ``default``, ``lru-oracle`` (LRU with offline admission: what an
admission rule next to LRU's order can reach, :mod:`kvtier.tools.sim.bounds`), ``belady`` and
``infinite``, then ``default - lru`` in points and the share of the LRU -> Belady gap that
the default and the oracle close ("-" where Belady is within 0.1 point of LRU). Columns of
policies the run did not include are "-". The closing line names the worst cell of the
default against LRU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLUMNS: tuple[tuple[str, str], ...] = (
    ("lru", "LRU"),
    ("default", "default"),
    ("lru-oracle", "oracle bound"),
    ("belady", "Belady"),
    ("infinite", "inf"),
)
"""(policy, column title) of the table, in order."""
MIN_GAP = 0.1
"""Points: a gap smaller than this between LRU and Belady gets no share."""


def gap_rows(result: dict[str, Any], label: str = "") -> list[dict[str, Any]]:
    """Per configuration: hit ratios (%) by policy, ``default - lru`` and the gap shares
    (None when not defined). Empty when the run has no ``lru`` or no ``default``."""
    by_config: dict[str, dict[str, float]] = {}
    for run in result["runs"]:
        by_config.setdefault(run["config"], {})[run["policy"]] = 100 * run["hit_ratio"]["total"]
    rows = []
    for config, hits in by_config.items():
        if "lru" not in hits or "default" not in hits:
            continue
        lru, default = hits["lru"], hits["default"]
        belady = hits.get("belady")
        oracle = hits.get("lru-oracle")
        gap = belady - lru if belady is not None else 0.0
        rows.append(
            {
                "trace": label or result.get("trace", ""),
                "config": config,
                "hit": {k: round(v, 3) for k, v in hits.items()},
                "default_minus_lru": round(default - lru, 3),
                "gap_closed": round((default - lru) / gap, 4) if gap >= MIN_GAP else None,
                "oracle_gap_closed": (
                    round((oracle - lru) / gap, 4)
                    if gap >= MIN_GAP and oracle is not None
                    else None
                ),
            }
        )
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def format_gap_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    """The rows of :func:`gap_rows` (one trace or several) as a table and a closing note."""
    header = ["trace", "capacity", *(t for _, t in COLUMNS), "default-LRU", "gap", "oracle gap"]
    table = [header]
    for r in rows:
        hit = r["hit"]
        cells = [str(r["trace"]), r["config"]]
        cells += [f"{hit[p]:.1f}" if p in hit else "-" for p, _ in COLUMNS]
        cells += [f"{r['default_minus_lru']:+.2f}", _pct(r["gap_closed"])]
        cells.append(_pct(r["oracle_gap_closed"]))
        table.append(cells)
    if markdown:
        lines = ["| " + " | ".join(c) + " |" for c in table]
        lines.insert(1, "|" + "---|" * len(header))
    else:
        widths = [max(len(row[c]) for row in table) for c in range(len(header))]
        lines = []
        for k, row in enumerate(table):
            left = "  ".join(c.ljust(w) for c, w in zip(row[:2], widths[:2], strict=True))
            right = "  ".join(c.rjust(w) for c, w in zip(row[2:], widths[2:], strict=True))
            lines.append(f"{left}  {right}".rstrip())
            if k == 0:
                lines.append("-" * len(lines[-1]))
    if rows:
        worst = min(rows, key=lambda r: r["default_minus_lru"])
        lines.append(
            f"worst cell of the default against LRU: {worst['default_minus_lru']:+.2f} points "
            f"({worst['trace']}, {worst['config']})"
        )
    return "\n".join(lines)


def format_sim(result: dict[str, Any]) -> str:
    """A plain-text table of a :func:`kvtier.tools.sim.simulator.run_sim` result: token hit
    ratio per tier and in total, one row per (configuration, policy)."""
    runs: list[dict[str, Any]] = result["runs"]
    tier_names: list[str] = []
    for run in runs:
        for cap in run["capacity"]:
            if cap["tier"] not in tier_names:
                tier_names.append(cap["tier"])
    header = ["capacity", "policy", *(f"{n} hit" for n in tier_names), "total hit", "evictions"]
    header.append("time")
    rows = [header]
    for run in runs:
        ratio = run["hit_ratio"]
        cells = [run["config"], run["policy"]]
        cells += [f"{100 * ratio[n]:.1f} %" if n in ratio else "-" for n in tier_names]
        cells.append(f"{100 * ratio['total']:.1f} %")
        cells.append(f"{sum(run['evictions'].values()):,}")
        cells.append(f"{run['seconds']:.2f} s")
        rows.append(cells)
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = [
        f"trace {Path(result['trace']).name}: {result['requests']:,} requests, "
        f"{result['blocks']:,} blocks of {result['block_tokens']} tokens, "
        f"{result['input_tokens']:,} input tokens; {result['bytes_per_token']:,} B/token; "
        f"{result['seconds']:.2f} s"
    ]
    for k, r in enumerate(rows):
        left = r[:2]
        right = r[2:]
        text = "  ".join(c.ljust(w) for c, w in zip(left, widths[:2], strict=True))
        text += "  " + "  ".join(c.rjust(w) for c, w in zip(right, widths[2:], strict=True))
        lines.append(text.rstrip())
        if k == 0:
            lines.append("-" * len(lines[-1]))
    return "\n".join(lines)
