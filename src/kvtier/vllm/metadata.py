"""What crosses vLLM's scheduler/worker boundary: kvtier's own plain-data objects."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from kvtier.jobs import StepPlan, WorkerReport


@dataclass
class KVTierMetadata(KVConnectorMetadata):
    """Scheduler -> workers, once per step."""

    plan: StepPlan = field(default_factory=StepPlan)
    states: StepPlan | None = None
    """The recurrent states' jobs (hybrid models; see :mod:`kvtier.stack.states`)."""


@dataclass
class KVTierWorkerMetadata(KVConnectorWorkerMetadata):
    """Workers -> scheduler, once per step (aggregated across workers)."""

    report: WorkerReport = field(default_factory=WorkerReport)
    states: WorkerReport | None = None
    """The recurrent states' job results (hybrid models)."""

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, KVTierWorkerMetadata)
        states = self.states
        if states is not None and other.states is not None:
            states = states.merge(other.states)
        return KVTierWorkerMetadata(self.report.merge(other.report), states or other.states)
