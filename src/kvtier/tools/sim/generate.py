"""Conversation-like request traces in Mooncake JSONL (``kvtier sim --generate``).

The generator models the traffic a chat or agent deployment sees, from the recipes in the
literature (multi-turn ShareGPT-like chat, shared system prompts, long-document QA):

- *Sessions* arrive as a Poisson process. Each picks one of a few shared *system prompts*
  (a handful of sizes, Zipf-distributed popularity) and runs several *turns*: each turn's
  prompt is the previous prompt, the previous answer and a new user message, so it extends
  the previous prompt exactly. Turns are separated by exponential *think times*.
- *Popularity skew across sessions*: a session's turn count is drawn from a heavy-tailed
  (Zipf) law, so a few sessions are long-lived and most are short.
- *One-off long documents*: requests carrying a unique long document (plus a system prompt
  and a question) that is never sent again.

Token content is not generated. A prompt is a list of *segments* (a system prompt, a user
message, an answer, a document), each with a unique id and a length; block ``j`` of a
prompt gets the id of its content (the pieces of segments it covers) chained to the id of
block ``j - 1``, exactly as Mooncake's ``hash_ids`` work: two prompts share their first k ids
iff their first k blocks hold the same tokens. The last id may cover a partial block.

Everything is deterministic given the seed. Shapes are presets of :class:`TraceShape`;
``name:key=value,...`` overrides fields (see :func:`parse_shape`).
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError
from kvtier.tools.sim.trace import TRACE_BLOCK_TOKENS


@dataclass(frozen=True)
class TraceShape:
    """Parameters of a generated trace (token counts are prompt tokens, times seconds)."""

    sessions: int = 600
    """Chat sessions in the trace."""
    session_rate: float = 1.0
    """Session arrivals per second (Poisson)."""
    turns_max: int = 12
    """Most turns in one session."""
    turns_skew: float = 1.3
    """Zipf exponent of the turn count per session (higher: more short sessions)."""
    think_s: float = 60.0
    """Mean think time between a reply and the next turn (exponential)."""
    system_sizes: tuple[int, ...] = (1024, 4096, 8192)
    """Sizes of the shared system prompts; ``systems_per_size`` prompts of each size."""
    systems_per_size: int = 3
    """Distinct system prompts of each size."""
    system_skew: float = 1.2
    """Zipf exponent of the system prompts' popularity."""
    user_tokens: int = 200
    """Median user message length (lognormal, sigma 0.8)."""
    answer_tokens: int = 350
    """Mean answer length (uniform 0.5x-1.5x); the answer becomes part of the next prompt."""
    doc_rate: float = 0.2
    """One-off long-document requests per second (Poisson), each a unique document."""
    doc_tokens: int = 24000
    """Median length of a one-off document (lognormal, sigma 0.5)."""
    max_prompt: int = 128000
    """A session ends once its next prompt would exceed this many tokens."""


_PRESET_FIELDS = (
    "sessions",
    "session_rate",
    "turns_max",
    "turns_skew",
    "think_s",
    "system_sizes",
    "systems_per_size",
    "system_skew",
    "user_tokens",
    "answer_tokens",
    "doc_rate",
    "doc_tokens",
)
"""The columns of :data:`_PRESETS`, in order (``max_prompt`` keeps its default)."""

_PRESETS: dict[str, tuple[Any, ...]] = {
    "chat": (600, 1.0, 12, 1.3, 60.0, (1024, 4096, 8192), 3, 1.2, 200, 350, 0.2, 24000),
    "agent": (300, 0.5, 40, 0.9, 8.0, (2048, 8192, 16384), 2, 1.2, 600, 250, 0.05, 24000),
    "docs": (500, 1.0, 6, 1.6, 90.0, (512, 2048), 4, 1.2, 200, 350, 0.8, 16000),
    "skewed": (800, 2.0, 25, 1.8, 30.0, (1024, 4096, 12288), 5, 1.6, 120, 200, 0.1, 24000),
    "longsys": (400, 1.0, 12, 1.3, 60.0, (8192, 16384, 32768), 2, 1.2, 200, 350, 0.05, 24000),
}
"""One row of :data:`_PRESET_FIELDS` per preset: a table, so presets compare column by
column (``chat`` is :class:`TraceShape`'s defaults)."""

SHAPES: dict[str, TraceShape] = {
    name: TraceShape(**dict(zip(_PRESET_FIELDS, row, strict=True)))
    for name, row in _PRESETS.items()
}
"""Presets: chat (ShareGPT-like), longsys (multi-turn chat behind long system prompts),
agent (long sessions, short pauses, big tool prompts),
docs (many one-off documents), skewed (strong popularity skew, short messages)."""


def parse_shape(text: str) -> TraceShape:
    """``chat``, ``agent``, ``docs``, ``skewed``, optionally with overrides:
    ``chat:sessions=200,think_s=30,system_sizes=512/2048``. ConfigError names a bad part."""
    name, _, rest = text.strip().partition(":")
    base = SHAPES.get(name.strip().lower())
    if base is None:
        raise ConfigError(
            f"generate: unknown shape {name!r}; accepted: {', '.join(SHAPES)} "
            "(optionally name:key=value,...)"
        )
    fields = {f.name: f for f in dataclasses.fields(TraceShape)}
    changes: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or key not in fields:
            raise ConfigError(
                f"generate: bad override {part!r}; use key=value with key one of "
                f"{', '.join(fields)}"
            )
        default = getattr(base, key)
        try:
            if isinstance(default, tuple):
                changes[key] = tuple(int(v) for v in value.split("/") if v.strip())
            elif isinstance(default, int):
                changes[key] = int(value)
            else:
                changes[key] = float(value)
        except ValueError:
            raise ConfigError(f"generate: {key}={value!r} is not a number") from None
    shape = dataclasses.replace(base, **changes)
    _check(shape)
    return shape


def _check(shape: TraceShape) -> None:
    for name in ("sessions", "turns_max", "systems_per_size", "max_prompt"):
        if getattr(shape, name) < 1:
            raise ConfigError(f"generate: {name} must be >= 1, got {getattr(shape, name)}")
    for name in ("session_rate", "think_s", "turns_skew", "system_skew"):
        if not getattr(shape, name) > 0:
            raise ConfigError(f"generate: {name} must be > 0, got {getattr(shape, name)}")
    if shape.doc_rate < 0:
        raise ConfigError(f"generate: doc_rate must be >= 0, got {shape.doc_rate}")
    if not shape.system_sizes or min(shape.system_sizes) < 1:
        raise ConfigError("generate: system_sizes needs at least one size >= 1")
    if min(shape.user_tokens, shape.answer_tokens, shape.doc_tokens) < 1:
        raise ConfigError("generate: user_tokens, answer_tokens and doc_tokens must be >= 1")


@dataclass(frozen=True, slots=True)
class GeneratedRequest:
    """One request of a generated trace, as written to the JSONL file."""

    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    retain_s: float = 0.0
    """A ``retain_s`` hint the request carries (written under ``kvtier``; 0: none)."""

    def to_json(self) -> str:
        out: dict[str, object] = {
            "timestamp": self.timestamp_ms,
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": list(self.hash_ids),
        }
        if self.retain_s:
            out["kvtier"] = {"retain_s": self.retain_s}
        return json.dumps(out)


class _BlockIds:
    """Mooncake-style block ids: block j's id is determined by block j-1's id and the
    segment pieces block j covers (so equal ids mean equal prefixes)."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self._ids: dict[tuple[int, tuple[tuple[int, int, int], ...]], int] = {}

    def of(self, segments: list[tuple[int, int]]) -> tuple[int, ...]:
        """Ids of the blocks of a prompt made of ``(segment id, length)`` pieces."""
        bt = self.block_tokens
        out: list[int] = []
        piece: list[tuple[int, int, int]] = []
        room, parent = bt, -1
        for seg, length in segments:
            pos = 0
            while pos < length:
                take = min(room, length - pos)
                piece.append((seg, pos, pos + take))
                pos += take
                room -= take
                if room == 0:
                    parent = self._id(parent, piece)
                    out.append(parent)
                    piece, room = [], bt
        if piece:
            out.append(self._id(parent, piece))
        return tuple(out)

    def _id(self, parent: int, piece: list[tuple[int, int, int]]) -> int:
        key = (parent, tuple(piece))
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = len(self._ids)
        return got


def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


def generate(
    shape: TraceShape, seed: int = 0, *, block_tokens: int = TRACE_BLOCK_TOKENS
) -> list[GeneratedRequest]:
    """The requests of one trace, in arrival order (see the module docstring)."""
    _check(shape)
    rng = random.Random(seed)
    ids = _BlockIds(block_tokens)
    next_seg = 0

    def new_segment() -> int:
        nonlocal next_seg
        next_seg += 1
        return next_seg

    systems = [
        (new_segment(), size) for size in shape.system_sizes for _ in range(shape.systems_per_size)
    ]
    rng.shuffle(systems)  # popularity rank independent of size
    sys_weights = _zipf_weights(len(systems), shape.system_skew)
    turn_counts = list(range(1, shape.turns_max + 1))
    turn_weights = _zipf_weights(shape.turns_max, shape.turns_skew)

    # Events: (time s, order, kind, payload). Sessions schedule their next turn when a turn
    # is sent: arrival + an answer time (output tokens at 50 tok/s) + think time.
    events: list[tuple[float, int, str, Any]] = []
    order = 0
    t = 0.0
    for _ in range(shape.sessions):
        t += rng.expovariate(shape.session_rate)
        system = rng.choices(systems, sys_weights)[0]
        turns = rng.choices(turn_counts, turn_weights)[0]
        heapq.heappush(events, (t, order, "turn", ([system], turns)))
        order += 1
    horizon = t
    if shape.doc_rate > 0:
        td = rng.expovariate(shape.doc_rate)
        while td < horizon:
            heapq.heappush(events, (td, order, "doc", None))
            order += 1
            td += rng.expovariate(shape.doc_rate)

    out: list[GeneratedRequest] = []
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "doc":
            system = rng.choices(systems, sys_weights)[0]
            doc = max(1, int(rng.lognormvariate(math.log(shape.doc_tokens), 0.5)))
            segments = [system, (new_segment(), doc), (new_segment(), _user(rng, shape))]
            out.append(_request(ids, now, segments, _answer(rng, shape)))
            continue
        history, turns_left = payload
        segments = [*history, (new_segment(), _user(rng, shape))]
        if sum(n for _, n in segments) > shape.max_prompt:
            continue
        answer = _answer(rng, shape)
        out.append(_request(ids, now, segments, answer))
        if turns_left > 1:
            nxt = now + answer / 50.0 + rng.expovariate(1.0 / shape.think_s)
            heapq.heappush(
                events, (nxt, order, "turn", ([*segments, (new_segment(), answer)], turns_left - 1))
            )
            order += 1
    return out


def _user(rng: random.Random, shape: TraceShape) -> int:
    return max(1, int(rng.lognormvariate(math.log(shape.user_tokens), 0.8)))


def _answer(rng: random.Random, shape: TraceShape) -> int:
    return max(1, int(shape.answer_tokens * rng.uniform(0.5, 1.5)))


def _request(
    ids: _BlockIds, now: float, segments: list[tuple[int, int]], answer: int
) -> GeneratedRequest:
    length = sum(n for _, n in segments)
    return GeneratedRequest(int(now * 1000), length, answer, ids.of(segments))


def iter_jsonl(requests: list[GeneratedRequest]) -> Iterator[str]:
    """One JSON line per request (Mooncake format)."""
    for r in requests:
        yield r.to_json() + "\n"


def write_trace(
    path: str | Path, shape: TraceShape, seed: int = 0, *, block_tokens: int = TRACE_BLOCK_TOKENS
) -> int:
    """Generate a trace and write it as Mooncake JSONL; returns the number of requests."""
    requests = generate(shape, seed, block_tokens=block_tokens)
    with Path(path).open("w", encoding="utf-8") as f:
        f.writelines(iter_jsonl(requests))
    return len(requests)
