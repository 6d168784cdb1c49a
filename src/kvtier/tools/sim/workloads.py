"""Workload shapes the chat generator does not cover (``kvtier sim --generate NAME``).

Each generator writes Mooncake JSONL with the block ids of :mod:`kvtier.tools.sim.generate`
(block j's id chains block j-1's, so equal ids mean equal prefixes), deterministic given the
seed. Token counts are prompt tokens, times seconds. Shapes, and what each stresses:

- ``agentloop``: agent sessions behind a few large shared tool prefixes. Each step appends a
  tool call and its result to the session's prompt; at some steps the agent *fans out*
  several branches (sub-tasks) off the same prefix, each running a few steps of its own;
  some sessions *idle* for a long time (a human in the loop) before their next step. Stresses
  many branches off one prefix and reuse after long gaps. With ``retain_s`` > 0 every step
  that has a next one carries a ``retain_s`` hint (``kvtier sim`` honours it unless
  ``--no-hints``: the agent workload with and without retention hints).
- ``rag``: retrieval-augmented QA. A corpus of shared documents with Zipf popularity; each
  request is a system prompt, ``k`` retrieved documents *in the retriever's order* (varying
  per request) and a question. Documents are shared but only the leading document's
  position is a shared prefix: reuse is shallow and order-dependent.
- ``scan``: a hot set of long-lived conversations (a few dozen sessions cycling turns)
  mixed with one-off long documents (a scan) that are never sent again. Stresses scan
  resistance: LRU lets each scan flush the hot set.
- ``shift``: agent sessions over a hot set of shared prefixes that is *replaced* half way
  (new tool prefixes, new sessions). Stresses adaptation: what learned the first half must
  let go of it.

Overrides: ``name:key=value,...`` with the keys of each shape's :data:`PARAMS`.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from pathlib import Path

from kvtier.errors import ConfigError
from kvtier.tools.sim.generate import (
    SHAPES,
    GeneratedRequest,
    _BlockIds,
    _zipf_weights,
    iter_jsonl,
    parse_shape,
)
from kvtier.tools.sim.generate import generate as generate_chat
from kvtier.tools.sim.trace import TRACE_BLOCK_TOKENS

Params = dict[str, float]
Generator = Callable[[random.Random, _BlockIds, Params], list[GeneratedRequest]]

PARAMS: dict[str, Params] = {
    "agentloop": {
        "sessions": 80,
        "prefixes": 3,
        "prefix_tokens": 12000,
        "steps": 14,
        "step_tokens": 700,
        "fanout_p": 0.2,
        "branches": 4,
        "branch_steps": 3,
        "idle_p": 0.15,
        "idle_s": 1800,
        "think_s": 6,
        "rate": 0.3,
        "retain_s": 0,
    },
    "rag": {
        "requests": 2500,
        "docs": 600,
        "doc_tokens": 3000,
        "doc_skew": 1.0,
        "k": 4,
        "system_tokens": 1500,
        "question_tokens": 80,
    },
    "scan": {
        "sessions": 40,
        "turns": 60,
        "system_tokens": 4000,
        "turn_tokens": 400,
        "scan_every": 3,
        "scan_tokens": 20000,
    },
    "shift": {
        "sessions": 160,
        "prefixes": 4,
        "prefix_tokens": 8000,
        "steps": 12,
        "step_tokens": 600,
        "prefix_skew": 1.2,
    },
}
"""Per shape: its parameters and their defaults (integers where the name counts things)."""


def _segment_counter() -> Callable[[], int]:
    n = [0]

    def new() -> int:
        n[0] += 1
        return n[0]

    return new


def _req(
    ids: _BlockIds, t: float, segs: list[tuple[int, int]], out: int, retain_s: float = 0.0
) -> GeneratedRequest:
    return GeneratedRequest(int(t * 1000), sum(n for _, n in segs), out, ids.of(segs), retain_s)


def _vary(rng: random.Random, mean: float) -> int:
    return max(1, int(rng.lognormvariate(math.log(mean), 0.5)))


def _agentloop(rng: random.Random, ids: _BlockIds, p: Params) -> list[GeneratedRequest]:
    seg = _segment_counter()
    prefixes = [(seg(), _vary(rng, p["prefix_tokens"])) for _ in range(int(p["prefixes"]))]
    events: list[tuple[float, int, list[tuple[int, int]], int, bool]] = []
    order = 0

    def push(when: float, history: list[tuple[int, int]], left: int, main: bool) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (when, order, history, left, main))

    t = 0.0
    for _ in range(int(p["sessions"])):
        t += rng.expovariate(p["rate"])
        push(
            t, [rng.choice(prefixes), (seg(), _vary(rng, p["step_tokens"]))], int(p["steps"]), True
        )
    out: list[GeneratedRequest] = []
    while events:
        now, _, history, left, main = heapq.heappop(events)
        answer = _vary(rng, 200)
        # An agent framework asks to keep the session's chain until its next step (only
        # while one follows: the last step's chain is not needed again).
        retain = p["retain_s"] if left > 1 else 0.0
        out.append(_req(ids, now, history, answer, retain))
        if left <= 1 or sum(n for _, n in history) > 100_000:
            continue
        gap = rng.expovariate(1 / p["think_s"])
        if rng.random() < p["idle_p"]:
            gap += rng.expovariate(1 / p["idle_s"])
        grown = [*history, (seg(), answer), (seg(), _vary(rng, p["step_tokens"]))]
        if main and rng.random() < p["fanout_p"]:  # branches do not fan out again
            for _ in range(int(p["branches"])):
                branch = [*history, (seg(), answer), (seg(), _vary(rng, p["step_tokens"]))]
                push(now + gap, branch, int(p["branch_steps"]), False)
        push(now + gap, grown, left - 1, main)
    return out


def _rag(rng: random.Random, ids: _BlockIds, p: Params) -> list[GeneratedRequest]:
    seg = _segment_counter()
    system = (seg(), int(p["system_tokens"]))
    docs = [(seg(), _vary(rng, p["doc_tokens"])) for _ in range(int(p["docs"]))]
    weights = _zipf_weights(len(docs), p["doc_skew"])
    out = []
    t = 0.0
    for _ in range(int(p["requests"])):
        t += rng.expovariate(2.0)
        picked: list[tuple[int, int]] = []
        while len(picked) < min(int(p["k"]), len(docs)):
            d = rng.choices(docs, weights)[0]
            if d not in picked:
                picked.append(d)
        segs = [system, *picked, (seg(), _vary(rng, p["question_tokens"]))]
        out.append(_req(ids, t, segs, _vary(rng, 150)))
    return out


def _scan(rng: random.Random, ids: _BlockIds, p: Params) -> list[GeneratedRequest]:
    seg = _segment_counter()
    system = (seg(), int(p["system_tokens"]))
    sessions = [[system] for _ in range(int(p["sessions"]))]
    out = []
    t = 0.0
    for i in range(int(p["turns"]) * len(sessions)):
        t += 0.5
        s = rng.randrange(len(sessions))
        sessions[s] = [*sessions[s], (seg(), _vary(rng, p["turn_tokens"]))]
        if sum(n for _, n in sessions[s]) > 60_000:  # a conversation ends, a new one starts
            sessions[s] = [system, (seg(), _vary(rng, p["turn_tokens"]))]
        answer = _vary(rng, 200)
        out.append(_req(ids, t, sessions[s], answer))
        sessions[s] = [*sessions[s], (seg(), answer)]
        if i % int(p["scan_every"]) == 0:
            doc = (seg(), _vary(rng, p["scan_tokens"]))
            out.append(_req(ids, t + 0.1, [system, doc, (seg(), 60)], 100))
    return out


def _shift(rng: random.Random, ids: _BlockIds, p: Params) -> list[GeneratedRequest]:
    seg = _segment_counter()
    out: list[GeneratedRequest] = []
    t = 0.0
    half = int(p["sessions"]) // 2
    for phase in range(2):
        prefixes = [(seg(), _vary(rng, p["prefix_tokens"])) for _ in range(int(p["prefixes"]))]
        weights = _zipf_weights(len(prefixes), p["prefix_skew"])
        live: list[tuple[list[tuple[int, int]], int]] = []
        started = 0
        n = half if phase == 0 else int(p["sessions"]) - half
        while started < n or live:
            if started < n and (len(live) < 8 or rng.random() < 0.2):
                live.append(([rng.choices(prefixes, weights)[0]], int(p["steps"])))
                started += 1
            k = rng.randrange(len(live))
            history, left = live[k]
            history = [*history, (seg(), _vary(rng, p["step_tokens"]))]
            t += 0.5
            answer = _vary(rng, 200)
            out.append(_req(ids, t, history, answer))
            if left <= 1:
                live.pop(k)
            else:
                live[k] = ([*history, (seg(), answer)], left - 1)
    return out


GENERATORS: dict[str, Generator] = {
    "agentloop": _agentloop,
    "rag": _rag,
    "scan": _scan,
    "shift": _shift,
}


def parse_workload(text: str) -> tuple[str, Params]:
    """``NAME`` or ``NAME:key=value,...`` of a shape of this module; ConfigError names a bad
    part."""
    name, _, rest = text.strip().partition(":")
    name = name.strip().lower()
    if name not in PARAMS:
        raise ConfigError(f"generate: unknown workload {name!r}; accepted: {', '.join(PARAMS)}")
    params = dict(PARAMS[name])
    for part in filter(None, (x.strip() for x in rest.split(","))):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in params:
            raise ConfigError(
                f"generate: bad override {part!r} for {name}; keys: {', '.join(params)}"
            )
        try:
            params[key] = float(value)
        except ValueError:
            raise ConfigError(f"generate: {key}={value!r} is not a number") from None
        if params[key] < 0 or (params[key] == 0 and key not in ("fanout_p", "idle_p")):
            raise ConfigError(f"generate: {key} must be > 0, got {value}")
    return name, params


def generate_named(
    text: str, seed: int = 0, *, block_tokens: int = TRACE_BLOCK_TOKENS
) -> list[GeneratedRequest]:
    """A trace of any shape: this module's workloads, or the chat generator's presets
    (``chat``, ``agent``, ``docs``, ``skewed``, ``longsys``)."""
    name = text.strip().partition(":")[0].strip().lower()
    if name not in GENERATORS:
        if name not in SHAPES:
            raise ConfigError(
                f"generate: unknown shape {name!r}; accepted: "
                f"{', '.join([*SHAPES, *GENERATORS])} (optionally name:key=value,...)"
            )
        return generate_chat(parse_shape(text), seed, block_tokens=block_tokens)
    name, params = parse_workload(text)
    reqs = GENERATORS[name](random.Random(seed), _BlockIds(block_tokens), params)
    return sorted(reqs, key=lambda r: r.timestamp_ms)


def write_named_trace(
    path: str | Path, text: str, seed: int = 0, *, block_tokens: int = TRACE_BLOCK_TOKENS
) -> int:
    """Generate a trace of shape ``text`` and write it as Mooncake JSONL; returns its size."""
    requests = generate_named(text, seed, block_tokens=block_tokens)
    with Path(path).open("w", encoding="utf-8") as f:
        f.writelines(iter_jsonl(requests))
    return len(requests)
