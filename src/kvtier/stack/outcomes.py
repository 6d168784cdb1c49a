"""What an answered job changes on the scheduler side (the scheduler's thread)."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.metrics import Metrics
from kvtier.stack.job_table import JobEntry
from kvtier.stack.loads import LoadPlanner
from kvtier.stack.movement import Movement
from kvtier.stack.requests import RequestState
from kvtier.stack.stack import TierStack


@dataclass(frozen=True)
class JobOutcomes:
    """Applies a job's result, once the workers answered it (:meth:`JobTable.answer`).

    - a load: to the load planner (a failed chunk leaves its tier, its request claims no
      more hits);
    - a store: its good chunks become hits in its tier (a failed one frees its slot), and
      the edge below continues them (``on_store: through``);
    - a copy between tiers: committed in the destination tier by the movement;

    and counts bytes, seconds, stored chunks and failures per tier. The request's own job
    set is the caller's (it ends the request's state)."""

    stack: TierStack
    loads: LoadPlanner
    movement: Movement
    metrics: Metrics

    def apply(self, entry: JobEntry, req: RequestState | None) -> None:
        """Apply ``entry``'s result; ``req``: the job's request, if it still has state."""
        job, result = entry.job, entry.result
        assert result is not None
        failed = result.ok.count(False)
        if job.kind == "load":
            self.loads.finished(job, result, req)
        else:
            dst = job.dst_tier if job.kind == "copy" else job.tier
            if job.kind == "copy":
                self.movement.copied(job, result.ok)
            else:
                t = self.stack.position[dst]
                self.stack[t].index.commit(job.keys, result.ok)
                self.movement.through(t, job.keys, job.slots, job.parents, result.ok, job.req_id)
            self.metrics.inc("store_bytes", result.nbytes, dst)
            self.metrics.inc("store_seconds", result.seconds, dst)
            self.metrics.inc("stored_chunks", len(job.keys) - failed, dst)
        if failed:
            kind = "load" if job.kind == "load" else "store"
            tier = job.dst_tier if job.kind == "copy" else job.tier
            self.metrics.inc("failures", failed, tier, kind)
