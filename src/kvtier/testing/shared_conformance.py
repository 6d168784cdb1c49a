"""The conformance suite every shared tier passes (in-process shared memory, Redis, ...).

A shared tier is an index + per-rank stores over one store that other engines write and
that loses keys on its own (see ``kvtier.tiers.base.TierIndex``). Subclass and provide
``make(world)`` returning a :class:`SharedHarness`::

    class TestRedis(SharedTierConformance):
        def make(self, world):
            return SharedHarness(index, [store_of(r) for r in range(world)], raw_get, ...)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvtier.keys import Key, Namespace, chunk_keys
from kvtier.tiers.base import Pending, SlotStore, TierIndex

CHUNK_BYTES = 8192
NAMESPACE = Namespace("conformance", "layout-digest", "tp2")


@dataclass
class SharedHarness:
    """One shared tier under test and raw access to its backing store."""

    index: TierIndex
    stores: list[SlotStore]
    """One store per rank (rank r at position r)."""
    raw_get: Callable[[Key, int], bytes | None]
    raw_put: Callable[[Key, int, bytes], None]
    drop: Callable[[Key, int], None]
    make_store: Callable[[int, bytes], SlotStore]
    """Another engine's store: ``(rank, namespace digest)``."""
    close: Callable[[], None]


def chain(n: int, salt: int = 0) -> list[Key]:
    """``n`` chunk keys of 4 tokens; chains of distinct salts share no chunk (the salt is in
    the seed: token ids must stay below 2**32, salts need not)."""
    seed = b"shared-seed" + salt.to_bytes(8, "little")
    return chunk_keys(list(range(n * 4)), 4, seed)


def payload(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, CHUNK_BYTES), dtype=torch.uint8, generator=g)


def segs(data: torch.Tensor) -> list[list[tuple[int, torch.Tensor]]]:
    """Each chunk as two segments (a split payload, as engine regions give it)."""
    h = CHUNK_BYTES // 2
    return [[(0, row[:h]), (h, row[h:])] for row in data]


def probe(index: TierIndex, keys: Sequence[Key], start: int = 0, timeout: float = 5.0) -> int:
    """``leading``, asked again while it answers PENDING (as the scheduler would)."""
    deadline = time.monotonic() + timeout
    while True:
        n = index.leading(keys, start)
        if not isinstance(n, Pending):
            return n
        assert time.monotonic() < deadline, "a probe never answered"
        time.sleep(0.001)


class SharedTierConformance:
    """Behaviour every shared tier must have."""

    def make(self, world: int) -> SharedHarness:
        raise NotImplementedError

    def _put(self, h: SharedHarness, keys: list[Key], data: Sequence[torch.Tensor]) -> None:
        parents: list[Key | None] = [None, *keys[:-1]]
        for store, d in zip(h.stores, data, strict=True):
            assert store.write([-1] * len(keys), keys, segs(d), parents) == [True] * len(keys)

    def _read(self, store: SlotStore, keys: list[Key]) -> tuple[list[bool], torch.Tensor]:
        out = torch.zeros(len(keys), CHUNK_BYTES, dtype=torch.uint8)
        return store.read([-1] * len(keys), keys, segs(out)), out

    def test_round_trip_every_rank(self) -> None:
        h = self.make(2)
        try:
            keys, data = chain(6), [payload(6, 1), payload(6, 2)]
            assert h.index.shared and probe(h.index, keys) == 0
            self._put(h, keys, data)
            assert probe(h.index, keys) == 6
            assert probe(h.index, keys, 4) == 6
            for store, d in zip(h.stores, data, strict=True):
                ok, out = self._read(store, keys)
                assert ok == [True] * 6 and torch.equal(out, d)
        finally:
            h.close()

    def test_probe_stops_at_the_first_miss_of_any_rank(self) -> None:
        h = self.make(2)
        try:
            keys = chain(8, salt=1)
            self._put(h, keys, [payload(8, 3), payload(8, 4)])
            h.drop(keys[5], 0)
            assert probe(h.index, keys) == 5
            h.drop(keys[2], 1)  # one rank's shard gone: the chunk is gone
            assert probe(h.index, keys) == 2
            assert probe(h.index, keys, 3) == 5, "a probe from a later start sees past a miss"
            assert not h.index.hold(keys[0]), "a shared index cannot pin"
        finally:
            h.close()

    def test_present_keys_are_skipped(self) -> None:
        h = self.make(1)
        try:
            keys, first = chain(4, salt=2), payload(4, 5)
            self._put(h, keys, [first])
            other = h.make_store(0, NAMESPACE.for_rank(0).digest())
            assert other.write([-1] * 4, keys, segs(payload(4, 6)), None) == [True] * 4
            ok, out = self._read(h.stores[0], keys)
            assert ok == [True] * 4 and torch.equal(out, first), "the first writer's bytes stay"
            other.close()
        finally:
            h.close()

    def test_bad_values_fail_only_their_chunk(self) -> None:
        h = self.make(1)
        try:
            keys, data = chain(6, salt=3), payload(6, 7)
            self._put(h, keys, [data])
            good = h.raw_get(keys[0], 0)
            assert good is not None
            h.drop(keys[1], 0)  # missing
            h.raw_put(keys[2], 0, good[: len(good) // 2])  # truncated
            bad = bytearray(good)
            bad[-1] ^= 0xFF
            h.raw_put(keys[3], 0, bytes(bad))  # corrupt payload
            h.raw_put(keys[4], 0, good)  # another key's value under this key
            h.raw_put(keys[5], 0, b"\x80\x04garbage that is no envelope")
            ok, out = self._read(h.stores[0], keys)
            assert ok == [True, False, False, False, False, False]
            assert torch.equal(out[0], data[0])
        finally:
            h.close()

    def test_another_namespace_never_validates(self) -> None:
        h = self.make(1)
        try:
            keys = chain(3, salt=4)
            foreign = h.make_store(0, Namespace("other-model", "x").digest())
            assert foreign.write([-1] * 3, keys, segs(payload(3, 8)), None) == [True] * 3
            foreign.close()
            ok, _ = self._read(h.stores[0], keys)
            assert ok == [False] * 3
        finally:
            h.close()

    def test_concurrent_engines_write_one_chain(self) -> None:
        h = self.make(1)
        try:
            keys, data = chain(16, salt=5), payload(16, 9)
            errors: list[Any] = []

            def engine() -> None:
                store = h.make_store(0, NAMESPACE.for_rank(0).digest())
                try:
                    for _ in range(5):
                        store.write([-1] * 16, keys, segs(data), None)
                        ok, out = self._read(store, keys)
                        if not all(ok) or not torch.equal(out, data):
                            errors.append("bad read")
                finally:
                    store.close()

            threads = [threading.Thread(target=engine) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors
            assert probe(h.index, keys) == 16
        finally:
            h.close()
