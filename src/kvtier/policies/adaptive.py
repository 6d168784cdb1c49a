"""The default policy: chain-aware ARC that also decides whether new chunks are stored.

Two admission rules, both only while the tier is full, both learned from the traffic:

- *By category* (:mod:`kvtier.policies.categories`): the new chunks of a kind of request
  whose new chunks rarely come back (one-off documents behind a shared system prompt) are
  not stored.
- *By recency*: ARC's target size ``p`` of T1 (keys used once since stored) is a learned
  answer to "does recency pay here?": ghost hits in B1 (keys T1 dropped and the traffic
  asked for again) grow it, ghost hits in B2 shrink it. When ``p`` is 0 a brand-new chunk
  can only displace another new chunk or a reused one, and the trace has shown that chunks
  seen once do not come back while a T1 of any size would hold them. The policy then stops
  storing brand-new chains: the first sighting of a chain is refused and remembered as a
  B1 ghost, so a second sighting (by another request) stores it and counts as a B1 hit,
  which grows ``p`` and reopens admission once refusals start to cost hits. A large cache,
  where first sightings come back while still held, keeps ``p`` above 0 and stores
  everything, as LRU does; a small one under one-shot traffic keeps its slots for chains
  that proved reusable.

Admission applies to a single-tier deployment only: with a disk tier, what the CPU tier
stores is what reaches the disk (write-through copies, write-back demotions), so the manager
stores every chain and the larger tier's capacity decides; the policy then acts as
chain-arc.

Refusal is per chain, sticky per request: :meth:`admit_chain` refuses the whole tail of a
chain at its first new key and records it; the same request asking again (each engine
step) gets the same answer until another request's :meth:`observe` sees the chain again.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.keys import Key
from kvtier.policies.categories import CategoryReuse
from kvtier.policies.chain_arc import ChainARCPolicy

_REFUSED = 1
"""B1 value of a key refused at its first sighting (B1 ghosts of evictions hold None)."""
_SEEN_AGAIN = 2
"""B1 value of a refused key that another request asked for since: admitted."""


class AdaptivePolicy(ChainARCPolicy):
    """Chain-aware ARC plus admission by learned category reuse and by ARC's ``p``."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.refused = 0
        """Chunks refused at their first sighting (inspection and tests)."""
        self.categories: CategoryReuse | None = None
        """Created at the first ``admit_chain``: a tier never asked (a stack of several
        tiers stores everything) pays neither its marks nor its pass per request."""
        self.category_refusals = 0
        """``admit_chain`` answers cut by the category rule (inspection and tests)."""

    def admit_chain(self, keys: Sequence[Key]) -> int:
        if self.categories is None:
            self.categories = CategoryReuse(self.capacity)
        if len(self) < self.capacity:
            return len(keys)
        worth = self.categories.worth_storing(keys)
        if worth < len(keys):
            self.category_refusals += 1
            keys = keys[:worth]
        if not keys or self.p > 0:
            return len(keys)
        b1, b2 = self.b1, self.b2
        for i, key in enumerate(keys):
            mark = b1.get(key, 0)
            if key in b2 or (key in b1 and mark != _REFUSED):
                continue  # a ghost (evicted, or refused and asked for again): store it
            if mark == _REFUSED:
                # Refused for this request already; chunks it completed since join the
                # refusal, so the next sighting admits the whole chain at once.
                self._refuse(keys[i + 1 :])
                return i
            self._refuse(keys[i:])  # first sighting: refuse the rest, remember it
            return i
        return len(keys)

    def _refuse(self, keys: Sequence[Key]) -> None:
        b1, b2 = self.b1, self.b2
        for k in keys:
            if k not in b1 and k not in b2:
                b1[k] = _REFUSED
                self.refused += 1
        limit = max(1, self.capacity)
        while len(b1) > limit:
            b1.popitem(last=False)

    def observe(self, keys: Sequence[Key], held: int) -> None:
        if self.categories is not None:
            self.categories.observe(keys, held)
        super().observe(keys, held)
        b1 = self.b1
        if not b1:
            return
        for key in keys[held:]:
            if b1.get(key) == _REFUSED:
                b1[key] = _SEEN_AGAIN
            elif key not in b1 and key not in self.b2:
                break  # refusals cover a chain's tail: nothing refused past a new key
