"""A slot index rebuilt from known entries (a tier's restart) and its invariants checked
(:meth:`kvtier.tiers.index.SlotIndex.restore` and ``check``, whose index the functions
take: typed ``Any`` here, as this module sits below the index's)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kvtier.keys import Key
from kvtier.tiers.index_entry import READY, IndexEntry, add_child
from kvtier.tiers.runs import Run, run_after


def check_index(index: Any, entries: Mapping[Key, IndexEntry], free: list[int]) -> None:
    """The invariants of the module docstring, asserted."""
    used = {e.slot for e in entries.values()}
    assert len(used) == len(entries), "two keys share a slot"
    assert used.isdisjoint(free), "a used slot is also free"
    assert len(used) + len(free) == index.num_slots, "slots leaked"
    assert len(index.policy) == len(entries), "policy and index disagree"
    assert index._slots == {k: e.slot for k, e in entries.items()}, "slot map out of step"
    for key, e in entries.items():
        if e.parent is not None:
            p = entries.get(e.parent)
            assert p is not None, "prefix closure broken: parent missing"
            assert key in p.children
            if e.state == READY:
                assert p.state == READY, "READY child of a non-READY parent"
        for c in e.children:
            assert entries[c].parent == key
        run = e.run
        assert run.keys[e.pos] == key and run.slots[e.pos] == e.slot, "run out of step"
        if e.pos > 0:
            assert e.parent == run.keys[e.pos - 1], "a run is not a path"
    for run in {id(e.run): e.run for e in entries.values()}.values():
        assert len(run.keys) == len(run.slots) == len(run.state)
        marked = (*run.pins, *run.done, *run.doomed, *run.branches)
        assert all(0 <= p < len(run.keys) for p in marked), "a mark past its run's end"
        assert all(run.pins.values()) and all(run.branches.values()), "an empty mark kept"
        assert all(k in entries and entries[k].run is run for k in run.keys), "run holds a gone key"


def restore_entries(index: Any, entries: Iterable[tuple[Key, int, Key | None]]) -> int:
    """Re-admit READY chunks at known slots into an empty index (a tier's restart).

    ``entries``: ``(key, slot, parent)``, parents before children, oldest first; the
    caller has already checked prefix closure. Keys are inserted into the eviction
    policy in the given order, so later entries are more recent. Returns the count.
    """
    if index._entries:
        raise ValueError("restore needs an empty index")
    taken: set[int] = set()
    for key, slot, parent in entries:
        if not 0 <= slot < index.num_slots or slot in taken or key in index._entries:
            raise ValueError(f"restore: bad or repeated slot {slot} / key")
        if parent is not None and parent not in index._entries:
            raise ValueError("restore: a parent must come before its children")
        taken.add(slot)
        if parent is None:
            run, pos = Run(), 0
        else:
            run, pos = run_after(index._runs[parent], index._positions[parent], parent)
        run.extend([key], [slot], READY)
        index._entries.add([key], run, pos)
        index._slots[key] = slot
        if parent is not None:
            add_child(index._entries[parent], key, pos)
        index.policy.insert(key)
        if index.listener is not None:
            index.listener.ready_run([key])
    index.recency.changed()
    # Lowest free slots first, as on a fresh index.
    index._free = [s for s in range(index.num_slots - 1, -1, -1) if s not in taken]
    return len(taken)
