"""Admission at the second sighting: a new chunk is stored once a second request asks for it.

Most chunks a request brings are never asked for again (one-off documents, the last turn
of a conversation, a sub-task's private tail); a chunk some other request already asked
for is likely to be asked for again. A :class:`Doorkeeper` remembers which chunks were seen
by exactly one request so far (*first sightings*) and refuses them in a full tier: each
reusable chunk then costs one miss more than under LRU (the request that sees it a second
time stores it), and in exchange one-off chunks never displace what the tier holds. It is
TinyLFU's doorkeeper idea (admit by frequency, here the simplest: seen before or not),
applied per chain: a chunk is only useful if its prefix is held, so a chain is refused from
its first first-sighted chunk on.

Why a chain's first sightings are a suffix of it (so each query is a binary search): a
request sees all its keys at once, so when a key was seen, so was every ancestor, at the
same time or later; a key stops being a first sighting when another request walks over it,
and that request walks over its ancestors too.

History: keys are remembered in two generations of at most ``HISTORY / 2`` x capacity keys
each; when the current one fills, it becomes the old one and the old one is dropped, so a
key is remembered for between ``HISTORY / 2`` and ``HISTORY`` x capacity newly seen keys.
Dropping a whole generation keeps prefix-closure (a key's ancestors were added with it or
later).

Sampling: with ``stride > 1`` only keys whose last two bytes (digest bytes, uniform; the
first ones are a group tag, :mod:`kvtier.keys`) are a multiple of ``stride`` are
remembered, and the capacity counts sampled keys, so memory does not grow with the tier. A
chain is then refused from its first *sampled* first sighting: up to about ``stride``
chunks of a new tail before it may be stored. :class:`DoorkeeperLRUPolicy` samples tiers
of more than ``EXACT_SLOTS`` chunks.

Cost per request: C-level passes over the request's *new* chunks only (one Python-level
filter when sampled) and binary searches; a request whose chain the tier holds costs
nothing. Memory: at most ``2 x HISTORY`` x capacity / stride key references.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from itertools import repeat

from kvtier.keys import Key
from kvtier.policies.eviction import LRUPolicy

HISTORY = 8
"""Keys remembered, in multiples of the tier's capacity (see the module docstring)."""
EXACT_SLOTS = 16384
"""Tiers up to this many chunks have an exact doorkeeper; larger ones a sampled one of
about this many keys' capacity (memory: at most ``2 x HISTORY x EXACT_SLOTS`` keys)."""


class Doorkeeper:
    """Which chunks only one request has asked for so far (see the module docstring)."""

    def __init__(self, capacity: int, history: int = HISTORY, stride: int = 1) -> None:
        self.stride = max(1, stride)
        self.limit = max(1, history * max(1, capacity) // (2 * self.stride))
        """Keys per generation."""
        self._seen: set[Key] = set()
        self._seen_old: set[Key] = set()
        self._first: dict[Key, None] = {}
        self._first_old: dict[Key, None] = {}

    def _was_seen(self, key: Key) -> bool:
        return key in self._seen or key in self._seen_old

    def is_first(self, key: Key) -> bool:
        """Whether ``key`` was seen by one request only (and is still remembered)."""
        return key in self._first or key in self._first_old

    def observe(self, keys: Sequence[Key], held: int) -> None:
        """A request asks for ``keys`` (root first), of which the tier holds ``held``: the
        rest are either seen again (no longer first sightings) or seen for the first time."""
        tail = keys[held:]
        if self.stride > 1:
            tail = [k for k in tail if self._sampled(k)]
        if not tail:
            return
        lo, hi = 0, len(tail)
        while lo < hi:  # the seen keys are a prefix of the tail (module docstring)
            mid = (lo + hi) // 2
            if self._was_seen(tail[mid]):
                lo = mid + 1
            else:
                hi = mid
        if lo:
            again = tail[:lo]
            deque(map(self._first.pop, again, repeat(None)), maxlen=0)
            deque(map(self._first_old.pop, again, repeat(None)), maxlen=0)
        if lo < len(tail):
            self._first.update(dict.fromkeys(tail[lo:]))
            if len(self._first) > self.limit:
                self._first_old, self._first = self._first, {}
        self._seen.update(tail)
        if len(self._seen) > self.limit:
            self._seen_old, self._seen = self._seen, set()

    def remembered(self) -> tuple[int, int, int, int]:
        """Keys each generation holds (seen, seen before; first sightings, first sightings
        before): the doorkeeper's memory. Each holds at most ``limit`` keys plus one
        request's before it becomes the older generation."""
        return len(self._seen), len(self._seen_old), len(self._first), len(self._first_old)

    def _sampled(self, key: Key) -> bool:
        return (key[-1] | key[-2] << 8) % self.stride == 0  # digest bytes (not the tag)

    def admitted(self, keys: Sequence[Key]) -> int:
        """How many leading ``keys`` (a chain's new chunks) are not first sightings: the
        chain up to its first chunk that only one request asked for (up to its first
        sampled one, when sampled)."""
        where: Sequence[int] = range(len(keys))
        if self.stride > 1:
            where = [i for i, k in enumerate(keys) if self._sampled(k)]
        lo, hi = 0, len(where)
        while lo < hi:  # first sightings are a suffix of the chain (module docstring)
            mid = (lo + hi) // 2
            if self.is_first(keys[where[mid]]):
                hi = mid
            else:
                lo = mid + 1
        return where[lo] if lo < len(where) else len(keys)


class DoorkeeperLRUPolicy(LRUPolicy):
    """LRU's order; a full tier stores a chain's new chunks up to the first one only one
    request has asked for (:class:`Doorkeeper`). Only a single tier is asked what to store
    (a stack stores every chain): the doorkeeper is created at the first ``admit_chain``,
    so a tier never asked is plain LRU and pays for no history."""

    observe_refreshes = True

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.door: Doorkeeper | None = None

    def observe(self, keys: Sequence[Key], held: int) -> None:
        if self.door is not None:
            self.door.observe(keys, held)
        if held:
            self.touch_many(keys[held - 1 :: -1])

    def admit_chain(self, keys: Sequence[Key]) -> int:
        door = self.door
        if door is None:
            stride = math.ceil(max(1, self.capacity) / EXACT_SLOTS)
            door = self.door = Doorkeeper(self.capacity, stride=stride)
            door.observe(keys, 0)  # the asking request's sighting, observed before
        if len(self._order) + len(keys) <= self.capacity:
            return len(keys)
        return door.admitted(keys)
