"""Prefetch on arrival and retention hints on real vLLM engines (CPU backend, SmolLM2).

(a) *Slow-tier hits*: ``--requests`` prompts, each a distinct 512-token prefix plus 32 new
    tokens (8 output tokens), arriving every ``--interval`` seconds, faster than the engine
    serves them (it runs four requests at a time: the others wait in its queue). The
    prefixes were served once (stored in the CPU tier, written through to a disk tier),
    then the CPU tier forgets them (the runner's ``evict`` op, what other traffic would do)
    and the engine's prefix cache is reset, so every prefix is on disk only. Replayed with
    prefetch off (each hit loads from disk when vLLM schedules the request) and on (each
    prefix is copied up into the CPU tier while its request waits), and once more with
    every prefix in the CPU tier (the CPU-tier-hit reference). TTFT runs from the request's
    arrival (its wait in the queue included; the runner adds requests between engine
    steps, so a long step admits the arrivals it covered as one burst). Summary:
    ``slow_hit_ttft_p50_over_cpu_hit`` (prefetch on; goal <= 1.1) and
    ``slow_hit_ttft_p99_prefetch_over_off`` (goal <= 1.0).
(b) *Agents*: ``--agents`` agents, each ``--turns`` turns: a 768-token context, then each turn
    adds its answer and a 48-token tool result, after a tool call of ``--gap`` seconds.
    Meanwhile background requests (512-token prompts drawn from a pool of 12, some reuse)
    arrive every 0.25 s and evict the agents' chains from a small CPU tier (192 MiB) and the
    engine's own cache (160 blocks). Run with ``retain_s`` on every agent turn and without
    it; hit ratio = cached prompt tokens / prompt tokens (vLLM's ``num_cached_tokens``: the
    engine's cache plus kvtier), agents' later turns and background apart:
    ``agent_hit_ratio_retain_over_off`` (goal > 1) and what the background pays,
    ``background_hit_ratio_retain_over_off``.
(c) ``outputs_match_baseline``: every request's greedy output equals that of vLLM without
    kvtier on the same program (fp32, so batch shapes cannot flip a token).

Three engines, one after another, each in its own process with the same explicit compute
threads (``--threads``; vLLM would give a connector's engine another count): vLLM alone
(both workloads), kvtier with a disk tier (a), kvtier with a small CPU tier (b). Each mode
runs ``--repeats`` times in one engine, the order swapped every other repeat; the summary
gives each ratio's worst repeat, with the best next to it.

Run: ``.venv/bin/python benchmarks/prefetch.py [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import statistics
import tempfile
import time
from typing import Any

from common import format_table, machine_info, write_json
from kvtier.errors import ConfigError
from kvtier.tools.bench.binding import check_equal, default_threads, same_binding
from kvtier.tools.bench.engine import run_engine

PREFIX, SUFFIX, OUT = 512, 32, 8
# Four requests at a time: the rest of a burst waits in vLLM's queue (what prefetch uses).
ENGINE = {
    "dtype": "float32",
    "max_model_len": 2048,
    "num_gpu_blocks_override": 160,
    "max_num_seqs": 4,
}
CONTEXT, TOOL, ANSWER, BG_TOKENS, BG_POOL, BG_EVERY = 768, 48, 16, 512, 12, 0.25
RETAIN = {"kvtier": {"retain_s": 60}}
SLOW_MODES = ("off", "on")


def ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 40000) for _ in range(n)]


def serve(name: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {"op": "serve", "name": name, "requests": requests, "max_concurrency": 1 << 10}


# -- (a) slow-tier hits ----------------------------------------------------------------------


def slow_program(n: int, interval: float, repeats: int) -> list[dict[str, Any]]:
    prefixes = [ids(100 + i, PREFIX) for i in range(n)]

    def replay(name: str) -> dict[str, Any]:
        reqs = [
            {
                "id": f"{name}-{i}",
                "prompt": p + ids(10_000 + i, SUFFIX),
                "max_tokens": OUT,
                "arrival": i * interval,
            }
            for i, p in enumerate(prefixes)
        ]
        return serve(name, reqs)

    fill = [{"id": f"fill-{i}", "prompt": p + ids(20_000 + i, SUFFIX), "max_tokens": 1}
            for i, p in enumerate(prefixes)]  # fmt: skip
    # Measured once kvtier's CPU tier has faulted its memory in (``settle``, as
    # vllm_ttft.py does): that start-up cost otherwise lands on the first replay.
    ops: list[dict[str, Any]] = [{"op": "settle"}, serve("fill", fill), {"op": "drain"}]
    for r in range(repeats):
        for mode in SLOW_MODES if r % 2 == 0 else SLOW_MODES[::-1]:
            ops += [
                {"op": "prefetch", "on": mode == "on"},
                {"op": "evict", "tier": "cpu"},
                {"op": "reset_prefix_cache"},
                replay(f"{mode}{r}"),
            ]
        # Every prefix is in the CPU tier now (prefetched, or filled by its disk hit).
        ops += [{"op": "prefetch", "on": False}, {"op": "reset_prefix_cache"}, replay(f"cpu{r}")]
    return ops


# -- (b) agents -------------------------------------------------------------------------------


def agent_program(agents: int, turns: int, gap: float, repeats: int) -> list[dict[str, Any]]:
    span = turns * (gap + 1.5) + 2.0
    ops: list[dict[str, Any]] = [{"op": "settle"}]
    for r in range(repeats):
        for mode in ("off", "retain") if r % 2 == 0 else ("retain", "off"):
            tag = f"{mode}{r}"
            hints = RETAIN if mode == "retain" else None
            reqs: list[dict[str, Any]] = []
            for a in range(agents):
                prev = None
                for t in range(turns):
                    req: dict[str, Any] = {
                        "id": f"{tag}-a{a}-t{t}",
                        "max_tokens": ANSWER,
                        "kv_transfer_params": hints,
                    }
                    if prev is None:
                        req.update(prompt=ids(300 + a, CONTEXT), arrival=0.1 * a)
                    else:
                        req.update(prompt=ids(400 + 10 * a + t, TOOL), extend=prev, gap=gap)
                    reqs.append(req)
                    prev = req["id"]
            rng = random.Random(7)
            for j in range(int(span / BG_EVERY)):
                doc = rng.randrange(BG_POOL)
                reqs.append(
                    {
                        "id": f"{tag}-bg{j}",
                        "prompt": ids(500 + doc, BG_TOKENS) + ids(600 + j, 8),
                        "max_tokens": 4,
                        "arrival": 0.5 + j * BG_EVERY,
                    }
                )
            # Each mode starts from empty tiers and an empty engine cache.
            ops += [{"op": "reset_prefix_cache", "connector": True}, serve(tag, reqs)]
    return ops


# -- figures ----------------------------------------------------------------------------------


def requests(result: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [r for op in result["ops"] if op["name"] == name for r in op["requests"]]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * len(xs) + 0.5) - 1))]  # nearest rank


def hit_ratio(reqs: list[dict[str, Any]]) -> float:
    total = sum(r["prompt_len"] for r in reqs)
    return sum(r["num_cached"] for r in reqs) / total if total else 0.0


def sources(reqs: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in reqs:
        for s, n in (r.get("hit_sources") or {}).items():
            out[s] = out.get(s, 0) + n
    return out


def outputs(result: dict[str, Any]) -> dict[str, list[int]]:
    return {r["id"]: r["output"] for op in result["ops"] for r in op["requests"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--quick", action="store_true", help="8 requests, 2 agents, 1 repeat")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between arrivals")
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--gap", type=float, default=2.0, help="tool-call seconds between turns")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="compute threads of every engine")
    ap.add_argument(
        "--parts",
        default="slow,agent",
        help="comma list of slow (a) and agent (b); the baseline runs the same parts",
    )
    args = ap.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not parts or parts - {"slow", "agent"}:
        raise SystemExit(
            f"prefetch: error: --parts: expected slow and/or agent, got {args.parts!r}"
        )
    if args.quick:
        args.requests, args.agents, args.repeats, args.gap = 8, 2, 1, 1.0
    threads = args.threads or default_threads(multiprocess=False)
    slow = slow_program(args.requests, args.interval, args.repeats) if "slow" in parts else []
    agent = (
        agent_program(args.agents, args.turns, args.gap, args.repeats) if "agent" in parts else []
    )
    disk_dir = tempfile.mkdtemp(prefix="kvtier-prefetch-disk-")
    configs: dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]]]] = {
        "baseline": (None, slow + agent),
        "slow": (
            {"cpu_bytes": "512MiB", "disk_path": disk_dir, "disk_bytes": "2GiB"},
            slow,
        ),
        "agent": ({"cpu_bytes": "192MiB", "retain_max_share": 0.75}, agent),
    }
    configs = {k: v for k, v in configs.items() if v[1]}
    results: dict[str, Any] = {}
    try:
        for kind, (connector, program) in configs.items():
            t0 = time.perf_counter()
            print(f"engine '{kind}' ...", flush=True)
            results[kind] = run_engine(
                {
                    "connector": connector,
                    "engine": ENGINE,
                    "inspect": connector is not None,
                    "program": program,
                    "threads": threads,
                }
            )
            print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        shutil.rmtree(disk_dir, ignore_errors=True)
    binding = {k: r.get("binding") for k, r in results.items()}
    if not same_binding(binding):
        write_json(args.json, {"summary": {"threads_equal": False}, "binding": binding})
        try:
            check_equal(binding)
        except ConfigError as e:
            raise SystemExit(f"prefetch: error: {e}") from None

    base = outputs(results["baseline"])
    mine = {
        k: v
        for kind in ("slow", "agent")
        if kind in results
        for k, v in outputs(results[kind]).items()
    }
    mismatched = sorted(k for k, v in mine.items() if base.get(k) != v)
    summary: dict[str, Any] = {
        "outputs_match_baseline": not mismatched,
        "threads_equal": True,
        "repeats": args.repeats,
        "parts": sorted(parts),
    }
    goals: dict[str, bool] = {}
    per_repeat_a = slow_figures(results["slow"], args) if "slow" in results else []
    per_repeat_b = agent_figures(results["agent"], args) if "agent" in results else []
    print()
    print(f"summary (worst of {args.repeats} repeat(s), best after the slash):")
    if per_repeat_a:
        p50w, p50b = worst(per_repeat_a, "p50_on_over_cpu", True)
        p99w, p99b = worst(per_repeat_a, "p99_on_over_off", True)
        offw, offb = worst(per_repeat_a, "p50_off_over_cpu", True)
        summary.update(
            slow_hit_ttft_p50_over_cpu_hit=p50w,
            slow_hit_ttft_p50_over_cpu_hit_best=p50b,
            slow_hit_ttft_p50_off_over_cpu_hit=offw,
            slow_hit_ttft_p50_off_over_cpu_hit_best=offb,
            slow_hit_ttft_p99_prefetch_over_off=p99w,
            slow_hit_ttft_p99_prefetch_over_off_best=p99b,
        )
        goals["slow_hit_ttft_p50_over_cpu_hit"] = p50w <= 1.1
        goals["slow_hit_ttft_p99_prefetch_over_off"] = p99w <= 1.0
        print(
            f"  slow-tier hit TTFT p50 / CPU-tier hit, prefetch on: {p50w:.2f} / {p50b:.2f} "
            f"(goal <= 1.1); off: {offw:.2f} / {offb:.2f}"
        )
        print(f"  slow-tier hit TTFT p99, prefetch on / off: {p99w:.2f} / {p99b:.2f} (goal <= 1.0)")
    if per_repeat_b:
        agw, agb = worst(per_repeat_b, "agent_retain_over_off", False)
        bgw, bgb = worst(per_repeat_b, "background_retain_over_off", False)
        summary.update(  # None (JSON null) where no repeat defined the ratio
            agent_hit_ratio_retain_over_off=None if math.isnan(agw) else agw,
            agent_hit_ratio_retain_over_off_best=None if math.isnan(agb) else agb,
            background_hit_ratio_retain_over_off=None if math.isnan(bgw) else bgw,
            background_hit_ratio_retain_over_off_best=None if math.isnan(bgb) else bgb,
        )
        goals["agent_hit_ratio_retain_over_off"] = agw > 1.0
        undefined = sum(row["agent_retain_over_off"] is None for row in per_repeat_b)
        print(
            f"  agents' hit ratio, retain_s / none: {agw:.2f} / {agb:.2f} (goal > 1); "
            f"background: {bgw:.2f} / {bgb:.2f}"
            + (
                f" ({undefined} repeat(s) without any agent hit when off: left out)"
                if undefined
                else ""
            )
        )
    summary["goals_met"] = goals
    print(
        f"  outputs match vLLM alone: {not mismatched}"
        + (f" (differ: {mismatched[:5]})" if mismatched else "")
    )
    write_json(
        args.json,
        {
            "summary": summary,
            "slow_hits": per_repeat_a,
            "agents": per_repeat_b,
            "binding": binding,
            "machine": machine_info(threads=threads),
            "args": vars(args),
            "kvtier": {
                k: r.get("kvtier", {}).get("metrics") for k, r in results.items() if k != "baseline"
            },
        },
    )


def ratio(a: float, b: float) -> float | None:
    """``a / b``, or None where ``b`` is 0 (a repeat whose reference had no hit at all)."""
    return a / b if b > 0 else None


def worst(rows: list[dict[str, Any]], key: str, high_is_bad: bool) -> tuple[float, float]:
    """(worst, best) of one ratio over the repeats where it is defined (NaN where it never
    is)."""
    xs = [row[key] for row in rows if row[key] is not None]
    if not xs:
        return math.nan, math.nan
    return (max(xs), min(xs)) if high_is_bad else (min(xs), max(xs))


MODE_NAMES = {"on": "prefetch on", "off": "prefetch off", "cpu": "CPU-tier hit"}


def slow_figures(result: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Part (a): per repeat, TTFT p50 / p99 per mode, their ratios, hit sources; the table."""
    rows, out = [], []
    for r in range(args.repeats):
        t = {m: [x["ttft"] for x in requests(result, f"{m}{r}")] for m in (*SLOW_MODES, "cpu")}
        p = {m: (statistics.median(v), pct(v, 0.99)) for m, v in t.items()}
        srcs = {m: sources(requests(result, f"{m}{r}")) for m in t}
        out.append(
            {
                "p50_s": {m: v[0] for m, v in p.items()},
                "p99_s": {m: v[1] for m, v in p.items()},
                "ttft_s": t,
                "p50_on_over_cpu": p["on"][0] / p["cpu"][0],
                "p50_off_over_cpu": p["off"][0] / p["cpu"][0],
                "p99_on_over_off": p["on"][1] / p["off"][1],
                "sources": srcs,
            }
        )
        for m in t:
            rows.append(
                [
                    r,
                    MODE_NAMES[m],
                    f"{p[m][0] * 1e3:.0f}",
                    f"{p[m][1] * 1e3:.0f}",
                    f"{p[m][0] / p['cpu'][0]:.2f}",
                    ", ".join(f"{s} {n}" for s, n in sorted(srcs[m].items())),
                ]
            )
    print()
    print(
        format_table(
            ["repeat", "mode", "TTFT p50 ms", "p99 ms", "p50 / CPU hit", "hit tokens by source"],
            rows,
            title=f"(a) {args.requests} requests, {PREFIX}-token prefixes on disk only, one "
            f"every {args.interval * 1e3:.0f} ms",
        )
    )
    return out


def agent_figures(result: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Part (b): per repeat, hit ratios of agents' later turns and of the background."""
    rows, out = [], []
    for r in range(args.repeats):
        fig: dict[str, dict[str, float]] = {}
        for mode in ("off", "retain"):
            reqs = requests(result, f"{mode}{r}")
            later = [x for x in reqs if "-a" in x["id"] and not x["id"].endswith("-t0")]
            bg = [x for x in reqs if "-bg" in x["id"]]
            fig[mode] = {"agent": hit_ratio(later), "background": hit_ratio(bg)}
            rows.append([r, mode, f"{fig[mode]['agent']:.3f}", f"{fig[mode]['background']:.3f}"])
        out.append(
            {
                "hit_ratio": fig,
                "agent_retain_over_off": ratio(fig["retain"]["agent"], fig["off"]["agent"]),
                "background_retain_over_off": ratio(
                    fig["retain"]["background"], fig["off"]["background"]
                ),
            }
        )
    print()
    print(
        format_table(
            ["repeat", "mode", "agents' later turns", "background"],
            rows,
            title=f"(b) hit ratio, {args.agents} agents x {args.turns} turns, tool calls of "
            f"{args.gap:.1f} s, background every {BG_EVERY} s",
        )
    )
    return out


if __name__ == "__main__":
    main()
