"""``kvtier soak``: mixed traffic with random faults on a real engine, against an oracle.

Two engine processes run the same rounds (:mod:`kvtier.tools.soak.workload`) with the same
engine settings and the same explicit CPU binding:

1. the oracle: vLLM without kvtier (its own prefix cache only), greedy outputs expected;
2. kvtier with a CPU tier and a write-through disk tier, both small so chunks move between
   tiers all the time, while faults are injected at random from a seed: failed and slow
   copies on the CPU tier's real row path and on the disk store (FaultyStore), and real
   damage to the disk tier's files (:mod:`kvtier.tools.soak.disk_faults`): corrupted payloads,
   truncated slab files, and a full filesystem (``ENOSPC`` from the kernel, on a tmpfs
   mounted for the run when this process may mount one).

With ``remote`` (the default) a third tier, a shared ``redis`` tier, sits last in the
stack on a private ``redis-server`` on loopback (``maxmemory`` + ``allkeys-lru``, so it
evicts keys on its own), and the server is killed, restarted empty and hung at random
(:mod:`kvtier.tools.soak.remote_faults`).
The result: per-request comparison with the oracle, faults by kind, leaks after the final
drain, resident memory growth after warm-up and hit tokens by source; a table on the
terminal and JSON with a ``summary``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError
from kvtier.tools.bench.engine import run_module
from kvtier.tools.redis_server import RedisServer
from kvtier.tools.soak.remote_faults import RemoteFaultInjector
from kvtier.tools.soak.workload import RoundShape, build_rounds

SOAK_RUNNER = "kvtier.vllm.harness.soak"
"""The engine process: ``python -m SOAK_RUNNER SPEC.json OUT.json``."""

MiB = 1 << 20

MODELS = ("smollm2", "gemma3")
"""What ``SoakOptions.model`` may name."""


@dataclass(frozen=True)
class SoakOptions:
    """What a soak runs (defaults: the full soak, about 1,000 requests)."""

    requests: int = 1000
    """About this many requests (rounded up to whole rounds of ``shape.size``)."""
    model: str = "smollm2"
    """The model both engines serve: ``"smollm2"`` (SmolLM2-135M, dense attention: one
    KV-cache group; failed loads are reported to vLLM per block) or ``"gemma3"`` (a tiny
    random-weight Gemma 3 built by :mod:`kvtier.tools.tiny_models`: sliding-window and
    global layers in several KV-cache groups with vLLM's hybrid KV-cache manager on; failed
    loads are reported per request, and every hit loads asynchronously). The tiny
    model's vocabulary is 512 tokens: the workload's token ids are folded into it."""
    seed: int = 0
    shape: RoundShape = field(default_factory=RoundShape)
    cpu_bytes: int = 96 * MiB
    """CPU tier: small, so it evicts and the disk tier serves hits too."""
    disk_bytes: int = 160 * MiB
    fs_bytes: int = 224 * MiB
    """Size of the tmpfs the disk tier lives on (ENOSPC once the ballast fills it)."""
    cpu_fault_rate: float = 0.02
    """Probability that a CPU-tier row copy fails (and, separately, is slow)."""
    disk_fault_rate: float = 0.02
    """Probability that a disk chunk read / write fails (and that a batch is slow)."""
    disk_fault_interval: float = 1.5
    """Mean seconds between two real faults on the disk tier's files."""
    slow_seconds: float = 0.05
    remote: bool = True
    """A shared redis tier last in the stack (cpu -> disk -> redis), with server faults."""
    remote_fault_interval: float = 6.0
    """Mean seconds between two faults of the redis-server (kill, restart empty, hang)."""
    remote_maxmemory: str = "128mb"
    """The server's ``maxmemory`` (``allkeys-lru``): small, so it evicts keys itself."""
    device_blocks: int = 16
    """The engine's own KV cache (blocks of 32 tokens): small, so vLLM preempts."""
    warmup_rounds: int = 1
    """Rounds before the resident-memory reference point."""
    step_warmup: bool = True
    """Before the rounds, run one prefill of every step size the engine can take (1 to
    ``max_num_batched_tokens`` tokens), in both engines. vLLM-CPU keeps native state per
    new step size (~2 MiB each here, in fp32; nothing more when a size comes again), so
    without this the engine's memory grows for as long as traffic brings sizes it has not
    seen, which says nothing about kvtier."""
    out: str = "soak-results"
    """Directory for engine logs (and ``soak.json`` unless ``json`` says otherwise)."""
    json: str | None = None
    progress: bool = True
    oracle: str | None = None
    """File of oracle results: reused when it holds this exact workload (same rounds,
    engine settings and binding), else written after the oracle run. Lets a long soak run
    its two engines in separate sittings."""
    oracle_only: bool = False
    """Run (or reuse) the oracle, save it to ``oracle`` and stop."""
    timeline: str | None = None
    """Record the kvtier engine's event timeline (``$KVTIER_TIMELINE``) in this file."""

    @property
    def rounds(self) -> int:
        return max(self.warmup_rounds + 1, -(-self.requests // self.shape.size))


def cpu_binding() -> dict[str, str]:
    """The same explicit OpenMP binding for both engines (vLLM reserves a core for a KV
    connector unless told otherwise, which would give the two runs different compute)."""
    cpus = sorted(os.sched_getaffinity(0))
    return {
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    }


STEP_TOKENS = 128
"""The engine's ``max_num_batched_tokens``: every step computes 1-128 tokens, so the
step-size warm-up (``SoakOptions.step_warmup``) is 128 short prefills."""


GROUP_BLOCKS = {"smollm2": 1, "gemma3": 3}
"""Engine blocks per ``device_blocks`` for each model: the tiny Gemma 3's sliding-window
groups take blocks from the same pool as its global layers, so the same context length
needs about three times the blocks (fewer do not fit a request of max_model_len)."""


def engine_settings(opts: SoakOptions) -> dict[str, Any]:
    return {
        # fp32: greedy tokens must not flip on rounding when batch shapes differ.
        "dtype": "float32",
        "num_gpu_blocks_override": opts.device_blocks * GROUP_BLOCKS.get(opts.model, 1),
        "max_model_len": (opts.device_blocks - 1) * 32,
        "max_num_batched_tokens": STEP_TOKENS,
        "max_num_seqs": max(4, opts.shape.burst),
    }


def kvtier_config(
    opts: SoakOptions, disk_path: str, remote_url: str | None = None
) -> dict[str, Any]:
    # Reads (loads) are rarer than writes (every store, every write-through copy): they
    # fail at a higher rate, so that both kinds occur in a short soak.
    rate, slow = opts.cpu_fault_rate, opts.slow_seconds
    tiers: dict[str, Any] = {
        "cpu_bytes": opts.cpu_bytes,
        "disk_path": disk_path,
        "disk_bytes": opts.disk_bytes,
        "disk_threads": 2,
        "disk_write_policy": "write-through",
    }
    if remote_url is not None:
        tiers = {
            "tiers": [
                {"kind": "cpu", "capacity": opts.cpu_bytes},
                {"kind": "disk", "path": disk_path, "capacity": opts.disk_bytes, "threads": 2},
                # Shorter than a hang fault, so a hung server costs timeouts, not waits.
                {"kind": "redis", "url": remote_url, "timeout_ms": 200},
            ]
        }
    return {
        **tiers,
        "fault_injection": {
            "seed": opts.seed,
            "read_fail_rate": min(1.0, 2.5 * rate),
            "write_fail_rate": rate,
            "slow_rate": rate,
            "slow_seconds": slow,
            "rows": True,
            "disk": {
                "seed": opts.seed + 1,
                "read_fail_rate": min(1.0, 2.5 * opts.disk_fault_rate),
                "write_fail_rate": opts.disk_fault_rate,
                "slow_rate": opts.disk_fault_rate,
                "slow_seconds": slow,
            },
        },
    }


@contextlib.contextmanager
def small_filesystem(size: int) -> Iterator[tuple[str, str]]:
    """A directory on a fresh tmpfs of ``size`` bytes, and how ENOSPC is produced there:
    "tmpfs" (the kernel's, when mounting works) or "none" (a plain temporary directory,
    when this process may not mount: no ENOSPC faults then)."""
    with tempfile.TemporaryDirectory(prefix="kvtier-soak-fs-") as tmp:
        proc = subprocess.run(
            # mode=0700: a tmpfs root is 1777 by default, which the disk tier refuses.
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", tmp],
            capture_output=True,
            text=True,
        )
        mounted = proc.returncode == 0
        try:
            yield tmp, ("tmpfs" if mounted else "none")
        finally:
            if mounted:
                subprocess.run(["umount", "-l", tmp], capture_output=True)


def _saved_oracle(path: str | None, fingerprint: str) -> dict[str, Any] | None:
    """Oracle results saved by an earlier run of this exact workload, or None."""
    if not path or not Path(path).is_file():
        return None
    try:
        saved: dict[str, Any] = json.loads(Path(path).read_text())
    except ValueError:
        return None
    return saved if saved.get("fingerprint") == fingerprint else None


def compare(
    expected: dict[str, Any], got: dict[str, Any] | None
) -> tuple[int, int, list[dict[str, Any]]]:
    """(wrong outputs, failed requests, details of each) of ``got`` against the oracle.

    An aborted request is compared on the tokens both runs produced before the abort."""
    want = {r["id"]: r for op in expected["ops"] for r in op["requests"]}
    have = {r["id"]: r for op in (got or {}).get("ops", []) for r in op["requests"]}
    wrong = failed = 0
    details = []
    for rid, w in want.items():
        h = have.get(rid)
        if h is None or "output" not in h:
            failed += 1
            details.append({"id": rid, "problem": "no result"})
            continue
        a, b = w["output"], h["output"]
        if w.get("aborted") or h.get("aborted"):
            n = min(len(a), len(b))
            same = bool(w.get("aborted")) == bool(h.get("aborted")) and a[:n] == b[:n] and n > 0
        else:
            same = a == b
        if not same:
            wrong += 1
            seen = {k: h[k] for k in ("hit_sources", "load", "num_cached", "prompt_len") if k in h}
            details.append(
                {"id": rid, "problem": "output differs", "expected": a, "got": b, **seen}
            )
    return wrong, failed, details


def hit_tokens(metrics: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for labels, value in metrics.get("values", {}).get("hit_tokens", []):
        out[labels[0]] = out.get(labels[0], 0) + int(value)
    return out


def _growth(rss: list[int], warmup_rounds: int) -> float | None:
    """Resident memory at the end over the reference point after warm-up."""
    ref = rss[warmup_rounds] if len(rss) > warmup_rounds else 0
    return rss[-1] / ref if ref else None


def summarize(
    opts: SoakOptions,
    oracle: dict[str, Any],
    status: int,
    result: dict[str, Any] | None,
    enospc_mode: str,
    remote_faults: dict[str, int] | None = None,
) -> dict[str, Any]:
    wrong, failed, details = compare(oracle, result)
    r = result or {}
    faults = {k: v for k, v in r.get("faults", {}).items() if "_detected_" not in k}
    faults.update(remote_faults or {})
    leaks = r.get("leaks", {})
    rss = r.get("rss_bytes", [])
    return {
        "summary": {
            "requests": sum(len(op["requests"]) for op in oracle["ops"]),
            "faults_injected": faults,
            "faults_injected_total": sum(faults.values()),
            "wrong_outputs": wrong,
            "failed_requests": failed,
            "crashes": int(status != 0),
            "leaked_slots": leaks.get("slots"),
            "leaked_pins": leaks.get("pins"),
            "leaked_jobs": (
                None if not leaks else leaks["jobs"] + leaks["worker_jobs"] + leaks["requests"]
            ),
            "index_errors": leaks.get("index_errors"),
            "rss_growth_after_warmup": _growth(rss, opts.warmup_rounds),
            # The same engine without kvtier, on the same rounds: what vLLM (and torch)
            # grow by on their own.
            "oracle_rss_growth_after_warmup": _growth(
                oracle.get("rss_bytes", []), opts.warmup_rounds
            ),
            "hit_tokens": hit_tokens(r.get("metrics", {})),
            "enospc": enospc_mode,
            "remote_tier": (
                f"redis-server on loopback, maxmemory {opts.remote_maxmemory} allkeys-lru, "
                "killed / restarted empty / hung at random"
                if opts.remote
                else "off"
            ),
        },
        "detected": {k: v for k, v in r.get("faults", {}).items() if "_detected_" in k},
        "faults_not_possible": r.get("faults_not_possible", {}),
        "preemptions": r.get("preemptions"),
        "aborted": sum(1 for op in r.get("ops", []) for q in op["requests"] if q.get("aborted")),
        "rss_bytes": rss,
        "leaks": leaks,
        "problems": details[:50],
    }


def _fold(rounds: list[dict[str, Any]], vocab: int) -> None:
    """Map every prompt's token ids into ``[3, vocab)`` (ids 0-2 are the tiny models'
    pad, bos and eos), the same way for every request, so shared prefixes stay shared."""
    for op in rounds:
        for r in op["requests"]:
            r["prompt"] = [3 + t % (vocab - 3) for t in r["prompt"]]


def soak_model(opts: SoakOptions, out_dir: Path) -> str:
    """The checkpoint the soak serves (a tiny model is written under ``out_dir``)."""
    from kvtier.tools.models import smollm2_path

    if opts.model not in MODELS:
        raise ConfigError(f"soak: model {opts.model!r} is not one of {', '.join(MODELS)}")
    if opts.model == "smollm2":
        return smollm2_path()
    from kvtier.tools.tiny_models import build

    return str(build(opts.model, out_dir / f"model-{opts.model}"))


def run_soak(opts: SoakOptions) -> dict[str, Any]:
    """Run the soak; return the results (also written to JSON). Raises ConfigError when the
    oracle engine itself fails (nothing to compare against)."""
    from kvtier.tools.bench.machine import machine_info
    from kvtier.tools.models import smollm2_path

    if opts.oracle_only and not opts.oracle:
        raise ConfigError("soak: --oracle-only needs --oracle PATH to save the oracle to")
    out_dir = Path(opts.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = soak_model(opts, out_dir)
    # The workload's text is tokenized with SmolLM2's tokenizer (the tiny models ship it).
    rounds = build_rounds(smollm2_path(), opts.rounds, opts.seed, opts.shape)
    if opts.model != "smollm2":
        from kvtier.tools.tiny_models import VOCAB

        _fold(rounds, VOCAB)
    total = sum(len(r["requests"]) for r in rounds)
    engine = engine_settings(opts)
    env = cpu_binding()
    bar = None
    if opts.progress:
        from tqdm import tqdm

        bar = tqdm(total=2 * total, desc="soak (oracle, then kvtier)", unit="req")
    t0 = time.perf_counter()
    warmup = {"step_warmup": STEP_TOKENS} if opts.step_warmup else {}
    oracle_spec = {
        "model": model,
        "engine": engine,
        "connector": None,
        "program": rounds,
        "soak": warmup,
    }
    fingerprint = hashlib.sha256(
        json.dumps([oracle_spec, env], sort_keys=True).encode()
    ).hexdigest()
    oracle = _saved_oracle(opts.oracle, fingerprint)
    reused = oracle is not None
    if oracle is None:
        status, oracle = run_module(
            SOAK_RUNNER, oracle_spec, out_dir / "engine-oracle.log", bar, env
        )
        if oracle is None:
            raise ConfigError(f"the oracle engine failed (see {out_dir / 'engine-oracle.log'})")
        oracle["fingerprint"] = fingerprint
        if opts.oracle:
            Path(opts.oracle).write_text(json.dumps(oracle))
    t_oracle = time.perf_counter() - t0
    if opts.oracle_only:
        if bar is not None:
            bar.close()
        return {"oracle": opts.oracle, "seconds": {"oracle": t_oracle}}
    if bar is not None:
        bar.n = total
        bar.refresh()
    remote_faults: dict[str, int] | None = None
    with contextlib.ExitStack() as stack:
        fs, enospc_mode = stack.enter_context(small_filesystem(opts.fs_bytes))
        url, injector = None, None
        if opts.remote:
            server = stack.enter_context(RedisServer(maxmemory=opts.remote_maxmemory))
            url = server.url
            injector = RemoteFaultInjector(server, opts.seed + 3, opts.remote_fault_interval)
        kinds = ["corrupt", "truncate"] + (["enospc"] if enospc_mode == "tmpfs" else [])
        spec = {
            "model": model,
            "engine": engine,
            "connector": kvtier_config(opts, fs, url),
            "program": rounds,
            "soak": {
                **warmup,
                "disk_faults": {
                    "seed": opts.seed + 2,
                    "kinds": kinds,
                    "interval": opts.disk_fault_interval,
                    "enospc_seconds": 1.0,
                },
            },
        }
        t1 = time.perf_counter()
        if injector is not None:
            injector.start()
        try:
            kv_env = {**env, "KVTIER_TIMELINE": opts.timeline} if opts.timeline else env
            status, result = run_module(
                SOAK_RUNNER, spec, out_dir / "engine-kvtier.log", bar, kv_env
            )
        finally:
            if injector is not None:
                remote_faults = injector.stop()
        t_kvtier = time.perf_counter() - t1
    if bar is not None:
        bar.n = 2 * total
        bar.refresh()
        bar.close()
    report = summarize(opts, oracle, status, result, enospc_mode, remote_faults)
    report.update(
        machine=machine_info(),
        binding=env,
        workload={
            "model": opts.model,
            "rounds": opts.rounds,
            "requests": total,
            "shape": asdict(opts.shape),
            "engine": engine,
        },
        config={
            **asdict(opts),
            "kvtier": kvtier_config(opts, "<tmpfs>", "redis://<loopback>" if opts.remote else None),
        },
        seconds={
            "oracle": t_oracle,
            "kvtier": t_kvtier,
            "oracle_rounds": [op["seconds"] for op in oracle["ops"]],
            "kvtier_rounds": [op["seconds"] for op in (result or {}).get("ops", [])],
            "oracle_reused": reused,
        },
    )
    print(format_report(report))
    if result is not None:  # every request's record, for a look at any problem
        (out_dir / "engine-kvtier.json").write_text(json.dumps(result))
    path = Path(opts.json) if opts.json else out_dir / "soak.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nresults written to {path}")
    return report


def format_report(report: dict[str, Any]) -> str:
    s = report["summary"]
    rows: list[tuple[str, str]] = [
        ("requests", str(s["requests"])),
        ("faults injected", str(s["faults_injected_total"])),
    ]
    rows += [(f"  {k}", str(v)) for k, v in sorted(s["faults_injected"].items())]
    rows += [(f"  detected {k}", str(v)) for k, v in sorted(report["detected"].items())]
    growth, oracle_growth = s["rss_growth_after_warmup"], s.get("oracle_rss_growth_after_warmup")
    rows += [
        ("wrong outputs", str(s["wrong_outputs"])),
        ("failed requests", str(s["failed_requests"])),
        ("crashes", str(s["crashes"])),
        (
            "leaked slots / pins / jobs",
            f"{s['leaked_slots']} / {s['leaked_pins']} / {s['leaked_jobs']}",
        ),
        ("rss growth after warm-up", f"{growth:.3f}" if growth else "n/a"),
        ("  the oracle's (no kvtier)", f"{oracle_growth:.3f}" if oracle_growth else "n/a"),
        ("hit tokens", ", ".join(f"{k} {v}" for k, v in sorted(s["hit_tokens"].items()))),
        ("preemptions / aborts", f"{report.get('preemptions')} / {report.get('aborted')}"),
        ("ENOSPC", s["enospc"]),
        ("remote tier", s["remote_tier"]),
    ]
    secs = report.get("seconds", {})
    if secs:
        rows.append(("seconds oracle / kvtier", f"{secs['oracle']:.0f} / {secs['kvtier']:.0f}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(["", "kvtier soak", *(f"{k.ljust(width)}  {v}" for k, v in rows)])
