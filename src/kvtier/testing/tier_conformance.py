"""The conformance suite every tier passes.

Subclass in a test module and provide ``make_tier``::

    class TestCpuTier(TierConformance):
        def make_tier(self, capacity_chunks, chunk_bytes):
            return CpuTier(capacity_chunks * chunk_bytes, chunk_bytes)
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from kvtier.errors import TierError
from kvtier.keys import chunk_keys
from kvtier.tiers.base import Tier

CHUNK_BYTES = 4096


def _chain(n: int, salt: int = 0) -> list[bytes]:
    return chunk_keys(list(range(salt * 10_000, salt * 10_000 + n * 4)), 4, b"conformance-seed")


def _payload(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, CHUNK_BYTES), dtype=torch.uint8, generator=g)


class TierConformance:
    """Behaviour every Tier must have (see the contract in ``kvtier.tiers.base.Tier``)."""

    def make_tier(self, capacity_chunks: int, chunk_bytes: int) -> Tier:
        raise NotImplementedError

    def _tier(self, capacity: int = 16) -> Any:
        tier = self.make_tier(capacity, CHUNK_BYTES)
        assert tier.chunk_bytes == CHUNK_BYTES
        return tier

    def test_round_trip(self) -> None:
        tier = self._tier()
        keys, data = _chain(5), _payload(5, 1)
        assert tier.put(keys, data) == 5
        out = torch.zeros_like(data)
        assert tier.get(keys, out) == 5
        assert torch.equal(out, data)
        assert len(tier) == 5
        tier.close()

    def test_missing_keys(self) -> None:
        tier = self._tier()
        keys = _chain(4)
        out = torch.zeros(4, CHUNK_BYTES, dtype=torch.uint8)
        assert tier.get(keys, out) == 0
        assert tier.prefix_len(keys) == 0
        assert not tier.contains(keys[0])
        tier.put(keys[:2], _payload(2, 2))
        assert tier.prefix_len(keys) == 2
        assert tier.get(keys, out) == 2
        tier.close()

    def test_chain_needs_parent(self) -> None:
        tier = self._tier()
        keys = _chain(4)
        # A chain continuing an absent parent is refused entirely.
        assert tier.put(keys[2:], _payload(2, 3), parent=keys[1]) == 0
        assert tier.prefix_len(keys[2:]) == 0
        assert tier.put(keys[:2], _payload(2, 3)) == 2
        assert tier.put(keys[2:], _payload(2, 4), parent=keys[1]) == 2
        assert tier.prefix_len(keys) == 4
        tier.close()

    def test_put_existing_counts_as_stored(self) -> None:
        tier = self._tier()
        keys, data = _chain(3), _payload(3, 5)
        assert tier.put(keys, data) == 3
        assert tier.put(keys, _payload(3, 6)) == 3
        out = torch.zeros_like(data)
        assert tier.get(keys, out) == 3
        assert torch.equal(out, data), "a second put of present keys must not change them"
        tier.close()

    def test_capacity_and_eviction(self) -> None:
        tier = self._tier(capacity=8)
        chains = [_chain(4, salt=s) for s in range(5)]
        for s, keys in enumerate(chains):
            assert tier.put(keys, _payload(4, 10 + s)) == 4
            assert len(tier) <= 8
        # The newest chain is whole; the oldest was evicted.
        assert tier.prefix_len(chains[-1]) == 4
        assert tier.prefix_len(chains[0]) == 0
        # Whatever is left of older chains is a prefix and reads back correctly.
        for s, keys in enumerate(chains):
            n = tier.prefix_len(keys)
            out = torch.zeros(4, CHUNK_BYTES, dtype=torch.uint8)
            assert tier.get(keys, out) == n
            assert torch.equal(out[:n], _payload(4, 10 + s)[:n])
        tier.close()

    def test_too_big_for_capacity(self) -> None:
        tier = self._tier(capacity=4)
        keys = _chain(6)
        assert tier.put(keys, _payload(6, 20)) == 4
        assert tier.prefix_len(keys) == 4
        tier.close()

    def test_delete_removes_descendants(self) -> None:
        tier = self._tier()
        keys = _chain(5)
        tier.put(keys, _payload(5, 30))
        tier.delete([keys[2]])
        assert tier.prefix_len(keys) == 2
        tier.close()

    def test_concurrent_put_get(self) -> None:
        tier = self._tier(capacity=64)
        errors: list[str] = []

        def worker(salt: int) -> None:
            keys, data = _chain(4, salt=salt), _payload(4, 100 + salt)
            for _ in range(20):
                tier.put(keys, data)
                out = torch.zeros_like(data)
                got = tier.get(keys, out)
                if not torch.equal(out[:got], data[:got]):
                    errors.append(f"wrong bytes for salt {salt}")

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert len(tier) <= 64
        tier.close()

    def test_close_is_idempotent(self) -> None:
        tier = self._tier()
        tier.close()
        tier.close()
        try:
            tier.put(_chain(1), _payload(1, 0))
        except TierError:
            pass
        else:
            raise AssertionError("put after close must raise TierError")
