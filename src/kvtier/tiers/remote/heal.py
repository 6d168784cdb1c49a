"""Self-healing of a remote store's values: bad values deleted after the read that found
them, and their names set again by the next store even where present."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence

from kvtier.tiers.remote.client import RemoteClient, RemoteUnavailable

SUSPECTS_MAX = 1 << 16
"""Names remembered as holding a bad value (forgotten all at once past this)."""


class Healer:
    """The healing bookkeeping of one :class:`~kvtier.tiers.remote.store.RemoteStore`.

    *Suspects* are names that held a bad value: a store sets them again even if present
    (the delete may have failed), until a set of theirs succeeds. :meth:`heal` deletes bad
    values found by a read in one round trip, through the client's breaker, and counts the
    names that existed then (``healed``). A bad value read while this store was setting
    that name (:meth:`setting`, stamped with ticks) is left alone: the delete could land
    after the honest value. A delete racing another engine's honest store may still drop
    that value: a miss, never wrong bytes. Called from the store's copy threads, each
    update one interpreter-atomic step on a set or dict, as the store needs no more.
    """

    def __init__(self, client: RemoteClient) -> None:
        self._client = client
        self.healed = 0
        """Bad values deleted after they were read (names that existed when deleted)."""
        self._suspects: set[bytes] = set()
        self._ticks = itertools.count(1)
        self._tick = 0
        self._set_at: dict[bytes, int] = {}
        self._setting: set[bytes] = set()

    @property
    def tick(self) -> int:
        """The last set's tick: a read takes it before it starts, for :meth:`heal`."""
        return self._tick

    def to_write(self, names: Sequence[bytes], present: Sequence[bool]) -> list[int]:
        """Indexes of the ``names`` a store must set: absent, or suspect though present."""
        suspects = self._suspects
        return [i for i, p in enumerate(present) if not p or names[i] in suspects]

    def written(self, name: bytes) -> None:
        """``name`` was set: no longer a suspect."""
        self._suspects.discard(name)

    @contextlib.contextmanager
    def setting(self, names: list[bytes]) -> Iterator[None]:
        """This store sets ``names`` within the block."""
        self._mark(names, True)
        try:
            yield
        finally:
            self._mark(names, False)

    def _mark(self, names: list[bytes], start: bool) -> None:
        tick = self._tick = next(self._ticks)
        if len(self._set_at) + len(names) > SUSPECTS_MAX:
            self._set_at.clear()
        for name in names:
            self._set_at[name] = tick
            if start:
                self._setting.add(name)
            else:
                self._setting.discard(name)

    def heal(self, names: list[bytes], since: int) -> None:
        """Delete values that failed a check (read after tick ``since``), and set those
        names again next time even if present; names this store was setting meanwhile
        are left alone."""
        names = [n for n in names if n not in self._setting and self._set_at.get(n, 0) <= since]
        if not names:
            return
        if len(self._suspects) + len(names) > SUSPECTS_MAX:
            self._suspects.clear()
        self._suspects.update(names)
        try:
            self.healed += self._client.delete(names, breaker=False)
        except RemoteUnavailable:
            return  # the next store overwrites them anyway
