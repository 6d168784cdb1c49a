"""Eviction policies: the order in which a tier gives up its chunks.

A policy only orders keys. The tier decides which of them may leave now (not pinned, not in
flight, no stored descendants) by filtering :meth:`EvictionPolicy.candidates`, and tells the
policy what it removed. This keeps every policy small and lets the tier enforce its
invariants in one place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator

from kvtier.keys import Key


class EvictionPolicy(ABC):
    """Orders the keys of one tier for eviction.

    Contract: ``insert`` is called once per stored key, ``touch`` on every reuse, ``remove``
    when the key leaves (``evicted=True`` when it left because of this policy's choice, so
    policies with ghost lists can remember it). ``candidates`` yields every key exactly once,
    first the one to evict first; it must not be mutated while iterating.
    """

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
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.p = 0.0
        self.t1: OrderedDict[Key, None] = OrderedDict()
        self.t2: OrderedDict[Key, None] = OrderedDict()
        self.b1: OrderedDict[Key, None] = OrderedDict()
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

    def touch(self, key: Key) -> None:
        if key in self.t1:
            del self.t1[key]
            self.t2[key] = None
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
