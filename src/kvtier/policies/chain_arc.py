"""ARC for prefix-closed tiers: reuse counted per request, no repeated scans past inner keys.

:class:`~kvtier.policies.eviction.ARCPolicy` keeps T1 (keys used by one request since they
were stored) and T2 (keys reused since) with ghost lists B1/B2 that adapt the target size
``p`` of T1 (Megiddo & Modha, FAST'03). In a prefix tree its order can offer a key before its
descendants: T2's LRU end is often the head of a chain whose fresh tail is still in T1 (a hot
system prompt or conversation prefix). The tier must skip such a key, and plain ARC offers it
again on every eviction: a scan that grows with the number of hot prefixes.

This variant changes the bookkeeping, not ARC's choices:

- *T2 is closed under ancestors*: ``observe`` promotes a request's stored prefix (a
  root-closed chain), and ``insert_chain`` puts a ghost-hit key into T2 only when its
  parent is in T2. So T1 -> T2 order meets leaves first.
- *Parking*: a key the tier passed over because it still has children (``defer``) leaves
  the candidate order; when its last child goes (``on_leaf``) it returns to the LRU end of
  its list, where ARC would have found it, or at the most recent end if it was used or
  touched meanwhile (a parked T1 key that is used moves to T2). A key is passed over at
  most once per time it becomes inner, so eviction is O(1) amortised.

Reuse is counted once per request (``observe``); ``touch`` only refreshes recency.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from itertools import repeat

from kvtier.keys import Key
from kvtier.policies.eviction import ARCPolicy

_NOT_PARKED = (False, False)


class ChainARCPolicy(ARCPolicy):
    """ARC whose order respects the prefix tree (see the module docstring)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.parked: dict[Key, tuple[bool, bool]] = {}
        """Keys out of the candidate order until they are leaves again: key -> (in T2,
        used or touched since parked)."""
        self.parks = 0
        """Keys parked so far (inspection and tests)."""
        self._parked_t1 = 0

    # -- stores ----------------------------------------------------------------------------

    def insert(self, key: Key) -> None:
        # Without a known parent the key cannot join T2 safely (restores, tests).
        self._ghost_hit(key)
        self.t1[key] = None

    def insert_chain(self, keys: Sequence[Key], parent: Key | None) -> None:
        if self.b1.keys().isdisjoint(keys) and self.b2.keys().isdisjoint(keys):
            # No ghost among them (the usual case): no ghost hit, so all go to T1, deepest
            # first, in one C-level pass (what the loop below does then).
            self.t1.update(zip(reversed(keys), repeat(None)))
            return
        self.insert_chain_each(keys, parent)

    def insert_chain_each(self, keys: Sequence[Key], parent: Key | None) -> None:
        """:meth:`insert_chain` a key at a time: ghost hits adapt ``p`` in order."""
        to_t2 = parent is None or parent in self.t2 or self.parked.get(parent, (False,))[0]
        n_t2 = 0
        for key in keys:
            to_t2 = self._ghost_hit(key) and to_t2
            if to_t2:
                n_t2 += 1
        # Deepest first within each list, so ancestors are the more recent.
        t1, t2 = self.t1, self.t2
        for key in reversed(keys[n_t2:]):
            t1[key] = None
        for key in reversed(keys[:n_t2]):
            t2[key] = None

    def _ghost_hit(self, key: Key) -> bool:
        """Adapt ``p`` if ``key`` is a ghost (ARC's rule); True when it was one."""
        c = float(max(1, self.capacity))
        if key in self.b1:
            self.p = min(c, self.p + max(1.0, len(self.b2) / max(1, len(self.b1))))
            del self.b1[key]
            return True
        if key in self.b2:
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / max(1, len(self.b2))))
            del self.b2[key]
            return True
        return False

    # -- use and recency -------------------------------------------------------------------

    def observe(self, keys: Sequence[Key], held: int) -> None:
        t1, t2, parked = self.t1, self.t2, self.parked
        # The held prefix is [T2 part][T1 part] (T2 is ancestor-closed), so the boundary is
        # a binary search. Promote the T1 part, then refresh the T2 part, both tail first
        # (ancestors end up the most recent) and in C-level passes when they can.
        lo, hi = 0, held
        while lo < hi:
            mid = (lo + hi) // 2
            k = keys[mid]
            if k in t2 or parked.get(k, _NOT_PARKED)[0]:
                lo = mid + 1
            else:
                hi = mid
        if lo < held:
            tail = keys[held - 1 : lo - 1 if lo else None : -1]
            try:
                deque(map(t1.__delitem__, tail), maxlen=0)
                deque(map(t2.__setitem__, tail, repeat(None)), maxlen=0)
            except KeyError:  # a parked key among them: one by one (every tail key is
                # stored, so one found nowhere is one the pass above took out of T1)
                for key in tail:
                    if key in parked:
                        self._parked_t1 -= not parked[key][0]
                        parked[key] = (True, True)
                    else:
                        t1.pop(key, None)
                        t2[key] = None
                        t2.move_to_end(key)
        if lo:
            self._refresh(keys[lo - 1 :: -1])

    def touch(self, key: Key) -> None:
        if key in self.t1:
            self.t1.move_to_end(key)
        elif key in self.t2:
            self.t2.move_to_end(key)
        elif key in self.parked:
            self.parked[key] = (self.parked[key][0], True)

    def touch_many(self, keys: Iterable[Key]) -> None:
        keys = list(keys)
        t1, t2, parked = self.t1, self.t2, self.parked
        try:
            deque(map(t2.move_to_end, keys), maxlen=0)
        except KeyError:  # some keys are in T1 or parked: each list in one C-level pass,
            # in the keys' order (what a touch per key leaves: the lists are independent)
            deque(map(t1.move_to_end, filter(t1.__contains__, keys)), maxlen=0)
            deque(map(t2.move_to_end, filter(t2.__contains__, keys)), maxlen=0)
            for key in filter(parked.__contains__, keys):
                parked[key] = (parked[key][0], True)

    def _refresh(self, keys: Sequence[Key]) -> None:
        """A use of T2 keys: to T2's most recent end, in order."""
        try:
            deque(map(self.t2.move_to_end, keys), maxlen=0)
        except KeyError:
            for key in keys:
                if key in self.t1:  # only if the ancestor closure was broken: promote
                    del self.t1[key]
                    self.t2[key] = None
                elif key in self.parked:
                    self._parked_t1 -= not self.parked[key][0]
                    self.parked[key] = (True, True)
                else:
                    self.t2.move_to_end(key)

    # -- eviction order --------------------------------------------------------------------

    def defer(self, keys: Sequence[Key]) -> None:
        for key in keys:
            if key in self.t2:
                del self.t2[key]
                self.parked[key] = (True, False)
            elif key in self.t1:
                del self.t1[key]
                self.parked[key] = (False, False)
                self._parked_t1 += 1
            else:
                continue
            self.parks += 1

    def on_leaf(self, key: Key) -> None:
        got = self.parked.pop(key, None)
        if got is None:
            return
        in_t2, used = got
        self._parked_t1 -= not in_t2
        lst = self.t2 if in_t2 else self.t1
        lst[key] = None
        if not used:  # where ARC would have found it: next in line
            lst.move_to_end(key, last=False)

    def remove(self, key: Key, evicted: bool = False) -> None:
        if key in self.parked:  # dropped (invalidated) while inner: no ghost
            self._parked_t1 -= not self.parked.pop(key)[0]
            return
        super().remove(key, evicted)

    def candidates(self) -> Iterator[Key]:
        # ARC's choice, with parked T1 keys counted in T1's size.
        t1, t2 = self.t1, self.t2
        if t1 and (len(t1) + self._parked_t1 > self.p or not t2):
            yield from t1
            yield from t2
        else:
            yield from t2
            yield from t1

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2) + len(self.parked)
