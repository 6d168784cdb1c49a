"""Transfer jobs for tests: one line per job instead of nine keyword arguments."""

from __future__ import annotations

from typing import Any

from kvtier.jobs import JobKind, TransferJob


def make_job(
    kind: JobKind,
    tier: str,
    keys: list[bytes],
    slots: list[int],
    block_ids: list[int],
    *,
    job_id: int = 1,
    req_id: str = "r",
    sync: bool = False,
    **more: Any,
) -> TransferJob:
    """A :class:`~kvtier.jobs.TransferJob` of request ``req_id`` (default job 1 of "r",
    async); ``more``: its other fields (``skip``, ``dst_tier``, ``parents``, ``after``...)."""
    return TransferJob(
        job_id=job_id,
        req_id=req_id,
        kind=kind,
        tier=tier,
        sync=sync,
        keys=keys,
        slots=slots,
        block_ids=block_ids,
        **more,
    )
