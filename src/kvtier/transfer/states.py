"""Worker side of recurrent states (hybrid models): copies between the engine's state
pages and the state tiers' slots.

A state is one block of each recurrent KV-cache group; its payload is, group after group
and layer after layer within a group, the unpadded part of that layer's page (the engine
pads pages to the attention page size; the padding is never copied). ``pages[g][l]`` is
layer ``l`` of group ``g`` as a ``[num_blocks, content bytes]`` uint8 view of the engine's
memory (borrowed: the engine owns it).

Timing (see :mod:`kvtier.stack.states` for why):

- stores run in ``end_forward`` (vLLM's ``wait_for_save``), on the engine's thread, to
  completion: the engine offers a state block only until the end of the step, after which
  the block may be freed and rewritten; copies between tiers planned with them run first,
  in plan order (a store into a slot being demoted waits for that demotion);
- loads run in ``start_loads``: they are async for the engine (the request waits for
  ``transfer_results`` to name it), into blocks nothing else touches meanwhile.

Failure granularity: per state (per job). A failed load names its request in
``transfer_results``' failed set; the engine then recomputes the whole request.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from kvtier.contract import SlotStore
from kvtier.jobs import MISSING, JobResult, StepPlan, TransferJob, WorkerReport


class StateMover:
    """Executes state jobs (see the module docstring); single-threaded (the engine's)."""

    def __init__(
        self, pages: Sequence[Sequence[torch.Tensor]], stores: Mapping[str, SlotStore]
    ) -> None:
        self.pages = [list(g) for g in pages]
        self.stores = dict(stores)
        self.state_bytes = sum(p.shape[1] for g in self.pages for p in g)
        self._plan = StepPlan()
        self._results: list[JobResult] = []
        self._recving: set[str] = set()
        self._failed: set[str] = set()
        self._staging: torch.Tensor | None = None

    def _segments(self, blocks: Sequence[int]) -> list[tuple[int, torch.Tensor]]:
        out: list[tuple[int, torch.Tensor]] = []
        off = 0
        for group, block in zip(self.pages, blocks, strict=True):
            for page in group:
                out.append((off, page[block]))
                off += page.shape[1]
        return out

    def begin_step(self, plan: StepPlan) -> None:
        self._plan = plan

    def start_loads(self) -> None:
        for job in self._plan.loads:
            t0 = time.perf_counter()
            try:
                if job.slots == [MISSING]:
                    ok = [False]  # gone from its tier since the lookup
                else:
                    dst = [self._segments(job.block_ids)]
                    ok = self.stores[job.tier].read(job.slots, job.keys, dst)
            except Exception:  # a tier error is a miss: the request recomputes
                ok = [False]
            self._finish(job, ok, t0)
            self._recving.add(job.req_id)
            if not all(ok):
                self._failed.add(job.req_id)

    def end_forward(self) -> None:
        for job in self._plan.stores:
            t0 = time.perf_counter()
            try:
                ok = self._run_store(job)
            except Exception:  # a failed store is a future miss
                ok = [False] * len(job.keys)
            self._finish(job, ok, t0)
        self._plan = StepPlan()

    def _run_store(self, job: TransferJob) -> list[bool]:
        if job.kind == "store":
            src = [self._segments(job.block_ids)]
            return self.stores[job.tier].write(job.slots, job.keys, src, job.parents or None)
        # a copy between tiers, one state at a time through a staging buffer
        if self._staging is None:
            self._staging = torch.empty(self.state_bytes, dtype=torch.uint8)
        seg = [[(0, self._staging)]]
        ok: list[bool] = []
        for i, key in enumerate(job.keys):
            good = self.stores[job.tier].read([job.slots[i]], [key], seg)[0]
            if good:
                parents = [job.parents[i]] if job.parents else None
                good = self.stores[job.dst_tier].write([job.dst_slots[i]], [key], seg, parents)[0]
            ok.append(good)
        return ok

    def _finish(self, job: TransferJob, ok: list[bool], t0: float) -> None:
        nbytes = self.state_bytes * sum(ok)
        self._results.append(JobResult.of(job, ok, nbytes, time.perf_counter() - t0))

    def transfer_results(self) -> tuple[set[str], set[str]]:
        """``(finished receiving, failed receiving)`` request ids since the last call."""
        out = (self._recving, self._failed)
        self._recving, self._failed = set(), set()
        return out

    def report(self) -> WorkerReport:
        counters = {}
        for tier, store in self.stores.items():
            counts = store.take_counters()
            if counts:
                counters[tier] = counts
        rep = WorkerReport(self._results, counters=counters)
        self._results = []
        return rep

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
