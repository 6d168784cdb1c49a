"""Sync loads copied layer by layer while the engine's forward runs.

One :class:`LayeredLoad` holds the sync loads of one step (``"rows"`` plans, host-memory
KV: see :meth:`kvtier.transfer.engine.TransferEngine.submit_layered`) and runs as one unit
on the expedited queue: first every job's last engine block in every region (the engine
may write this step's KV there before any attention runs, see :mod:`kvtier.worker`), then
layer after layer, each layer's regions for every job. The engine's thread lets the copy
run one layer ahead of the attention it waits for (:meth:`LayeredLoad.wait_layer`), so
the copy thread never competes with the forward's threads for more than about one
layer's copy at a time, and never reads ahead into work the forward does not need yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kvtier import timeline
from kvtier.jobs import JobResult, TransferJob
from kvtier.transfer.plans import Plan

log = logging.getLogger(__name__)

RunChecked = Callable[[TransferJob, Plan, list[int] | None], list[bool]]
"""Runs a plan (on the given regions alone) under the sync-load retry; may raise."""


class LayeredLoad:
    """The sync loads of one step, copied layer by layer (see the module docstring).

    ``plans``: per job, its ``"rows"`` plan split as (last block, the rest)
    (:func:`~kvtier.transfer.plans.split_last_block`); ``layers``: each engine layer's
    region indices, in forward order. The engine's thread calls :meth:`wait_tail`,
    :meth:`wait_layer` and :meth:`release`; the queue thread :meth:`run`.
    """

    def __init__(
        self, jobs: list[TransferJob], plans: list[tuple[Plan, Plan]], layers: list[list[int]]
    ) -> None:
        self.jobs = jobs
        self.plans = plans
        self.layers = layers
        self._cond = threading.Condition()
        self._allowed = 0  # layers 0 .. _allowed may be copied
        self._copied = 0  # layers 0 .. _copied - 1 are whole
        self._tail_done = False
        self._over = False

    @property
    def copied(self) -> int:
        """How many leading layers are whole (copied, and fenced where a fence is given)."""
        return self._copied

    @property
    def tail_done(self) -> bool:
        """Whether every job's last block is copied."""
        return self._tail_done

    # -- the engine's thread ---------------------------------------------------------------

    def wait_tail(self) -> None:
        """Until every job's last block is copied (before the forward)."""
        with self._cond:
            while not (self._tail_done or self._over):
                self._cond.wait()

    def wait_layer(self, k: int) -> None:
        """Let layer ``k + 1`` start, then wait until layers ``0 .. k`` are whole."""
        with self._cond:
            self._allowed = max(self._allowed, k + 1)
            self._cond.notify_all()
            while self._copied <= k and not self._over:
                self._cond.wait()

    def release(self) -> None:
        """Let every remaining layer be copied (the end of the forward)."""
        with self._cond:
            self._allowed = len(self.layers)
            self._cond.notify_all()

    # -- the copy thread -------------------------------------------------------------------

    def finished(self) -> None:
        """The unit is over, copied or not: nothing waits for it any more."""
        self._set(over=True)

    def run(
        self, run_checked: RunChecked, block_bytes: int, fence: Callable[[], object] | None = None
    ) -> list[JobResult]:
        """Copy every part of every job, each under the sync-load retry (a layer is copied
        again before its attention may run). A job with a part that still fails fails
        whole, as its whole copy would, and its later parts are skipped (vLLM recomputes
        its blocks). ``fence``: called after a part's copies were issued and before the
        part is reported whole (device copies: waits for the copy stream); an exception
        from it fails the whole unit, as one from a copy fails a job."""
        t0 = time.perf_counter()
        ok = [True] * len(self.jobs)

        def part(i: int, plan: Plan, only: list[int] | None) -> None:
            job = self.jobs[i]
            if not ok[i]:
                return
            try:
                ok[i] = all(run_checked(job, plan, only))
            except Exception:
                log.exception("kvtier: layer-wise load %d failed", job.job_id)
                ok[i] = False

        for job in self.jobs:
            timeline.event(
                "copy.start", job=job.job_id, req=job.req_id, kind=job.kind, tier=job.tier
            )
        for i, (tail, _) in enumerate(self.plans):
            part(i, tail, None)
        if fence is not None:
            fence()
        self._set(tail=True)
        for k, only in enumerate(self.layers):
            self._may_copy(k)
            for i, (_, rest) in enumerate(self.plans):
                part(i, rest, only)
            if fence is not None:
                fence()
            self._set(copied=k + 1)
        seconds = time.perf_counter() - t0
        out = []
        for job, good in zip(self.jobs, ok, strict=True):
            timeline.event("copy.end", job=job.job_id, req=job.req_id, kind=job.kind)
            nbytes = len(job.block_ids) * block_bytes if good else 0
            result = [good] * len(job.keys)
            out.append(JobResult.of(job, result, nbytes, seconds))
        return out

    def _may_copy(self, k: int) -> None:
        with self._cond:
            while self._allowed < k:
                self._cond.wait()

    def _set(self, *, tail: bool = False, copied: int = 0, over: bool = False) -> None:
        with self._cond:
            self._tail_done |= tail
            self._copied = max(self._copied, copied)
            self._over |= over
            self._cond.notify_all()
