"""The first tier as what arriving requests ask of it: prefetch copies chains into it,
retention leases keep chains in it (:mod:`kvtier.stack.prefetch`, :mod:`kvtier.stack.retain`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.contract import Pending, TierIndex
from kvtier.keys import Key
from kvtier.metrics import Metrics
from kvtier.stack.stack import TierStack


@dataclass(frozen=True)
class FirstTier:
    """The first tier of one engine's stack, shared by the prefetcher and the leases: the
    stack it heads, the metrics both count into, its slot count (what bounds both), and
    the one way both keep a chain there: hold the deepest chunk of it the tier can read,
    which keeps the whole chain (eviction takes leaves only), and release that hold later.
    Single-threaded (the scheduler's thread)."""

    stack: TierStack
    metrics: Metrics

    @property
    def index(self) -> TierIndex:
        return self.stack[0].index

    @property
    def slots(self) -> int:
        return self.stack.slots(0)

    def readable(self, keys: Sequence[Key], start: int = 0) -> int:
        """End of the run of ``keys`` from ``start`` the first tier can read now
        (``start`` when it cannot answer)."""
        n = self.index.leading(keys, start)
        return start if isinstance(n, Pending) else n

    def hold(self, key: Key) -> bool:
        """Hold ``key`` (and so its chain); False when the tier cannot (it left)."""
        return self.index.hold(key)

    def release(self, key: Key) -> None:
        self.index.release(key)
