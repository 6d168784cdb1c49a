"""The conformance suite of the index/store split the engine runs, for every tier kind.

Inside an engine a tier is two objects in two places: the scheduler's
:class:`~kvtier.tiers.base.TierIndex` and every worker's
:class:`~kvtier.tiers.base.SlotStore`, both built by the tier registry. These tests drive
them as the manager and the transfer engine do (reserve -> write -> commit -> leading ->
hold -> read -> release) and check what the engine relies on. Subclass and provide
``spec(tmp_path)``::

    class TestCpuSplit(SplitConformance):
        def spec(self, tmp_path):
            return TierSpec("cpu")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvtier.config import KVTierConfig
from kvtier.keys import Namespace, chunk_keys
from kvtier.stack.registry import TierContext, tier_kind
from kvtier.stack.spec import TierSpec
from kvtier.tiers.base import SlotStore, TierIndex

CHUNK = 512


def _chain(n: int, salt: int = 0) -> list[bytes]:
    return chunk_keys(list(range(salt * 1000, salt * 1000 + n * 4)), 4, b"split-seed")


def _segs(n: int, fill: int | None = None, seed: int = 0) -> list[Any]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = torch.randint(0, 256, (CHUNK,), dtype=torch.uint8, generator=g)
        if fill is not None:
            t.fill_(fill + i)
        out.append([(0, t)])
    return out


class SplitConformance:
    """Behaviour of one kind's (index, store) pair; ``spec`` names the kind."""

    def spec(self, tmp_path: Path) -> TierSpec:
        raise NotImplementedError

    def build(self, tmp_path: Path, chunks: int = 8) -> tuple[TierIndex, SlotStore]:
        spec = self.spec(tmp_path)
        spec = TierSpec(**{**spec.to_dict(), "capacity": chunks * CHUNK})
        config = KVTierConfig()
        ns = Namespace("split", "layout")
        kind = tier_kind(spec.kind)
        sched = TierContext(config, CHUNK, ns, rank_dirs=False)
        store = kind.make_store(spec, sched)
        return kind.make_index(spec, sched), store

    def store_chain(self, index: TierIndex, store: SlotStore, keys: list[bytes], segs: Any) -> int:
        """The engine's store sequence; returns how many chunks became readable."""
        start = index.stored_len(keys)
        todo = keys[start:]
        addrs = index.reserve(todo, keys[start - 1] if start else None)
        parents = [keys[start - 1] if start else None, *todo[: len(addrs) - 1]]
        ok = store.write(addrs, todo[: len(addrs)], segs[start : start + len(addrs)], parents)
        index.commit(todo[: len(addrs)], ok)
        return start + sum(ok)

    def test_store_then_load_round_trip(self, tmp_path: Path) -> None:
        index, store = self.build(tmp_path)
        keys, segs = _chain(4), _segs(4, seed=1)
        assert self.store_chain(index, store, keys, segs) == 4
        assert index.leading(keys) == 4
        held = index.hold(keys[-1])
        out = _segs(4, fill=0)
        assert store.read(index.slots_of(keys), keys, out) == [True] * 4
        for (_, a), (_, b) in zip((s[0] for s in out), (s[0] for s in segs), strict=True):
            assert torch.equal(a, b)
        if held:
            index.release(keys[-1])
        store.close()

    def test_partial_segments_read_the_right_bytes(self, tmp_path: Path) -> None:
        """A load that skips the blocks the engine holds reads part of a payload."""
        index, store = self.build(tmp_path)
        keys, segs = _chain(2), _segs(2, seed=2)
        assert self.store_chain(index, store, keys, segs) == 2
        part = torch.zeros(CHUNK // 2, dtype=torch.uint8)
        ok = store.read(index.slots_of(keys[1:]), keys[1:], [[(CHUNK // 2, part)]])
        assert ok == [True] and torch.equal(part, segs[1][0][1][CHUNK // 2 :])
        store.close()

    def test_chains_continue_and_leading_stops_at_the_first_miss(self, tmp_path: Path) -> None:
        index, store = self.build(tmp_path)
        keys = _chain(5)
        assert self.store_chain(index, store, keys[:3], _segs(3)) == 3
        assert index.leading(keys) == 3 and index.leading(keys, 3) == 3
        assert self.store_chain(index, store, keys, _segs(5)) == 5
        assert index.leading(keys) == 5
        assert index.leading(_chain(3, salt=9)) == 0
        store.close()

    def test_capacity_is_bounded_and_what_leads_reads_back(self, tmp_path: Path) -> None:
        index, store = self.build(tmp_path, chunks=6)
        chains = [_chain(3, salt=s) for s in range(5)]
        for s, keys in enumerate(chains):
            self.store_chain(index, store, keys, _segs(3, seed=10 + s))
        assert index.leading(chains[-1]) == 3, "the newest chain is whole"
        total = 0
        for s, keys in enumerate(chains):
            n = index.leading(keys)
            assert isinstance(n, int)
            total += n
            out = _segs(n, fill=0)
            assert store.read(index.slots_of(keys[:n]), keys[:n], out) == [True] * n
            for i in range(n):
                assert torch.equal(out[i][0][1], _segs(3, seed=10 + s)[i][0][1])
        assert total <= 6
        store.close()

    def test_failed_writes_are_never_readable(self, tmp_path: Path) -> None:
        index, store = self.build(tmp_path)
        keys = _chain(3)
        addrs = index.reserve(keys, None)
        store.write(addrs, keys, _segs(3), [None, *keys[:2]])
        index.commit(keys, [True, False, True])
        assert index.leading(keys) in (1, 3) if index.shared else index.leading(keys) == 1
        store.close()
