"""Hit sources: which tier every hit token came from, computed from runs.

A lookup yields *runs*, ``(start_token, end_token, source)`` half-open ranges, not per-chunk
lists. A dense model has one run list; a hybrid model has one per KV group, possibly with
different chunk sizes, and recurrent-state groups contribute one run over the whole reused
prefix. :func:`hit_sources` merges them with vLLM's semantics:

- sources are ordered DEVICE < HOST < P2P < DISK < EXTERNAL_UNSPECIFIED; where runs overlap the
  *outermost* (largest) source wins;
- tokens of ``[start, end)`` covered by no run count as EXTERNAL_UNSPECIFIED;
- the values sum to ``end - start``; zero counts are omitted; an empty hit gives ``{}``.

The cost is O(R log R) in the number of runs R, which is O(tiers) per group, independent of
the hit length: a 128k-token hit from one tier is one run, not 8,192 chunk ranges.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import NamedTuple


class HitSource(IntEnum):
    """Where hit tokens came from; the integer order is "distance from the accelerator"."""

    DEVICE = 0
    HOST = 1
    P2P = 2
    DISK = 3
    EXTERNAL_UNSPECIFIED = 4

    @property
    def label(self) -> str:
        """vLLM's CacheHitSource value ("host", "disk", ...)."""
        return self.name.lower()


class HitRun(NamedTuple):
    """Tokens ``[start, end)`` of a request served by ``source``."""

    start: int
    end: int
    source: HitSource


def hit_sources(
    group_runs: Iterable[Sequence[HitRun]], start: int, end: int
) -> dict[HitSource, int]:
    """Split the hit ``[start, end)`` by source; see the module docstring for the rules."""
    if end <= start:
        return {}
    events: list[tuple[int, int, int]] = []
    for runs in group_runs:
        for run in runs:
            lo = max(run.start, start)
            hi = min(run.end, end)
            if lo < hi:
                events.append((lo, 1, int(run.source)))
                events.append((hi, -1, int(run.source)))
    out = [0] * len(HitSource)
    if not events:
        return {HitSource.EXTERNAL_UNSPECIFIED: end - start}
    events.sort()
    active = [0] * len(HitSource)
    unspecified = HitSource.EXTERNAL_UNSPECIFIED
    pos = start
    for boundary, delta, src in events:
        if boundary > pos:
            out[_outermost(active, unspecified)] += boundary - pos
            pos = boundary
        active[src] += delta
    out[unspecified] += end - pos
    return {HitSource(i): n for i, n in enumerate(out) if n}


def _outermost(active: list[int], default: int) -> int:
    for i in range(len(active) - 1, -1, -1):
        if active[i]:
            return i
    return default


def chunk_runs(
    sources: Sequence[HitSource], chunk_tokens: int, start_chunk: int = 0, limit: int | None = None
) -> list[HitRun]:
    """Runs from per-chunk sources (chunk ``start_chunk + i`` served by ``sources[i]``).

    A helper for callers that hold per-chunk results; adjacent equal sources merge. Token
    ranges are clipped at ``limit`` when given.
    """
    runs: list[HitRun] = []
    for i, src in enumerate(sources):
        lo = (start_chunk + i) * chunk_tokens
        hi = lo + chunk_tokens
        if limit is not None:
            hi = min(hi, limit)
            if lo >= hi:
                break
        if runs and runs[-1].source == src and runs[-1].end == lo:
            runs[-1] = HitRun(runs[-1].start, hi, src)
        else:
            runs.append(HitRun(lo, hi, src))
    return runs
