"""Admission policies: whether a chunk is worth storing at all."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import compress, count

from kvtier.keys import Key


class AdmissionPolicy:
    """Store every chunk. Subclasses may refuse chunks unlikely to be reused.

    ``observe`` is called for every key a lookup walks past (hit or miss), ``admit`` when a
    chunk could be stored; admission is decided per key and never blocks.
    """

    def observe(self, keys: Iterable[Key]) -> None:
        """Keys seen in a lookup."""

    def admit(self, key: Key) -> bool:
        """Whether to store ``key`` now."""
        return True

    def admit_run(self, keys: Sequence[Key]) -> int:
        """How many leading ``keys`` :meth:`admit` would take, stopping at its first refusal
        (O(1) when every chunk is admitted)."""
        return len(keys)


class SeenCountAdmission(AdmissionPolicy):
    """Store a chunk only after it was seen in ``min_seen`` lookups.

    One-shot traffic then never displaces reused chunks. Counts live in an LRU-bounded map
    of ``max_tracked`` keys, so memory stays bounded under unique traffic.
    """

    def __init__(self, min_seen: int, max_tracked: int = 1 << 16) -> None:
        self.min_seen = min_seen
        self.max_tracked = max_tracked
        self._seen: OrderedDict[Key, int] = OrderedDict()

    def observe(self, keys: Iterable[Key]) -> None:
        seen = self._seen
        for key in keys:
            seen[key] = seen.get(key, 0) + 1
            seen.move_to_end(key)
        while len(seen) > self.max_tracked:
            seen.popitem(last=False)

    def admit(self, key: Key) -> bool:
        return self._seen.get(key, 0) >= self.min_seen

    def admit_run(self, keys: Sequence[Key]) -> int:
        refused = next(compress(count(), map(self._refuses, keys)), None)
        return len(keys) if refused is None else refused

    def _refuses(self, key: Key) -> bool:
        return self._seen.get(key, 0) < self.min_seen


def make_admission_policy(min_seen: int, max_tracked: int = 1 << 16) -> AdmissionPolicy:
    """``min_seen`` <= 1 stores everything; otherwise a SeenCountAdmission."""
    return AdmissionPolicy() if min_seen <= 1 else SeenCountAdmission(min_seen, max_tracked)
