"""The disk tier's address path: transfer jobs planned as flat address arrays
(``Buffers``) instead of one tensor view per block and layer, against the segment path as
the oracle (same bytes in the engine blocks, same slab files)."""

from __future__ import annotations

import hashlib
from unittest import mock

import numpy as np
import pytest
import torch

import kvtier.tiers.disk.slab as disk_module
from kvtier.contract import Buffers
from kvtier.keys import Namespace, chunk_keys
from kvtier.tiers.cpu import CpuSlab
from kvtier.tiers.disk.native import native_io
from kvtier.tiers.disk.slab import DiskSlab
from kvtier.transfer import KVRegions, TransferEngine
from tests.support.jobs import make_job

NS = Namespace("buffers-model", "layout").digest()

pytestmark = pytest.mark.skipif(native_io() is None, reason="needs the native disk path")


def kv_layout(num_blocks=24, layers=3):
    """vLLM CPU backend layout: per layer [blocks, kv_heads, block_size, 2*head_dim]."""
    gen = torch.Generator().manual_seed(num_blocks)
    return [
        torch.randn(num_blocks, 2, 4, 8, generator=gen).to(torch.bfloat16) for _ in range(layers)
    ]


def block_bytes(kv, b):
    return torch.cat([t[b].reshape(-1).view(torch.uint8) for t in kv])


def keys_of(n, salt=b"b"):
    return chunk_keys(list(range(n * 4)), 4, salt)


def run(eng, job):
    eng.submit(job)
    assert eng.wait([job.job_id], timeout=30)
    (res,) = eng.poll()
    return res


@pytest.fixture
def setup(tmp_path):
    kv = kv_layout()
    regions = KVRegions.from_tensors(kv, num_blocks=24)
    bpc = 3
    slab = DiskSlab(tmp_path / "d", 8, regions.chunk_bytes(bpc), NS, threads=2)
    cpu = CpuSlab(8, regions.row_bytes, bpc)
    eng = TransferEngine(regions, {"cpu": cpu, "disk": slab}, bpc)
    yield kv, regions, bpc, slab, eng
    eng.close()


def test_disk_jobs_are_planned_as_buffers_and_move_exact_bytes(setup):
    kv, regions, bpc, slab, eng = setup
    keys = keys_of(3)
    src = [0, 1, 2, 7, 9, 8, 20, 3, 4]  # a contiguous run, scattered blocks, a mix
    before = [block_bytes(kv, b).clone() for b in src]
    store = make_job("store", "disk", keys, [4, 5, 1], src, parents=[None, *keys[:-1]])
    assert eng.plan(store)[0] == "buffers"
    assert run(eng, store).all_ok
    # The oracle: the segment path reads the same payloads back.
    for i, slot in enumerate([4, 5, 1]):
        out = torch.zeros(regions.chunk_bytes(bpc), dtype=torch.uint8)
        assert slab.read([slot], [keys[i]], [[(0, out)]]) == [True]
        views = regions.segments(src[i * bpc : (i + 1) * bpc], 0, bpc)
        for off, view in views:
            assert torch.equal(out[off : off + view.numel()], view)
    # Load all three elsewhere, the first chunk skipping its first block (a gap).
    dst = [10, 11, 12, 13, 14, 15, 16, 17]
    load = make_job("load", "disk", keys, [4, 5, 1], dst, job_id=2, sync=True, skip=1)
    assert eng.plan(load)[0] == "buffers"
    assert run(eng, load).all_ok
    for i, b in enumerate(dst):
        assert torch.equal(block_bytes(kv, b), before[i + 1])


def test_a_buffers_plan_runs_again_unchanged(setup):
    """A sync load that failed is copied again with the same plan: its gap entries (payload
    offsets) must not have been turned into scratch addresses by the first run."""
    kv, *_, eng = setup
    keys = keys_of(2, b"again")
    src = [5, 6, 7, 1, 2, 3]
    assert run(
        eng,
        make_job("store", "disk", keys, [0, 1], src),
    ).all_ok
    load = make_job("load", "disk", keys, [0, 1], [18, 19, 20, 21, 22], job_id=2, sync=True, skip=1)
    prepared = eng.plan(load)
    kept = prepared[1].ptrs.copy()
    for _ in range(2):
        for b in (18, 19, 20, 21, 22):
            for t in kv:
                t[b].zero_()
        assert eng.run_plan(load, prepared) == [True, True]
        assert np.array_equal(prepared[1].ptrs, kept)
        for j, b in enumerate((18, 19, 20, 21, 22)):
            assert torch.equal(block_bytes(kv, b), block_bytes(kv, src[j + 1]))


def test_cpu_to_disk_copies_use_payload_buffers(setup):
    kv, *_, eng = setup
    keys = keys_of(2, b"copy")
    src = [2, 3, 4, 11, 9, 10]
    assert run(
        eng,
        make_job("store", "cpu", keys, [6, 7], src),
    ).all_ok
    copy = make_job("copy", "cpu", keys, [6, 7], [], job_id=2, dst_tier="disk", dst_slots=[2, 3])
    assert eng.plan(copy)[0] == "copy-buffers"
    assert run(eng, copy).all_ok
    dst = [12, 13, 14, 15, 16, 17]
    assert run(
        eng,
        make_job("load", "disk", keys, [2, 3], dst, job_id=3),
    ).all_ok
    for a, b in zip(src, dst, strict=True):
        assert torch.equal(block_bytes(kv, b), block_bytes(kv, a))


def _payload(keys, nbytes):
    rows = [
        torch.frombuffer(bytearray(hashlib.shake_128(k).digest(nbytes)), dtype=torch.uint8)
        for k in keys
    ]
    return torch.stack(rows)


def _buffers(tensors, gaps=()):
    """Buffers of one whole-payload tensor per chunk; ``gaps``: (chunk, offset, length)
    ranges skipped, each splitting its chunk's entry."""
    start, ptrs, lens, gap_idx = [0], [], [], []
    for c, t in enumerate(tensors):
        pos = 0
        for gc, off, n in gaps:
            if gc != c:
                continue
            ptrs.append(t.data_ptr() + pos)
            lens.append(off - pos)
            gap_idx.append(len(ptrs))
            ptrs.append(off)
            lens.append(n)
            pos = off + n
        ptrs.append(t.data_ptr() + pos)
        lens.append(t.numel() - pos)
        start.append(len(ptrs))
    return Buffers(
        np.array(start, dtype=np.int64),
        np.array(ptrs, dtype=np.uint64),
        np.array(lens, dtype=np.uint64),
        np.array(gap_idx, dtype=np.int64),
    )


def test_consecutive_chunks_skipping_the_same_range_verify_each(tmp_path):
    """Consecutive small slots share one read syscall, and every chunk's skipped range
    lands in the same scratch buffer: they must not share it before being hashed."""
    nbytes = 1000  # not a page multiple: padding between payloads
    keys = keys_of(6, b"gaps")
    data = _payload(keys, nbytes)
    with DiskSlab(tmp_path / "d", 8, nbytes, NS, threads=1) as slab:
        src = _buffers([data[i] for i in range(6)])
        assert slab.write_buffers(list(range(6)), keys, src) == [True] * 6
        out = torch.zeros_like(data)
        dst = _buffers([out[i] for i in range(6)], gaps=[(c, 100, 300) for c in range(6)])
        asked = [*keys[:4], keys[0], keys[5]]  # chunk 4: a key its slot does not hold
        assert slab.read_buffers(list(range(6)), asked, dst) == [True] * 4 + [False, True]
        for i in (0, 1, 2, 3, 5):
            assert torch.equal(out[i, :100], data[i, :100])
            assert not out[i, 100:400].any()
            assert torch.equal(out[i, 400:], data[i, 400:])
        assert slab.stale_reads == 1 and slab.corrupt_reads == 0


def test_malformed_buffers_raise_before_any_io(tmp_path):
    nbytes = 4096
    keys = keys_of(2, b"bad")
    data = _payload(keys, nbytes)
    with DiskSlab(tmp_path / "d", 4, nbytes, NS, threads=1) as slab:
        good = _buffers([data[0], data[1]])
        short = good._replace(lens=good.lens - np.uint64(1))
        with pytest.raises(ValueError, match="whole"):
            slab.write_buffers([0, 1], keys, short)
        with pytest.raises(ValueError, match="gaps"):
            slab.write_buffers([0, 1], keys, _buffers([data[0], data[1]], gaps=[(0, 0, 8)]))
        outside = _buffers([data[0], data[1]], gaps=[(1, 8, 16)])
        outside.ptrs[outside.gaps[0]] = nbytes  # a gap past the payload
        with pytest.raises(ValueError, match="gaps"):
            slab.read_buffers([0, 1], keys, outside)
        with pytest.raises(ValueError, match="segment lists"):
            slab.read_buffers([0], keys[:1], good)
        assert slab.holds(0) is None and slab.holds(1) is None  # nothing written
    kv = kv_layout()
    regions = KVRegions.from_tensors(kv, num_blocks=24)
    with pytest.raises(ValueError, match="outside"):
        regions.buffers([0, 24, 1], 0, 3)
    with pytest.raises(ValueError, match="whole chunks"):
        regions.buffers([0, 1], 0, 3)
    with pytest.raises(ValueError, match="outside"):
        CpuSlab(2, regions.row_bytes, 1).payload_buffers([2])


def test_without_the_native_path_jobs_use_segments(tmp_path):
    kv = kv_layout()
    regions = KVRegions.from_tensors(kv, num_blocks=24)
    with mock.patch.object(disk_module, "native_io", lambda: None):
        slab = DiskSlab(tmp_path / "d", 4, regions.chunk_bytes(1), NS, threads=1)
    eng = TransferEngine(regions, {"disk": slab}, 1)
    try:
        assert not slab.accepts_buffers()
        keys = keys_of(2, b"py")
        store = make_job("store", "disk", keys, [0, 1], [3, 4])
        assert eng.plan(store)[0] == "segments"
        assert run(eng, store).all_ok
        with pytest.raises(RuntimeError, match="native"):
            slab.read_buffers([0], keys[:1], regions.buffers([5], 0, 1))
        assert run(
            eng,
            make_job("load", "disk", keys, [0, 1], [5, 6], job_id=2),
        ).all_ok
        assert torch.equal(block_bytes(kv, 5), block_bytes(kv, 3))
        assert torch.equal(block_bytes(kv, 6), block_bytes(kv, 4))
    finally:
        eng.close()
