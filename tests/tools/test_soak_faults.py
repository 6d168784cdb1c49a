"""The soak's fault sources, without an engine: real damage to disk tier files, row-path
copy faults, and the configuration that turns them on."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch

from kvtier.config import KVTierConfig
from kvtier.errors import ConfigError
from kvtier.keys import Namespace, chunk_keys
from kvtier.tiers.cpu import CpuSlab
from kvtier.tiers.disk.slab import DiskSlab
from kvtier.tiers.faulty import FaultPlan, FaultyStore
from kvtier.tools.soak.disk_faults import DiskFaultInjector
from kvtier.tools.soak.run import small_filesystem
from kvtier.transfer import KVRegions, TransferEngine
from tests.support.jobs import make_job

NS = Namespace("soak-model", "layout", "tp1").digest()
CH = 16 << 10


def payload(key: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(hashlib.shake_128(key).digest(CH)), dtype=torch.uint8)


def filled_slab(path, n=24) -> tuple[DiskSlab, list[bytes]]:
    slab = DiskSlab(path, 64, CH, NS, 1, file_bytes=16 * (CH + 4096))
    keys = chunk_keys(list(range(n * 4)), 4, b"\0" * 16)[:n]
    parents = [None, *keys[:-1]]
    assert all(slab.write(range(n), keys, [[(0, payload(k))] for k in keys], parents))
    return slab, keys


def read_all(slab: DiskSlab, keys: list[bytes]) -> list[bool]:
    out = [torch.empty(CH, dtype=torch.uint8) for _ in keys]
    ok = slab.read(range(len(keys)), keys, [[(0, o)] for o in out])
    for good, k, o in zip(ok, keys, out, strict=True):
        if good:  # whatever reads back as good is exactly what was written
            assert torch.equal(o, payload(k))
    return ok


def test_corrupted_payloads_fail_their_checksum(tmp_path):
    slab, keys = filled_slab(tmp_path / "d")
    inj = DiskFaultInjector(tmp_path / "d", seed=3, kinds=("corrupt",))
    for _ in range(5):
        assert inj.inject("corrupt")
    ok = read_all(slab, keys)
    assert 1 <= ok.count(False) <= 5
    assert slab.corrupt_reads == ok.count(False)
    slab.close()


def test_truncated_files_come_up_short_and_later_writes_reextend(tmp_path):
    slab, keys = filled_slab(tmp_path / "d")
    inj = DiskFaultInjector(tmp_path / "d", seed=5, kinds=("truncate",))
    assert inj.inject("truncate")
    ok = read_all(slab, keys)
    assert ok.count(False) >= 1 and ok[0]
    assert slab.io_errors + slab.corrupt_reads >= ok.count(False)
    # Rewriting the last slot extends the file again; what lies between reads as zeros
    # and fails its checksum, never as data.
    last = len(keys) - 1
    assert slab.write([last], [keys[last]], [[(0, payload(keys[last]))]]) == [True]
    assert read_all(slab, keys)[last]
    slab.close()


def test_full_filesystem_fails_writes_then_recovers(tmp_path):
    with small_filesystem(8 << 20) as (fs, mode):
        if mode != "tmpfs":
            pytest.skip("cannot mount a tmpfs here (not root): the soak reports ENOSPC as 'none'")
        slab = DiskSlab(os.path.join(fs, "d"), 256, CH, NS, 1)
        keys = chunk_keys(list(range(256 * 4)), 4, b"\0" * 16)
        inj = DiskFaultInjector(os.path.join(fs, "d"), seed=1, kinds=("enospc",))
        inj.enospc_seconds = 0.0
        ballast_full = []

        def write_while_full() -> None:
            ballast_full.append(slab.write([200], [keys[200]], [[(0, payload(keys[200]))]]))

        # Fill the filesystem as the injector does, write, then release it.
        import errno

        fd = os.open(os.path.join(fs, "ballast"), os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, bytes(1 << 20))
        except OSError as e:
            assert e.errno == errno.ENOSPC
        finally:
            os.close(fd)
        write_while_full()
        os.unlink(os.path.join(fs, "ballast"))
        assert ballast_full == [[False]] and slab.io_errors >= 1
        assert slab.write([200], [keys[200]], [[(0, payload(keys[200]))]]) == [True]
        assert inj.inject("enospc")  # the injector's own episode fills and frees it too
        assert slab.write([201], [keys[201]], [[(0, payload(keys[201]))]]) == [True]
        slab.close()


def test_row_path_faults_fail_whole_jobs_and_scribble_loads():
    kv = [torch.randn(20, 3, 4, 8) for _ in range(3)]
    regions = KVRegions.from_tensors(kv, num_blocks=20)
    slab = CpuSlab(8, regions.row_bytes, 1)
    store = FaultyStore(slab, FaultPlan(fail_all_reads=True, rows=True))
    eng = TransferEngine(regions, {"cpu": store}, 1)
    try:
        assert eng.plan(make_job("load", "cpu", [b"a"], [0], [1], job_id=9, sync=True))[0] == "rows"
        eng.submit(make_job("store", "cpu", [b"a", b"b"], [0, 1], [3, 4]))
        assert eng.wait([1], timeout=10)
        before = kv[0][5].clone()
        eng.submit(make_job("load", "cpu", [b"a", b"b"], [0, 1], [5, 6], job_id=2, sync=True))
        assert eng.wait([2], timeout=10)
        results = {r.job_id: r for r in eng.poll()}
        assert results[1].all_ok and not any(results[2].ok)
        assert store.failed_reads == 3  # a sync load is copied three times before it fails
        assert not torch.equal(kv[0][5], before)  # scribbled: must be recomputed
    finally:
        eng.close()
    # Without ``rows`` the wrapper keeps its per-chunk segment path.
    inner, engine_rows = CpuSlab(2, [64], 1), [torch.zeros(4, 64, dtype=torch.uint8)]
    assert inner.supports_rows(engine_rows) and inner.partial_reads
    plain = FaultyStore(inner, FaultPlan())
    assert not plain.supports_rows(engine_rows) and not plain.partial_reads
    assert FaultyStore(inner, FaultPlan(rows=True)).supports_rows(engine_rows)


def test_tier_to_tier_copies_out_of_a_wrapped_disk_store_move_exact_bytes(tmp_path):
    """A FaultyStore over the disk tier (the soak's) has no slot memory of its own to copy
    from, like the disk store it wraps: disk -> cpu copies stage through a buffer and land
    byte-exact; a FaultyStore over the CPU tier still copies straight from its slots."""
    disk, keys = filled_slab(tmp_path / "d", n=4)
    cpu = CpuSlab(4, [CH], 1)
    stores = {"cpu": FaultyStore(cpu, FaultPlan(rows=True)), "disk": FaultyStore(disk, FaultPlan())}
    assert stores["cpu"].host_payload
    assert not stores["disk"].host_payload
    eng = TransferEngine(
        KVRegions.from_tensors([torch.zeros(4, CH, dtype=torch.uint8)], 4), stores, 1
    )
    try:
        copy = make_job(
            "copy", "disk", keys, [0, 1, 2, 3], [], skip=0, dst_tier="cpu", dst_slots=[3, 2, 1, 0]
        )
        eng.submit(copy)
        assert eng.wait([1], timeout=10)
        (result,) = eng.poll()
        assert result.all_ok
        for slot, k in zip([3, 2, 1, 0], keys, strict=True):
            assert torch.equal(cpu.payload_segments(slot)[0][1].flatten(), payload(k))
    finally:
        eng.close()


def test_fault_config_keys():
    cfg = KVTierConfig.from_dict(
        {
            "fault_injection": {
                "slow_rate": 0.1,
                "slow_seconds": 0.02,
                "rows": True,
                "disk": {"read_fail_rate": 0.5},
            }
        }
    )
    assert cfg.fault_injection is not None and cfg.fault_injection["disk"]["read_fail_rate"] == 0.5
    with pytest.raises(ConfigError, match=r"fault_injection\.disk: unknown key 'disk'"):
        KVTierConfig.from_dict({"fault_injection": {"disk": {"disk": {}}}})
    with pytest.raises(ConfigError, match=r"slow_rate: must be within \[0, 1\]"):
        KVTierConfig.from_dict({"fault_injection": {"slow_rate": 2}})
