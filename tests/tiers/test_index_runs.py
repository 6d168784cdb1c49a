"""The index's run-level store paths against the simple per-key reference.

A reservation builds its entries in one pass per field, a store's own in-order commit
promotes its run at once (``commit_run``), ancestors are touched with one ``touch_many``
over run slices, and policies insert a chain and touch many keys in C-level passes. The
reference (:class:`PerKeyIndex`) is the index as it was: one key at a time everywhere.
Both run the same random operations on chains that share prefixes; after each operation
every entry, the slot lists, the policy's eviction order and what each call returned
must be identical. A store's touch of its ancestors is deferred until the policy is used
otherwise, so the orders are compared once that has happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import EVICTION_POLICIES
from kvtier.keys import Key, chunk_keys
from kvtier.policies import make_eviction_policy
from kvtier.policies.chain_arc import ChainARCPolicy
from kvtier.policies.eviction import LRUPolicy
from kvtier.tiers.index import SlotIndex, evict_leaves
from kvtier.tiers.index_commit import commit_each
from kvtier.tiers.index_entry import STORING, add_child
from kvtier.tiers.runs import Run, run_after


class PerKeyIndex(SlotIndex):
    """The reference: reserve, commit and the ancestors' touch one key at a time (a
    reservation appends to its run's columns key by key; commits go through the general
    loop, entry views field by field)."""

    def reserve(self, keys: Sequence[Key], parent: Key | None) -> list[int]:
        if not keys or (parent is not None and not self.has(parent)):
            return []
        for i, k in enumerate(keys):
            if k in self._entries:
                keys = keys[:i]
                break
        if not keys:
            return []
        need = len(keys) - len(self._free)
        if need > 0:
            evict_leaves(self, need, protect=parent)
        n = min(len(keys), len(self._free))
        slots = [self._free.pop() for _ in range(n)]
        prev = parent
        if parent is None:
            run, pos = Run(), 0
        else:
            e = self._entries[parent]
            run, pos = run_after(e.run, e.pos, parent)
        for key, slot in zip(keys[:n], slots, strict=True):
            run.keys.append(key)
            run.slots.append(slot)
            run.state.append(STORING)
            self._entries.add([key], run, pos)
            self._slots[key] = slot
            if prev is not None:
                add_child(self._entries[prev], key, pos)
            prev = key
            pos += 1
        self.policy.insert_chain(keys[:n], parent)
        self._touch_ancestors(parent)
        self.recency.changed()
        return slots

    def _touch_ancestors(self, key: Key | None) -> None:
        while key is not None:
            self.policy.touch(key)
            key = self._entries[key].parent

    def commit(self, keys: Sequence[Key], ok: Sequence[bool]) -> list[Key]:
        return commit_each(self, keys, ok)


class TouchCounting(LRUPolicy):
    """LRU that counts the keys ``touch_many`` moved."""

    moved = 0

    def touch_many(self, keys: Any) -> None:
        keys = list(keys)
        self.moved += len(keys)
        super().touch_many(keys)


def test_a_chunked_prefill_touches_its_ancestors_once():
    """A chain stored in steps, each continuing the last: no step touches the ancestors
    (the next store would touch them again); reading the order settles the last deferred
    touch, and the order is the per-key reference's, which touches at every step."""
    keys = chunk_keys(list(range(64)), 4, b"steps")
    policy = TouchCounting(40)
    fast = SlotIndex(40, policy)
    ref = PerKeyIndex(40, LRUPolicy(40))
    other = chunk_keys([7] * 8, 4, b"steps")
    for idx in (fast, ref):
        idx.reserve(other, None)
        for i in range(0, 16, 4):
            slots = idx.reserve(keys[i : i + 4], keys[i - 1] if i else None)
            idx.commit(keys[i : i + 4], [True] * len(slots))
    assert policy.moved == 0 and fast.recency.pending == (keys[11], keys[15])
    assert list(fast.policy.candidates()) == list(ref.policy.candidates())
    assert policy.moved == 12 and fast.recency.pending is None


def chains() -> list[list[Key]]:
    """Chains sharing prefixes of 1-3 chunks, so the stored tree branches."""
    out = []
    for c in range(6):
        toks = [0] * 4 + [c % 3] * 4 + [c % 2 + 10] * 4 + [c] * 20
        out.append(chunk_keys(toks, 4, b"runs"))
    return out


def state(idx: SlotIndex, settled: bool = True) -> Any:
    """Everything the index holds; the policy's order only when ``settled`` (reading it
    settles a deferred ancestor touch, which a following store of the same chain must be
    able to take over)."""
    entries = {
        k: (e.slot, e.parent, e.state, e.pins, e.done, e.doomed, list(e.children), e.pos)
        for k, e in idx.entries.items()
    }
    runs = {k: e.run.keys for k, e in idx.entries.items()}
    order = list(idx.policy.candidates()) if settled else None
    return entries, runs, idx.free_slot_order, order, idx.evictions


ops = st.lists(
    st.tuples(
        st.sampled_from(["store", "begin", "end", "fail_end", "pin", "unpin", "touch", "drop"]),
        st.integers(0, 5),
        st.integers(1, 8),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops, st.integers(1, 14), st.sampled_from(EVICTION_POLICIES))
def test_run_paths_match_the_per_key_reference(sequence, capacity, policy):
    fast = SlotIndex(capacity, make_eviction_policy(policy, capacity))
    ref = PerKeyIndex(capacity, make_eviction_policy(policy, capacity))
    all_chains = chains()
    in_flight: list[list[Key]] = []
    pinned: list[Key] = []
    for op, ci, n in sequence:
        keys = all_chains[ci]
        got: list[list[Any]] = [[], []]
        for idx, out in ((fast, got[0]), (ref, got[1])):
            if op in ("store", "begin"):
                present = idx.prefix_len(keys, any_state=True)
                todo = keys[present : present + n]
                slots = idx.reserve(todo, keys[present - 1] if present else None)
                out.append(slots)
                if op == "store":
                    out.append(idx.commit(todo[: len(slots)], [True] * len(slots)))
            elif op in ("end", "fail_end") and in_flight:
                job = in_flight[ci % len(in_flight)]
                ok = [op == "end" or i < n // 2 for i in range(len(job))]
                out.append(idx.commit(job, ok))
            elif op == "pin":
                m = idx.prefix_len(keys[:n])
                if m:
                    idx.pin([keys[m - 1]])
            elif op == "unpin" and pinned:
                idx.unpin([pinned[-1]])
            elif op == "touch":
                idx.touch(keys[: idx.prefix_len(keys)])
            elif op == "drop":
                out.append(idx.invalidate(keys[min(n, len(keys) - 1)]))
        if op == "begin" and got[0][0]:
            present = fast.prefix_len(keys, any_state=True) - len(got[0][0])
            in_flight.append(keys[present : present + len(got[0][0])])
        elif op in ("end", "fail_end") and in_flight:
            in_flight.pop(ci % len(in_flight))
        elif op == "pin" and fast.prefix_len(keys[:n]):
            pinned.append(keys[fast.prefix_len(keys[:n]) - 1])
        elif op == "unpin" and pinned:
            pinned.pop()
        assert got[0] == got[1], op
        # After a store the fast index may hold a deferred touch: the order is compared
        # after the next other operation, or a store of another chain, settles it.
        settled = op not in ("store", "begin")
        assert state(fast, settled) == state(ref, settled), op
        if settled:
            fast.check()
    assert state(fast) == state(ref)
    fast.check()


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["insert", "touch", "observe", "remove"]),
            st.integers(0, 5),
            st.integers(1, 8),
        ),
        max_size=40,
    ),
    st.sampled_from(["lru", "chain-arc"]),
)
def test_policy_chain_passes_match_key_by_key(sequence, name):
    """LRU's ``insert_chain`` and chain-ARC's ``insert_chain`` and ``touch_many`` (C-level
    passes) leave the order a key at a time leaves; removed keys come back as ghost hits."""
    cls = LRUPolicy if name == "lru" else ChainARCPolicy
    fast, ref = cls(8), cls(8)
    all_chains = chains()
    held: set[Key] = set()
    for op, ci, n in sequence:
        keys = all_chains[ci][:n]
        if op == "insert":
            new = [k for k in keys if k not in held][:3]
            if not new:
                continue
            fast.insert_chain(new, None)
            if isinstance(ref, ChainARCPolicy):  # key by key: ghost hits adapt p in order
                ref.insert_chain_each(new, None)
            else:
                for k in reversed(new):
                    ref.insert(k)
            held.update(new)
        elif op == "touch":
            mine = [k for k in keys if k in held]
            fast.touch_many(reversed(mine))
            for k in reversed(mine):
                ref.touch(k)
        elif op == "observe":
            mine = [k for k in keys if k in held]
            fast.observe(mine, len(mine))
            ref.observe(mine, len(mine))
        elif op == "remove" and held:
            k = sorted(held)[ci % len(held)]
            held.discard(k)
            fast.remove(k, evicted=True)
            ref.remove(k, evicted=True)
        if name == "chain-arc" and op == "touch" and isinstance(fast, ChainARCPolicy):
            assert isinstance(ref, ChainARCPolicy)
            fast.defer([k for k in keys if k in fast.t1][:1])
            ref.defer([k for k in keys if k in ref.t1][:1])
        assert list(fast.candidates()) == list(ref.candidates())
        if isinstance(fast, ChainARCPolicy) and isinstance(ref, ChainARCPolicy):
            assert (fast.p, list(fast.t2), list(fast.b1.items()), list(fast.b2)) == (
                ref.p,
                list(ref.t2),
                list(ref.b1.items()),
                list(ref.b2),
            )


@settings(max_examples=150, deadline=None)
@given(st.data(), st.sampled_from(EVICTION_POLICIES))
def test_out_of_order_commits_of_one_chain_against_a_model(data, policy):
    """A chain reserved in several stores, committed in any order, some failing: after each
    commit the READY prefix is the stores committed well from the start, up to the first
    failed one; nothing at or past a failed store stays visible; in the end only the READY
    prefix holds slots. An oracle of its own, not the per-key reference, which shares the
    run-level entries."""
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))
    keys = chunk_keys(list(range(4 * sum(sizes))), 4, b"ooo")
    idx = SlotIndex(64, make_eviction_policy(policy, 64))
    jobs: list[tuple[int, list[Key]]] = []
    start = 0
    for size in sizes:
        job = keys[start : start + size]
        assert len(idx.reserve(job, keys[start - 1] if start else None)) == size
        jobs.append((start, job))
        start += size
    order = data.draw(st.permutations(range(len(jobs))))
    fails = data.draw(st.lists(st.booleans(), min_size=len(jobs), max_size=len(jobs)))
    good: set[int] = set()
    failed_from = len(keys)
    ready = 0
    for j in order:
        first, job = jobs[j]
        idx.commit(job, [not fails[j]] * len(job))
        if fails[j]:
            failed_from = min(failed_from, first)
        else:
            good.add(j)
        ready = 0
        for i, (first2, job2) in enumerate(jobs):
            if i not in good or first2 >= failed_from:
                break
            ready = first2 + len(job2)
        assert idx.prefix_len(keys) == ready
        assert idx.stored_len(keys) <= failed_from
        idx.check()
    assert len(idx) == ready and idx.free_slots == 64 - ready
