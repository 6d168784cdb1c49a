"""One key's entry in a slot tier's index (:mod:`kvtier.tiers.index`), its states, and the
key -> entry map.

The index stores no object per key: a key maps to its run and its position there, and the
run holds the fields (:mod:`kvtier.tiers.runs`). :class:`IndexEntry` is a view of one
member, built on demand for the paths that go key by key (removal, out-of-order commits,
pins, checks); the store paths work on the runs' columns directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import count, repeat

from kvtier.keys import Key
from kvtier.tiers.runs import READY, STORING, Run

__all__ = ["READY", "STORING", "EntryMap", "IndexEntry", "add_child", "writing"]


class IndexEntry:
    """Member ``pos`` of ``run``: its fields, read from and written to the run's columns."""

    __slots__ = ("pos", "run")

    def __init__(self, run: Run, pos: int) -> None:
        self.run = run
        self.pos = pos

    @property
    def slot(self) -> int:
        return self.run.slots[self.pos]

    @property
    def parent(self) -> Key | None:
        return self.run.parent_at(self.pos)

    @property
    def state(self) -> int:
        return self.run.state[self.pos]

    @state.setter
    def state(self, value: int) -> None:
        self.run.state[self.pos] = value

    @property
    def pins(self) -> int:
        """Loads reading it."""
        return self.run.pins.get(self.pos, 0)

    @pins.setter
    def pins(self, value: int) -> None:
        if value:
            self.run.pins[self.pos] = value
        else:
            self.run.pins.pop(self.pos, None)

    @property
    def done(self) -> bool:
        """Store finished but the parent is not READY yet."""
        return self.pos in self.run.done

    @done.setter
    def done(self, value: bool) -> None:
        _mark(self.run.done, self.pos, value)

    @property
    def doomed(self) -> bool:
        """Invalidated while busy: removed when its copy ends."""
        return self.pos in self.run.doomed

    @doomed.setter
    def doomed(self, value: bool) -> None:
        _mark(self.run.doomed, self.pos, value)

    @property
    def branches(self) -> tuple[Key, ...]:
        """Children that start a run of their own."""
        return self.run.branches.get(self.pos, ())

    @branches.setter
    def branches(self, value: tuple[Key, ...]) -> None:
        if value:
            self.run.branches[self.pos] = value
        else:
            self.run.branches.pop(self.pos, None)

    @property
    def children(self) -> tuple[Key, ...]:
        """Its stored children: the next member of its run, if any, then ``branches``."""
        keys = self.run.keys
        if self.pos + 1 < len(keys):
            return (keys[self.pos + 1], *self.branches)
        return self.branches

    def has_children(self) -> bool:
        return self.run.has_children(self.pos)


def _mark(marks: set[int], pos: int, value: bool) -> None:
    if value:
        marks.add(pos)
    else:
        marks.discard(pos)


def add_child(parent: IndexEntry, child: Key, pos: int) -> None:
    """``child`` joined the index under ``parent`` at position ``pos`` of its run: a
    branch unless it continues the parent's run (``pos`` > 0)."""
    if pos == 0:
        parent.branches = (*parent.branches, child)


def writing(e: IndexEntry) -> bool:
    """A store into the entry's slot may still be running."""
    return e.run.writing(e.pos)


class EntryMap(Mapping[Key, IndexEntry]):
    """Key -> :class:`IndexEntry` (a view made per lookup) over two dicts, key -> run and
    key -> position, which a reservation extends in C with no object per key."""

    __slots__ = ("positions", "runs")

    def __init__(self) -> None:
        self.runs: dict[Key, Run] = {}
        self.positions: dict[Key, int] = {}

    def __getitem__(self, key: Key) -> IndexEntry:
        return IndexEntry(self.runs[key], self.positions[key])

    def get(self, key: Key, default: None = None) -> IndexEntry | None:  # type: ignore[override]
        run = self.runs.get(key)
        return None if run is None else IndexEntry(run, self.positions[key])

    def __contains__(self, key: object) -> bool:
        return key in self.runs

    def __iter__(self) -> Iterator[Key]:
        return iter(self.runs)

    def __len__(self) -> int:
        return len(self.runs)

    def add(self, keys: Sequence[Key], run: Run, pos: int) -> None:
        """``keys`` are members ``pos``, ``pos + 1``, ... of ``run``."""
        self.runs.update(zip(keys, repeat(run)))
        self.positions.update(zip(keys, count(pos)))

    def discard(self, key: Key) -> None:
        del self.runs[key], self.positions[key]

    def pin(self, keys: Iterable[Key]) -> list[int]:
        """One more load reads each of ``keys``, which must be READY and not doomed
        (KeyError at the first that is not); their slots."""
        slots = []
        for key in keys:
            e = self[key]
            if e.state != READY or e.doomed:
                raise KeyError("pin: key is not ready")
            e.pins += 1
            slots.append(e.slot)
        return slots

    def unpin(self, key: Key) -> bool:
        """A load of ``key`` ended (an absent key is skipped): whether that was the last
        load of a doomed key, which the index must then remove."""
        e = self.get(key)
        if e is None:
            return False
        e.pins -= 1
        return e.pins == 0 and e.doomed
