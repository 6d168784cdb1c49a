"""Runs: a slot index's tree cut into paths, each holding its members' fields as columns.

Every index entry belongs to one :class:`Run`, a path of the tree (each member the child of
the one before) whose members are all present. A reserve under the last member of a run
extends it; any other reserve starts a new run. An entry leaves the index only when it has
no children, so the members after it in its run have left already: the run is cut there
(:meth:`Run.cut`). Reading the slots of a chain of ``n`` keys then costs one dict lookup
and one slice per run it passes through, plus a binary search where it leaves a run.

A run keeps its members' fields itself, so a reservation of ``n`` chunks builds no object
per chunk: keys, slots and states are columns extended in C (a state per member, a byte),
and what only some members have (pins, a finished store waiting for its parent, a doomed
mark, children that start runs of their own) is kept by position, for those members only.
A member's parent is the member before it, or the run's ``parent`` for the first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvtier.keys import Key

STORING = 0
READY = 1


class Run:
    """One path of the index's tree, in chain order, with its members' fields (see the
    module docstring)."""

    __slots__ = ("branches", "done", "doomed", "keys", "parent", "pins", "slots", "state")

    def __init__(self, parent: Key | None = None) -> None:
        self.parent = parent
        """Parent of the first member (None: a chain's root)."""
        self.keys: list[Key] = []
        self.slots: list[int] = []
        self.state = bytearray()
        """Per member: STORING or READY."""
        self.pins: dict[int, int] = {}
        """Position -> loads reading that member (pinned members only)."""
        self.done: set[int] = set()
        """Positions whose store finished while the parent was not READY yet."""
        self.doomed: set[int] = set()
        """Positions invalidated while busy: removed when their copy ends."""
        self.branches: dict[int, tuple[Key, ...]] = {}
        """Position -> children that start runs of their own (the next member is the
        other child)."""

    def extend(self, keys: Sequence[Key], slots: Sequence[int], state: int) -> None:
        """Append members, all in ``state`` (C-level passes)."""
        self.keys += keys
        self.slots += slots
        self.state += bytes([state]) * len(keys)

    def parent_at(self, pos: int) -> Key | None:
        """Parent of member ``pos``."""
        return self.keys[pos - 1] if pos else self.parent

    def has_children(self, pos: int) -> bool:
        """Whether member ``pos`` has a stored child (the next member, or a branch)."""
        return pos + 1 < len(self.keys) or pos in self.branches

    def num_children(self, pos: int) -> int:
        return (pos + 1 < len(self.keys)) + len(self.branches.get(pos, ()))

    def writing(self, pos: int) -> bool:
        """A store into member ``pos``'s slot may still be running."""
        return self.state[pos] == STORING and pos not in self.done

    def cut(self, pos: int) -> None:
        """Member ``pos`` left (so had every member after it); what was kept for it by
        position goes with it."""
        del self.keys[pos:], self.slots[pos:], self.state[pos:]
        self.pins.pop(pos, None)
        self.done.discard(pos)
        self.doomed.discard(pos)
        self.branches.pop(pos, None)


def run_after(run: Run | None, pos: int, parent: Key | None) -> tuple[Run, int]:
    """The run a new child of ``parent`` (member ``pos`` of ``run``; None: a root) joins,
    and its position there: the parent's own when the parent ends it, else a new one."""
    if run is not None and pos == len(run.keys) - 1:
        return run, pos + 1
    return Run(parent), 0


def run_slots(
    runs: Mapping[Key, Run], positions: Mapping[Key, int], keys: Sequence[Key]
) -> list[int]:
    """:meth:`~kvtier.tiers.index.SlotIndex.chain_slots`: one slice of each run the chain
    passes through."""
    out: list[int] = []
    i, n = 0, len(keys)
    while i < n:
        key = keys[i]
        run, pos = runs[key], positions[key]
        m = chain_overlap(run.keys, pos, keys, i)
        if m == n:
            return run.slots[pos : pos + m]
        out += run.slots[pos : pos + m]
        i += m
    return out


def chain_overlap(run: Sequence[Key], pos: int, keys: Sequence[Key], i: int) -> int:
    """How many keys ``keys[i:]`` and ``run[pos:]`` share from the start, where both are
    paths of one tree from the same node ``keys[i] == run[pos]``: once two such paths part
    they never meet again (a node has one parent), so agreement is monotone and a binary
    search over it finds the end; the first probe, the whole overlap, is the usual answer."""
    hi = min(len(keys) - i, len(run) - pos)
    if run[pos + hi - 1] == keys[i + hi - 1]:
        return hi
    lo = 1  # agree at lo, disagree at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run[pos + mid - 1] == keys[i + mid - 1]:
            lo = mid
        else:
            hi = mid
    return lo
