"""The scheduler's job table: job ids, what each job holds, answers from every worker."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from kvtier.contract import TierIndex
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import Key


@dataclass
class JobEntry:
    job: TransferJob
    answers: int = 0
    result: JobResult | None = None
    holds: list[tuple[TierIndex, Key]] = field(default_factory=list)
    """Keys this job keeps from eviction until it ends (one per tier it reads)."""


class JobTable:
    """Jobs in flight. A job ends when all ``num_workers`` answered; its chunk results are
    the AND of theirs (a chunk is good only if every rank moved its shard)."""

    def __init__(self, num_workers: int = 1) -> None:
        self.num_workers = num_workers
        self._jobs: dict[int, JobEntry] = {}
        self._next = 1

    def add(self, job: TransferJob, holds: list[tuple[TierIndex, Key]] | None = None) -> int:
        """Give ``job`` an id and track it; ``holds`` are released when it ends."""
        job.job_id = self._next
        self._next += 1
        self._jobs[job.job_id] = JobEntry(job, holds=holds or [])
        return job.job_id

    def hold(self, index: TierIndex, key: Key) -> list[tuple[TierIndex, Key]]:
        """Hold ``key`` in ``index`` if it can be held: the ``holds`` argument of add."""
        return [(index, key)] if index.hold(key) else []

    def answer(self, result: JobResult) -> JobEntry | None:
        """Record one worker's result; the entry (removed, holds released) once it ends."""
        entry = self._jobs.get(result.job_id)
        if entry is None:
            return None
        entry.result = result if entry.result is None else entry.result.merge(result)
        entry.answers += 1
        if entry.answers < self.num_workers:
            return None
        del self._jobs[result.job_id]
        for index, key in entry.holds:
            index.release(key)
        return entry

    def kind_of(self, job_id: int) -> str:
        return self._jobs[job_id].job.kind

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[JobEntry]:
        return iter(self._jobs.values())
