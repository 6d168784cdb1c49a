"""Recency bookkeeping of a slot index: when a refresh of a chain's recency changes nothing.

Split from :mod:`kvtier.tiers.index` (one job per module)."""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.keys import Key


class RecencyMemo:
    """Tells when refreshing a chain's recency would change nothing.

    A touch of a chain prefix makes its keys the most recent, ancestors last. Doing it again
    is a no-op while nothing changed the policy's order since, and the prefix is covered by
    the last refresh: the index then skips it. Every change of the order must be reported
    (:meth:`changed`), or a touch that matters is skipped.
    """

    __slots__ = ("_changes", "_fresh")

    def __init__(self) -> None:
        self._changes = 0
        self._fresh: tuple[int, Sequence[Key], int] | None = None
        """``(changes, chain, n)`` of the last refresh: the chain's first ``n`` keys were
        made the most recent (chains only grow, so those keys stay as they were)."""

    def changed(self) -> None:
        """The policy's order may have changed (a store, removal, deferral, restore)."""
        self._changes += 1

    def refreshed(self, keys: Sequence[Key], n: int) -> None:
        """``keys[:n]`` were just made the most recent, tail first."""
        self._changes += 1
        self._fresh = (self._changes, keys, n)

    def is_fresh(self, keys: Sequence[Key]) -> bool:
        """Whether the chain prefix ``keys`` is as a touch would leave it."""
        n, fresh = len(keys), self._fresh
        return (
            n > 0
            and fresh is not None
            and fresh[0] == self._changes
            and n <= fresh[2]
            and fresh[1][n - 1] == keys[n - 1]  # chained keys: equal here, equal prefix
        )
