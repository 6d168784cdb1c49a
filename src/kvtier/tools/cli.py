"""The ``kvtier`` command: ``bench``, ``sim``, ``soak``, ``inspect`` and ``purge``.

User mistakes (unknown model path, workload, bad size string...) end in one clear line
and exit status 2, not a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from kvtier.errors import ConfigError, KVTierError

_T = TypeVar("_T")


def _csv(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _bench(args: argparse.Namespace) -> int:
    from kvtier.tools.bench.run import BenchOptions, run_bench

    # Flags are named after BenchOptions fields; only the two lists need splitting.
    names = {f.name for f in dataclasses.fields(BenchOptions)}
    kw = {k: v for k, v in vars(args).items() if k in names - {"workloads", "modes"}}
    opts = BenchOptions(**kw, workloads=_csv(args.workload), modes=_csv(args.modes))
    run_bench(opts)
    return 0


def _sim(args: argparse.Namespace) -> int:
    from kvtier.tools.bench.workloads import DEFAULT_TRACE
    from kvtier.tools.sim import format_sim, run_sim
    from kvtier.tools.sim.report import format_gap_table, gap_rows
    from kvtier.tools.sim.workloads import write_named_trace

    trace = args.trace or DEFAULT_TRACE
    if args.generate:
        if args.trace:
            raise ConfigError("sim: give --trace or --generate, not both")
        if not args.save_trace:
            raise ConfigError("sim: --generate needs --save-trace PATH (where the trace goes)")
        n = write_named_trace(args.save_trace, args.generate, args.seed)
        print(f"generated {n:,} requests ({args.generate}, seed {args.seed}) -> {args.save_trace}")
        trace = args.save_trace
    result = run_sim(
        trace,
        _csv(args.capacity),
        policies=_csv(args.policies),
        limit=args.limit,
        block_tokens=args.block_tokens,
        progress=not args.no_progress,
        hints=not args.no_hints,
    )
    print(format_sim(result))
    rows = gap_rows(result, Path(trace).name)
    if rows:  # the run compares the default with LRU: the policy table too
        result["policy_table"] = rows
        print()
        print(format_gap_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from kvtier.tools.inspect import format_inspect, inspect_dir

    info = inspect_dir(args.path)
    if info.get("error") == "not a directory":
        raise ConfigError(f"inspect: {args.path} is not a directory")
    print(json.dumps(info, indent=2) if args.json else format_inspect(info))
    return 0


def _purge(args: argparse.Namespace) -> int:
    from kvtier.tools.purge import progress_printer, target_of

    if not (args.remote or args.disk):
        raise ConfigError("purge: give --remote URL and/or --disk PATH")
    if args.list:
        return _purge_list(args)
    target = target_of(
        args.all, args.model, args.revision, args.layout, args.parallel, args.namespace, args.digest
    )
    if (target.digest is not None or target.labels is not None) and args.remote and args.disk:
        raise ConfigError(
            "purge: --digest selects on one tier at a time (remote names carry labels, disk "
            "headers a rank digest: see --list)"
        )
    if args.disk and (target.tenant is not None or target.labels is not None):
        raise ConfigError(
            "purge: a disk tier is selected by --all, --model with --layout, or a --digest "
            "(its headers carry only a digest of the whole namespace)"
        )
    verb = "would remove" if args.dry_run else "removed"
    print(f"purge: {target.describe()}{' (dry run: nothing is removed)' if args.dry_run else ''}")
    if args.remote:
        from kvtier.tiers.remote.kind import secret_for
        from kvtier.tools.purge.remote import nothing_matched, purge_remote
        from kvtier.tools.redis_options import key_secret_from_args

        with _remote(args) as (client, display, spec):
            secret = secret_for(spec, key_secret_from_args(args))
            got = _redis_call(
                display,
                lambda: purge_remote(
                    client,
                    target,
                    dry_run=args.dry_run,
                    secret=secret,
                    progress=progress_printer(display),
                ),
            )
            why = _redis_call(display, lambda: nothing_matched(client, target, got, secret))
        extra = f" ({got.foreign} other keys under the prefix left alone)" if got.foreign else ""
        print(f"{display}: {verb} {got.chunks} chunks{extra}")
        if why:
            print(f"{display}: {why}", file=sys.stderr)
    if args.disk:
        from kvtier.tools.purge.disk import purge_disk

        done = purge_disk(args.disk, target, dry_run=args.dry_run)
        print(f"{args.disk}: {verb} {done.chunks} chunks in {done.dirs} tier directories")
    return 0


def _purge_list(args: argparse.Namespace) -> int:
    if args.remote:
        from kvtier.tools.purge.remote import namespaces_present

        with _remote(args) as (client, display, _):
            counts = _redis_call(display, lambda: namespaces_present(client))
        print(f"{display}: {sum(counts.values())} kvtier chunks")
        for ns, n in counts.items():
            print(f"  --digest {ns}  {n} chunks")
    if args.disk:
        from kvtier.tools.inspect import inspect_dir
        from kvtier.tools.purge.disk import tier_dirs

        for d in tier_dirs(Path(args.disk)):
            info = inspect_dir(d)
            print(f"{d}: {info.get('valid_chunks', 0)} kvtier chunks")
            for row in info["namespaces"]:
                print(f"  --digest {row['namespace']}  {row['chunks']} chunks")
    return 0


@contextlib.contextmanager
def _remote(args: argparse.Namespace) -> Iterator[tuple[Any, str, Any]]:
    """The library client, display form and tier spec of ``--remote`` with the tier's own
    connection options (TLS files, password file: :mod:`kvtier.tools.redis_options`)."""
    from kvtier.tiers.remote.kind import client_for
    from kvtier.tools.redis_options import tier_from_args

    spec = tier_from_args(args.remote, args, "purge")
    client = client_for(spec)
    display = client.target.display
    try:
        yield _redis_call(display, lambda: client.client), display, spec
    finally:
        client.close()


def _redis_call(display: str, call: Callable[[], _T]) -> _T:
    import redis
    from redis.exceptions import RedisClusterException

    from kvtier.errors import TierUnavailable

    try:
        return call()
    except (redis.RedisError, RedisClusterException) as e:
        # The library's messages name hosts and reasons, never the password.
        raise TierUnavailable(f"{display}: {type(e).__name__}: {e}") from None


def _soak(args: argparse.Namespace) -> int:
    from kvtier.tools.soak.run import SoakOptions, run_soak

    opts = SoakOptions(
        requests=args.requests,
        model=args.model,
        seed=args.seed,
        out=args.out,
        json=args.json,
        oracle=args.oracle,
        oracle_only=args.oracle_only,
        remote=not args.no_remote,
        timeline=args.timeline,
        step_warmup=not args.no_step_warmup,
    )
    report = run_soak(opts)
    if opts.oracle_only:
        return 0
    s = report["summary"]
    clean = not (s["wrong_outputs"] or s["failed_requests"] or s["crashes"])
    clean = clean and not (s["leaked_slots"] or s["leaked_pins"] or s["leaked_jobs"])
    return 0 if clean else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvtier", description="Tiered KV-cache offloading for vLLM.")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="what tiered offload buys on a workload (real engine)")
    b.add_argument(
        "--model",
        default=None,
        help="local model directory (default: the built-in SmolLM2-135M-Instruct)",
    )
    b.add_argument(
        "--workload",
        default="multi-turn,doc-qa",
        help="comma list of multi-turn, doc-qa, trace, no-reuse, two-engines (engine A "
        "serves first turns into a remote store, a fresh engine B the continuations)",
    )
    b.add_argument(
        "--modes",
        default="baseline,async,sync,auto",
        help="comma list of baseline, async, sync, auto, sync-layers (sync with layer_loads on)",
    )
    b.add_argument("--requests", type=int, default=12, help="about this many requests per workload")
    b.add_argument("--concurrency", type=int, default=2, help="requests running at once")
    b.add_argument(
        "--rate",
        type=float,
        default=None,
        help="Poisson arrivals per second (default: all ready, paced by --concurrency)",
    )
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--cpu-bytes", default="1GiB", help="CPU tier size, e.g. 8GiB")
    b.add_argument("--budget", default="256MiB", help="per-step sync budget of the 'sync' mode")
    b.add_argument(
        "--device-blocks",
        type=int,
        default=64,
        help="engine KV cache in blocks (small, so offloading matters)",
    )
    b.add_argument(
        "--dtype",
        default="float32",
        help="float32 (default: the only dtype in which vLLM-CPU's greedy outputs do not depend "
        "on batch composition, so '=base' tests kvtier alone), bfloat16, or auto (bf16 only "
        "with CPU bf16 support)",
    )
    b.add_argument("--max-tokens", type=int, default=24, help="output tokens per request")
    b.add_argument("--doc-tokens", type=int, default=600, help="document length in tokens")
    b.add_argument("--trace", default=None, help="Mooncake-format JSONL for --workload trace")
    b.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each workload per mode (caches reset between); statistics over all",
    )
    b.add_argument("--out", default="bench-results", help="directory for results.json and plots")
    b.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="drive the workloads over HTTP against this running OpenAI-compatible server",
    )
    b.add_argument(
        "--serve",
        action="store_true",
        help="start an OpenAI server per mode (127.0.0.1) and drive it over HTTP",
    )
    b.add_argument(
        "--threads",
        type=int,
        default=None,
        help="compute threads of every mode's engine (default: all cores; equal in all modes)",
    )
    b.add_argument(
        "--remote",
        default=None,
        metavar="URL",
        help="the two-engines workload's Redis/Valkey store (default: a private "
        "redis-server on 127.0.0.1 for the run); only this run's keys are written and deleted",
    )
    b.set_defaults(func=_bench)

    s = sub.add_parser("sim", help="trace-driven cache simulation of kvtier's policies")
    s.add_argument(
        "--trace",
        default=None,
        help="Mooncake-format JSONL trace (default: the bundled synthetic trace)",
    )
    s.add_argument(
        "--generate",
        default=None,
        metavar="SHAPE",
        help="generate a trace instead: chat, longsys, agent, docs, skewed (chat generator), "
        "agentloop, rag, scan, shift (kvtier.tools.sim.workloads), optionally with overrides "
        "(chat:sessions=200,think_s=30); needs --save-trace",
    )
    s.add_argument("--seed", type=int, default=0, help="seed of --generate")
    s.add_argument("--save-trace", default=None, metavar="PATH", help="where --generate writes")
    s.add_argument(
        "--capacity",
        default="1M,3M,10M",
        help="comma list of capacities; tokens (3M), bytes (8GiB) or a share of the trace's "
        "unique KV (5%%); 1M+10M = CPU+disk",
    )
    s.add_argument(
        "--policies",
        default="lru,default,lru-oracle,belady,infinite",
        help="comma list of default (the connector's), adaptive, adaptive-arc, lru, arc, "
        "chain-arc, lru-doorkeeper, lru-seenN, lru-oracle (LRU with offline admission), "
        "lru-reuse (LRU storing exactly the chunks used again), belady, infinite; "
        "with lru and default, a policy table (default - LRU, gap closed) follows",
    )
    s.add_argument("--limit", type=int, default=None, help="first N requests only")
    s.add_argument("--block-tokens", type=int, default=512, help="tokens per trace hash id")
    s.add_argument("--json", default=None, metavar="PATH")
    s.add_argument("--no-progress", action="store_true")
    s.add_argument(
        "--no-hints",
        action="store_true",
        help="ignore the requests' retain_s hints (their 'kvtier' field; agentloop:retain_s=S "
        "writes them): the same workload without retention",
    )
    s.set_defaults(func=_sim)

    k = sub.add_parser("soak", help="mixed traffic with random faults against an oracle")
    k.add_argument("--requests", type=int, default=1000, help="about this many requests")
    k.add_argument("--seed", type=int, default=0, help="seed of the traffic and the faults")
    k.add_argument(
        "--model",
        default="smollm2",
        choices=["smollm2", "gemma3"],
        help="smollm2 (dense, one KV-cache group) or gemma3 (a tiny random-weight Gemma 3: "
        "sliding-window and global groups, failed loads reported per request)",
    )
    k.add_argument("--out", default="soak-results", help="directory for engine logs")
    k.add_argument("--json", default=None, metavar="PATH", help="default: OUT/soak.json")
    k.add_argument(
        "--oracle",
        default=None,
        metavar="PATH",
        help="oracle results: reused when they match this workload, else saved there",
    )
    k.add_argument(
        "--oracle-only", action="store_true", help="only run (and save) the oracle engine"
    )
    k.add_argument(
        "--no-remote",
        action="store_true",
        help="without the redis tier (and its server faults): cpu -> disk only",
    )
    k.add_argument(
        "--timeline",
        default=None,
        metavar="PATH",
        help="record the kvtier engine's event timeline (JSON lines) in PATH",
    )
    k.add_argument(
        "--no-step-warmup",
        action="store_true",
        help="skip the prefill of every step size before the rounds (memory then grows "
        "with each step size the engine meets for the first time)",
    )
    k.set_defaults(func=_soak)

    i = sub.add_parser("inspect", help="what a disk tier directory holds (headers only)")
    i.add_argument("path")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=_inspect)

    r = sub.add_parser(
        "purge",
        help="remove kvtier's chunks (all, or one namespace's) from a remote store / disk tier",
        description="Remove every kvtier chunk (--all) or one namespace's: by its parts as "
        "the engine logs them at start (--model, --revision, --layout, --parallel, "
        "--namespace), or by a digest --list shows. Only kvtier's own keys and files are "
        "touched; --dry-run counts without removing.",
    )
    r.add_argument("--remote", default=None, metavar="URL", help="a Redis/Valkey store")
    r.add_argument(
        "--disk", default=None, metavar="PATH", help="a disk tier directory (or a disk_path)"
    )
    r.add_argument("--all", action="store_true", help="every kvtier chunk")
    r.add_argument("--model", default=None, help="the model, as the engine was given it")
    r.add_argument("--revision", default="", help="the model revision (default: none)")
    r.add_argument("--layout", default=None, help="the KV layout digest the engine logs")
    r.add_argument("--parallel", default="tp1pp1", help="parallel layout (default: tp1pp1)")
    r.add_argument(
        "--namespace", default="", help="the deployment's namespace text (a tenant; default: '')"
    )
    r.add_argument(
        "--digest",
        default=None,
        metavar="HEX",
        help="a digest (disk) or labels (remote) --list shows",
    )
    from kvtier.tools.redis_options import add_arguments as add_redis_arguments

    add_redis_arguments(r)
    r.add_argument("--dry-run", action="store_true", help="count only; remove nothing")
    r.add_argument("--list", action="store_true", help="chunks per namespace digest")
    r.set_defaults(func=_purge)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KVTierError as e:
        print(f"kvtier: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
