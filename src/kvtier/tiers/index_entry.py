"""One key's entry in a slot tier's index (:mod:`kvtier.tiers.index`), and its states."""

from __future__ import annotations

from kvtier.keys import Key
from kvtier.tiers.runs import Run

STORING = 0
READY = 1


class IndexEntry:
    """One key's place in the index. A plain class with ``__slots__`` (not a dataclass): a
    reservation builds one per chunk through ``map``, 8,192 for a 128k-token store.

    Children are not stored per entry: the one that follows it in its run is the run's next
    member, and only the others (each the start of another run) are kept, in
    ``branches``. A reservation then builds nothing per chunk but the entry (a child list
    per chunk cost an allocation more and the collector's time, ~0.1 us a chunk)."""

    __slots__ = ("branches", "done", "doomed", "parent", "pins", "pos", "run", "slot", "state")

    def __init__(
        self,
        slot: int,
        parent: Key | None,
        run: Run,
        pos: int,
        state: int = STORING,
    ) -> None:
        self.slot = slot
        self.parent = parent
        self.run = run
        self.pos = pos
        """Position in ``run``."""
        self.state = state
        self.pins = 0
        self.done = False
        """Store finished but the parent is not READY yet."""
        self.doomed = False
        """Invalidated while pinned: removed at the last unpin."""
        self.branches: tuple[Key, ...] = ()
        """Children that start a run of their own (replaced, never changed in place)."""

    @property
    def children(self) -> tuple[Key, ...]:
        """Its stored children: the next member of its run, if any, then ``branches``."""
        keys = self.run.keys
        if self.pos + 1 < len(keys):
            return (keys[self.pos + 1], *self.branches)
        return self.branches

    def has_children(self) -> bool:
        return self.pos + 1 < len(self.run.keys) or bool(self.branches)

    def num_children(self) -> int:
        return (self.pos + 1 < len(self.run.keys)) + len(self.branches)


def add_child(parent: IndexEntry, child: Key, pos: int) -> None:
    """``child`` joined the index under ``parent`` at position ``pos`` of its run: a
    branch unless it continues the parent's run (``pos`` > 0)."""
    if pos == 0:
        parent.branches = (*parent.branches, child)


def writing(e: IndexEntry) -> bool:
    """A store into the entry's slot may still be running."""
    return e.state == STORING and not e.done
