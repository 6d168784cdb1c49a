"""The transfer engine's copy lanes: one thread each, and which lane a job runs on.

- The *expedited* lane runs sync loads (hits loaded within the step). It has its own
  thread (and CUDA stream), so a sync load never waits behind queued async work.
- The *load* lane runs async loads from the first store (host memory), the *io-load*
  lane async loads from any other local store (disk, in-process shared): a request waiting
  for its KV never queues behind stores, a write-through or a slow read (a busy engine
  queues stores every step, and a waiting request costs TTFT, a late store only a later hit).
- The *normal* lane runs stores into the first store, the *io* lane stores and copies
  touching any other local store, each in submission order.
- The *net-load* and *net* lanes (only when a store says ``network = True``: remote tiers)
  run the loads, and the stores and copies, touching a network store, so a slow or dead
  server never holds up disk I/O, nor disk I/O the network.

On CUDA each lane issues its copies on its own stream after waiting for the work the
engine had queued on the compute stream when the job was submitted (zeroed blocks, this
step's KV writes), then waits for its own event, off the engine's thread.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import torch

from kvtier.contract import SlotStore
from kvtier.jobs import JobResult, TransferJob
from kvtier.transfer.host_memory import cuda_available
from kvtier.transfer.layered import LayeredLoad

log = logging.getLogger(__name__)

Run = Callable[[TransferJob, Any, Any], JobResult | list[JobResult]]
"""How a lane runs a job: ``(job, prepared, (stream, ready event))`` -> its result(s)."""


class Lane:
    """One worker thread executing jobs in submission order; a job with ``after`` first
    waits for those jobs (which run on other lanes) to finish. A job that raises fails
    whole (logged), never the thread; each result goes to ``done`` once its job ended."""

    def __init__(
        self,
        name: str,
        run: Run,
        done: Callable[[JobResult], None],
        wait: Callable[[list[int]], object],
    ) -> None:
        self._run = run
        self.name = name
        self._done = done
        self._wait = wait
        self._jobs: deque[tuple[TransferJob, Any, Any]] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self.stream: Any = torch.cuda.Stream() if cuda_available() else None  # type: ignore[no-untyped-call]
        self._thread = threading.Thread(target=self._loop, name=f"kvtier-{name}", daemon=True)
        self._thread.start()

    def submit(self, job: TransferJob, prepared: Any) -> None:
        ready = None
        if self.stream is not None:
            # Order after everything the engine queued so far on its current stream.
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ready.record()
        with self._cond:
            self._jobs.append((job, prepared, ready))
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stop:
                    self._cond.wait()
                if not self._jobs:
                    return
                job, prepared, ready = self._jobs[0]
            if job.after:
                self._wait(job.after)  # jobs on other lanes; never the other way round
            jobs = prepared.jobs if isinstance(prepared, LayeredLoad) else [job]
            try:
                result = self._run(job, prepared, (self.stream, ready))
                results = result if isinstance(result, list) else [result]
            except Exception:  # a bug or device fault: the job fails, the engine lives
                log.exception("kvtier: transfer job %d failed", job.job_id)
                results = [failed(j) for j in jobs]
            finally:
                if isinstance(prepared, LayeredLoad):
                    prepared.finished()  # never leave the forward waiting
            with self._cond:
                self._jobs.popleft()
            for r in results:
                self._done(r)

    def idle(self) -> bool:
        """Whether no job is queued or running here (a running job stays queued until it
        is done)."""
        with self._cond:
            return not self._jobs

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=60)


def failed(job: TransferJob) -> JobResult:
    """``job``'s result when it failed whole."""
    return JobResult.of(job, [False] * len(job.keys), 0, 0.0)


class Lanes:
    """The engine's lanes (see the module docstring) over its ``stores``, the first of
    which is the primary (host memory) one. Owns the lane threads until :meth:`close`;
    every lane runs jobs with ``run`` and reports to ``done``, and waits for a job's
    ``after`` with ``wait``."""

    def __init__(
        self,
        stores: Mapping[str, SlotStore],
        run: Run,
        done: Callable[[JobResult], None],
        wait: Callable[[list[int]], object],
    ) -> None:
        self._stores = stores
        self.primary = next(iter(stores), "")
        self.normal = Lane("normal", run, done, wait)
        self.expedited = Lane("expedited", run, done, wait)
        self.loads = Lane("load", run, done, wait)
        # Jobs touching a slower store (disk, shared) get their own lanes, so slow I/O
        # never holds up memory copies queued behind it.
        self.io = Lane("io", run, done, wait)
        self.io_loads = Lane("io-load", run, done, wait)
        self.net: Lane | None = None
        self.net_loads: Lane | None = None
        if any(s.network for s in stores.values()):
            self.net = Lane("net", run, done, wait)
            self.net_loads = Lane("net-load", run, done, wait)

    def of(self, job: TransferJob) -> Lane:
        """The lane ``job`` runs on."""
        if job.sync:
            return self.expedited
        load = job.kind == "load"
        stores = self._stores
        if self.net is not None and any(
            t in stores and stores[t].network for t in (job.tier, job.dst_tier)
        ):
            return self.net_loads if load and self.net_loads is not None else self.net
        slow = job.kind == "copy" or job.tier != self.primary
        if load:
            return self.io_loads if slow else self.loads
        return self.io if slow else self.normal

    def close(self) -> None:
        """Finish the queued jobs, stop the threads (sync loads' lane first)."""
        lanes = [self.expedited, self.loads, self.normal, self.io_loads, self.io]
        for lane in (*lanes, self.net_loads, self.net):
            if lane is not None:
                lane.close()
