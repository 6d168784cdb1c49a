"""Bench workloads: deterministic request schedules built from a seed, no downloads.

Each workload is a list of requests for :mod:`kvtier.vllm.harness.runner`'s ``serve`` op: token-id
prompts (or continuations of earlier requests), output lengths and arrival times.

- ``multi-turn``: U users x T turns. A shared system prompt, a document per user in the
  first turn, then each turn appends the previous answer and a new question. Users take
  turns round-robin, so with a small engine cache a user's context is gone by their next
  turn unless a tier kept it.
- ``doc-qa``: D long documents, Q questions each, interleaved (d0q0, d1q0, ... d0q1, ...)
  so the engine's own cache cannot hold every document.
- ``trace``: replay of a Mooncake-format JSONL trace, scaled down: each 512-token hash id
  becomes ``trace_block`` tokens, synthesized deterministically from the id (equal ids give
  equal tokens, so shared prefixes stay shared).
- ``no-reuse``: distinct documents, nothing shared: the miss-path control.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError
from kvtier.tools.bench.prompts import chat_turn, document_text, exact_document, followup
from kvtier.tools.bench.text import question

WORKLOADS = ("multi-turn", "doc-qa", "trace", "no-reuse")
DEFAULT_TRACE = Path(__file__).resolve().parents[1] / "data" / "mooncake_synthetic_trace.jsonl"
"""The Mooncake synthetic trace bundled with kvtier (Apache-2.0; see tools/data/README.md)."""


@dataclass
class Workload:
    """A named request schedule."""

    name: str
    requests: list[dict[str, Any]]
    description: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_tokens_known(self) -> int:
        return sum(len(r["prompt"]) for r in self.requests if not r.get("extend"))


@dataclass(frozen=True)
class WorkloadOptions:
    """Sizes shared by the workload builders (scaled to a small CPU machine by default)."""

    requests: int = 12
    """Approximate number of requests per workload."""
    seed: int = 0
    doc_tokens: int = 600
    """Tokens of a document (multi-turn first turn, doc-qa, no-reuse)."""
    max_tokens: int = 24
    """Output tokens per request."""
    rate: float | None = None
    """Poisson arrival rate (requests/s); None: every request is ready at once and the
    concurrency limit paces them (a closed loop)."""
    trace_path: str | None = None
    trace_block: int = 16
    """Tokens per trace hash id after scaling (the trace's ids stand for 512 tokens)."""
    max_prompt_tokens: int = 1200


def build(name: str, model_dir: str, opts: WorkloadOptions) -> Workload:
    """Build workload ``name``; raises ConfigError for an unknown name."""
    builders = {
        "multi-turn": _multi_turn,
        "doc-qa": _doc_qa,
        "trace": _trace,
        "no-reuse": _no_reuse,
    }
    if name not in builders:
        raise ConfigError(f"workload: unknown {name!r}; accepted: {', '.join(WORKLOADS)}")
    wl = builders[name](model_dir, opts)
    _arrivals(wl.requests, opts)
    return wl


def _arrivals(requests: list[dict[str, Any]], opts: WorkloadOptions) -> None:
    if opts.rate is None:
        return
    rng = random.Random(opts.seed + 17)
    t = 0.0
    for r in requests:
        t += rng.expovariate(opts.rate)
        r["arrival"] = round(t, 4)


def _multi_turn(model_dir: str, opts: WorkloadOptions) -> Workload:
    users = max(2, round(opts.requests**0.5) + 1)
    turns = max(2, opts.requests // users)
    reqs: list[dict[str, Any]] = []
    for t in range(turns):
        for u in range(users):
            rid = f"u{u}t{t}"
            q = question(opts.seed * 1000 + u * 10 + t)
            if t == 0:
                text = document_text(model_dir, opts.seed * 100 + u, opts.doc_tokens)
                prompt = chat_turn(model_dir, f"{text}\n\n{q}")
                reqs.append({"id": rid, "prompt": prompt, "max_tokens": opts.max_tokens})
            else:
                reqs.append(
                    {
                        "id": rid,
                        "prompt": followup(model_dir, q),
                        "extend": f"u{u}t{t - 1}",
                        "max_tokens": opts.max_tokens,
                    }
                )
    return Workload(
        "multi-turn",
        reqs,
        f"{users} users x {turns} turns, round-robin",
        {"users": users, "turns": turns},
    )


def _doc_qa(model_dir: str, opts: WorkloadOptions) -> Workload:
    docs = max(2, min(6, opts.requests // 3))
    questions = max(1, opts.requests // docs)
    texts = [
        document_text(model_dir, 500 + opts.seed * 100 + d, opts.doc_tokens) for d in range(docs)
    ]
    reqs = []
    for q in range(questions):
        for d in range(docs):
            prompt = chat_turn(
                model_dir, f"{texts[d]}\n\n{question(opts.seed * 1000 + 97 * d + q)}"
            )
            reqs.append({"id": f"d{d}q{q}", "prompt": prompt, "max_tokens": opts.max_tokens})
    return Workload(
        "doc-qa",
        reqs,
        f"{docs} documents x {questions} questions, interleaved",
        {"documents": docs, "questions": questions},
    )


def _no_reuse(model_dir: str, opts: WorkloadOptions) -> Workload:
    n = max(2, opts.requests // 2)
    reqs = [
        {
            "id": f"n{i}",
            "prompt": exact_document(model_dir, 9000 + opts.seed * 100 + i, opts.doc_tokens),
            "max_tokens": opts.max_tokens,
        }
        for i in range(n)
    ]
    return Workload("no-reuse", reqs, f"{n} distinct documents", {"requests": n})


def _trace(model_dir: str, opts: WorkloadOptions) -> Workload:
    path = Path(opts.trace_path) if opts.trace_path else DEFAULT_TRACE
    if not path.is_file():
        raise ConfigError(f"trace: file not found: {path} (pass --trace PATH)")
    reqs: list[dict[str, Any]] = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if len(reqs) >= opts.requests:
                break
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                ids = [int(x) for x in rec["hash_ids"]]
                out = int(rec.get("output_length", opts.max_tokens))
            except (ValueError, KeyError, TypeError) as e:
                raise ConfigError(f"trace: {path} line {lineno}: {e}") from None
            prompt: list[int] = []
            for h in ids:
                prompt += _hash_tokens(h, opts.trace_block)
            prompt = prompt[: opts.max_prompt_tokens]
            reqs.append(
                {
                    "id": f"r{len(reqs)}",
                    "prompt": prompt,
                    "max_tokens": max(1, min(out, opts.max_tokens)),
                }
            )
    return Workload(
        "trace",
        reqs,
        f"{len(reqs)} requests of {path.name}, {opts.trace_block} tokens per hash id",
        {"path": str(path)},
    )


def _hash_tokens(h: int, n: int) -> list[int]:
    """Deterministic token ids standing for trace hash id ``h`` (ordinary vocabulary ids)."""
    rng = random.Random(h * 7919 + 1)
    return [rng.randrange(1000, 40000) for _ in range(n)]


def next_ready(
    pending: list[dict[str, Any]],
    now: float,
    history: dict[str, list[int]],
    finished: dict[str, float] | None = None,
) -> dict[str, Any] | None:
    """Pop the first request that has arrived and whose predecessor (if any) finished
    (``history`` holds finished requests' prompt + output), ``gap`` seconds ago or more
    when it gives one (an agent's tool call; ``finished``: when each request finished, on
    the clock of ``now``)."""
    for i, r in enumerate(pending):
        if r.get("arrival", 0.0) > now:
            return None
        prev = r.get("extend")
        if not prev or prev in history:
            gap = r.get("gap", 0.0)
            if gap and prev and finished is not None and now < finished.get(prev, 0.0) + gap:
                continue
            return pending.pop(i)
    return None


def repetition(requests: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """Run ``k`` of a workload's requests: ids (and the ids a request extends) get
    ``#k``, so the runs' requests stay apart in the results and in the engine."""
    out = []
    for r in requests:
        r = {**r, "id": f"{r['id']}#{k}"}
        if r.get("extend"):
            r["extend"] = f"{r['extend']}#{k}"
        out.append(r)
    return out
