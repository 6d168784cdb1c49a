import pytest
import torch

from kvtier.errors import ConfigError
from kvtier.tiers.cpu import CpuSlab
from kvtier.transfer import KVRegions, TransferEngine
from tests.support.jobs import make_job
from tests.support.kv_tensors import block_bytes, cpu_layout


def test_regions_from_cpu_layout():
    kv = cpu_layout()
    r = KVRegions.from_tensors(kv, num_blocks=20)
    assert len(r.regions) == 3
    assert r.row_bytes == [3 * 4 * 8 * 2] * 3
    assert r.block_bytes == 3 * 192


def test_regions_from_split_kv_layout():
    # FlashAttention-style [2, blocks, block_size, heads, head_dim]: two regions per layer.
    kv = [torch.randn(2, 20, 4, 3, 8) for _ in range(2)]
    r = KVRegions.from_tensors(kv, num_blocks=20)
    assert len(r.regions) == 4
    assert r.row_bytes == [4 * 3 * 8 * 4] * 4


def test_regions_reject_ambiguous_or_sparse():
    with pytest.raises(ConfigError, match="block dimension"):
        KVRegions.from_tensors([torch.zeros(5, 5)], num_blocks=5)
    t = torch.zeros(20, 4, 8).transpose(1, 2)
    with pytest.raises(ConfigError, match="not dense"):
        KVRegions.from_tensors([t], num_blocks=20)


def test_store_then_load_moves_exact_bytes_across_layouts():
    kv = cpu_layout()
    regions = KVRegions.from_tensors(kv, num_blocks=20)
    bpc = 3
    slab = CpuSlab(8, regions.row_bytes, bpc)
    eng = TransferEngine(regions, {"cpu": slab}, bpc)
    try:
        src_blocks = [0, 1, 2, 7, 9, 8]  # two chunks: one contiguous run, one scattered
        before = [block_bytes(kv, b).clone() for b in src_blocks]
        eng.submit(make_job("store", "cpu", [b"k1", b"k2"], [5, 2], src_blocks))
        assert eng.wait([1], timeout=10)
        # load both chunks whole (scattered destination), then chunk 2 skipping its first block
        dst = [10, 11, 12, 14, 13, 17]
        eng.submit(make_job("load", "cpu", [b"k1", b"k2"], [5, 2], dst, job_id=2, sync=True))
        eng.submit(make_job("load", "cpu", [b"k2"], [2], [15, 16], job_id=3, skip=1))
        assert eng.wait([2, 3], timeout=10)
        results = {r.job_id: r for r in eng.poll()}
        assert all(r.all_ok for r in results.values())
        assert results[1].nbytes == 6 * regions.block_bytes
        for i, b_dst in enumerate(dst):
            assert torch.equal(block_bytes(kv, b_dst), before[i])
        assert torch.equal(block_bytes(kv, 15), before[4])
        assert torch.equal(block_bytes(kv, 16), before[5])
    finally:
        eng.close()


def test_job_exception_fails_the_job_not_the_engine():
    kv = cpu_layout()
    regions = KVRegions.from_tensors(kv, num_blocks=20)
    eng = TransferEngine(regions, {"cpu": CpuSlab(2, regions.row_bytes, 1)}, 1)
    try:
        eng.submit(make_job("store", "cpu", [b"k"], [99], [0]))  # bad slot
        eng.submit(make_job("store", "cpu", [b"k"], [1], [0], job_id=2))
        assert eng.wait([1, 2], timeout=10)
        res = {r.job_id: r.all_ok for r in eng.poll()}
        assert res == {1: False, 2: True}
    finally:
        eng.close()


def test_calibrate_reports_bandwidth():
    kv = cpu_layout()
    eng = TransferEngine(KVRegions.from_tensors(kv, num_blocks=20), {}, 2)
    try:
        bw = eng.calibrate(nbytes=4 << 20)
        assert bw > 1e8
    finally:
        eng.close()


@pytest.mark.parametrize("faulty", [False, True])
def test_row_path_and_segment_path_agree(faulty):
    """The batched row path (CpuSlab) and the generic segment path (any store) move the
    same bytes: store with one, read back with the other."""
    from kvtier.tiers.faulty import FaultPlan, FaultyStore

    kv = cpu_layout(num_blocks=40)
    regions = KVRegions.from_tensors(kv, num_blocks=40)
    bpc = 2
    slab = CpuSlab(10, regions.row_bytes, bpc)
    store = FaultyStore(slab, FaultPlan()) if faulty else slab  # FaultyStore: segment path
    eng = TransferEngine(regions, {"cpu": store}, bpc)
    try:
        src = [3, 4, 9, 1, 20, 21, 22, 5]  # 4 chunks into slots 2,3,4 (a run) and 7
        before = [block_bytes(kv, b).clone() for b in src]
        eng.submit(make_job("store", "cpu", [b"a", b"b", b"c", b"d"], [2, 3, 4, 7], src))
        assert eng.wait([1], timeout=10)
        # Read the payload of slot 3 through the generic path and compare with the blocks.
        out = torch.empty(regions.chunk_bytes(bpc), dtype=torch.uint8)
        assert slab.read([3], [b"b"], [[(0, out)]]) == [True]
        rb = regions.row_bytes
        expect = torch.cat(
            [
                torch.cat(
                    [
                        before[2][sum(rb[:r]) : sum(rb[: r + 1])],
                        before[3][sum(rb[:r]) : sum(rb[: r + 1])],
                    ]
                )
                for r in range(len(rb))
            ]
        )
        assert torch.equal(out, expect)
        dst = [30, 31, 35, 33, 34, 36, 37]  # skip the first block of chunk "a"
        eng.submit(
            make_job(
                "load",
                "cpu",
                [b"a", b"b", b"c", b"d"],
                [2, 3, 4, 7],
                dst,
                job_id=2,
                sync=True,
                skip=1,
            )
        )
        assert eng.wait([2], timeout=10)
        assert all(r.all_ok for r in eng.poll())
        for i, b in enumerate(dst):
            assert torch.equal(block_bytes(kv, b), before[i + 1])
    finally:
        eng.close()


@pytest.mark.parametrize("rows", [False, True])
def test_a_sync_load_that_fails_once_is_copied_again_within_the_step(rows):
    """A transient copy error on a sync load is retried before the job reports: the blocks
    end up exact and the load counts as good (vLLM would otherwise keep the scribbled
    blocks cached until their owner recomputes them). A persistent error still fails the
    chunk, and async loads, whose failures vLLM handles safely, are not retried."""
    from kvtier.tiers.faulty import FaultPlan, FaultyStore

    class FailsFirst(FaultyStore):
        """Fails (and scribbles over) only the first ``n`` reads."""

        def __init__(self, inner, n):
            super().__init__(inner, FaultPlan(fail_all_reads=True, rows=rows))
            self.left = n

        def _fails(self, key, rate, keys, all_):
            if self.left > 0 and all_:
                self.left -= 1
                return True
            return False

    kv = cpu_layout(num_blocks=30)
    regions = KVRegions.from_tensors(kv, num_blocks=30)
    bpc = 2
    store = FailsFirst(CpuSlab(8, regions.row_bytes, bpc), 0)
    eng = TransferEngine(regions, {"cpu": store}, bpc)
    try:
        src = [1, 2, 3, 4]
        before = [block_bytes(kv, b).clone() for b in src]
        eng.submit(make_job("store", "cpu", [b"a", b"b"], [0, 1], src))
        assert eng.wait([1], timeout=10) and eng.poll()[0].all_ok
        cases = [(True, 1, True), (True, 10, False), (False, 1, False)]  # sync?, failures, ok
        for job_id, (sync, fails, want_ok) in enumerate(cases, start=2):
            store.left = fails
            dst = [20 + job_id, 21 + job_id, 10, 11]
            eng.submit(make_job("load", "cpu", [b"a", b"b"], [0, 1], dst, job_id=job_id, sync=sync))
            assert eng.wait([job_id], timeout=10)
            (result,) = eng.poll()
            assert result.all_ok is want_ok, (sync, fails)
            if want_ok:
                for i, b in enumerate(dst):
                    assert torch.equal(block_bytes(kv, b), before[i])
    finally:
        eng.close()


def test_cpu_tier_stores_run_on_the_submitting_thread_when_their_lane_is_idle():
    """A row store (CPU tier, host KV) is done when submit returns, on this thread; with
    inline stores off, or waiting for another job, it goes to its lane's thread."""
    import threading

    kv = cpu_layout()
    regions = KVRegions.from_tensors(kv, num_blocks=20)
    slab = CpuSlab(8, regions.row_bytes, 1)
    eng = TransferEngine(regions, {"cpu": slab}, 1)
    threads: list[str] = []
    store_rows = slab.store_rows

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return store_rows(*args, **kwargs)

    slab.store_rows = spy  # type: ignore[method-assign]
    try:
        eng.submit(make_job("store", "cpu", [b"k1"], [0], [3]))
        assert [r.job_id for r in eng.poll()] == [1]  # done before submit returned
        eng.inline_stores = False
        eng.submit(make_job("store", "cpu", [b"k2"], [1], [4], job_id=2))
        eng.inline_stores = True
        eng.submit(make_job("store", "cpu", [b"k3"], [2], [5], job_id=3, after=[2]))
        assert eng.wait([2, 3], timeout=10)
        assert threads == [threading.current_thread().name, "kvtier-normal", "kvtier-normal"]
        load = make_job(
            "load", "cpu", [b"k1", b"k2", b"k3"], [0, 1, 2], [9, 10, 11], job_id=4, sync=True
        )
        eng.submit(load)
        assert eng.wait([4], timeout=10)
        for src, dst in ((3, 9), (4, 10), (5, 11)):
            assert torch.equal(block_bytes(kv, dst), block_bytes(kv, src))
    finally:
        eng.close()
