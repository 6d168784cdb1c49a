"""The tier stack: ordered tiers, innermost first, and the lookup across them.

Lookup: tier t answers :meth:`~kvtier.contract.TierIndex.leading` from where the tiers
above stopped, so a hit is at most one run per tier: tier 0 serves its prefix, the next tier
continues where it stops, and so on. Authoritative tiers are prefix-closed (a binary search
each); a shared tier probes from that point and stops at its first miss. A lookup on a
128k-token prompt costs O(tiers * log chunks) plus one probe per shared tier.

The stack also answers the per-edge questions (:meth:`TierStack.edge`) the movement planner
and the store planner ask; it never plans a job itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvtier.contract import Pending, TierIndex
from kvtier.contract.kind import Capabilities
from kvtier.contract.spec import TierSpec
from kvtier.errors import ConfigError
from kvtier.keys import Key
from kvtier.sources import HitSource


@dataclass(frozen=True)
class StackTier:
    """One tier as the scheduler sees it: a name, a hit source, its index, its spec and
    what its kind can do."""

    name: str
    source: HitSource
    index: TierIndex
    spec: TierSpec
    capabilities: Capabilities = field(default_factory=Capabilities)

    @property
    def shared(self) -> bool:
        return self.index.shared

    @property
    def sync_loads(self) -> bool:
        """Hits served from it may load within the step (see ``Capabilities.sync_loads``)."""
        return self.capabilities.sync_loads


class TierStack:
    """The ordered tiers of one engine's scheduler side (single-threaded)."""

    def __init__(self, tiers: Sequence[StackTier]) -> None:
        if not tiers:
            raise ConfigError("tiers: at least one tier is needed")
        self.tiers = list(tiers)
        self.position = {t.name: i for i, t in enumerate(self.tiers)}
        if len(self.position) != len(self.tiers):
            raise ConfigError("tiers: two tiers have the same name")
        for i, t in enumerate(self.tiers):
            if t.shared and i == 0:
                raise ConfigError("tiers[0]: the first tier cannot be shared")
            if t.shared and i + 1 < len(self.tiers):
                raise ConfigError(
                    f"tiers[{i}]: a shared tier must be the last one (nothing is copied "
                    "out of a store that evicts on its own)"
                )
        # Write-back edges: the upper tier must report what it evicts.
        for i in range(len(self.tiers) - 1):
            if self.edge(i).on_evict == "demote":
                self.tiers[i].index.record_evictions = True

    def __len__(self) -> int:
        return len(self.tiers)

    def __getitem__(self, i: int) -> StackTier:
        return self.tiers[i]

    def by_name(self, name: str) -> StackTier:
        return self.tiers[self.position[name]]

    def edge(self, upper: int) -> TierSpec:
        """The rules of the edge from tier ``upper`` to tier ``upper + 1``."""
        return self.tiers[upper + 1].spec

    def has_below(self, t: int) -> bool:
        return t + 1 < len(self.tiers)

    def lookup(self, keys: Sequence[Key], first: int) -> list[tuple[int, int, int]] | None:
        """``(tier position, first chunk, end chunk)`` runs covering chunks from ``first``
        on, innermost tier first, contiguous; None when a tier cannot answer yet."""
        runs: list[tuple[int, int, int]] = []
        covered = first
        for t, tier in enumerate(self.tiers):
            n = tier.index.leading(keys, covered)
            if isinstance(n, Pending):
                return None
            if n > covered:
                runs.append((t, covered, n))
                covered = n
        return runs

    def touch(self, keys: Sequence[Key]) -> None:
        """Reuse refreshes the chain in every tier that holds (part of) it: with write-
        through, a prefix hot in the CPU tier must not age out of the tier below."""
        for tier in self.tiers:
            if tier.shared:
                continue
            held = tier.index.leading(keys, 0)
            if not isinstance(held, Pending) and held:
                tier.index.touch(keys[:held])

    def entry(self, deepest: int) -> int:
        """Where the engine stores a request whose hit reached tier ``deepest``: climb
        while the edge above fills on hits; a shared tier is fed by its edge, never
        directly."""
        t = deepest
        while t > 0 and self.edge(t - 1).on_hit == "fill":
            t -= 1
        while self.tiers[t].shared:
            t -= 1
        return t

    def clear(self) -> None:
        for tier in self.tiers:
            tier.index.clear()
