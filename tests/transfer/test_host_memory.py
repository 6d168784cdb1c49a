"""HostBuffer: usable at once, warmed in the background without changing what was written."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from kvtier.tiers.cpu import CpuSlab
from kvtier.transfer.host_memory import HostBuffer


# Timing limits are benchmarks: only the ``slow`` variant asserts them.
@pytest.mark.parametrize(
    "timed",
    [pytest.param(False, id="exact"), pytest.param(True, id="timed", marks=pytest.mark.slow)],
)
def test_writes_during_warm_up_survive_it(timed):
    nbytes = 512 << 20
    t0 = time.perf_counter()
    buf = HostBuffer(nbytes, spans=[(o, 8 << 20) for o in range(0, nbytes, 8 << 20)])
    built = time.perf_counter() - t0
    assert not timed or built < 0.5, "construction must not touch every page"
    gen = torch.Generator().manual_seed(1)
    # Write all over the buffer while the warm-up walks it, ahead of and behind its front.
    marks = {}
    for off in torch.randint(0, nbytes - 4096, (400,), generator=gen).tolist():
        data = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=gen)
        buf.tensor[off : off + 4096].copy_(data)
        marks[off] = data
    assert buf.wait_ready(timeout=120)
    assert buf.ready_bytes == nbytes and buf.ready_seconds is not None
    # Later writes win over earlier ones where they overlap: replay in order to compare.
    expect = torch.zeros(nbytes, dtype=torch.uint8)
    for off, data in marks.items():
        expect[off : off + 4096] = data
    assert torch.equal(buf.tensor, expect)
    buf.close()
    buf.close()


def test_fresh_buffer_is_zero_and_spans_are_checked():
    buf = HostBuffer(3 << 20, background=False)
    assert buf.ready_bytes == 3 << 20
    assert int(buf.tensor.count_nonzero()) == 0
    with pytest.raises(ValueError, match="outside"):
        HostBuffer(1 << 20, spans=[(0, 2 << 20)])
    assert HostBuffer(0).tensor.numel() == 0


def test_cpu_slab_warms_in_slot_order_and_copies_before_it_is_ready():
    rows = [4096, 8192, 4096]
    slab = CpuSlab(64, rows, 2)
    assert slab.host is not None
    spans = slab.host.spans
    # Every byte of the slab in exactly one span; a region's rows never split by a span edge.
    covered = sorted(spans)
    assert sum(n for _, n in covered) == slab.flat.numel()
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(covered))
    key = (1).to_bytes(16, "little")
    payload = torch.randint(0, 256, (slab.slot_bytes,), dtype=torch.uint8)
    assert slab.write([5], [key], [[(0, payload)]]) == [True]
    out = torch.zeros_like(payload)
    assert slab.read([5], [key], [[(0, out)]]) == [True]
    assert torch.equal(out, payload)
    assert slab.host.wait_ready(timeout=60)
    slab.read([5], [key], [[(0, out)]])
    assert torch.equal(out, payload)
    slab.close()
