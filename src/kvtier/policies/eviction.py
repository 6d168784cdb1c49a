"""Eviction policies: the order in which a tier gives up its chunks.

A policy only orders keys. The tier decides which of them may leave now (not pinned, not in
flight, no stored descendants) by filtering :meth:`EvictionPolicy.candidates`, and tells the
policy what it removed. This keeps every policy small and lets the tier enforce its
invariants in one place.

*Use* and *recency* are separate signals. :meth:`EvictionPolicy.observe` is one request's
use of a chain, called once per request; :meth:`EvictionPolicy.touch` only refreshes recency
and may come many times per request (every store of a chunked prefill touches the chain's
ancestors, a preempted request is allocated again). Policies that count reuse (ARC's second
list, frequency sketches) count it in ``observe`` only, so repeated touches of one request
are never mistaken for repeated use.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat

from kvtier.keys import Key


class EvictionPolicy(ABC):
    """Orders the keys of one tier for eviction.

    Contract: ``insert`` (or ``insert_chain``) is called once per stored key, ``observe``
    once per request with the request's chain, ``touch`` whenever recency is refreshed,
    ``remove`` when the key leaves (``evicted=True`` when it left because of this policy's
    choice, so policies with ghost lists can remember it). ``candidates`` yields every key
    exactly once, first the one to evict first; it must not be mutated while iterating. All
    calls come from the tier's owner thread and cost O(1) amortised per key.

    Ordering rule: the tier evicts leaves only, so a policy should yield a key after its
    stored descendants; a key it yields too early is skipped and handed to ``defer``.

    ``insert_chain`` and ``admit_chain`` must not depend on the recency order (membership
    and counts only): a slot index defers a store's touch of its ancestors past the same
    chain's next insert (:meth:`kvtier.tiers.index.SlotIndex.reserve`).
    """

    observe_refreshes = False
    """Whether ``observe`` leaves the stored prefix exactly as ``touch_many`` of it, tail
    first, would (the most recent, ancestors last), so the tier may skip a touch that
    follows it with nothing in between."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    @abstractmethod
    def insert(self, key: Key) -> None:
        """A new key was stored."""

    @abstractmethod
    def touch(self, key: Key) -> None:
        """A stored key was used again."""

    def touch_many(self, keys: Iterable[Key]) -> None:
        """``touch`` each key in order (the last one ends up the most recent)."""
        for key in keys:
            self.touch(key)

    def insert_chain(self, keys: Sequence[Key], parent: Key | None) -> None:
        """``keys``, a chain continuing the stored key ``parent`` (None: from the root), were
        stored in one reservation. Default: ``insert`` deepest first, so that after the
        tier touches the ancestors every one of them is more recent than its descendants."""
        for key in reversed(keys):
            self.insert(key)

    def admit_chain(self, keys: Sequence[Key]) -> int:
        """How many leading ``keys`` (a chain the tier lacks, about to be stored) are worth
        storing now; the store planner stores only those (asked only when the tier is the
        only one: a next tier gets what this one stores). A request may ask
        again on every engine step: the answer must change only through ``observe`` (other
        requests), never through asking again. Default: all of them."""
        return len(keys)

    def observe(self, keys: Sequence[Key], held: int) -> None:
        """One request uses this chain: ``keys`` are all its chunk keys, root first, of
        which the first ``held`` are stored (READY) in this tier. Called once per request,
        before its hit is touched; the only place a policy may count reuse."""

    def defer(self, keys: Sequence[Key]) -> None:
        """The tier passed over these candidates (in candidate order) because they still
        have stored children. A policy whose order can put a key before its descendants
        should stop offering them until :meth:`on_leaf` (LRU orders never need to)."""

    def on_leaf(self, key: Key) -> None:
        """The last stored child of ``key`` left: it may be evicted again."""

    @abstractmethod
    def remove(self, key: Key, evicted: bool = False) -> None:
        """The key left the tier."""

    @abstractmethod
    def candidates(self) -> Iterator[Key]:
        """Keys in eviction order."""

    @abstractmethod
    def __len__(self) -> int: ...


class LRUPolicy(EvictionPolicy):
    """Least recently used first."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._order: OrderedDict[Key, None] = OrderedDict()

    def insert(self, key: Key) -> None:
        self._order[key] = None
        self._order.move_to_end(key)

    def touch(self, key: Key) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def insert_chain(self, keys: Sequence[Key], parent: Key | None) -> None:
        order = self._order
        if any(map(order.__contains__, keys)):  # a re-insert moves: key by key
            super().insert_chain(keys, parent)
            return
        # Deepest first, as the default does, in one C-level pass (8,192 keys a 128k store).
        order.update(zip(reversed(keys), repeat(None)))

    def touch_many(self, keys: Iterable[Key]) -> None:
        # A C-level loop: a 128k-token hit touches 8,192 keys on the scheduler's thread.
        # Every key must be present (callers touch what a lookup found).
        deque(map(self._order.move_to_end, keys), maxlen=0)

    def remove(self, key: Key, evicted: bool = False) -> None:
        self._order.pop(key, None)

    def candidates(self) -> Iterator[Key]:
        return iter(self._order)

    def __len__(self) -> int:
        return len(self._order)


class ARCPolicy(EvictionPolicy):
    """Adaptive Replacement Cache (Megiddo & Modha, FAST'03).

    T1 holds keys seen once recently, T2 keys seen at least twice; ghost lists B1/B2 remember
    keys recently evicted from each, and a hit in a ghost list moves the target size ``p`` of
    T1 toward the list that would have kept it. Eviction takes T1's LRU end while T1 exceeds
    ``p``, else T2's, and falls back to the other list when every candidate is held.

    A key moves to T2 when a request uses it (``observe``), never on a ``touch``: the store
    of each new chunk touches its ancestors, which would otherwise promote a chain that one
    request prefilled over several steps.
    """

    observe_refreshes = True

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.p = 0.0
        self.t1: OrderedDict[Key, None] = OrderedDict()
        self.t2: OrderedDict[Key, None] = OrderedDict()
        self.b1: OrderedDict[Key, int | None] = OrderedDict()
        """Ghosts of T1 (value None); subclasses may mark entries with small ints."""
        self.b2: OrderedDict[Key, None] = OrderedDict()

    def insert(self, key: Key) -> None:
        c = max(1, self.capacity)
        if key in self.b1:
            self.p = min(float(c), self.p + max(1.0, len(self.b2) / max(1, len(self.b1))))
            del self.b1[key]
            self.t2[key] = None
        elif key in self.b2:
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / max(1, len(self.b2))))
            del self.b2[key]
            self.t2[key] = None
        else:
            self.t1[key] = None

    def observe(self, keys: Sequence[Key], held: int) -> None:
        t1, t2 = self.t1, self.t2
        for key in reversed(keys[:held]):  # tail first: ancestors end up the most recent
            if key in t1:
                del t1[key]
                t2[key] = None
            elif key in t2:
                t2.move_to_end(key)

    def touch(self, key: Key) -> None:
        if key in self.t1:
            self.t1.move_to_end(key)
        elif key in self.t2:
            self.t2.move_to_end(key)

    def remove(self, key: Key, evicted: bool = False) -> None:
        c = max(1, self.capacity)
        if key in self.t1:
            del self.t1[key]
            if evicted:
                self.b1[key] = None
                while len(self.b1) > c:
                    self.b1.popitem(last=False)
        elif key in self.t2:
            del self.t2[key]
            if evicted:
                self.b2[key] = None
                while len(self.b2) > c:
                    self.b2.popitem(last=False)

    def candidates(self) -> Iterator[Key]:
        if self.t1 and (len(self.t1) > self.p or not self.t2):
            yield from self.t1
            yield from self.t2
        else:
            yield from self.t2
            yield from self.t1

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)
