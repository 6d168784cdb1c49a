"""Prefetch on arrival: promote a waiting request's slow-tier prefix into the CPU tier.

When a request arrives (vLLM's ``on_new_request``, before it is scheduled), the part of its
chain that is readable in a tier below the first one (disk, Redis, ...) and not present in
the first tier is copied up into the first tier: one reservation there (evicting as a store
would, demotions first) and one ``copy`` job per source tier, run by the workers' copy
lanes off the engine thread. When vLLM schedules the request, its lookup finds those chunks
in the first tier: a host hit, loaded within the step where the sync budget allows.

What: only requests part of whose hit cannot load within the step, or loads there at
least ``WORTH_SLOWDOWN`` times slower than host memory (a Redis tier; a disk tier until
its loads were measured, or measured slow). Where the whole hit loads within the step
about as fast as from host memory (a disk tier reading from the page cache), a copy ahead
would only move the bytes twice.

When: at the end of the step the request arrived in (the step's plan carries the copies,
so a copy starts no later than if it had been planned at arrival), and only if vLLM did
not admit the request in that step. An admitted request has no wait to hide a copy in: it
takes its hit where it lies (a disk hit loads within the step where the budget allows),
instead of reading its chunks twice. A ``prefetch_only`` request is prefetched at once
(the copy in the first tier is what it asks for).

Contracts:

- Bounded: the bytes a prefetch reserves count against ``prefetch_inflight_bytes`` (at most
  half the first tier) from the moment its copies are planned until the request loads them,
  finishes, or its lease ends; and at most ``prefetch_step_bytes`` are planned per engine
  step. What does not fit waits (FIFO) and is retried each step; a shared tier that
  cannot answer yet (a probe in flight) is retried the same way.
- Pinned while waiting: once its copies end, the deepest prefetched chunk is held in the
  first tier (the chain above it with it) until the request's load takes its own hold, the
  request finishes (aborted or not), or ``prefetch_lease_s`` after the copies were planned.
  A copy's source chunk is held by its job (released when it ends, whatever the outcome).
- Failure granularity: a chunk whose copy failed (a read or a write) leaves the first tier
  with its descendants (the index commit); the request's lookup then serves the source tier
  again or recomputes. Nothing a failed prefetch reserved stays held.
- One use: the prefetch neither observes nor touches any tier's policy. The request's
  lookup observes its chain once; for the first tier it leaves out the chunks prefetched for
  it (:meth:`Prefetcher.observe_limit`), so a prefetch and its use count as one use, as a
  hit in the source tier would.
- A lookup while this request's copies are still running asks vLLM to try again next step
  (at most ``MAX_WAIT_S``): the request then loads from host memory instead of reading the
  same chunks from the slow tier a second time.

Single-threaded (the scheduler's thread), as the manager.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvtier.jobs import TransferJob
from kvtier.keys import Key
from kvtier.stack.first_tier import FirstTier
from kvtier.stack.movement import Movement

WORTH_SLOWDOWN = 2.0
"""A prefetch pays where the source tier's hits load within the step this many times
slower than host memory, or more (or cannot load within the step at all)."""
MAX_WAIT_S = 2.0
"""Longest a request's lookup waits for its own prefetch copies; past that it takes its hit
where it is now (a slow tier hung on a prefetch must not hang the request)."""


@dataclass
class _Prefetch:
    keys: Sequence[Key]
    start: int
    """First chunk prefetched (the first tier's stored prefix at the first attempt)."""
    end: int
    """End of the chunks reserved in the first tier so far."""
    planned: float
    nbytes: int = 0
    jobs: set[int] = field(default_factory=set)
    held: Key | None = None
    landed: int = 0
    """Chunks [start, start + landed) readable in the first tier when the copies ended."""
    closed: bool = False
    """Its request loaded, finished, or its lease ended: only copies left to account for."""


class Prefetcher:
    """Prefetch state of one engine's scheduler side (see the module docstring)."""

    def __init__(
        self,
        first: FirstTier,
        movement: Movement,
        chunk_bytes: int,
        *,
        step_bytes: int,
        inflight_bytes: int,
        lease_s: float,
        clock: Callable[[], float] = time.monotonic,
        slowdown: Callable[[str], float | None] = lambda tier: None,
    ) -> None:
        self.first = first
        self.slowdown = slowdown
        """How many times slower than host memory a hit in the named tier loads within the
        step, or None where it cannot (see :meth:`_worth`); by default none can."""
        self.movement = movement
        self.chunk_bytes = max(1, chunk_bytes)
        half = first.slots // 2 * self.chunk_bytes
        self.inflight_cap = min(inflight_bytes, half)
        self.step_cap = step_bytes
        self.lease_s = lease_s
        self.clock = clock
        self.inflight = 0
        """Bytes reserved by prefetches not yet released (the in-flight cap's count)."""
        self._step_used = 0
        self._reqs: dict[str, _Prefetch] = {}
        self._jobs: dict[int, str] = {}
        self._backlog: OrderedDict[str, Sequence[Key]] = OrderedDict()
        stack = first.stack
        self.able = len(stack) > 1 and not stack[0].shared and self.inflight_cap > 0
        """Whether there is a tier to prefetch from and room to prefetch into."""

    # -- arrival ---------------------------------------------------------------------------

    def arrive(self, req_id: str, keys: Sequence[Key], *, now: bool = False) -> None:
        """A request arrived with chain ``keys`` (kept by reference: they only grow). Its
        prefetch is planned at the end of the step (:meth:`step`) unless vLLM admits it
        first (:meth:`consumed`); ``now``: planned at once (``prefetch_only``)."""
        if self.able and keys and (not now or not self._try(req_id, keys)):
            self._backlog[req_id] = keys

    def _try(self, req_id: str, keys: Sequence[Key]) -> bool:
        """Plan what fits of the request's prefetch; False to retry it next step."""
        start = self.first.index.stored_len(keys)
        if start >= len(keys):
            return True
        runs = self.first.stack.lookup(keys, start)
        if runs is None:
            return False  # a shared tier's probe is in flight
        if not runs or not any(self._worth(t) for t, _, _ in runs):
            return True
        room = min(self.inflight_cap - self.inflight, self.step_cap - self._step_used)
        n = min(runs[-1][2] - start, room // self.chunk_bytes)
        if n <= 0:
            return False
        end = start + n
        slots, demotions = self.movement.reserve(
            0, keys[start:end], keys[start - 1] if start else None, req_id
        )
        self.movement.pending += demotions
        if not slots:
            return True  # the first tier is full of held chunks: nothing to gain
        end = start + len(slots)
        rec = self._reqs.get(req_id)
        if rec is None:
            rec = self._reqs[req_id] = _Prefetch(keys, start, end, self.clock())
        rec.end = end
        nbytes = len(slots) * self.chunk_bytes
        rec.nbytes += nbytes
        self.inflight += nbytes
        self._step_used += nbytes
        for t, a, b in runs:
            b = min(b, end)
            if b <= a:
                break
            self._copy(req_id, rec, t, keys, a, b, slots[a - start : b - start])
        return end >= runs[-1][2]

    def _worth(self, t: int) -> bool:
        """Whether a hit in tier ``t`` gains from being copied up ahead: it cannot load
        within the step, or loads there ``WORTH_SLOWDOWN`` times slower than host memory
        or more. A request whose whole hit loads within the step about as fast as host
        memory is not prefetched: the copy would move its bytes twice, and on a CPU
        backend through the cores the forward computes on."""
        slow = self.slowdown(self.first.stack[t].name)
        return slow is None or slow >= WORTH_SLOWDOWN

    def _copy(
        self,
        req_id: str,
        rec: _Prefetch,
        t: int,
        keys: Sequence[Key],
        a: int,
        b: int,
        dst_slots: list[int],
    ) -> None:
        src, dst = self.first.stack[t], self.first.stack[0]
        chunk_keys = list(keys[a:b])
        copy = TransferJob(
            job_id=0,
            req_id=req_id,
            kind="copy",
            tier=src.name,
            sync=False,
            keys=chunk_keys,
            slots=src.index.chain_slots(chunk_keys),
            block_ids=[],
            dst_tier=dst.name,
            dst_slots=dst_slots,
            parents=[keys[a - 1] if a else None, *chunk_keys[:-1]],
            after=self.movement.after(0, dst_slots),
        )
        jobs = self.movement.jobs
        job_id = jobs.add(copy, jobs.hold(src.index, chunk_keys[-1]))
        rec.jobs.add(job_id)
        self._jobs[job_id] = req_id
        self.movement.pending.append(copy)
        self.first.metrics.inc("prefetch_chunks", len(chunk_keys), src.name)

    # -- copies ----------------------------------------------------------------------------

    def landed(self, job: TransferJob) -> None:
        """A copy ended (the manager committed it into the first tier already)."""
        req_id = self._jobs.pop(job.job_id, None)
        if req_id is None or (rec := self._reqs.get(req_id)) is None:
            return
        rec.jobs.discard(job.job_id)
        if rec.jobs:
            return
        rec.landed = max(0, self.first.readable(rec.keys[: rec.end], rec.start) - rec.start)
        if rec.closed and rec.landed:  # landed after its request was done with it
            self.first.metrics.inc("prefetch_unused_chunks", rec.landed)
        if rec.closed or not rec.landed:  # nothing to hold: release its bytes now
            self._close(req_id, rec, 0)
        else:
            key = rec.keys[rec.start + rec.landed - 1]
            if self.first.hold(key):
                rec.held = key

    def waiting(self, req_id: str) -> bool:
        """Whether the request's lookup should wait for its own copies (see the module
        docstring)."""
        rec = self._reqs.get(req_id)
        return (
            rec is not None
            and bool(rec.jobs)
            and not rec.closed
            and self.clock() - rec.planned < MAX_WAIT_S
        )

    def observe_limit(self, req_id: str) -> int | None:
        """Chunks of the request's chain the first tier held before its prefetch (its
        policy observes only those), or None without a prefetch."""
        rec = self._reqs.get(req_id)
        return rec.start if rec is not None else None

    # -- the end of a prefetch -------------------------------------------------------------

    def consumed(self, req_id: str, end_chunk: int) -> None:
        """The request's load was planned up to chunk ``end_chunk`` (its own hold is
        taken): release the prefetch's hold, count what it used."""
        self._backlog.pop(req_id, None)
        rec = self._reqs.get(req_id)
        if rec is not None:
            used = max(0, min(end_chunk, rec.start + rec.landed) - rec.start)
            self._close(req_id, rec, used)

    def finished(self, req_id: str) -> None:
        """The request finished (or was aborted) without a load consuming its prefetch."""
        self.consumed(req_id, 0)

    def _close(self, req_id: str, rec: _Prefetch, used: int) -> None:
        if not rec.closed:
            rec.closed = True
            if used:
                self.first.metrics.inc("prefetch_used_chunks", used)
            if rec.landed > used:
                self.first.metrics.inc("prefetch_unused_chunks", rec.landed - used)
            if rec.held is not None:
                self.first.release(rec.held)
                rec.held = None
        if not rec.jobs:  # copies still running keep their bytes counted until they end
            self.inflight -= rec.nbytes
            del self._reqs[req_id]

    # -- steps -----------------------------------------------------------------------------

    def step(self) -> None:
        """Once per engine step (at its end): a new per-step allowance, leases that ended,
        the backlog (this step's arrivals that vLLM did not admit among them) planned in
        arrival order."""
        self._step_used = 0
        if self._reqs:
            now = self.clock()
            for req_id, rec in list(self._reqs.items()):
                if not rec.closed and not rec.jobs and now - rec.planned >= self.lease_s:
                    self._close(req_id, rec, 0)
        while self._backlog:
            req_id, keys = next(iter(self._backlog.items()))
            if not self._try(req_id, keys):
                return  # out of room (or a probe pending): keep the order
            del self._backlog[req_id]

    def pinned(self) -> int:
        """Prefetched chains held in the first tier now (inspection and tests)."""
        return sum(rec.held is not None for rec in self._reqs.values())

    def active(self) -> int:
        """Requests with prefetch state (inspection and tests)."""
        return len(self._reqs) + len(self._backlog)
