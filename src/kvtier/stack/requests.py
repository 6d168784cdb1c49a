"""Per-request state of the scheduler side, and the hit a lookup found."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtier.hints import NO_HINTS, Hints
from kvtier.keys import Key, KeyChain
from kvtier.sources import HitRun


@dataclass(frozen=True)
class Hit:
    """An external hit: tokens ``[start, end)`` found in tiers, as per-tier chunk runs."""

    start: int
    """Tokens the engine already has (its own cache); the hit continues from here."""
    end: int
    """End of the hit in tokens (a chunk boundary)."""
    runs: tuple[tuple[str, int, int], ...]
    """``(tier, first chunk, end chunk)``, innermost tier first, contiguous."""

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass
class RequestState:
    """What the scheduler side keeps per request."""

    chain: KeyChain
    hit: Hit | None = None
    load_runs: list[HitRun] = field(default_factory=list)
    load_start: int = 0
    entry: int = 0
    """Tier position the engine stores this request's chunks into (the edge fill rules)."""
    jobs: set[int] = field(default_factory=set)
    finished: bool = False
    observed: bool = False
    unkeyable: bool = False
    """Its inputs include a kind chunk keys cannot cover: never loaded nor stored."""
    hints: Hints = NO_HINTS
    """What the request's ``kv_transfer_params`` asked (:mod:`kvtier.hints`)."""
    load_failed_at: int | None = None
    """The first chunk of this request whose load failed. From then on its lookups claim
    nothing: vLLM recomputes the request (from its first failed block with one KV-cache
    group, from scratch with several), a hit that cannot load (a planted value, a flaky
    disk, a timeout) cannot loop it through reschedules, and the request never loads
    asynchronously twice (vLLM 0.32 keeps a request whose async load failed among its
    in-flight prefills, so a second async load of it is reserved twice, which under
    memory pressure never fits: the engine stalls with the request waiting)."""

    def claimable(self, keys: Sequence[Key]) -> Sequence[Key]:
        """The chain's keys a lookup may claim: all of them, none once a load of the
        request failed (:attr:`load_failed_at`)."""
        return keys if self.load_failed_at is None else keys[:0]
