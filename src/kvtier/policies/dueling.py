"""The default policy: dueling shadow caches pick the leader, with a budget against LRU.

The tier's chunks are ordered by one *leader* policy: ``lru``, ``arc`` (chain-aware ARC,
:mod:`kvtier.policies.chain_arc`) or ``adaptive-arc`` (the same plus admission,
:mod:`kvtier.policies.adaptive`). Which one leads is decided online:

- *Shadows.* Each candidate also runs in a key-only :class:`~kvtier.policies.shadow.ShadowCache`
  fed every ``stride``-th key of each chain (by depth), ``stride = ceil(capacity /
  SHADOW_SLOTS)``: a tier of up to ``SHADOW_SLOTS`` chunks has exact (unsampled) shadows.
  Shadows score hit blocks; scores halve every window (``WINDOW`` x shadow capacity sampled
  blocks). At each window's end the best-scoring candidate becomes the *preference* if it
  beats the current one by ``MARGIN`` (hysteresis: no flapping on noise).
- *Budget against LRU.* The policy counts the tier's own hit blocks (``observe``'s
  ``held``, exact) and estimates LRU's from the LRU shadow; ``deficit`` = LRU's - ours. A
  leader other than LRU is allowed only while ``deficit <= BUDGET x blocks requested``;
  past that the leader becomes LRU, and returns to the preference only once the deficit is
  under half the budget. It also counts ``diverged``: keys the LRU shadow holds that the
  tier does not, and records it at each switch to LRU (``switch_diverged``).

Why that bounds the loss against LRU (exact shadows, stores that complete, as in
``kvtier sim``): an LRU cache's content is the last ``capacity`` distinct keys used,
whatever it held before. After a switch to LRU the tier's order puts every key used since
in front of every key used before, so once ``capacity`` distinct keys have been used the
tier holds exactly what LRU holds and hits exactly when LRU hits; until then a block LRU
hits and the tier misses is a key LRU held and the tier did not, each at most once: at most
``switch_diverged`` blocks. The check runs before every request, so under a non-LRU leader
the deficit exceeds the budget by at most one request. Hence, at every point::

    hit blocks >= LRU's hit blocks - BUDGET x blocks requested - longest request (blocks)
                  - switch_diverged (what the last switch to LRU may still cost)

(``tests/policies/test_dueling.py`` checks exactly this on random traces, against a real LRU
replay.) ``switch_diverged`` is at most the capacity; on the traces of
``benchmarks/policy_table.py`` the worst cell is well inside 0.5 points (docs/policy.md).
With sampled shadows (``stride > 1``) the deficit is an estimate (sampled hits x stride)
and the bound holds up to its sampling error. In an engine, pins, in-flight and failed
stores make the tier differ from the shadows' model by what those hold back.

Switching: the new leader is rebuilt from the tier's content in one O(capacity) pass (an
LRU order from ARC's lists T1, T2, parked keys; an ARC with every key in T1 that starts
from its shadow's ``p``, ghosts (exact shadows only) and category reuse rates), so only the
leader's bookkeeping runs per request. Cost per request beyond the leader's own: one
slice of the chain, and each shadow's replay of ``len(chain) / stride`` keys; memory: three
shadows of at most ``SHADOW_SLOTS`` keys each plus their ghosts.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain

from kvtier.keys import Key
from kvtier.policies.adaptive import AdaptivePolicy
from kvtier.policies.categories import CategoryReuse
from kvtier.policies.chain_arc import ChainARCPolicy
from kvtier.policies.eviction import EvictionPolicy, LRUPolicy
from kvtier.policies.shadow import ShadowCache

SHADOW_SLOTS = 1024
"""Keys per shadow: a tier of up to this many chunks has exact shadows."""
BUDGET = 0.004
"""Hit blocks the policy may lose against LRU, as a share of the blocks requested."""
MARGIN = 0.02
"""A candidate becomes the preference when its window score beats the current one's by
this share (plus one block)."""
WINDOW = 2
"""Scores halve every ``WINDOW`` x shadow capacity sampled blocks requested."""
CANDIDATES: tuple[str, ...] = ("lru", "arc", "adaptive-arc")
"""What may lead, by index: 0 is LRU (the budget's fallback)."""
_LRU, _ARC, _ADAPTIVE = 0, 1, 2


class DuelingPolicy(EvictionPolicy):
    """A leader chosen by shadow caches, held within a budget against LRU (module docs)."""

    observe_refreshes = True

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        cap = max(1, capacity)
        self.stride = max(1, math.ceil(cap / SHADOW_SLOTS))
        shadow_cap = max(1, cap // self.stride)
        self.shadows = (
            ShadowCache(LRUPolicy(shadow_cap), on_store=self._lru_stored, on_evict=self._lru_gone),
            ShadowCache(ChainARCPolicy(shadow_cap)),
            ShadowCache(AdaptivePolicy(shadow_cap), admission=True),
        )
        self.mode = _LRU
        """The leader's index in :data:`CANDIDATES`; LRU until a shadow beats it."""
        self.preferred = _LRU
        """What the shadows prefer (the leader unless the budget holds it at LRU)."""
        self.lru: LRUPolicy | None = LRUPolicy(capacity)
        self.arc: AdaptivePolicy | None = None
        self.scores = [0.0] * len(CANDIDATES)
        self.window = WINDOW * shadow_cap
        self._since = 0
        self._held_back = False
        self.requested = 0
        """Blocks requested so far (sum of chain lengths observed)."""
        self.hit_blocks = 0
        """The tier's own hit blocks so far."""
        self.diverged = 0
        """Sampled keys the LRU shadow holds and the tier does not."""
        self.switches = 0
        """Leader changes so far (inspection, tests)."""
        self.switch_diverged = 0
        """``diverged`` (x stride) at the last switch to LRU: what its transient may cost."""

    # -- the budget ------------------------------------------------------------------------

    @property
    def lru_hit_estimate(self) -> int:
        """LRU's hit blocks so far, from its shadow (exact when ``stride`` is 1)."""
        return self.shadows[_LRU].hits * self.stride

    @property
    def deficit(self) -> int:
        """LRU's hit blocks minus the tier's (negative: the tier is ahead)."""
        return self.lru_hit_estimate - self.hit_blocks

    def _over_budget(self, share: float) -> bool:
        return self.deficit > share * BUDGET * self.requested

    def _has(self, key: Key) -> bool:
        if self.lru is not None:
            return key in self.lru._order
        arc = self.arc
        assert arc is not None
        return key in arc.t2 or key in arc.t1 or key in arc.parked

    def _missing(self, keys: Sequence[Key]) -> int:
        """How many of ``keys`` the tier does not hold (one C-level pass under LRU)."""
        if self.lru is not None:
            return len(keys) - sum(map(self.lru._order.__contains__, keys))
        return sum(not self._has(k) for k in keys)

    def _lru_stored(self, keys: Sequence[Key]) -> None:
        self.diverged += self._missing(keys)

    def _lru_gone(self, keys: Sequence[Key]) -> None:
        self.diverged -= self._missing(keys)

    # -- choosing the leader ---------------------------------------------------------------

    def observe(self, keys: Sequence[Key], held: int) -> None:
        self.requested += len(keys)
        self.hit_blocks += held
        sampled = keys if self.stride == 1 else keys[self.stride - 1 :: self.stride]
        if sampled:
            scores = self.scores
            for i, shadow in enumerate(self.shadows):
                scores[i] += shadow.request(sampled)
            self._since += len(sampled)
            if self._since >= self.window:
                self._end_window()
        want = self.preferred
        if want != _LRU:
            if self._held_back:
                self._held_back = self._over_budget(0.5)
            else:
                self._held_back = self._over_budget(1.0)
            if self._held_back:
                want = _LRU
        if want != self.mode:
            if want == _LRU:
                self.switch_diverged = self.diverged * self.stride
            self._switch(want)
        if self.lru is not None:
            if held:
                self.lru.touch_many(keys[held - 1 :: -1])
        else:
            assert self.arc is not None
            self.arc.observe(keys, held)

    def _end_window(self) -> None:
        scores = self.scores
        best = max(range(len(scores)), key=scores.__getitem__)
        cur = self.preferred
        if best != cur and scores[best] > scores[cur] * (1 + MARGIN) + 1:
            self.preferred = best
        self.scores = [s / 2 for s in scores]
        self._since = 0

    def _switch(self, mode: int) -> None:
        """Make ``mode`` the leader; the ARC family shares one policy object."""
        self.switches += 1
        if mode == _LRU and self.lru is None:
            arc = self.arc
            assert arc is not None
            fresh = LRUPolicy(self.capacity)
            fresh._order = OrderedDict.fromkeys(chain(arc.t1, arc.t2, arc.parked))
            self.lru, self.arc = fresh, None
        elif mode != _LRU and self.arc is None:
            old = self.lru
            assert old is not None
            self.lru, self.arc = None, self._arc_from(old, mode)
        self.mode = mode

    def _arc_from(self, lru: LRUPolicy, mode: int) -> AdaptivePolicy:
        """An ARC over the tier's content (all in T1, LRU order) that starts from what the
        mode's shadow learned: its ``p`` (scaled), its ghosts (exact shadows only) and its
        category reuse rates."""
        arc = AdaptivePolicy(self.capacity)
        arc.t1 = OrderedDict.fromkeys(lru._order)
        src = self.shadows[mode].policy
        assert isinstance(src, ChainARCPolicy)
        arc.p = min(float(max(1, self.capacity)), src.p * self.stride)
        if self.stride == 1:
            t1 = arc.t1
            arc.b1 = OrderedDict((k, None) for k in src.b1 if k not in t1)
            arc.b2 = OrderedDict.fromkeys(k for k in src.b2 if k not in t1)
        cats = getattr(src, "categories", None)
        if mode == _ADAPTIVE and cats is not None:
            own = arc.categories = CategoryReuse(self.capacity)
            own.reused, own.born = list(cats.reused), list(cats.born)
            if self.stride == 1:
                own.marks = OrderedDict(cats.marks)
        return arc

    @property
    def leader(self) -> EvictionPolicy:
        """The policy ordering the tier now."""
        got = self.lru if self.lru is not None else self.arc
        assert got is not None
        return got

    # -- the tier's calls, to the leader ---------------------------------------------------

    def admit_chain(self, keys: Sequence[Key]) -> int:
        if self.mode != _ADAPTIVE or self.arc is None:
            return len(keys)
        return self.arc.admit_chain(keys)

    def insert(self, key: Key) -> None:
        self.leader.insert(key)
        if key in self.shadows[_LRU]:
            self.diverged -= 1

    def insert_chain(self, keys: Sequence[Key], parent: Key | None) -> None:
        self.leader.insert_chain(keys, parent)
        shadow = self.shadows[_LRU].parent
        if shadow:
            self.diverged -= sum(map(shadow.__contains__, keys))

    def touch(self, key: Key) -> None:
        self.leader.touch(key)

    def touch_many(self, keys: Iterable[Key]) -> None:
        self.leader.touch_many(keys)

    def defer(self, keys: Sequence[Key]) -> None:
        self.leader.defer(keys)

    def on_leaf(self, key: Key) -> None:
        self.leader.on_leaf(key)

    def remove(self, key: Key, evicted: bool = False) -> None:
        if self._has(key) and key in self.shadows[_LRU]:
            self.diverged += 1
        self.leader.remove(key, evicted)

    def candidates(self) -> Iterator[Key]:
        return self.leader.candidates()

    def __len__(self) -> int:
        return len(self.leader)
