"""Runs: a slot index's tree cut into paths, so a chain's slots are a few list slices.

Every index entry belongs to one :class:`Run`, a path of the tree (each member the child of
the one before) whose members are all present. A reserve under the last member of a run
extends it; any other reserve starts a new run. An entry leaves the index only when it has
no children, so the members after it in its run have left already: the run is cut there
(:meth:`Run.cut`). Reading the slots of a chain of ``n`` keys then costs one dict lookup
and one slice per run it passes through, plus a binary search where it leaves a run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from kvtier.keys import Key


class Member(Protocol):
    """What this module reads of an index entry: its run and its position there (an
    index's own entry type, kept there so that this module does not import the index)."""

    run: Run
    pos: int


class Run:
    """Keys of one path of the index's tree, in chain order, and their slots (see the
    module docstring's *Runs*)."""

    __slots__ = ("keys", "slots")

    def __init__(self) -> None:
        self.keys: list[Key] = []
        self.slots: list[int] = []

    def cut(self, pos: int) -> None:
        """Member ``pos`` left (so had every member after it)."""
        del self.keys[pos:], self.slots[pos:]


def run_after(parent: Member | None) -> tuple[Run, int]:
    """The run a new child of ``parent`` joins, and its position there: the parent's own
    when the parent ends it, else a new one."""
    if parent is not None and parent.pos == len(parent.run.keys) - 1:
        return parent.run, parent.pos + 1
    return Run(), 0


def run_slots(entries: Mapping[Key, Member], keys: Sequence[Key]) -> list[int]:
    """:meth:`~kvtier.tiers.index.SlotIndex.chain_slots`: one slice of each run the chain
    passes through."""
    out: list[int] = []
    i, n = 0, len(keys)
    while i < n:
        e = entries[keys[i]]
        run, pos = e.run, e.pos
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
