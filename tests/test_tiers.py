import torch

from kvtier.keys import chunk_keys
from kvtier.testing import TierConformance
from kvtier.tiers import CpuTier, FaultPlan, MemoryTier, faulty_tier


class TestCpuTier(TierConformance):
    def make_tier(self, capacity_chunks, chunk_bytes):
        return CpuTier(capacity_chunks * chunk_bytes, chunk_bytes)


class TestCpuTierArc(TierConformance):
    def make_tier(self, capacity_chunks, chunk_bytes):
        return CpuTier(capacity_chunks * chunk_bytes, chunk_bytes, eviction="arc")


class TestMemoryTier(TierConformance):
    def make_tier(self, capacity_chunks, chunk_bytes):
        return MemoryTier(capacity_chunks, chunk_bytes)


def test_cpu_tier_never_pins_memory_without_cuda():
    tier = CpuTier(1 << 20, 4096)
    assert tier.store.flat.is_pinned() == torch.cuda.is_available()
    assert tier.capacity_chunks == 256


def test_faulty_reads_are_misses_never_wrong_bytes():
    keys = chunk_keys(list(range(40)), 4, b"s")
    data = torch.randint(0, 256, (10, 512), dtype=torch.uint8)
    tier = faulty_tier(CpuTier(64 * 512, 512), FaultPlan(fail_read_keys={keys[4]}))
    assert tier.put(keys, data) == 10
    out = torch.zeros_like(data)
    assert tier.get(keys, out) == 4
    assert torch.equal(out[:4], data[:4])
    # the failed chunk and its descendants are gone; the prefix survives
    assert tier.prefix_len(keys) == 4


def test_faulty_writes_refuse_the_chain_tail():
    keys = chunk_keys(list(range(40)), 4, b"s")
    data = torch.randint(0, 256, (10, 512), dtype=torch.uint8)
    tier = faulty_tier(MemoryTier(64, 512), FaultPlan(fail_write_keys={keys[6]}))
    assert tier.put(keys, data) == 6
    assert tier.prefix_len(keys) == 6


def test_seeded_faults_replay():
    keys = chunk_keys(list(range(400)), 4, b"s")
    data = torch.zeros(100, 64, dtype=torch.uint8)
    results = []
    for _ in range(2):
        tier = faulty_tier(MemoryTier(200, 64), FaultPlan(seed=3, write_fail_rate=0.05))
        results.append(tier.put(keys, data))
    assert results[0] == results[1] < 100
