"""Bench results: per workload x mode statistics, the terminal table, JSON and plots."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

SOURCES = ("device", "host", "disk", "remote", "recomputed")


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ys = sorted(xs)
    k = max(0, min(len(ys) - 1, round(q / 100 * len(ys) + 0.5) - 1))
    return ys[k]


def merge_runs(ops: list[dict[str, Any]]) -> dict[str, Any]:
    """A workload's repeated runs in one mode as one result: their requests together,
    their seconds (and, over HTTP, kvtier's hit tokens) added."""
    out = {**ops[0], "requests": [r for op in ops for r in op["requests"]], "runs": len(ops)}
    out["seconds"] = sum(op["seconds"] for op in ops)
    if "kvtier_hit_tokens" in ops[0]:
        hits: dict[str, int] = {}
        for op in ops:
            for src, n in op["kvtier_hit_tokens"].items():
                hits[src] = hits.get(src, 0) + n
        out["kvtier_hit_tokens"] = hits
    return out


def summarize(op: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, Any]:
    """Statistics of one workload run in one mode (``op`` is a runner ``serve`` result)."""
    reqs = op["requests"]
    ttft = [r["ttft"] for r in reqs]
    tokens = dict.fromkeys(SOURCES, 0)
    loads = {"sync": 0, "async": 0}
    for r in reqs:
        external = 0
        for src, n in r.get("hit_sources", {}).items():
            key = src if src in tokens else "remote"
            tokens[key] += n
            external += n
        tokens["device"] += max(0, r["num_cached"] - external)
        tokens["recomputed"] += r["prompt_len"] - max(r["num_cached"], external)
        if r.get("load") in loads:
            loads[r["load"]] += 1
    for src, n in (op.get("kvtier_hit_tokens") or {}).items():  # over HTTP: per workload
        tokens[src if src in tokens else "remote"] += n
        tokens["device"] = max(0, tokens["device"] - n)
    out_tokens = sum(len(r["output"]) for r in reqs)
    prompt_tokens = sum(r["prompt_len"] for r in reqs)
    result: dict[str, Any] = {
        "requests": len(reqs),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p90_s": percentile(ttft, 90),
        "ttft_p99_s": percentile(ttft, 99),
        "ttft_mean_s": statistics.fmean(ttft),
        "e2e_mean_s": statistics.fmean(r["e2e"] for r in reqs),
        "throughput_tok_s": (prompt_tokens + out_tokens) / op["seconds"],
        "seconds": op["seconds"],
        "prompt_tokens": prompt_tokens,
        "output_tokens": out_tokens,
        "hit_tokens": tokens,
        "loads": loads,
        "hit_ttft_p50_s": _hit_ttft(reqs),
    }
    if baseline is None:
        result["outputs_match_baseline"] = True  # the baseline itself
    else:
        base = {r["id"]: r["output"] for r in baseline["requests"]}
        same = sum(base.get(r["id"]) == r["output"] for r in reqs)
        result["outputs_match_baseline"] = same == len(reqs)
        result["outputs_matching"] = same
        b_hit = _hit_ttft(baseline["requests"])
        h = result["hit_ttft_p50_s"]
        result["extra_ttft_vs_baseline_hits_s"] = (h - b_hit) if h is not None and b_hit else None
        result.update(cold_ttft(op, baseline))
    return result


def cold_ttft(op: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """TTFT of the requests kvtier did not serve a token of (no tier hit: they would be
    no faster with kvtier, and must be no slower), against the same requests' TTFT in the
    baseline: p50 and p99 of each, and their ratios (``cold_ttft_p50_over_baseline``,
    ``cold_ttft_p99_over_baseline``). None each when there is no such request, or when
    per-request hits are unknown (over HTTP, only per-workload totals are)."""
    keys = ("cold_requests", "cold_ttft_p50_s", "cold_ttft_p99_s", "cold_ttft_p50_over_baseline")
    out: dict[str, Any] = dict.fromkeys((*keys, "cold_ttft_p99_over_baseline"))
    if "kvtier_hit_tokens" in op:
        return out
    base = {r["id"]: r["ttft"] for r in baseline["requests"]}
    cold = [r for r in op["requests"] if not sum(r.get("hit_sources", {}).values())]
    cold = [r for r in cold if r["id"] in base]
    out["cold_requests"] = len(cold)
    if not cold:
        return out
    mine = [r["ttft"] for r in cold]
    theirs = [base[r["id"]] for r in cold]
    for q in (50, 99):
        a, b = percentile(mine, q), percentile(theirs, q)
        out[f"cold_ttft_p{q}_s"] = a
        out[f"baseline_cold_ttft_p{q}_s"] = b
        out[f"cold_ttft_p{q}_over_baseline"] = a / b if b > 0 else None
    return out


def _hit_ttft(reqs: list[dict[str, Any]]) -> float | None:
    """Median TTFT of requests with at least half their prompt cached (any source)."""
    xs = [
        r["ttft"]
        for r in reqs
        if max(r["num_cached"], sum(r.get("hit_sources", {}).values())) * 2 >= r["prompt_len"]
    ]
    return statistics.median(xs) if xs else None


def table(workload: str, description: str, modes: dict[str, dict[str, Any]]) -> Any:
    """A rich Table for one workload (fits a 100-column terminal)."""
    from rich.table import Table

    t = Table(title=f"{workload}: {description}", title_justify="left")
    for col in (
        "mode",
        "TTFT p50/p90/p99 ms",
        "e2e s",
        "tok/s",
        "prompt tokens dev/host/disk/recomp",
        "loads s/a",
        "hit TTFT vs base",
        "cold TTFT p50/p99 vs base",
        "=base",
    ):
        t.add_column(col, justify="left" if col == "mode" else "right")
    for mode, s in modes.items():
        h = s["hit_tokens"]
        extra = s.get("extra_ttft_vs_baseline_hits_s")
        t.add_row(
            mode,
            "/".join(f"{s[k] * 1e3:.0f}" for k in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s")),
            f"{s['e2e_mean_s']:.2f}",
            f"{s['throughput_tok_s']:.0f}",
            "/".join(str(h[k]) for k in ("device", "host", "disk", "recomputed")),
            f"{s['loads']['sync']}/{s['loads']['async']}",
            "-" if extra is None else f"{extra * 1e3:+.0f} ms",
            _cold(s),
            _match(s.get("outputs_match_baseline")),
        )
    return t


def _cold(s: dict[str, Any]) -> str:
    a, b = s.get("cold_ttft_p50_over_baseline"), s.get("cold_ttft_p99_over_baseline")
    if a is None or b is None:
        return "-"
    return f"{a:.2f}x/{b:.2f}x ({s['cold_requests']})"


def _match(same: bool | None) -> str:
    return "-" if same is None else ("yes" if same else "NO")


def plots(results: dict[str, Any], out_dir: Path) -> list[str]:
    """PNG plots per workload: TTFT CDF per mode, prompt tokens by source per mode."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []
    for wl, data in results["workloads"].items():
        fig, ax = plt.subplots(figsize=(6, 4))
        for mode, raw in data["raw"].items():
            xs = sorted(r["ttft"] for r in raw["requests"])
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=mode)
        ax.set_xlabel("TTFT (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"TTFT CDF: {wl}")
        ax.legend()
        ax.grid(alpha=0.3)
        path = out_dir / f"ttft_cdf_{wl}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))

        fig, ax = plt.subplots(figsize=(6, 4))
        modes = list(data["modes"])
        bottom = [0] * len(modes)
        for src in SOURCES:
            vals = [data["modes"][m]["hit_tokens"][src] for m in modes]
            if any(vals):
                ax.bar(modes, vals, bottom=bottom, label=src)
                bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_ylabel("prompt tokens")
        ax.set_title(f"Prompt tokens by source: {wl}")
        ax.legend()
        path = out_dir / f"hit_sources_{wl}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written
