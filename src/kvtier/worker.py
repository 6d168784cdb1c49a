"""Worker side of one engine step: issue the plan's jobs at the right moments, report back.

Per step, in the engine's order:

1. ``begin_step(plan)`` when the step's plan arrives (before the forward pass);
2. ``start_loads()``: flush jobs whose blocks are about to be reused, run sync loads to
   completion on the expedited queue (or, loading layer by layer, only each job's last
   block), queue async loads on the normal queue;
3. the engine's forward pass; loading layer by layer, ``wait_layer(name)`` before each
   layer's attention;
4. ``end_forward()``: finish the layer-wise loads, and keep the plan's stores (they read
   KV this forward wrote) for the start of the next step (``begin_step``), or an earlier
   ``flush`` or ``drain``. Submitted here, a CPU-tier row copy from host KV ran on the
   engine's thread right away (see ``TransferEngine.inline_stores``), between the forward
   and the step's output: every request whose prefill ended in the step, cold ones
   included, got its first token after the copy of its own prompt's KV. At the next
   step's start the copy still runs between forwards, and the tokens are out. The store's
   blocks stay allocated meanwhile: the store is in flight from here on (a finished
   request's blocks are released only once its stores are done), and the next step writes
   KV only after ``begin_step``;
5. ``transfer_results()``, ``load_errors()``, ``report()``. In a step where the
   engine computes nothing (``plan.idle``: the only work is waiting for async loads), this
   first waits until one of the async loads in flight finishes, up to
   ``IDLE_WAIT_SECONDS``: an idle engine would otherwise spin through empty steps (about
   a millisecond each, holding the interpreter and a core the copy threads need: a 4k-token
   remote load took 2.4 s behind 1,280 empty steps, 0.58 s without them) and learn of the
   load one step late.

Loading layer by layer (``layers`` given; CPU-tier loads of one KV-cache group only, see
:meth:`kvtier.transfer.engine.TransferEngine.submit_layered`; on device KV each layer is
reported whole once the copy stream finished it): the engine writes this
step's new KV into the cache before the attention of the same layer runs, and that
attention is where the engine waits for the layer (vLLM's CPU backend updates the cache
in an op of its own, ahead of the attention op the connector's wait wraps). The only
loaded block that can receive this step's KV is a job's last one (a hit leaves at least
its last token to compute; blocks wholly covered by the hit are written by nobody this
step), so that block is loaded, in every layer, before the forward starts; the others
follow one layer at a time, at most one layer ahead of the attention waiting for them.
Other requests of the batch that read those blocks through the engine's prefix cache read
them in the same attention op, after the same wait. Every layer-wise copy has finished
before ``end_forward`` queues stores and before load errors or results are reported.

Engine-agnostic: the vLLM connector calls these from its worker-role hooks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from kvtier import timeline
from kvtier.jobs import JobResult, StepPlan, TransferJob, WorkerReport
from kvtier.transfer.engine import TransferEngine
from kvtier.transfer.layered import LayeredLoad

log = logging.getLogger("kvtier")

IDLE_WAIT_SECONDS = 0.25
"""The longest an idle step waits for an async load to finish. Bounds how late a request
that arrives meanwhile is scheduled; a load still running then is waited for by the next
idle step."""


class WorkerSide:
    """Drives a TransferEngine from StepPlans; single-threaded (the engine's thread)."""

    def __init__(
        self,
        engine: TransferEngine,
        *,
        calibrate: bool = True,
        layers: Sequence[tuple[Sequence[str], Sequence[int]]] = (),
    ) -> None:
        """``layers``: to load sync loads layer by layer, the engine's KV tensors in
        forward order, each as (the names of the layers using it, its region indices);
        empty (default): sync loads finish before the forward."""
        self.engine = engine
        self._layers = [list(regions) for _, regions in layers]
        self._layer_of = {n: k for k, (names, _) in enumerate(layers) for n in names}
        self._layered: LayeredLoad | None = None
        self.layered_steps = 0
        """Steps whose sync loads went layer by layer (inspection and tests)."""
        self._plan = StepPlan()
        self._deferred: list[TransferJob] = []
        """Stores of the last forward, submitted at the next step's start (step 4)."""
        self._inflight: dict[int, TransferJob] = {}
        self._async_loads: dict[str, set[int]] = {}
        self._release: dict[str, set[int]] = {}
        self._results: list[JobResult] = []
        self._idle = False
        self._load_errors: set[int] = set()
        self._failed_reqs: set[str] = set()
        self._t_begin = 0.0
        self._load_seconds = 0.0
        self._forward_seconds = 0.0
        self._bandwidth = engine.calibrate() if calibrate else 0.0

    # -- step hooks ------------------------------------------------------------------------

    def begin_step(self, plan: StepPlan) -> None:
        self._finish_layered()  # a step whose forward never ran (never in vLLM's order)
        self._submit_deferred()
        self._plan = plan
        self._idle = plan.idle
        self._t_begin = time.perf_counter()
        self._load_seconds = 0.0
        this_step = {j.job_id for j in plan.loads} | {j.job_id for j in plan.stores}
        for req_id, ids in plan.release.items():
            self._release[req_id] = set(ids) & (self._inflight.keys() | this_step)

    def flush(self, job_ids: Iterable[int]) -> None:
        """Wait for jobs whose engine blocks are about to be reused (preempted requests)."""
        ids = list(job_ids)
        if ids:
            self._finish_layered()
            self._submit_deferred()
            self.engine.wait(ids)

    def flush_stores(self) -> None:
        """Wait for every store in flight: the engine is about to free or reuse blocks a
        running request still holds (sliding-window groups drop blocks that left the
        window at the next step's allocation, without telling the connector)."""
        self.flush([i for i, j in self._inflight.items() if j.kind == "store"])

    def start_loads(self) -> None:
        """Flush, then sync loads (waited for), then async loads (queued)."""
        t0 = time.perf_counter()
        plan = self._plan
        self.flush(plan.flush)
        sync = [j for j in plan.loads if j.sync]
        unit = self.engine.submit_layered(sync, self._layers) if self._layers and sync else None
        if unit is not None:
            self._layered = unit
            self.layered_steps += 1
            self._inflight.update((j.job_id, j) for j in sync)
            unit.wait_tail()
        else:
            for job in sync:
                self._submit(job)
            if sync:
                self.engine.wait([j.job_id for j in sync])
        for job in plan.loads:
            if not job.sync:
                self._async_loads.setdefault(job.req_id, set()).add(job.job_id)
                self._submit(job)
        self._collect()
        self._load_seconds += time.perf_counter() - t0
        timeline.event("worker.loads_done", sync=len(sync), seconds=time.perf_counter() - t0)

    def wait_layer(self, name: str) -> None:
        """Before the attention of layer ``name``: wait until its KV is whole (layer-wise
        loads; returns at once without them). A layer not known waits for every layer."""
        unit = self._layered
        if unit is None:
            return
        t0 = time.perf_counter()
        k = self._layer_of.get(name)
        if k is None:
            self._finish_layered()
        else:
            unit.wait_layer(k)
        self._load_seconds += time.perf_counter() - t0

    def _finish_layered(self) -> None:
        """Let the layer-wise loads run to their end and wait for them; record failures."""
        unit, self._layered = self._layered, None
        if unit is None:
            return
        unit.release()
        self.engine.wait([j.job_id for j in unit.jobs])
        self._collect()

    def end_forward(self) -> None:
        """The forward pass is done: finish layer-wise loads, time it and queue this
        step's stores."""
        t0 = time.perf_counter()
        self._finish_layered()
        self._load_seconds += time.perf_counter() - t0
        self._forward_seconds = max(0.0, time.perf_counter() - self._t_begin - self._load_seconds)
        for job in self._plan.stores:  # in flight from here: their blocks stay allocated
            self._inflight[job.job_id] = job
        self._deferred += self._plan.stores
        self._plan = StepPlan()

    def _submit(self, job: TransferJob) -> None:
        self._inflight[job.job_id] = job
        self.engine.submit(job)

    def _submit_deferred(self) -> None:
        jobs, self._deferred = self._deferred, []
        if not jobs:
            return
        t0 = time.perf_counter()
        for job in jobs:
            self.engine.submit(job)
        timeline.event("worker.stores", jobs=len(jobs), seconds=time.perf_counter() - t0)

    def _collect(self) -> None:
        """Take finished results; record the engine blocks of failed load chunks."""
        bpc = self.engine.blocks_per_chunk
        for r in self.engine.poll():
            job = self._inflight.pop(r.job_id, None)
            self._results.append(r)
            if job is None or r.kind != "load" or r.all_ok:
                continue
            failed: list[int] = []
            for ok, (_, blocks) in zip(r.ok, job.chunk_blocks(bpc), strict=True):
                if not ok:
                    failed += blocks
            self._load_errors.update(failed)
            self._failed_reqs.add(job.req_id)
            timeline.event("worker.load_failed", job=r.job_id, req=job.req_id, blocks=failed)

    # -- results ---------------------------------------------------------------------------

    def transfer_results(self) -> tuple[set[str], set[str]]:
        """``(finished sending, finished receiving)`` request ids, vLLM's get_finished.
        A request whose async load failed is among those receiving, once all its loads
        ended; :meth:`failed_requests` then names it."""
        self._finish_layered()  # vLLM may defer end_forward (a draft model's forward)
        if self._idle:
            self._idle = False
            loading = [i for ids in self._async_loads.values() for i in ids]
            if loading:
                self.engine.wait_any(loading, timeout=IDLE_WAIT_SECONDS)
        self._collect()
        recving: set[str] = set()
        for req_id, ids in list(self._async_loads.items()):
            ids &= self._inflight.keys()
            if not ids:
                recving.add(req_id)
                del self._async_loads[req_id]
        sending: set[str] = set()
        for req_id, ids in list(self._release.items()):
            ids &= self._inflight.keys()
            if not ids:
                sending.add(req_id)
                del self._release[req_id]
        return sending, recving

    def load_errors(self) -> set[int]:
        """Engine block ids whose load failed since the last call (block-level failure
        reporting, for engines with one KV-cache group)."""
        self._finish_layered()
        out, self._load_errors = self._load_errors, set()
        self._failed_reqs.clear()
        return out

    def failed_requests(self, finished: set[str]) -> set[str]:
        """Of ``finished`` (request ids :meth:`transfer_results` just reported as done
        receiving), those with a failed load chunk: vLLM recomputes them from scratch
        (request-level failure reporting, for engines with several KV-cache groups, where
        block ids do not name a request). Each failure is reported once. Failures of
        requests not in ``finished`` are kept until they are; block-level errors of the
        same chunks are dropped (:meth:`load_errors` is not asked in that mode)."""
        self._finish_layered()
        out = self._failed_reqs & finished
        self._failed_reqs -= out
        self._load_errors.clear()
        if out:
            log.warning("kvtier: loads failed for %d request(s); they recompute", len(out))
        return out

    def report(self) -> WorkerReport:
        """Results and measurements since the last report."""
        self._collect()
        counters = {}
        for tier, store in self.engine.stores.items():
            counts = store.take_counters()
            if counts:
                counters[tier] = counts
        rep = WorkerReport(self._results, self._forward_seconds, self._bandwidth, counters)
        self._results = []
        self._forward_seconds = 0.0
        self._bandwidth = 0.0
        return rep

    def drain(self, timeout: float | None = None) -> bool:
        """Wait for every job in flight (shutdown, reset)."""
        if self._layered is not None:
            self._layered.release()
        self._submit_deferred()
        return self.engine.wait(self.engine.pending(), timeout=timeout)

    def close(self) -> None:
        self.drain(timeout=60)
        self.engine.close()
