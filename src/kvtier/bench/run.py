"""``kvtier bench``: run workloads on a real engine in each mode and compare.

Modes, each a separate engine process on the same requests:

- ``baseline``: vLLM with its own prefix cache only;
- ``async``: kvtier with ``sync_budget=0`` (every hit loads between steps);
- ``sync``: kvtier with a fixed per-step budget (``--budget``);
- ``auto``: kvtier's default (budget derived from measured bandwidth and step time).

Within a mode the workloads run one after another on one engine; between workloads the
engine's prefix cache and kvtier's tiers are reset, so workloads do not help each other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvtier.bench import report
from kvtier.bench.binding import (
    binding_env,
    check_equal,
    default_threads,
    describe,
    same_binding,
)
from kvtier.bench.http import run_http_modes
from kvtier.bench.machine import machine_info, preferred_dtype
from kvtier.bench.workloads import WORKLOADS, Workload, WorkloadOptions, build
from kvtier.errors import ConfigError
from kvtier.units import parse_size

MODES = ("baseline", "async", "sync", "auto")


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
    dtype: str = "auto"
    max_tokens: int = 24
    doc_tokens: int = 600
    trace: str | None = None
    out: str = "bench-results"
    threads: int | None = None
    """Compute threads of every mode's engine (None: all cores in process, one fewer for
    a server's model worker). The same for every mode, set explicitly: see
    ``kvtier.bench.binding``."""
    server: str | None = None
    """URL of a running OpenAI-compatible server: drive the workloads over HTTP against
    it (one mode, "server"; it must serve the bench model)."""
    serve: bool = False
    """Start an OpenAI server per mode and drive the workloads over HTTP."""


def validate(opts: BenchOptions) -> str:
    """Check options up front (one clear error each); return the model directory."""
    for w in opts.workloads:
        if w not in WORKLOADS:
            raise ConfigError(f"--workload: unknown {w!r}; accepted: {', '.join(WORKLOADS)}")
    for m in opts.modes:
        if m not in MODES:
            raise ConfigError(f"--modes: unknown {m!r}; accepted: {', '.join(MODES)}")
    parse_size(opts.cpu_bytes, name="--cpu-bytes")
    parse_size(opts.budget, name="--budget")
    if opts.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError(
            f"--dtype: got {opts.dtype!r}; accepted: auto, float32, bfloat16, float16"
        )
    for name in ("requests", "concurrency", "device_blocks", "max_tokens", "doc_tokens"):
        if getattr(opts, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')}: must be > 0")
    if opts.server and opts.serve:
        raise ConfigError("--server, --serve: give one (a running server, or start one per mode)")
    if opts.server and not opts.server.startswith(("http://", "https://")):
        raise ConfigError(f"--server: expected an http:// URL, got {opts.server!r}")
    if opts.threads is not None:
        binding_env(opts.threads, multiprocess=False)  # raises on a bad count
    if opts.model is None:
        from kvtier.models import smollm2_path

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
    budget = {"async": 0, "sync": opts.budget, "auto": "auto"}[mode]
    return {"cpu_bytes": opts.cpu_bytes, "sync_budget": budget}


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
    workloads = [build(name, model, wopts) for name in opts.workloads]
    # vLLM refuses a max_model_len its KV cache could not hold for one request.
    engine = {
        "dtype": dtype,
        "max_num_seqs": opts.concurrency,
        "num_gpu_blocks_override": opts.device_blocks,
        "max_model_len": min(4096, (opts.device_blocks - 1) * 32),
    }
    http = bool(opts.server or opts.serve)
    threads = opts.threads or default_threads(multiprocess=http)
    modes = ("server",) if opts.server else opts.modes
    out_dir = Path(opts.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    total = len(modes) * (1 + sum(len(w.requests) for w in workloads))  # + warm-up
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
            raw[mode] = _run_with_progress(spec, bar, out_dir / f"engine-{mode}.log")
    elapsed = time.perf_counter() - t_start

    binding = {m: raw[m].get("binding") for m in modes}
    results: dict[str, Any] = {
        "machine": machine_info(),
        "config": {
            **asdict(opts),
            "model": model,
            "dtype": dtype,
            "engine": engine,
            "threads": threads,
        },
        "binding": binding,
        "threads_equal": same_binding(binding),
        "seconds": elapsed,
        "workloads": {},
    }
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    if len(modes) > 1:
        check_equal(binding)  # no table of engines that computed on different threads
        console.print(f"every mode's engine computed on {describe(binding[modes[0]] or {})}")
    for i, wl in enumerate(workloads):
        ops = {m: raw[m]["ops"][i] for m in modes}
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


def _program(workloads: list[Workload], opts: BenchOptions) -> list[dict[str, Any]]:
    prog: list[dict[str, Any]] = [
        {
            "op": "serve",
            "name": "warmup",
            "requests": [
                {"id": "warmup", "prompt": workloads[0].requests[0]["prompt"][:64], "max_tokens": 2}
            ],
        },
        {"op": "reset_prefix_cache", "connector": True},
    ]
    for wl in workloads:
        prog.append(
            {
                "op": "serve",
                "name": wl.name,
                "requests": wl.requests,
                "max_concurrency": opts.concurrency,
            }
        )
        prog.append({"op": "reset_prefix_cache", "connector": True})
    return prog


def _run_with_progress(spec: dict[str, Any], bar: Any, log_path: Path) -> dict[str, Any]:
    """One engine process; the runner reports finished requests through a file."""
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-") as tmp:
        spec_path, out_path, prog = (Path(tmp) / n for n in ("spec.json", "out.json", "progress"))
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ, KVTIER_PROGRESS=str(prog))
        seen = 0
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvtier.vllm.runner", str(spec_path), str(out_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
            while proc.poll() is None:
                time.sleep(0.5)
                seen = _advance(bar, prog, seen)
        _advance(bar, prog, seen)
        if proc.returncode != 0:
            tail = log_path.read_text()[-2500:]
            raise ConfigError(f"the engine failed (see {log_path}):\n{tail}")
        result: dict[str, Any] = json.loads(out_path.read_text())
        # The warm-up op is not a workload.
        result["ops"] = [op for op in result["ops"] if op["name"] != "warmup"]
        return result


def _advance(bar: Any, prog: Path, seen: int) -> int:
    """Move the bar by the requests finished since the last look."""
    try:
        n = int(prog.read_text() or 0)
    except (OSError, ValueError):
        return seen
    if n > seen:
        bar.update(n - seen)
        return n
    return seen
