"""Fault injection: a SlotStore wrapper that fails chosen keys or operations.

Failures are decided per chunk from a seeded RNG (rates) and/or explicit key sets, so a
test can say "fail every read of chunk 3" or "fail 20% of writes, seed 7" and replay the
same faults. A failed read also scribbles over its destination, as a half-finished copy
would: if anything used those bytes, outputs would change and tests would see it.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtier.keys import Key
from kvtier.tiers.base import Segments, SlotStore
from kvtier.tiers.slot_tier import SlotTier

log = logging.getLogger(__name__)


@dataclass
class FaultPlan:
    """Which operations fail."""

    seed: int = 0
    read_fail_rate: float = 0.0
    """Probability that reading one chunk fails."""
    write_fail_rate: float = 0.0
    """Probability that writing one chunk fails."""
    fail_read_keys: set[Key] = field(default_factory=set)
    """Reads of these keys always fail."""
    fail_write_keys: set[Key] = field(default_factory=set)
    """Writes of these keys always fail."""
    fail_all_reads: bool = False
    fail_all_writes: bool = False


class FaultyStore(SlotStore):
    """Wraps a SlotStore and fails what the FaultPlan says. Counts what it failed."""

    def __init__(self, inner: SlotStore, plan: FaultPlan) -> None:
        self.inner = inner
        self.plan = plan
        self.num_slots = inner.num_slots
        self.slot_bytes = inner.slot_bytes
        self._rng = random.Random(plan.seed)
        self._lock = threading.Lock()
        self.failed_reads = 0
        self.failed_writes = 0
        log.warning("kvtier fault injection is active: %s", plan)

    def _fails(self, key: Key, rate: float, keys: set[Key], all_: bool) -> bool:
        with self._lock:
            roll = self._rng.random()
        return all_ or key in keys or roll < rate

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        p = self.plan
        fail = [self._fails(k, p.read_fail_rate, p.fail_read_keys, p.fail_all_reads) for k in keys]
        ok = self.inner.read(slots, keys, dst)
        for i, f in enumerate(fail):
            if f:
                ok[i] = False
                for _, seg in dst[i]:
                    seg.fill_(0x5A)
        self.failed_reads += sum(fail)
        return ok

    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        p = self.plan
        fail = [
            self._fails(k, p.write_fail_rate, p.fail_write_keys, p.fail_all_writes) for k in keys
        ]
        ok = self.inner.write(slots, keys, src, parents)
        self.failed_writes += sum(fail)
        return [o and not f for o, f in zip(ok, fail, strict=True)]

    def close(self) -> None:
        self.inner.close()


def faulty_tier(tier: SlotTier, plan: FaultPlan) -> SlotTier:
    """The same tier with its store wrapped in a FaultyStore."""
    return SlotTier(tier.name, tier.source, tier.index, FaultyStore(tier.store, plan))
