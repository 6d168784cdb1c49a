"""Retention leases: keep a finished request's chain in the CPU tier for a while.

A ``retain_s`` hint (:mod:`kvtier.hints`) asks that a request's chain stay in the first tier
for that many seconds after the request finishes (an agent's next turn comes after a tool
call; other traffic would evict it meanwhile). A lease holds the deepest chunk of the chain
readable in the first tier, which keeps the whole chain (eviction only takes leaves), and
moves that hold deeper as the request's last stores land.

Contracts:

- Bounded: the chunks all leases cover stay within ``retain_max_share`` of the first
  tier's slots; a lease asking for more covers the leading part that fits (its chain's
  root first: what a next turn reuses first), the rest is counted in
  ``kvtier_retain_refused_chunks``. A lease is at most ``retain_max_s`` long.
- Expiring on its own: each engine step drops the leases that ended (their holds
  released). A lease whose chain continues an older lease's chain (the agent's next turn)
  replaces it, so a conversation holds one lease.
- Not a use: a lease neither observes nor touches the policy; the chain's recency is what
  its request left.

Single-threaded (the scheduler's thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.keys import Key
from kvtier.stack.first_tier import FirstTier


@dataclass
class _Lease:
    keys: list[Key]
    until: float
    held: Key | None = None
    depth: int = 0
    """Chunks of ``keys`` covered by ``held``."""


class Retention:
    """The leases of one engine's first tier."""

    def __init__(
        self,
        first: FirstTier,
        *,
        max_share: float,
        max_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.first = first
        self.max_s = max_s
        self.clock = clock
        self.cap = int(max_share * first.slots)
        """Chunks all leases together may cover."""
        self.covered = 0
        self._leases: dict[str, _Lease] = {}

    def lease(self, req_id: str, keys: Sequence[Key], seconds: float) -> None:
        """Keep chain ``keys`` in the first tier for ``seconds`` from now."""
        seconds = min(seconds, self.max_s)
        if seconds <= 0 or not keys or self.cap <= 0:
            return
        keys = list(keys)
        if req_id in self._leases:
            self._drop(req_id)
        for other_id, other in list(self._leases.items()):
            n = len(other.keys)
            if n <= len(keys) and keys[n - 1] == other.keys[-1]:  # chained keys: a prefix
                self._drop(other_id)
        n = min(len(keys), self.cap - self.covered)
        if n < len(keys):
            self.first.metrics.inc("retain_refused_chunks", len(keys) - n)
        if n <= 0:
            return
        self.first.metrics.inc("retained_chunks", n)
        self.covered += n
        lease = self._leases[req_id] = _Lease(keys[:n], self.clock() + seconds)
        self._deepen(lease)

    def step(self) -> None:
        """Once per engine step: end the leases that expired, hold deeper where the
        chain's stores landed since."""
        if not self._leases:
            return
        now = self.clock()
        for req_id, lease in list(self._leases.items()):
            if now >= lease.until:
                self._drop(req_id)
            elif lease.depth < len(lease.keys):
                self._deepen(lease)

    def _deepen(self, lease: _Lease) -> None:
        n = self.first.readable(lease.keys)
        if n <= lease.depth:
            return
        if self.first.hold(lease.keys[n - 1]):
            self._release(lease)
            lease.held, lease.depth = lease.keys[n - 1], n

    def _release(self, lease: _Lease) -> None:
        if lease.held is not None:
            self.first.release(lease.held)
            lease.held, lease.depth = None, 0

    def _drop(self, req_id: str) -> None:
        lease = self._leases.pop(req_id)
        self._release(lease)
        self.covered -= len(lease.keys)

    def clear(self) -> None:
        """End every lease (a cache reset)."""
        for req_id in list(self._leases):
            self._drop(req_id)

    def leases(self) -> int:
        return len(self._leases)

    def pinned(self) -> int:
        """Leases holding a chain now (inspection and tests)."""
        return sum(lease.held is not None for lease in self._leases.values())
