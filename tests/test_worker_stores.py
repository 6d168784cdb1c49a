"""When the worker side runs a step's stores: at the next step's start, not between the
forward and the step's output (a request's first token must not wait for the copy of its
own prompt's KV), with the blocks held until the copy is done.

Real TransferEngine, real CPU-tier slab, real KV tensors in vLLM's CPU layout.
"""

from __future__ import annotations

import torch

from kvtier.jobs import StepPlan, TransferJob
from kvtier.tiers.cpu import CpuSlab
from kvtier.transfer import KVRegions, TransferEngine
from kvtier.worker import WorkerSide
from tests.support.jobs import make_job
from tests.support.kv_tensors import block_bytes, cpu_layout


def side() -> tuple[list[torch.Tensor], WorkerSide]:
    kv = cpu_layout()
    regions = KVRegions.from_tensors(kv, num_blocks=20)
    eng = TransferEngine(regions, {"cpu": CpuSlab(8, regions.row_bytes, 1)}, 1)
    return kv, WorkerSide(eng, calibrate=False)


def store(job_id: int, block: int, slot: int) -> TransferJob:
    return make_job("store", "cpu", [b"k%d" % job_id], [slot], [block], job_id=job_id)


def load(job_id: int, block: int, slot: int) -> TransferJob:
    return make_job(
        "load", "cpu", [b"k%d" % slot], [slot], [block], job_id=job_id, req_id="q", sync=True
    )


def test_stores_run_at_the_next_step_start_and_hold_their_blocks_until_then():
    kv, w = side()
    try:
        w.begin_step(StepPlan(stores=[store(1, 3, 0)]))
        w.start_loads()
        w.end_forward()
        # The step's output goes out now: the store has not run, nor is it reported, and
        # the request's blocks are not released even though its release is known.
        assert w.transfer_results() == (set(), set())
        assert w.report().results == []
        expected = block_bytes(kv, 3).clone()
        w.begin_step(StepPlan(release={"r": [1]}))  # the next step: the store runs first
        sending, _ = w.transfer_results()
        assert sending == {"r"}
        assert [r.job_id for r in w.report().results] == [1]
        # What was stored is block 3 as the forward left it: load it elsewhere and compare.
        w.begin_step(StepPlan(loads=[load(2, 9, 0)]))
        w.start_loads()
        w.end_forward()
        assert torch.equal(block_bytes(kv, 9), expected)
    finally:
        w.close()


def test_a_flush_or_drain_runs_the_stores_kept_for_the_next_step():
    kv, w = side()
    try:
        w.begin_step(StepPlan(stores=[store(1, 3, 0), store(2, 4, 1)]))
        w.start_loads()
        w.end_forward()
        want3, want4 = block_bytes(kv, 3).clone(), block_bytes(kv, 4).clone()
        w.flush([1])  # a preempted request's blocks are about to be reused
        assert {r.job_id for r in w.report().results} >= {1}
        assert w.drain(timeout=10)
        for b in (3, 4):
            kv_b = [t[b] for t in kv]
            for t in kv_b:
                t.zero_()  # reused by another request from here on
        w.begin_step(StepPlan(loads=[load(3, 9, 0), load(4, 10, 1)]))
        w.start_loads()
        w.end_forward()
        assert torch.equal(block_bytes(kv, 9), want3)
        assert torch.equal(block_bytes(kv, 10), want4)
    finally:
        w.close()
