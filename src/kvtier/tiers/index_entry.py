"""One key's entry in a slot tier's index (:mod:`kvtier.tiers.index`), and its states."""

from __future__ import annotations

from kvtier.keys import Key
from kvtier.tiers.runs import Run

STORING = 0
READY = 1


class IndexEntry:
    """One key's place in the index. A plain class with ``__slots__`` (not a dataclass): a
    reservation builds one per chunk through ``map``, 8,192 for a 128k-token store.
    ``children`` is a tuple, replaced on change: a reservation's 1-tuples come from one
    ``zip`` in C, where a list per chunk cost an allocation more and the collector's time
    (~0.1 us a chunk)."""

    __slots__ = ("children", "done", "doomed", "parent", "pins", "pos", "run", "slot", "state")

    def __init__(
        self,
        slot: int,
        parent: Key | None,
        run: Run,
        pos: int,
        children: tuple[Key, ...] = (),
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
        self.children = children


def writing(e: IndexEntry) -> bool:
    """A store into the entry's slot may still be running."""
    return e.state == STORING and not e.done
