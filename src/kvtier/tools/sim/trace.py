"""Loading Mooncake-format request traces for the cache simulator.

One JSON object per line (Mooncake FAST'25 format)::

    {"timestamp": 0, "input_length": 40160, "output_length": 6, "hash_ids": [0, 1, 2, ...]}

``hash_ids`` holds one id per ``trace_block_tokens``-token block of the prompt (512 in the
public traces); the last id may cover a partial block. Two requests share a k-block prefix
exactly when their first k ids are equal.

The simulator does not trust ids to be chained already: it derives kvtier chunk keys from
them with :func:`kvtier.keys.chunk_keys` (one "token" per id, chunk size 1), so key i depends
on ids[0..i] exactly as a real chunk key depends on every token before it. The keys are
computed once per request here and reused by every simulated policy.

Every line is validated; a bad line raises :class:`~kvtier.errors.ConfigError` naming the
file, the line number and the field, so a CLI can print it without a traceback.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtier.errors import ConfigError
from kvtier.hints import NO_HINTS, parse_hints
from kvtier.keys import Key, chunk_keys

TRACE_BLOCK_TOKENS = 512
"""Tokens per hash id in the public Mooncake traces."""

SIM_SEED: bytes = hashlib.blake2b(b"kvtier-sim-v1", digest_size=16).digest()
"""Chain seed of simulated requests (all requests share one namespace)."""

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of a trace, as the simulator needs it."""

    line: int
    """1-based line number in the trace file (for messages)."""
    timestamp: float
    """Arrival time in ms (informational: requests are replayed in file order)."""
    input_tokens: int
    """Prompt length in tokens, scaled to the simulation's block size."""
    hash_ids: tuple[int, ...]
    retain_s: float = 0.0
    """The request's ``retain_s`` hint (its optional ``kvtier`` field, as vLLM's
    ``kv_transfer_params`` carry it; an invalid one warns and counts as none)."""


@dataclass
class Trace:
    """Requests of a trace plus what every simulation reuses: chained keys and token counts.

    ``keys[i][j]`` is the chunk key of block j of request i; ``tokens[i]`` its prompt length
    in tokens. The first ``n`` blocks of request i cover :meth:`prefix_tokens` tokens.
    """

    path: str
    block_tokens: int
    requests: list[SimRequest]
    keys: list[list[Key]] = field(repr=False)
    tokens: list[int] = field(repr=False)

    @property
    def num_blocks(self) -> int:
        return sum(len(k) for k in self.keys)

    @property
    def input_tokens(self) -> int:
        return sum(self.tokens)

    @property
    def unique_blocks(self) -> int:
        """Distinct blocks (prefixes) in the trace: the slots an infinite cache would use."""
        return len({k for keys in self.keys for k in keys})

    def prefix_tokens(self, i: int, n_blocks: int) -> int:
        """Tokens covered by the first ``n_blocks`` blocks of request ``i``.

        Every block but the last is full; the last covers what is left of the prompt.
        """
        return min(n_blocks * self.block_tokens, self.tokens[i])


def load_trace(
    path: str | Path,
    *,
    limit: int | None = None,
    block_tokens: int = TRACE_BLOCK_TOKENS,
    trace_block_tokens: int = TRACE_BLOCK_TOKENS,
) -> Trace:
    """Read and validate a Mooncake JSONL trace and precompute its chunk keys.

    ``limit`` keeps the first ``limit`` requests (lines after them are not read).
    ``block_tokens`` is the size of one hash-id block in the simulation; prompt lengths are
    scaled by ``block_tokens / trace_block_tokens`` so a trace recorded with 512-token blocks
    can be replayed at, say, 32 tokens per block (block counts, hence hit ratios, unchanged).
    """
    if block_tokens <= 0:
        raise ConfigError(f"block_tokens: must be > 0, got {block_tokens}")
    if trace_block_tokens <= 0:
        raise ConfigError(f"trace_block_tokens: must be > 0, got {trace_block_tokens}")
    if limit is not None and limit < 0:
        raise ConfigError(f"limit: must be >= 0, got {limit}")
    p = Path(path)
    requests: list[SimRequest] = []
    keys: list[list[Key]] = []
    tokens: list[int] = []
    for req in _iter_requests(p, limit, trace_block_tokens):
        requests.append(req)
        keys.append(chunk_keys(req.hash_ids, 1, SIM_SEED))
        tokens.append(_scale(req.input_tokens, block_tokens, trace_block_tokens))
    return Trace(str(p), block_tokens, requests, keys, tokens)


def _scale(input_tokens: int, block_tokens: int, trace_block_tokens: int) -> int:
    """Prompt length at the simulation's block size (exact when the sizes are equal)."""
    if block_tokens == trace_block_tokens:
        return input_tokens
    return -(-input_tokens * block_tokens // trace_block_tokens)


def _iter_requests(path: Path, limit: int | None, trace_block_tokens: int) -> Iterator[SimRequest]:
    """Parsed requests of ``path`` in file order; blank lines are skipped."""
    if limit == 0:
        return
    try:
        f = path.open(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"trace: cannot open {str(path)!r}: {e.strerror or e}") from None
    n = 0
    with f:
        try:
            for lineno, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                yield parse_request(text, lineno, trace_block_tokens, source=path.name)
                n += 1
                if limit is not None and n >= limit:
                    return
        except UnicodeDecodeError as e:
            raise ConfigError(f"trace {path.name}: not UTF-8 text ({e.reason})") from None


def parse_request(
    text: str, lineno: int, trace_block_tokens: int = TRACE_BLOCK_TOKENS, *, source: str = "trace"
) -> SimRequest:
    """Parse and validate one trace line; ConfigError names the line and the field."""
    where = f"{source} line {lineno}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object, got {_kind(obj)}")
    input_tokens = _int_field(obj, "input_length", where, required=True)
    _int_field(obj, "output_length", where, required=False)
    timestamp = _timestamp(obj, where)
    hash_ids = _hash_ids(obj, where)
    max_ids = math.ceil(input_tokens / trace_block_tokens)
    if len(hash_ids) > max_ids:
        raise ConfigError(
            f"{where}: field 'hash_ids' has {len(hash_ids)} ids but input_length "
            f"{input_tokens} spans only {max_ids} blocks of {trace_block_tokens} tokens "
            "(is the trace's block size different? set trace_block_tokens)"
        )
    hints = parse_hints({"kvtier": obj["kvtier"]}) if "kvtier" in obj else NO_HINTS
    return SimRequest(lineno, timestamp, input_tokens, hash_ids, hints.retain_s)


def _kind(value: Any) -> str:
    """A JSON type name for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _int_field(obj: dict[str, Any], name: str, where: str, *, required: bool) -> int:
    """A non-negative integer field (0 when optional and absent)."""
    if name not in obj:
        if required:
            raise ConfigError(f"{where}: missing field {name!r}")
        return 0
    value = obj[name]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{where}: field {name!r} must be an integer, got {_kind(value)}")
    if value < 0:
        raise ConfigError(f"{where}: field {name!r} must be >= 0, got {value}")
    return value


def _timestamp(obj: dict[str, Any], where: str) -> float:
    """The optional ``timestamp`` (ms): a finite number >= 0."""
    value = obj.get("timestamp", 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: field 'timestamp' must be a number, got {_kind(value)}")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}: field 'timestamp' must be finite and >= 0, got {value}")
    return float(value)


def _hash_ids(obj: dict[str, Any], where: str) -> tuple[int, ...]:
    """The ``hash_ids`` array: 64-bit signed integers."""
    if "hash_ids" not in obj:
        raise ConfigError(f"{where}: missing field 'hash_ids'")
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        raise ConfigError(f"{where}: field 'hash_ids' must be an array, got {_kind(ids)}")
    for j, h in enumerate(ids):
        if not isinstance(h, int) or isinstance(h, bool):
            raise ConfigError(
                f"{where}: field 'hash_ids' item {j} must be an integer, got {_kind(h)}"
            )
        if not _INT64_MIN <= h <= _INT64_MAX:
            raise ConfigError(f"{where}: field 'hash_ids' item {j} does not fit in 64 bits: {h}")
    return tuple(ids)
