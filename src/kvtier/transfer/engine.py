"""The worker-side transfer engine: copy lanes (:mod:`kvtier.transfer.lanes`) and the job
bookkeeping around them (:mod:`kvtier.transfer.completions`).

Sync loads run on a lane of their own, async loads never queue behind stores, and jobs
touching a slower or a network store never hold up host-memory copies (the lanes'
module docstring). Loads and stores never touch the same engine blocks or tier slots at
once (a loaded slot is pinned until its load is reported; a chunk is a hit only once its
store is reported), so the lanes need no ordering between them beyond a job's ``after``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from kvtier import timeline
from kvtier.contract import SlotStore
from kvtier.jobs import JobResult, TransferJob
from kvtier.transfer.completions import Completions
from kvtier.transfer.copy import copy_segments
from kvtier.transfer.groups import GroupedRegions
from kvtier.transfer.host_memory import alloc_host_buffer
from kvtier.transfer.lanes import Lane, Lanes, failed
from kvtier.transfer.layered import LayeredLoad
from kvtier.transfer.plans import make_plan, run_plan, split_by_layer
from kvtier.transfer.regions import KVRegions

AnyRegions = KVRegions | GroupedRegions
"""One block table (dense models) or one per KV-cache group."""

__all__ = ["JobResult", "TransferEngine"]

log = logging.getLogger(__name__)

SYNC_LOAD_ATTEMPTS = 3
"""Copies of a sync load before its failed chunks are reported (see ``_run_checked``)."""

_PLAN_ON_QUEUE = object()
"""Marks a job whose copy plan is built by its queue thread."""


def _run_layered(
    unit: LayeredLoad, ctx: Any, run_checked: Any, block_bytes: int
) -> list[JobResult]:
    """Run a layer-wise unit; on CUDA on the queue's stream (``ctx``), each part fenced by
    it: a part is done once the stream is, only then may its layer be read."""
    stream, ready = ctx
    if stream is None:
        return unit.run(run_checked, block_bytes)
    with torch.cuda.stream(stream):
        stream.wait_event(ready)
        return unit.run(run_checked, block_bytes, fence=stream.synchronize)


class TransferEngine:
    """Executes TransferJobs between engine KV regions and tier stores.

    Ownership: the engine KV tensors (inside ``regions``) and the stores are borrowed.
    Failure granularity: per chunk (``JobResult.ok``); an exception inside a job fails the
    whole job and is logged, never raised into the engine. Thread-safety: ``submit``,
    ``poll`` and ``wait`` are called from the engine's thread; results are produced on the
    lane threads (:class:`~kvtier.transfer.lanes.Lanes`).
    """

    def __init__(self, regions: AnyRegions, stores: Mapping[str, SlotStore], blocks_per_chunk: int):
        self.regions = regions
        self.stores = dict(stores)
        self.blocks_per_chunk = blocks_per_chunk
        self.completions = Completions()
        """The jobs in flight and the results not polled yet."""
        self.lanes = Lanes(
            self.stores, self._execute, self.completions.ended, self.completions.wait
        )
        self.load_bandwidth: float | None = None
        self.inline_stores = os.environ.get("KVTIER_INLINE_STORES", "1") != "0"
        """Stores into the first tier that are CPU-tier row copies from host-memory KV run
        on the submitting thread (the engine's, after its forward) when their lane is
        idle, instead of on the lane's thread. Such a copy of a step's new KV takes a small
        fraction of the forward that computed it (streaming row copies), while a copy
        thread waking up during the next forward takes a core from one of the engine's
        OpenMP threads, and the whole team waits for that thread at its next barrier
        (what that cost at 0% reuse: docs/benchmarks.md, "What the connector costs when
        nothing hits").
        ``KVTIER_INLINE_STORES=0`` queues them (for comparisons)."""

    # -- submission and completion ---------------------------------------------------------

    def submit(self, job: TransferJob) -> None:
        """Queue a job on its lane (see the module docstring).

        The copy plan (:mod:`kvtier.transfer.plans`) of sync loads and stores is built
        here, on the caller's thread, so the queue threads only run copies, which release
        the GIL; an async load is planned on its queue thread (a 4k-token load planned as
        segments, a view per block and layer, takes tens of milliseconds, which would
        otherwise delay the engine's step; the disk tier's address plan takes well under
        one).
        """
        prepared: Any = _PLAN_ON_QUEUE
        if job.sync or job.kind != "load":
            try:
                prepared = self.plan(job)
            except Exception:
                log.exception("kvtier: cannot plan transfer job %d", job.job_id)
                prepared = None
        self.completions.started((job.job_id,))
        timeline.event("copy.submit", job=job.job_id, req=job.req_id, kind=job.kind, sync=job.sync)
        queue = self.lanes.of(job)
        if self._runs_inline(job, prepared, queue):
            self._run_inline(job, prepared)
            return
        queue.submit(job, prepared)

    def _runs_inline(self, job: TransferJob, prepared: Any, queue: Lane) -> bool:
        """Whether a store runs on the caller's thread (see ``inline_stores``): a CPU-tier
        row copy from host-memory KV, waiting for no other job, with its lane idle (so it
        overtakes nothing queued there)."""
        return (
            self.inline_stores
            and job.kind == "store"
            and not job.after
            and isinstance(prepared, tuple)
            and prepared[0] == "rows"
            and queue is self.lanes.normal
            and queue.idle()
        )

    def _run_inline(self, job: TransferJob, prepared: Any) -> None:
        try:
            got = self._execute(job, prepared, (None, None))
            results = got if isinstance(got, list) else [got]
        except Exception:  # as on a queue: the job fails, the engine lives
            log.exception("kvtier: transfer job %d failed", job.job_id)
            results = [failed(job)]
        for r in results:
            self.completions.ended(r)

    def submit_layered(
        self, jobs: list[TransferJob], layers: list[list[int]]
    ) -> LayeredLoad | None:
        """Queue sync loads to be copied layer by layer (:class:`LayeredLoad`; ``layers``:
        each engine layer's region indices, in forward order), or None, queueing nothing,
        where they cannot be: several KV-cache groups, a job that waits for another
        (``after``), or a plan that cannot split by region (:func:`split_by_layer`). On
        CUDA a layer counts as copied (what :meth:`LayeredLoad.wait_layer` waits for) once
        the expedited stream finished its copies: its attention is queued after them."""
        if not jobs or not layers or self.regions.grouped:
            return None
        plans = []
        for job in jobs:
            try:
                prepared = self.plan(job)
            except Exception:
                return None  # submit() plans it again and logs why
            if not (job.sync and job.kind == "load") or job.after:
                return None  # (a unit waits for no other job: it starts at once)
            split = split_by_layer(
                prepared, self.stores[job.tier], self.regions.row_bytes, self.blocks_per_chunk
            )
            if split is None:
                return None
            plans.append(split)
        unit = LayeredLoad(jobs, plans, layers)
        self.completions.started(j.job_id for j in jobs)
        timeline.event("copy.submit_layered", jobs=[j.job_id for j in jobs], layers=len(layers))
        self.lanes.expedited.submit(jobs[0], unit)
        return unit

    def lane_of(self, job: TransferJob) -> str:
        """The name of the lane (queue thread) ``job`` runs on: "expedited" (sync loads),
        "load" / "normal" (the first tier's loads / stores), "io-load" / "io" (other
        tiers' and copies), "net-load" / "net" (jobs touching a network store)."""
        return self.lanes.of(job).name

    def poll(self) -> list[JobResult]:
        """Results finished since the last poll."""
        return self.completions.poll()

    def wait(self, job_ids: Iterable[int], timeout: float | None = None) -> bool:
        """Block until the given jobs finished (results stay available to ``poll``)."""
        return self.completions.wait(job_ids, timeout)

    def wait_any(self, job_ids: Iterable[int], timeout: float) -> bool:
        """:meth:`Completions.wait_any`."""
        return self.completions.wait_any(job_ids, timeout)

    def pending(self) -> set[int]:
        return self.completions.pending()

    def close(self) -> None:
        """Finish queued jobs, stop the threads."""
        self.lanes.close()
        for store in self.stores.values():
            store.close()

    # -- execution ---------------------------------------------------------------------------

    def plan(self, job: TransferJob) -> tuple[str, Any]:
        """How to copy a job (:func:`kvtier.transfer.plans.make_plan`)."""
        return make_plan(job, self.regions, self.stores, self.blocks_per_chunk)

    def _execute(self, job: TransferJob, prepared: Any, ctx: Any) -> JobResult | list[JobResult]:
        stream, ready = ctx
        if isinstance(prepared, LayeredLoad):
            return _run_layered(prepared, ctx, self._run_checked, self.regions.block_bytes)
        if prepared is _PLAN_ON_QUEUE:
            prepared = self.plan(job)
        if prepared is None:
            raise ValueError(f"job {job.job_id} has no valid copy plan")
        t0 = time.perf_counter()
        timeline.event("copy.start", job=job.job_id, req=job.req_id, kind=job.kind, tier=job.tier)
        nbytes = len(job.block_ids) * self.regions.block_bytes
        if job.kind == "copy":
            nbytes = len(job.keys) * self.stores[job.tier].slot_bytes
        if stream is not None:
            with torch.cuda.stream(stream):
                stream.wait_event(ready)
                ok = self._run_checked(job, prepared)
                stream.synchronize()
        else:
            ok = self._run_checked(job, prepared)
        timeline.event("copy.end", job=job.job_id, req=job.req_id, kind=job.kind)
        return JobResult.of(job, ok, nbytes, time.perf_counter() - t0)

    def _run_checked(
        self, job: TransferJob, prepared: tuple[str, Any], only: list[int] | None = None
    ) -> list[bool]:
        """Run the plan; a sync load that failed any chunk runs it again, whole, up to
        SYNC_LOAD_ATTEMPTS times in all.

        Why a sync load is copied again: vLLM (``kv_load_failure_policy = "recompute"``)
        leaves the blocks of a failed sync load in its prefix cache, counting on the
        request that loaded them to recompute them in place at its next step. A request
        that reaches those blocks before that (the owner preempted first, or another
        request sharing them while the owner's recompute spans several chunked steps)
        reads what the failed copy left. A transient copy error fixed within the step
        never opens that window; one that outlasts every attempt still does (closing it
        needs vLLM to un-cache those blocks, as it does under the "fail" policy).
        Re-copying every chunk is idempotent (same slots into the same blocks, nothing
        reads them before the forward). Async loads need no retry: vLLM caches their
        blocks only once the load is reported good.
        """
        if not (job.sync and job.kind == "load"):
            return self.run_plan(job, prepared)
        for attempt in range(1, SYNC_LOAD_ATTEMPTS + 1):
            last = attempt == SYNC_LOAD_ATTEMPTS
            try:
                ok = self.run_plan(job, prepared, only)
            except Exception as e:  # the queue's own handler would fail the whole job
                if last:
                    raise
                log.warning("kvtier: sync load %d failed (%s); copying it again", job.job_id, e)
                ok = [False] * len(job.keys)
            if all(ok) or last:
                break
            timeline.event("copy.retry", job=job.job_id, req=job.req_id, failed=ok.count(False))
        return ok

    def run_plan(
        self, job: TransferJob, prepared: tuple[str, Any], only: list[int] | None = None
    ) -> list[bool]:
        """Execute a plan from :meth:`plan` on the calling thread (the queues' data path);
        ``only``: these regions alone (see :func:`~kvtier.transfer.plans.run_plan`)."""
        return run_plan(job, prepared, self.regions, self.stores, only)

    # -- calibration -------------------------------------------------------------------------

    def calibrate(self, nbytes: int = 32 << 20, repeats: int = 3) -> float:
        """Measure load copy bandwidth (bytes/s) once, with the engine's own row sizes.

        Copies scratch buffers only (never live KV): ``nbytes`` split into runs of one
        chunk's per-region size, host to engine device, best of ``repeats``. Both load
        queues share the result; it feeds the ``auto`` sync budget.
        """
        run = max(1, self.blocks_per_chunk * max(self.regions.row_bytes))
        # At most 4,096 runs: an engine of tiny rows (tests) would otherwise spend seconds
        # building views; real engines' runs are tens of KiB (a few hundred runs).
        count = max(1, min(nbytes // run, 4096))
        device = self.regions.regions[0].device
        src = alloc_host_buffer(count * run)
        dst = torch.empty(count * run, dtype=torch.uint8, device=device)
        srcs = [src.narrow(0, i * run, run) for i in range(count)]
        dsts = [dst.narrow(0, i * run, run) for i in range(count)]
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            copy_segments(dsts, srcs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - t0)
        self.load_bandwidth = count * run / max(best, 1e-9)
        return self.load_bandwidth
