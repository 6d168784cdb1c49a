"""``kvtier bench``: run workloads on a real engine in each mode and compare.

Modes, each a separate engine process on the same requests:

- ``baseline``: vLLM with its own prefix cache only;
- ``async``: kvtier with ``sync_budget=0`` (every hit loads between steps);
- ``sync``: kvtier with a fixed per-step budget (``--budget``);
- ``auto``: kvtier's default (budget derived from measured bandwidth and step time);
- ``sync-layers`` (only when asked for, ``--modes``): ``sync`` with ``layer_loads="on"``
  (sync loads copied layer by layer while the forward runs).

Within a mode the workloads run one after another on one engine; between workloads the
engine's prefix cache and kvtier's tiers are reset, so workloads do not help each other.

The ``two-engines`` workload runs engines of its own instead of the modes (kvtier's
default settings with a remote tier, and a baseline without kvtier): see
:mod:`kvtier.tools.bench.two_engines`. Every engine of one bench run, whichever workload, computes
on the same ``threads``, and the run refuses to compare engines whose measured binding differs.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError
from kvtier.tools.bench import report, two_engines
from kvtier.tools.bench.binding import (
    binding_env,
    check_equal,
    default_threads,
    describe,
    same_binding,
)
from kvtier.tools.bench.engine import run_with_progress
from kvtier.tools.bench.http import run_http_modes
from kvtier.tools.bench.machine import machine_info, preferred_dtype
from kvtier.tools.bench.workloads import WORKLOADS, Workload, WorkloadOptions, build, repetition
from kvtier.units import parse_size

MODES = ("baseline", "async", "sync", "auto")
"""The modes run by default."""
ACCEPTED_MODES = (*MODES, "sync-layers")
ACCEPTED_WORKLOADS = (*WORKLOADS, two_engines.NAME)


@dataclass(frozen=True)
class BenchOptions:
    """Everything ``kvtier bench`` takes (the CLI flags)."""

    model: str | None = None
    workloads: tuple[str, ...] = ("multi-turn", "doc-qa")
    modes: tuple[str, ...] = MODES
    requests: int = 12
    concurrency: int = 2
    rate: float | None = None
    seed: int = 0
    cpu_bytes: str = "1GiB"
    budget: str = "256MiB"
    device_blocks: int = 64
    """The engine's own KV cache in blocks of 32 tokens: small on purpose, so its prefix
    cache cannot hold the workload and offloading has something to do."""
    dtype: str = "float32"
    """The engines' dtype. fp32 by default: in bf16, vLLM-CPU's greedy outputs change with
    the batch a request runs in (measured on an AVX-512 BF16 machine: 4 of 12 requests per
    workload differ between 4 and 1 requests at a time, no kvtier involved), so the
    token-identity column would not isolate kvtier."""
    max_tokens: int = 24
    doc_tokens: int = 600
    trace: str | None = None
    out: str = "bench-results"
    threads: int | None = None
    """Compute threads of every mode's engine (None: all cores in process, one fewer for
    a server's model worker). The same for every mode, set explicitly: see
    ``kvtier.tools.bench.binding``."""
    server: str | None = None
    """URL of a running OpenAI-compatible server: drive the workloads over HTTP against
    it (one mode, "server"; it must serve the bench model)."""
    serve: bool = False
    """Start an OpenAI server per mode and drive the workloads over HTTP."""
    repeats: int = 3
    """Runs of each workload per mode, the caches reset between them; every statistic is
    over the requests of all runs (request ids get ``#run``). Three runs make the cold
    requests' TTFT ratios (``cold_ttft_p50_over_baseline``) stable to a few percent here,
    where one run's half-dozen cold requests moved them by 10%."""
    remote: str | None = None
    """The ``two-engines`` workload's store: a Redis / Valkey URL (the run writes and then
    deletes keys of its own namespace only); None: a private redis-server on 127.0.0.1,
    started for the run and stopped after it."""


def validate(opts: BenchOptions) -> str:
    """Check options up front (one clear error each); return the model directory."""
    for w in opts.workloads:
        if w not in ACCEPTED_WORKLOADS:
            raise ConfigError(
                f"--workload: unknown {w!r}; accepted: {', '.join(ACCEPTED_WORKLOADS)}"
            )
    for m in opts.modes:
        if m not in ACCEPTED_MODES:
            raise ConfigError(f"--modes: unknown {m!r}; accepted: {', '.join(ACCEPTED_MODES)}")
    parse_size(opts.cpu_bytes, name="--cpu-bytes")
    parse_size(opts.budget, name="--budget")
    if opts.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError(
            f"--dtype: got {opts.dtype!r}; accepted: auto, float32, bfloat16, float16"
        )
    for name in ("requests", "concurrency", "device_blocks", "max_tokens", "doc_tokens", "repeats"):
        if getattr(opts, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')}: must be > 0")
    if opts.server and opts.serve:
        raise ConfigError("--server, --serve: give one (a running server, or start one per mode)")
    if opts.server and not opts.server.startswith(("http://", "https://")):
        raise ConfigError(f"--server: expected an http:// URL, got {opts.server!r}")
    if opts.threads is not None:
        binding_env(opts.threads, multiprocess=False)  # raises on a bad count
    if two_engines.NAME in opts.workloads and (opts.server or opts.serve):
        raise ConfigError(
            f"--workload {two_engines.NAME}: runs its own engines in process, "
            "not with --server or --serve"
        )
    if opts.remote is not None:
        if two_engines.NAME not in opts.workloads:
            raise ConfigError(
                f"--remote: only the {two_engines.NAME} workload uses a remote store "
                f"(add --workload {two_engines.NAME})"
            )
        two_engines.check_url(opts.remote)
    if opts.model is None:
        from kvtier.tools.models import smollm2_path

        return smollm2_path()
    path = Path(opts.model)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"--model: {opts.model!r} is not a local model directory (no config.json); "
            "kvtier never downloads models - omit --model for the built-in SmolLM2"
        )
    return str(path)


def connector_config(mode: str, opts: BenchOptions) -> dict[str, Any] | None:
    if mode == "baseline":
        return None
    budget = {"async": 0, "sync": opts.budget, "sync-layers": opts.budget, "auto": "auto"}[mode]
    out: dict[str, Any] = {"cpu_bytes": opts.cpu_bytes, "sync_budget": budget}
    if mode == "sync-layers":
        out["layer_loads"] = "on"
    return out


def run_bench(opts: BenchOptions) -> dict[str, Any]:
    """Run every mode, print the tables, write results.json and plots to ``opts.out``."""
    from rich.console import Console
    from tqdm import tqdm

    console = Console(width=max(120, Console().width))
    model = validate(opts)
    dtype = preferred_dtype() if opts.dtype == "auto" else opts.dtype
    wopts = WorkloadOptions(
        requests=opts.requests,
        seed=opts.seed,
        doc_tokens=opts.doc_tokens,
        max_tokens=opts.max_tokens,
        rate=opts.rate,
        trace_path=opts.trace,
    )
    workloads = [build(name, model, wopts) for name in opts.workloads if name in WORKLOADS]
    pair = _pair_options(opts) if two_engines.NAME in opts.workloads else None
    # vLLM refuses a max_model_len its KV cache could not hold for one request.
    engine = {
        "dtype": dtype,
        "max_num_seqs": opts.concurrency,
        "num_gpu_blocks_override": opts.device_blocks,
        "max_model_len": min(4096, (opts.device_blocks - 1) * 32),
    }
    http = bool(opts.server or opts.serve)
    threads = opts.threads or default_threads(multiprocess=http)
    modes = ("server",) if opts.server else opts.modes if workloads else ()
    out_dir = Path(opts.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    total = len(modes) * (1 + opts.repeats * sum(len(w.requests) for w in workloads))
    total += two_engines.progress_total(pair) if pair else 0
    paired: dict[str, Any] | None = None
    raw: dict[str, dict[str, Any]] = {}
    t_start = time.perf_counter()
    with tqdm(total=total, desc="kvtier bench", unit="req") as bar:
        if http:
            raw = run_http_modes(
                opts.server,
                modes,
                workloads,
                lambda m: connector_config(m, opts),
                model=model,
                engine=engine,
                threads=threads,
                concurrency=opts.concurrency,
                out_dir=out_dir,
                bar=bar,
                repeats=opts.repeats,
            )
        for mode in () if http else modes:
            bar.set_postfix_str(f"mode {mode}")
            spec = {
                "model": model,
                "engine": engine,
                "connector": connector_config(mode, opts),
                "inspect": mode != "baseline",
                "program": _program(workloads, opts),
                "threads": threads,
            }
            raw[mode] = run_with_progress(spec, bar, out_dir / f"engine-{mode}.log")
        if pair:
            paired = two_engines.run_two_engines(
                opts.remote,
                model=model,
                engine=engine,
                threads=threads,
                opts=pair,
                out_dir=out_dir,
                bar=bar,
            )
    elapsed = time.perf_counter() - t_start

    binding = {m: raw[m].get("binding") for m in modes}
    binding.update(paired.pop("binding") if paired else {})
    results: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            **asdict(opts),
            "model": model,
            "dtype": dtype,
            "engine": engine,
            "threads": threads,
            "remote": two_engines.shown(opts.remote) if pair else None,  # no password
        },
        "binding": binding,
        "threads_equal": same_binding(binding),
        "seconds": elapsed,
        "workloads": {},
    }
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if len(binding) > 1:
        check_equal(binding)  # no table of engines that computed on different threads
        first = next(iter(binding.values())) or {}
        console.print(f"every engine of this run computed on {describe(first)}")
    for i, wl in enumerate(workloads):
        r = opts.repeats
        ops = {m: report.merge_runs(raw[m]["ops"][i * r : (i + 1) * r]) for m in modes}
        base = ops.get("baseline")
        stats = {
            m: report.summarize(op, base if m != "baseline" else None) for m, op in ops.items()
        }
        if base is None:  # a lone running server: nothing to compare outputs with
            for s in stats.values():
                s["outputs_match_baseline"] = None
        results["workloads"][wl.name] = {
            "description": wl.description,
            "params": wl.params,
            "modes": stats,
            "raw": ops,
        }
        console.print(report.table(wl.name, wl.description, stats))
    results["kvtier"] = {m: raw[m].get("kvtier") for m in modes}
    if paired:
        results["kvtier"].update(
            {f"{two_engines.NAME} {k}": v for k, v in paired.pop("kvtier").items()}
        )
        results["workloads"][two_engines.NAME] = paired
        console.print(two_engines.table(paired))
    results["plots"] = report.plots(results, out_dir)
    slim = dict(results)
    slim["workloads"] = {
        k: {kk: vv for kk, vv in v.items() if kk != "raw"} for k, v in results["workloads"].items()
    }
    (out_dir / "results.json").write_text(json.dumps(slim, indent=2) + "\n")
    (out_dir / "requests.json").write_text(
        json.dumps({k: v["raw"] for k, v in results["workloads"].items()}) + "\n"
    )
    console.print(
        f"results: {out_dir / 'results.json'} (per-request data in requests.json), "
        f"plots: {', '.join(Path(p).name for p in results['plots'])}; "
        f"{elapsed:.0f} s in all"
    )
    return slim


def _pair_options(opts: BenchOptions) -> two_engines.TwoEngineOptions:
    """The two-engine run's sizes from the bench flags: ``--requests`` / 2 conversations
    (each a first turn on A and a continuation on B)."""
    return two_engines.TwoEngineOptions(
        conversations=max(2, opts.requests // 2),
        doc_tokens=opts.doc_tokens,
        max_tokens=opts.max_tokens,
        seed=opts.seed,
        concurrency=opts.concurrency,
        cpu_bytes=opts.cpu_bytes,
    )


def _program(workloads: list[Workload], opts: BenchOptions) -> list[dict[str, Any]]:
    prog: list[dict[str, Any]] = [
        {
            "op": "serve",
            "name": "warmup",
            "requests": [
                {"id": "warmup", "prompt": workloads[0].requests[0]["prompt"][:64], "max_tokens": 2}
            ],
        },
        # Measured once the CPU tier has faulted its memory in (a one-time start-up cost:
        # its background warm-up took a core from the first workload's requests).
        {"op": "settle"},
        {"op": "reset_prefix_cache", "connector": True},
    ]
    for wl in workloads:
        for k in range(opts.repeats):
            prog.append(
                {
                    "op": "serve",
                    "name": wl.name,
                    "requests": repetition(wl.requests, k),
                    "max_concurrency": opts.concurrency,
                }
            )
            prog.append({"op": "reset_prefix_cache", "connector": True})
    return prog
