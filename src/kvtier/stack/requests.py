"""Per-request state of the scheduler side, the hit a lookup found, and the table of the
requests the scheduler side knows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtier.hints import NO_HINTS, Hints
from kvtier.keyinputs import NO_INPUTS, KeyInputs
from kvtier.keys import Key, KeyChain, Namespace
from kvtier.metrics import Metrics
from kvtier.sources import HitRun, HitSource, hit_sources


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

    def hit_sources(self, num_external: int) -> dict[HitSource, int]:
        """Which tier each of the first ``num_external`` tokens its load covers came from."""
        if num_external <= 0:
            return {}
        return hit_sources([self.load_runs], self.load_start, self.load_start + num_external)


class Requests:
    """The scheduler side's request states, by request id (the scheduler's thread).

    A request's state is made the first time anything asks for it (its first lookup, its
    arrival with hints, a store planned for it), with its key chain: from then on its key
    inputs are not read again. It is dropped when the request finished and no job of it is
    left. Readers outside the manager (the connector, recurrent states, tier events) use
    :meth:`knows`, :meth:`chain_keys` and :meth:`get`; only the manager opens and ends."""

    def __init__(self, namespace: Namespace, chunk_tokens: int, metrics: Metrics) -> None:
        self.namespace = namespace
        self.chunk_tokens = chunk_tokens
        self.metrics = metrics
        self._states: dict[str, RequestState] = {}

    def open(self, req_id: str, inputs: KeyInputs = NO_INPUTS) -> RequestState:
        """The request's state, made (its chain seeded by ``inputs``) if it has none."""
        req = self._states.get(req_id)
        if req is None:
            chain = self.namespace.key_chain(self.chunk_tokens, inputs)
            req = self._states[req_id] = RequestState(chain, unkeyable=bool(inputs.unkeyable))
            if inputs.unkeyable:
                self.metrics.inc("unkeyable_requests", 1, inputs.unkeyable)
        return req

    def get(self, req_id: str) -> RequestState | None:
        return self._states.get(req_id)

    def knows(self, req_id: str) -> bool:
        """Whether the request has state (its inputs were read; they are read no more)."""
        return req_id in self._states

    def __len__(self) -> int:
        return len(self._states)

    def chain_keys(self, req_id: str, tokens: Sequence[int] = ()) -> Sequence[Key]:
        """The request's chunk keys computed so far, first extended over ``tokens`` (its
        tokens from the start); empty for a request without state."""
        req = self._states.get(req_id)
        if req is None:
            return ()
        if tokens and not req.unkeyable:
            req.chain.update(tokens)
        return req.chain.keys

    def set_hit(self, req_id: str, hit: Hit) -> None:
        """Replace the hit the request's last lookup found with a part of it (recurrent
        states: the prefix whose state is present, :mod:`kvtier.stack.states`)."""
        req = self._states.get(req_id)
        if req is not None:
            req.hit = hit if hit.tokens > 0 else None

    def finish(self, req_id: str, req: RequestState) -> list[int]:
        """The request finished: the ids of its jobs still running, in order; its state
        stays until they end (:meth:`job_ended`), or goes now when there are none."""
        req.finished = True
        if req.jobs:
            return sorted(req.jobs)
        del self._states[req_id]
        return []

    def job_ended(self, req_id: str, job_id: int) -> None:
        """A job of the request ended: a finished request's last one drops its state."""
        req = self._states.get(req_id)
        if req is not None:
            req.jobs.discard(job_id)
            if req.finished and not req.jobs:
                del self._states[req_id]
