"""The soak's mixed traffic: rounds of short requests of every kind, from a seed.

A round (one ``serve`` op of :mod:`kvtier.vllm.harness.runner`) mixes, in a seeded order:

- ``mt``: multi-turn chats (a document, then follow-ups that extend the previous answer);
- ``qa``: questions on documents drawn from a fixed pool, so documents recur across rounds;
- ``tr``: a sliding window of the bundled Mooncake trace, replayed (windows overlap);
- ``nr``: distinct documents, nothing shared (the miss path);
- ``bu``: a burst of requests on one fresh prefix, admitted together;
- ``lg``: long decodes that outgrow a small engine cache, so vLLM preempts;
- aborts: some ``qa``/``nr``/``bu`` requests are aborted after two output tokens.

Prompts are short and outputs few tokens, so a request costs a fraction of a second and a
soak of thousands fits in minutes. Every request id is unique across rounds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from kvtier.tools.bench.prompts import chat_turn, document_text, exact_document, followup
from kvtier.tools.bench.text import question
from kvtier.tools.bench.workloads import WorkloadOptions, build


@dataclass(frozen=True)
class RoundShape:
    """How many requests of each kind one round holds (about 50 by default)."""

    users: int = 4
    turns: int = 3
    qa: int = 12
    trace: int = 12
    trace_tokens: int = 96
    """Trace prompts are cut to this many tokens."""
    no_reuse: int = 6
    burst: int = 6
    long: int = 2
    doc_tokens: int = 48
    max_tokens: int = 4
    long_tokens: int = 48
    abort_rate: float = 0.15
    qa_documents: int = 8
    """Size of the document pool ``qa`` draws from (recurring prefixes)."""

    @property
    def size(self) -> int:
        return (
            self.users * self.turns + self.qa + self.trace + self.no_reuse + self.burst + self.long
        )


def build_rounds(model_dir: str, rounds: int, seed: int, shape: RoundShape) -> list[dict[str, Any]]:
    """``rounds`` serve ops for the runner."""
    trace = build(
        "trace",
        model_dir,
        WorkloadOptions(
            requests=shape.trace * (rounds + 1),
            seed=seed,
            max_tokens=shape.max_tokens,
            trace_block=16,
            max_prompt_tokens=shape.trace_tokens,
        ),
    ).requests
    docs = [document_text(model_dir, 700 + d, shape.doc_tokens) for d in range(shape.qa_documents)]
    return [_round(model_dir, r, seed, shape, trace, docs) for r in range(rounds)]


def _round(
    model_dir: str,
    r: int,
    seed: int,
    shape: RoundShape,
    trace: list[dict[str, Any]],
    docs: list[str],
) -> dict[str, Any]:
    rng = random.Random(seed * 7919 + r)
    p = f"R{r}"
    mt: list[dict[str, Any]] = []
    for u in range(shape.users):
        for t in range(shape.turns):
            q = question(seed * 100_000 + r * 100 + u * 10 + t)
            rid = f"{p}-mt{u}t{t}"
            if t == 0:
                text = document_text(model_dir, seed * 10_000 + r * 10 + u, shape.doc_tokens)
                req: dict[str, Any] = {
                    "id": rid,
                    "prompt": chat_turn(model_dir, f"{text}\n\n{q}"),
                }
            else:
                req = {
                    "id": rid,
                    "prompt": followup(model_dir, q),
                    "extend": f"{p}-mt{u}t{t - 1}",
                }
            mt.append({**req, "max_tokens": shape.max_tokens})
    singles: list[dict[str, Any]] = []
    for i in range(shape.qa):
        doc = docs[rng.randrange(len(docs))]
        q = question(seed * 100_000 + 50_000 + r * 100 + i)
        singles.append({"id": f"{p}-qa{i}", "prompt": chat_turn(model_dir, f"{doc}\n\n{q}")})
    start = (r * shape.trace // 2) % max(1, len(trace) - shape.trace)
    for i, tr in enumerate(trace[start : start + shape.trace]):
        singles.append({"id": f"{p}-tr{i}", "prompt": tr["prompt"]})
    for i in range(shape.no_reuse):
        prompt = exact_document(model_dir, 90_000 + seed * 1000 + r * 10 + i, shape.doc_tokens)
        singles.append({"id": f"{p}-nr{i}", "prompt": prompt})
    for i in range(shape.long):
        prompt = exact_document(model_dir, 80_000 + seed * 1000 + r * 10 + i, shape.doc_tokens)
        singles.append(
            {
                "id": f"{p}-lg{i}",
                "prompt": prompt,
                "max_tokens": shape.long_tokens,
                "ignore_eos": True,
            }
        )
    burst_doc = document_text(model_dir, 60_000 + seed * 1000 + r, 2 * shape.doc_tokens)
    burst: list[dict[str, Any]] = [
        {
            "id": f"{p}-bu{i}",
            "prompt": chat_turn(
                model_dir, f"{burst_doc}\n\n{question(seed * 1000 + 70_000 + r * 10 + i)}"
            ),
        }
        for i in range(shape.burst)
    ]
    for one in singles + burst:
        one.setdefault("max_tokens", shape.max_tokens)
        if "-lg" not in one["id"] and rng.random() < shape.abort_rate:
            one["max_tokens"] = 8
            one["abort_after_tokens"] = 2
    # Shuffle everything but keep the burst together (admitted at once) and each chat's
    # turns in order (a turn waits for the previous one anyway).
    units: list[list[dict[str, Any]]] = [[x] for x in mt + singles] + [burst]
    rng.shuffle(units)
    return {
        "op": "serve",
        "name": p,
        "requests": [req for unit in units for req in unit],
        "max_concurrency": max(4, shape.burst),
    }
