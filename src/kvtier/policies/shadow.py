"""Shadow caches: a key-only replay of one eviction policy, for choosing a policy online.

A :class:`ShadowCache` runs a policy over a prefix-closed cache of ``capacity`` keys that
holds no data: per request it answers how long a prefix of the chain it holds, refreshes
it, stores the rest (asking the policy's ``admit_chain`` when admission is on; the held
ancestors are refreshed again after the store, as a real reservation does) and evicts
leaves in the policy's order, as :class:`kvtier.tiers.index.SlotIndex` and the manager's
store planner do for a real tier (the chain's deepest held key is protected, a key offered
before its children is skipped and handed to ``defer``, ``on_leaf`` when its last child
goes; no pins or in-flight keys, since a shadow's stores complete at once).

Sampling: a dueling policy feeds its shadows every ``stride``-th key of a chain, by
depth (``keys[stride - 1 :: stride]``): a key's depth is a property of the key (its
prefix), so the sample is consistent across requests, costs one C-level slice, and the
sampled keys of a chain form a chain of the sampled tree. A shadow of ``capacity / stride``
keys then stands for a cache of ``capacity``; its hit count times ``stride`` estimates
that cache's hit blocks (exact when ``stride`` is 1).

Cost per request: O(sampled chain) for the refresh, O(log) for the held prefix (the
shadow is prefix-closed, so presence is monotone along the chain), O(1) amortised per
stored or evicted key. Memory: ``capacity`` keys plus the policy's ghosts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat

from kvtier.keys import Key
from kvtier.policies.eviction import EvictionPolicy

KeysHook = Callable[[Sequence[Key]], None]
"""Told of keys a shadow stored or evicted (the dueling policy counts divergence)."""


class ShadowCache:
    """One policy's key-only cache (see the module docstring). Single-threaded."""

    def __init__(
        self,
        policy: EvictionPolicy,
        admission: bool = False,
        on_store: KeysHook | None = None,
        on_evict: KeysHook | None = None,
    ) -> None:
        self.policy = policy
        self.capacity = max(1, policy.capacity)
        self.admission = admission
        self.parent: dict[Key, Key | None] = {}
        """Stored keys -> their (sampled) parent; the shadow's content."""
        self.children: dict[Key, int] = {}
        """Stored keys with stored children -> how many."""
        self.hits = 0
        """Sampled hit blocks so far."""
        self.on_store = on_store
        self.on_evict = on_evict

    def __contains__(self, key: Key) -> bool:
        return key in self.parent

    def __len__(self) -> int:
        return len(self.parent)

    def held(self, keys: Sequence[Key]) -> int:
        """Length of the prefix of ``keys`` the shadow holds (content is prefix-closed)."""
        parent = self.parent
        lo, hi = 0, len(keys)
        while lo < hi:
            mid = (lo + hi) // 2
            if keys[mid] in parent:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def request(self, keys: Sequence[Key]) -> int:
        """Replay one request's (sampled) chain; returns its hit length in the shadow."""
        held = self.held(keys)
        self.hits += held
        policy = self.policy
        policy.observe(keys, held)
        if held and not policy.observe_refreshes:
            policy.touch_many(keys[held - 1 :: -1])
        new = keys[held:]
        if not new:
            return held
        if self.admission:
            new = new[: policy.admit_chain(new)]
            if not new:
                return held
        top = keys[held - 1] if held else None
        need = len(self.parent) + len(new) - self.capacity
        if need > 0:
            got = self._evict(need, top)
            if got < need:  # as a reservation that finds too few leaves: a shorter chain
                new = new[: len(new) - (need - got)]
                if not new:
                    return held
        # Each new key's parent is the key before it (the first's, the held top); each but
        # the last has one child: C-level passes, where a shadow replays hundreds a request.
        self.parent.update(zip(new, [top, *new[:-1]], strict=True))
        if held:
            anc = keys[held - 1]
            self.children[anc] = self.children.get(anc, 0) + 1
        self.children.update(zip(new[:-1], repeat(1)))
        policy.insert_chain(new, keys[held - 1] if held else None)
        if held:  # as the tier does: ancestors stay more recent than their descendants
            policy.touch_many(keys[held - 1 :: -1])
        if self.on_store is not None:
            self.on_store(new)
        return held

    def _evict(self, n: int, protect: Key | None) -> int:
        """Evict up to ``n`` leaves in the policy's order; returns how many went."""
        got = 0
        while got < n:
            victims: list[Key] = []
            inner: list[Key] = []
            gone: dict[Key, int] = {}
            children = self.children
            for key in self.policy.candidates():
                if key == protect:
                    continue
                if children.get(key, 0) > gone.get(key, 0):
                    inner.append(key)
                    continue
                victims.append(key)
                par = self.parent[key]
                if par is not None:
                    gone[par] = gone.get(par, 0) + 1
                if len(victims) == n - got:
                    break
            for key in victims:
                self._remove(key)
            if inner:
                self.policy.defer([k for k in inner if k in self.parent and k in children])
            if self.on_evict is not None and victims:
                self.on_evict(victims)
            if not victims:
                break
            got += len(victims)
        return got

    def _remove(self, key: Key) -> None:
        par = self.parent.pop(key)
        self.policy.remove(key, evicted=True)
        if par is not None:
            left = self.children[par] - 1
            if left:
                self.children[par] = left
            else:
                del self.children[par]
                self.policy.on_leaf(par)
