"""Layer-wise sync loads (:mod:`kvtier.transfer.layered`) on host-memory KV, no engine:
the last block before the forward, one layer of lookahead, retries and failures, and the
cases that fall back to loading whole before the forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvtier.jobs import StepPlan
from kvtier.tiers.cpu import CpuSlab
from kvtier.tiers.faulty import FaultPlan, FaultyStore
from kvtier.transfer import KVRegions, TransferEngine
from kvtier.transfer.layered import LayeredLoad
from kvtier.transfer.plans import run_plan, split_last_block, split_segments
from kvtier.worker import WorkerSide
from tests.support.jobs import make_job

BLOCKS, BPC, LAYERS = 32, 2, 4
SRC = [1, 2, 3, 4, 5, 6]  # three chunks
DST = [20, 21, 22, 23, 24, 25]


def split_kv(layers: int = LAYERS) -> dict[str, torch.Tensor]:
    """Per layer a [2, blocks, block_size, heads * head_dim] tensor: K and V regions."""
    return {f"model.layers.{i}.attn": torch.randn(2, BLOCKS, 4, 8) for i in range(layers)}


def layer_of(regions: KVRegions) -> list[tuple[list[str], list[int]]]:
    return [([n], r) for n, r in regions.layer_regions.items()]


def rows_equal(kv: torch.Tensor, a: int, b: int) -> bool:
    return bool(torch.equal(kv[:, a], kv[:, b]))


class SegmentsOnly(CpuSlab):
    """The CPU tier as device-memory KV sees it: no row path, so loads are planned as
    segments (split by region for a load layer by layer)."""

    def supports_rows(self, engine_regions):
        return False


def setup(store_wrap=None, slab_cls=CpuSlab):
    kv = split_kv()
    regions = KVRegions.from_tensors(kv, BLOCKS, block_dim=1)
    store = slab_cls(8, regions.row_bytes, BPC)
    wrapped = store_wrap(store) if store_wrap else store
    eng = TransferEngine(regions, {"cpu": wrapped}, BPC)
    keys = [b"a", b"b", b"c"]
    eng.submit(make_job("store", "cpu", keys, [0, 1, 2], SRC))
    assert eng.wait([1], timeout=10) and eng.poll()[0].all_ok
    for t in kv.values():
        t[:, DST] = 0
    load = make_job("load", "cpu", keys, [0, 1, 2], DST, job_id=2, sync=True)
    return kv, regions, eng, load, wrapped


def test_layer_regions_name_each_tensor_and_its_aliases():
    kv = split_kv(2)
    kv["model.layers.2.attn"] = kv["model.layers.0.attn"]  # shares layer 0's cache
    regions = KVRegions.from_tensors(kv, BLOCKS, block_dim=1)
    assert len(regions.regions) == 4
    assert regions.layer_regions == {
        "model.layers.0.attn": [0, 1],
        "model.layers.1.attn": [2, 3],
        "model.layers.2.attn": [0, 1],
    }


def test_split_last_block_keeps_every_block_once():
    runs = [(4, np.array([7, 8])), (10, np.array([3, 9, 11]))]
    (how, last), (_, rest) = split_last_block(("rows", runs))
    assert how == "rows" and len(last) == 1
    assert last[0][0] == 12 and last[0][1].tolist() == [11]
    assert [(r, b.tolist()) for r, b in rest] == [(4, [7, 8]), (10, [3, 9])]
    (_, last), (_, rest) = split_last_block(("rows", [(0, np.array([5]))]))
    assert last[0][1].tolist() == [5] and rest == []
    with pytest.raises(ValueError):
        split_last_block(("buffers", None))


@pytest.mark.parametrize("slab_cls", [CpuSlab, SegmentsOnly], ids=["rows", "segments"])
def test_layers_are_copied_one_ahead_of_the_wait(slab_cls):
    kv, regions, eng, load, _ = setup(slab_cls=slab_cls)
    names = list(kv)
    try:
        assert eng.plan(load)[0] == ("rows" if slab_cls is CpuSlab else "segments")
        w = WorkerSide(eng, calibrate=False, layers=layer_of(regions))
        w.begin_step(StepPlan(loads=[load]))
        w.start_loads()
        assert w.layered_steps == 1
        # Before the forward: the last block, in every layer; no other block beyond layer 0.
        for t in kv.values():
            assert rows_equal(t, DST[-1], SRC[-1])
        for name in names[1:]:
            assert not any(rows_equal(kv[name], d, s) for d, s in zip(DST, SRC[:-1], strict=False))
        for k, name in enumerate(names):
            w.wait_layer(name)
            assert all(rows_equal(kv[name], d, s) for d, s in zip(DST, SRC, strict=True))
            for later in names[k + 2 :]:  # one layer of lookahead, no more
                assert not rows_equal(kv[later], DST[0], SRC[0])
        w.end_forward()
        (result,) = [r for r in w.report().results if r.job_id == 2]
        assert result.all_ok and result.nbytes == len(DST) * regions.block_bytes
        assert not w.load_errors()
    finally:
        eng.close()


def test_a_forward_that_waits_for_no_layer_still_ends_with_whole_loads():
    kv, regions, eng, load, _ = setup()
    try:
        w = WorkerSide(eng, calibrate=False, layers=layer_of(regions))
        w.begin_step(StepPlan(loads=[load]))
        w.start_loads()
        w.wait_layer("not.a.layer")  # unknown: waits for every layer
        for t in kv.values():
            assert all(rows_equal(t, d, s) for d, s in zip(DST, SRC, strict=True))
        w.end_forward()
        assert all(r.all_ok for r in w.report().results)
    finally:
        eng.close()


@pytest.mark.parametrize("fails", [1, 10])
def test_a_failed_layer_is_copied_again_or_fails_the_whole_job(fails):
    class FailsFirst(FaultyStore):
        def __init__(self, inner):
            super().__init__(inner, FaultPlan(fail_all_reads=True, rows=True))
            self.left = 0

        def _fails(self, key, rate, keys, all_):
            if self.left > 0 and all_:
                self.left -= 1
                return True
            return False

    kv, regions, eng, load, store = setup(FailsFirst)
    try:
        store.left = fails
        w = WorkerSide(eng, calibrate=False, layers=layer_of(regions))
        w.begin_step(StepPlan(loads=[load]))
        w.start_loads()
        for name in kv:
            w.wait_layer(name)
        w.end_forward()
        errors = w.load_errors()
        (result,) = [r for r in w.report().results if r.job_id == 2]
        if fails == 1:  # retried within the step: whole and good
            assert result.all_ok and not errors
            for t in kv.values():
                assert all(rows_equal(t, d, s) for d, s in zip(DST, SRC, strict=True))
        else:
            assert not any(result.ok) and errors == set(DST)
    finally:
        eng.close()


def test_plans_that_cannot_split_by_layer_load_before_the_forward():
    # The fault wrapper without ``rows`` hides the row path: per-chunk reads, which a
    # layer-wise load cannot split.
    kv, regions, eng, load, _ = setup(lambda s: FaultyStore(s, FaultPlan(seed=1)))
    try:
        w = WorkerSide(eng, calibrate=False, layers=layer_of(regions))
        w.begin_step(StepPlan(loads=[load]))
        w.start_loads()
        assert w.layered_steps == 0
        for t in kv.values():
            assert all(rows_equal(t, d, s) for d, s in zip(DST, SRC, strict=True))
        w.end_forward()
    finally:
        eng.close()


@given(
    bpc=st.integers(1, 3),
    chunks=st.integers(1, 4),
    skip=st.integers(0, 2),
    data=st.data(),
)
def test_split_segments_copies_every_byte_once_and_the_last_block_first(bpc, chunks, skip, data):
    """The two "regions" plans of a split segments plan load, together, what the whole
    plan loads (region by region, in any layer order), the first part exactly the job's
    last block."""
    skip = min(skip, bpc - 1)
    kv = {k: t.view(torch.int32) for k, t in split_kv(3).items()}  # bitwise equality
    regions = KVRegions.from_tensors(kv, BLOCKS, block_dim=1)
    slab = SegmentsOnly(chunks, regions.row_bytes, bpc)
    slab.flat.copy_(torch.randint(0, 256, slab.flat.shape, dtype=torch.uint8))
    n = chunks * bpc - skip
    dst = data.draw(st.lists(st.integers(0, BLOCKS - 1), min_size=n, max_size=n, unique=True))
    keys = [bytes([i]) for i in range(chunks)]
    job = make_job("load", "cpu", keys, list(range(chunks)), dst, sync=True, skip=skip)
    stores = {"cpu": slab}
    eng = TransferEngine(regions, stores, bpc)
    try:
        whole = eng.plan(job)
    finally:
        eng.close()
    assert whole[0] == "segments"
    run_plan(job, whole, regions, stores)
    expect = {k: t.clone() for k, t in kv.items()}
    for t in kv.values():
        t.zero_()
    tail, rest = split_segments(whole, regions.row_bytes, bpc)
    assert all(run_plan(job, tail, regions, stores))
    for k, t in kv.items():  # only the last block so far, in every layer
        assert torch.equal(t[:, dst[-1]], expect[k][:, dst[-1]])
        assert not t[:, dst[:-1]].any()
    order = data.draw(st.permutations(list(regions.layer_regions.values())))
    for only in order:
        assert all(run_plan(job, rest, regions, stores, only))
    for k, t in kv.items():
        assert torch.equal(t[:, dst], expect[k][:, dst])
        for half, r in enumerate(regions.layer_regions[k]):  # the oracle: the slab's rows
            for p, b in enumerate(dst, start=skip):
                want = slab.regions[r][(p // bpc) * bpc + p % bpc]
                assert torch.equal(t[half, b].reshape(-1).view(torch.uint8), want)
    with pytest.raises(ValueError):
        split_segments(("rows", []), regions.row_bytes, bpc)


def test_a_part_counts_as_copied_only_after_its_fence():
    """Device copies: ``wait_layer`` must not return before the copy stream finished the
    layer. The fence runs after each part's copies and before the part is reported."""
    job = make_job("load", "cpu", [b"a"], [0], [5], sync=True)
    layers = [[0], [1], [2]]
    unit = LayeredLoad([job], [(("rows", []), ("rows", []))], layers)
    unit.release()
    seen = []

    def fence():
        seen.append((unit.tail_done, unit.copied))

    (result,) = unit.run(lambda j, plan, only: [True], 10, fence=fence)
    assert seen == [(False, 0), (True, 0), (True, 1), (True, 2)]
    assert result.all_ok and unit.copied == 3
