"""The fault wrapper chosen by configuration, over real stores, seen through the one-process
adapter (SlotTier) that composes a kind's index and store; the CPU slab's memory."""

import dataclasses

import pytest
import torch

from kvtier.contract.kind import TierContext
from kvtier.keys import Namespace, chunk_keys
from kvtier.sources import HitSource
from kvtier.stack.build import make_index, make_store
from kvtier.stack.parse import resolved, tier_spec
from kvtier.tiers.cpu import CpuSlab
from kvtier.tiers.faulty import FaultPlan, FaultyStore
from kvtier.tools.slot_tier import SlotTier

NS = Namespace("tiers", "layout")


def tier(entry: dict, chunk_bytes: int, faults: FaultPlan | None = None) -> SlotTier:
    """A one-process tier of ``entry``'s kind, built as the engine builds its two sides."""
    spec = resolved(tier_spec(entry), "lru")
    if faults is not None:
        spec = dataclasses.replace(spec, faults=faults)
    ctx = TierContext(chunk_bytes, NS, rank_dirs=False)
    return SlotTier(spec.label, HitSource.HOST, make_index(spec, ctx), make_store(spec, ctx))


def test_cpu_slab_never_pins_memory_without_cuda():
    slab = CpuSlab.flat_chunks(256, 4096)
    assert slab.flat.is_pinned() == torch.cuda.is_available()
    slab.close()


def test_the_builder_wraps_a_store_with_faults_and_only_then():
    plain = tier({"kind": "cpu", "capacity": 8 * 512}, 512)
    wrapped = tier({"kind": "cpu", "capacity": 8 * 512, "faults": {"seed": 2}}, 512)
    assert not isinstance(plain.store, FaultyStore)
    assert isinstance(wrapped.store, FaultyStore) and wrapped.store.plan == FaultPlan(seed=2)


def test_faulty_reads_are_misses_never_wrong_bytes():
    keys = chunk_keys(list(range(40)), 4, b"s")
    data = torch.randint(0, 256, (10, 512), dtype=torch.uint8)
    t = tier({"kind": "cpu", "capacity": 64 * 512}, 512, FaultPlan(fail_read_keys={keys[4]}))
    assert t.put(keys, data) == 10
    out = torch.zeros_like(data)
    assert t.get(keys, out) == 4
    assert torch.equal(out[:4], data[:4])
    # the failed chunk and its descendants are gone; the prefix survives
    assert t.prefix_len(keys) == 4


def test_faulty_writes_refuse_the_chain_tail(tmp_path):
    keys = chunk_keys(list(range(40)), 4, b"s")
    data = torch.randint(0, 256, (10, 512), dtype=torch.uint8)
    entry = {"kind": "disk", "path": str(tmp_path / "d"), "capacity": 64 * 512, "threads": 1}
    t = tier(entry, 512, FaultPlan(fail_write_keys={keys[6]}))
    assert t.put(keys, data) == 6
    assert t.prefix_len(keys) == 6
    t.close()


def test_seeded_faults_replay():
    keys = chunk_keys(list(range(400)), 4, b"s")
    data = torch.zeros(100, 64, dtype=torch.uint8)
    results = []
    for _ in range(2):
        t = tier(
            {"kind": "memory", "capacity": 200 * 64}, 64, FaultPlan(seed=3, write_fail_rate=0.05)
        )
        results.append(t.put(keys, data))
    assert results[0] == results[1] < 100


def test_slot_tier_composes_authoritative_tiers_only():
    spec = resolved(
        tier_spec({"kind": "memory", "shared": True, "url": "memory://slot-tier"}), "lru"
    )
    ctx = TierContext(64, NS)
    with pytest.raises(TypeError, match="authoritative"):
        SlotTier("m", HitSource.P2P, make_index(spec, ctx), make_store(spec, ctx))
