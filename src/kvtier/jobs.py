"""Transfer jobs: what the scheduler side asks the worker side to copy, and the answers.

Plain data (ints, strings, bytes, lists) so it crosses process boundaries with any
serializer and carries no live objects. Jobs are columnar: one flat list of engine blocks
rather than a list per chunk, so a 128k-token hit costs a few list slices to describe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

JobKind = Literal["load", "store", "copy"]

MISSING = -2
"""The slot of a load whose chunk left its tier between the lookup and the job (a
recurrent state evicted by a store of the same step): the worker fails it, and the
request recomputes."""


@dataclass(slots=True, kw_only=True)
class TransferJob:
    """Copy chunks between a tier's slots and engine blocks, or between two tiers.

    Chunk i lives under key ``keys[i]``, in tier slot ``slots[i]`` (-1 for a tier addressed
    by key). For loads and stores,
    ``block_ids`` lists the engine blocks moved, chunk after chunk: every chunk covers
    ``blocks_per_chunk`` blocks except the first, whose leading ``skip`` blocks are not
    moved (the engine already holds them); stores always have ``skip == 0``. A ``copy``
    job moves whole chunks from ``tier`` slots to ``dst_tier`` slots ``dst_slots`` (no
    engine blocks). ``parents`` (the chain key before each key) goes along to tiers that
    record it for restarts. ``after``: ids of jobs (of the same plan or earlier) that must
    finish on this worker before this one starts; a store or copy into slots whose previous
    chunks are still being demoted to the tier below waits for those copies.
    """

    job_id: int
    req_id: str
    kind: JobKind
    tier: str
    sync: bool
    keys: list[bytes]
    slots: list[int]
    block_ids: list[int]
    skip: int = 0
    dst_tier: str = ""
    dst_slots: list[int] = field(default_factory=list)
    parents: list[bytes | None] = field(default_factory=list)
    after: list[int] = field(default_factory=list)

    def chunk_blocks(self, blocks_per_chunk: int) -> list[tuple[int, list[int]]]:
        """Per chunk: (first chunk-relative block moved, engine block ids)."""
        out = []
        pos = 0
        for i in range(len(self.keys)):
            first = self.skip if i == 0 else 0
            n = blocks_per_chunk - first
            out.append((first, self.block_ids[pos : pos + n]))
            pos += n
        if pos != len(self.block_ids):
            raise ValueError(
                f"job {self.job_id}: {len(self.block_ids)} block ids for {len(self.keys)} "
                f"chunks of {blocks_per_chunk} blocks (skip {self.skip})"
            )
        return out


@dataclass(slots=True)
class JobResult:
    """Outcome of one job: per-chunk success, bytes moved, seconds spent."""

    job_id: int
    req_id: str
    kind: JobKind
    tier: str
    sync: bool
    ok: list[bool]
    nbytes: int
    seconds: float

    @classmethod
    def of(cls, job: TransferJob, ok: list[bool], nbytes: int, seconds: float) -> JobResult:
        """The result of ``job``: its identity, per-chunk ``ok``, bytes and seconds."""
        return cls(job.job_id, job.req_id, job.kind, job.tier, job.sync, ok, nbytes, seconds)

    @property
    def all_ok(self) -> bool:
        return all(self.ok)

    def merge(self, other: JobResult) -> JobResult:
        """Combine the same job's results from two workers: a chunk is good only if good on
        both; bytes add; time is the slower worker's."""
        ok = [a and b for a, b in zip(self.ok, other.ok, strict=True)]
        return JobResult(
            self.job_id,
            self.req_id,
            self.kind,
            self.tier,
            self.sync,
            ok,
            self.nbytes + other.nbytes,
            max(self.seconds, other.seconds),
        )


@dataclass(slots=True)
class StepPlan:
    """Everything the workers do for one engine step."""

    loads: list[TransferJob] = field(default_factory=list)
    """Loads to issue this step: sync ones finish before the forward pass."""
    stores: list[TransferJob] = field(default_factory=list)
    """Stores of KV computed by this step's forward; issued after it."""
    flush: list[int] = field(default_factory=list)
    """Jobs that must finish before the forward pass (their blocks are about to be reused)."""
    release: dict[str, list[int]] = field(default_factory=dict)
    """Finished requests whose blocks stay alive until these jobs are done."""
    idle: bool = False
    """The engine computes nothing this step (only async loads are waited for): the
    workers may block for this step's async loads, so they are reported in this step
    rather than after another round trip (see ``WorkerSide.transfer_results``)."""
    states: StepPlan | None = None
    """Hybrid models: the recurrent states' jobs of the step (their own job ids and
    slots, :mod:`kvtier.stack.states`)."""

    def is_empty(self) -> bool:
        return not (self.loads or self.stores or self.flush or self.release or self.states)


@dataclass(slots=True)
class WorkerReport:
    """What workers tell the scheduler side after a step."""

    results: list[JobResult] = field(default_factory=list)
    forward_seconds: float = 0.0
    """Forward-pass time of the step, sync copies excluded (0 if no forward ran)."""
    load_bandwidth: float = 0.0
    """Calibrated load bandwidth in bytes/s (reported once, 0 otherwise)."""
    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    """Stores' own counts since the last report: ``{tier: {metric name: amount}}``
    (metrics labelled by tier alone, e.g. ``remote_auth_failures``)."""
    states: WorkerReport | None = None
    """Hybrid models: the recurrent states' job results."""

    def merge(self, other: WorkerReport) -> WorkerReport:
        """Reports of several workers for one step (the scheduler counts per-job answers;
        counters add)."""
        counters = {t: dict(c) for t, c in self.counters.items()}
        for tier, counts in other.counters.items():
            mine = counters.setdefault(tier, {})
            for name, v in counts.items():
                mine[name] = mine.get(name, 0.0) + v
        return WorkerReport(
            self.results + other.results,
            max(self.forward_seconds, other.forward_seconds),
            min(x for x in (self.load_bandwidth, other.load_bandwidth) if x > 0)
            if (self.load_bandwidth > 0 or other.load_bandwidth > 0)
            else 0.0,
            counters,
            self.states.merge(other.states)
            if self.states is not None and other.states is not None
            else self.states or other.states,
        )
