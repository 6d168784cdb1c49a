"""Two engines, one remote store: the ``two-engines`` workload of ``kvtier bench``.

What is compared, all on the same model, engine settings, requests and explicit CPU
binding (``threads``), each engine a separate process as two hosts would be:

- engine **A** (kvtier: a CPU tier, then a ``redis`` tier) serves the first turns of
  ``conversations`` conversations (the shared system prompt, a document per conversation,
  a question), storing their KV through its CPU tier into the remote store;
- engine **B** (kvtier, same configuration, a fresh process with an empty CPU tier and an
  empty engine cache) then serves each conversation's continuation: A's prompt + A's
  answer + a new question. Its hits on what A stored are the remote (``p2p``) hit tokens;
- the **baseline**, an engine without kvtier (vLLM's own prefix cache only), serves A's
  first turns, drops its prefix cache, then serves B's continuations: every token
  recomputed, the TTFT that B is measured against and the oracle of A's and B's outputs
  (greedy; they must be token-identical).

The store: a private ``redis-server`` on 127.0.0.1 started for the run and stopped after
it, or the user's (``url``). Either way the run's keys live in a namespace of their own
(``KVTierConfig.namespace``, a fresh id per run), so nothing stored earlier helps B, and
on a user's store exactly those keys are deleted afterwards (and expire after an hour if
the run dies first): kvtier never flushes a store it did not start.

``shared_prefix_tokens``: the tokens of B's prompts whose KV A computed (A's prompt + its
answer but the last sampled token), in whole chunks (all a chunked cache can hold) and
counted once per distinct chunk (the system-prompt chunk every conversation starts with
is one chunk: B loads it once, then finds it in its own prefix cache). ``hit_fraction``
= B's remote hit tokens / that; 1.0 means every chunk A stored that B needed came back
from the remote store (above 1: B loaded a shared chunk twice, e.g. for two requests in
flight at once).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError
from kvtier.keys import chunk_keys
from kvtier.tools.bench import report
from kvtier.tools.bench.engine import run_with_progress
from kvtier.tools.bench.prompts import chat_turn, document_text, exact_document, followup, tokenizer
from kvtier.tools.bench.text import question

NAME = "two-engines"
TTL_S = 3600
"""Expiry of the chunks a run writes into a user's store: a safety net should the run die
before it deletes them."""


@dataclass(frozen=True)
class TwoEngineOptions:
    """Sizes and settings of one two-engine run."""

    conversations: int = 6
    """Conversations: A serves their first turns, B their continuations."""
    doc_tokens: int = 600
    """Tokens of each conversation's document."""
    max_tokens: int = 24
    """Output tokens per request."""
    long_tokens: int = 0
    """With > 0: one more prompt of this many tokens (a document alone), served by A and
    again by B (id ``long``): a large remote hit on its own."""
    seed: int = 0
    concurrency: int = 1
    """Requests running at once in every engine."""
    cpu_bytes: str = "1GiB"
    """CPU tier of A and B."""
    sync_budget: str = "auto"
    """kvtier's per-step sync budget in A and B (the default: ``auto``)."""


def check_url(url: str) -> str:
    """Refuse a bad or unreachable store URL in one line naming it; return its display
    form (credentials masked)."""
    from kvtier.tiers.remote import RemoteClient, RemoteUnavailable, parse_remote_url

    try:
        target = parse_remote_url(url)
    except ConfigError as e:
        raise ConfigError(f"--remote: {str(e).removeprefix('url: ')}") from None
    log = logging.getLogger("kvtier")
    level = log.level
    log.setLevel(logging.ERROR)  # the tier's own warning would say it twice
    try:
        client = RemoteClient(target, timeout_s=3)
        try:
            client.exists_many([b"kvt4:reachable?"])
        finally:
            client.close()
    except RemoteUnavailable as e:
        raise ConfigError(f"--remote: cannot reach {e}") from None
    except Exception as e:  # redis-py's cluster start-up error is no RedisError
        raise ConfigError(f"--remote: cannot reach {target.display}: {e}") from None
    finally:
        log.setLevel(level)
    return target.display


def progress_total(opts: TwoEngineOptions) -> int:
    """Requests the run finishes (warm-ups included): the progress bar's share."""
    n = opts.conversations + (1 if opts.long_tokens else 0)
    return 3 + 4 * n  # A: n, B: n, baseline: 2n, + one warm-up each


def run_two_engines(
    url: str | None,
    *,
    model: str,
    engine: dict[str, Any],
    threads: int,
    opts: TwoEngineOptions,
    out_dir: Path,
    bar: Any = None,
) -> dict[str, Any]:
    """Run A, B and the baseline (see the module docstring); return rows, raw ops,
    bindings and a ``summary``. ``url`` None: a private redis-server for the run."""
    first = _first_turns(model, opts)
    warmup = [{"id": "warmup", "prompt": exact_document(model, 7777, 64), "max_tokens": 2}]
    namespace = f"kvtier-bench-{uuid.uuid4().hex[:12]}"

    def spec(connector: dict[str, Any] | None, *serves: tuple[str, list[Any]]) -> dict[str, Any]:
        prog: list[dict[str, Any]] = [
            {"op": "serve", "name": "warmup", "requests": warmup},
            {"op": "reset_prefix_cache", "connector": True},
        ]
        for i, (name, requests) in enumerate(serves):
            if i:
                prog.append({"op": "reset_prefix_cache", "connector": True})
            prog.append(
                {
                    "op": "serve",
                    "name": name,
                    "requests": requests,
                    "max_concurrency": opts.concurrency,
                }
            )
        return {
            "model": model,
            "engine": engine,
            "connector": connector,
            "inspect": connector is not None,
            "program": prog,
            "threads": threads,
        }

    def engine_run(name: str, s: dict[str, Any]) -> dict[str, Any]:
        if bar is not None:
            bar.set_postfix_str(f"{NAME} {name}")
        return run_with_progress(s, bar, out_dir / f"engine-{NAME}-{name}.log")

    with _store(url) as (store_url, own):
        cfg = _connector(store_url, namespace, own, opts)
        a = engine_run("A", spec(cfg, ("first", first)))
        second = _continuations(model, opts, first, a["ops"][0])
        try:
            b = engine_run("B", spec(cfg, ("continuations", second)))
        finally:
            if not own:  # a store kvtier did not start: delete exactly this run's keys
                _delete_namespace(store_url, namespace)
    base = engine_run("baseline", spec(None, ("first", first), ("continuations", second)))
    return _result(a, b, base, first, second, opts, namespace, url)


@contextlib.contextmanager
def _store(url: str | None) -> Iterator[tuple[str, bool]]:
    """(URL, whether kvtier started it): the user's store, or a private loopback server."""
    if url is not None:
        yield url, False
        return
    from kvtier.tools.redis_server import RedisServer

    with RedisServer() as server:
        yield server.url, True


def _connector(url: str, namespace: str, own: bool, opts: TwoEngineOptions) -> dict[str, Any]:
    redis: dict[str, Any] = {"kind": "redis", "url": url}
    if not own:
        redis["ttl_s"] = TTL_S
    return {
        "sync_budget": opts.sync_budget,
        "namespace": namespace,
        "tiers": [{"kind": "cpu", "capacity": opts.cpu_bytes}, redis],
    }


def _first_turns(model: str, opts: TwoEngineOptions) -> list[dict[str, Any]]:
    reqs = []
    for i in range(opts.conversations):
        doc = document_text(model, opts.seed * 100 + 700 + i, opts.doc_tokens)
        prompt = chat_turn(model, f"{doc}\n\n{question(opts.seed * 1000 + i)}")
        reqs.append({"id": f"c{i}", "prompt": prompt, "max_tokens": opts.max_tokens})
    if opts.long_tokens:
        long = exact_document(model, opts.seed * 100 + 99, opts.long_tokens)
        reqs.append({"id": "long", "prompt": long, "max_tokens": 4})
    return reqs


def _continuations(
    model: str, opts: TwoEngineOptions, first: list[dict[str, Any]], a_op: dict[str, Any]
) -> list[dict[str, Any]]:
    """B's requests: each conversation's prompt + A's answer + a new question (the long
    prompt, if any, as it was)."""
    eos = tokenizer(model).eos_token_id
    answers = {r["id"]: r["output"] for r in a_op["requests"]}
    reqs = []
    for r in first:
        if r["id"] == "long":
            reqs.append(dict(r))
            continue
        out = answers[r["id"]]
        out = out[:-1] if out and out[-1] == eos else out  # the follow-up closes the turn
        q = question(opts.seed * 1000 + 500 + int(r["id"][1:]))
        prompt = r["prompt"] + out + followup(model, q)
        reqs.append({"id": f"t{r['id'][1:]}", "prompt": prompt, "max_tokens": opts.max_tokens})
    return reqs


def shared_prefix_tokens(
    first: list[dict[str, Any]],
    a_op: dict[str, Any],
    second: list[dict[str, Any]],
    chunk: int,
) -> int:
    """Distinct whole-chunk tokens of ``second``'s prompts whose KV A computed (see the
    module docstring); request i of ``second`` continues request i of ``first``."""
    answers = {r["id"]: r["output"] for r in a_op["requests"]}
    keys: set[bytes] = set()
    for f, s in zip(first, second, strict=True):
        computed = f["prompt"] + answers[f["id"]][:-1]  # the last sampled token has no KV
        common = 0
        for x, y in zip(computed, s["prompt"], strict=False):  # common <= len(prompt)
            if x != y:
                break
            common += 1
        # kvtier may load a whole prompt (vLLM then recomputes only its last token).
        n = common // chunk * chunk
        keys.update(chunk_keys(s["prompt"][:n], chunk, bytes(16)))
    return len(keys) * chunk


def _ratios(op: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """TTFT of ``op`` over the baseline's: of the means, and per request best and worst."""
    b = {r["id"]: r["ttft"] for r in base["requests"]}
    per = [r["ttft"] / b[r["id"]] for r in op["requests"]]
    mean = statistics.fmean(r["ttft"] for r in op["requests"])
    return {
        "mean": mean / statistics.fmean(b.values()),
        "best": min(per),
        "worst": max(per),
    }


def _result(
    a: dict[str, Any],
    b: dict[str, Any],
    base: dict[str, Any],
    first: list[dict[str, Any]],
    second: list[dict[str, Any]],
    opts: TwoEngineOptions,
    namespace: str,
    url: str | None,
) -> dict[str, Any]:
    ops = {
        "A": a["ops"][0],
        "B": b["ops"][0],
        "baseline first": base["ops"][0],
        "baseline": base["ops"][1],
    }
    against = {"A": "baseline first", "B": "baseline"}
    rows = {
        k: report.summarize(op, ops[against[k]] if k in against else None) for k, op in ops.items()
    }
    shared = shared_prefix_tokens(first, ops["A"], second, b["kvtier"]["chunk_tokens"])
    remote = rows["B"]["hit_tokens"]["remote"]
    for k, ref in against.items():
        rows[k]["ttft_vs_baseline"] = _ratios(ops[k], ops[ref])
    rows["B"]["shared_prefix_tokens"] = shared
    rows["B"]["hit_fraction"] = remote / shared if shared else None
    summary = {
        "remote_hit_tokens": remote,
        "shared_prefix_tokens": shared,
        "hit_fraction": rows["B"]["hit_fraction"],
        "ttft_ratio_vs_baseline": rows["B"]["ttft_vs_baseline"]["mean"],
        "ttft_ratio_vs_baseline_best": rows["B"]["ttft_vs_baseline"]["best"],
        "ttft_ratio_vs_baseline_worst": rows["B"]["ttft_vs_baseline"]["worst"],
        "first_turn_ttft_ratio_vs_baseline": rows["A"]["ttft_vs_baseline"]["mean"],
        "outputs_match_baseline": bool(
            rows["A"]["outputs_match_baseline"] and rows["B"]["outputs_match_baseline"]
        ),
    }
    return {
        "description": (
            f"{opts.conversations} conversations: engine A serves first turns, a fresh "
            "engine B their continuations on A's remote store"
        ),
        "params": {
            **asdict(opts),
            "store": shown(url),
            "namespace": namespace,
        },
        "modes": rows,
        "raw": ops,
        "summary": summary,
        "binding": {
            f"{NAME} A": a.get("binding"),
            f"{NAME} B": b.get("binding"),
            f"{NAME} baseline": base.get("binding"),
        },
        "kvtier": {"A": a.get("kvtier"), "B": b.get("kvtier")},
    }


def shown(url: str | None) -> str:
    """Where the run's store is, for results (credentials masked)."""
    if url is None:
        return "private redis-server on 127.0.0.1"
    from kvtier.tiers.remote import parse_remote_url

    return parse_remote_url(url).display


def _delete_namespace(url: str, namespace: str) -> None:
    """Delete this run's chunks (its namespace text's keys) from a store kvtier did not
    start."""
    from kvtier.tiers.remote import RemoteClient, RemoteUnavailable, parse_remote_url
    from kvtier.tiers.remote.keyspace import purge_pattern

    client = RemoteClient(parse_remote_url(url), timeout_s=10)
    with contextlib.suppress(RemoteUnavailable):
        pattern = purge_pattern(namespace, None, None)
        client.delete(list(client.client.scan_iter(match=pattern, count=1000)))
    client.close()


def table(result: dict[str, Any]) -> Any:
    """A rich Table of one run: A, B and the baseline rows (fits the bench's 120 columns).
    Columns: requests, prompt tokens, remote hit tokens, their fraction of the shared
    prefix tokens, TTFT, mean TTFT over the baseline's (per-request best-worst), outputs
    token-identical to the baseline."""
    from rich.table import Table

    t = Table(title=f"{NAME}: {result['description']}", title_justify="left")
    cols = (
        "engine",
        "req",
        "prompt",
        "remote",
        "of shared",
        "TTFT ms mean/p50/p90",
        "TTFT/base (per req)",
        "=base",
    )
    for col in cols:
        t.add_column(col, justify="left" if col == "engine" else "right", no_wrap=True)
    names = {
        "A": "A first turns",
        "B": "B continuations",
        "baseline first": "base first turns",
        "baseline": "base continuations",
    }
    for key, s in result["modes"].items():
        ratio = s.get("ttft_vs_baseline")
        frac = s.get("hit_fraction")
        t.add_row(
            names[key],
            str(s["requests"]),
            str(s["prompt_tokens"]),
            str(s["hit_tokens"]["remote"]),
            "-" if frac is None else f"{frac:.2f} of {s['shared_prefix_tokens']}",
            "/".join(f"{s[k] * 1e3:.0f}" for k in ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s")),
            "-"
            if ratio is None
            else f"{ratio['mean']:.2f} ({ratio['best']:.2f}-{ratio['worst']:.2f})",
            "yes" if s["outputs_match_baseline"] else "NO",
        )
    return t
