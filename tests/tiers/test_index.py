import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.keys import chunk_keys
from kvtier.policies import make_eviction_policy
from kvtier.tiers.index import SlotIndex


def chains(n_chains=4, length=6):
    out = []
    for c in range(n_chains):
        # chains share a 2-chunk prefix per pair, so trees branch
        toks = [c // 2] * 8 + [c] * (length - 2) * 4
        out.append(chunk_keys(toks, 4, b"seed"))
    return out


def store(index, keys, n, ok=True):
    present = index.prefix_len(keys, any_state=True)
    todo = keys[present:n]
    slots = index.reserve(todo, keys[present - 1] if present else None)
    index.commit(todo[: len(slots)], [ok] * len(slots))
    return present + len(slots)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_store_lookup_evict(policy):
    idx = SlotIndex(6, make_eviction_policy(policy, 6))
    a, b, *_ = chains()
    assert store(idx, a, 6) == 6
    assert idx.prefix_len(a) == 6
    assert store(idx, b, 6) >= 4  # shares 2 chunks with a, evicts a's tail
    idx.check()
    assert idx.prefix_len(b) == 6
    assert idx.prefix_len(a) == 2


def test_pinned_and_storing_are_never_evicted():
    idx = SlotIndex(4, make_eviction_policy("lru", 4))
    a, _, c, _, e, _ = chains(6, 4)  # chains 0, 2, 4 share nothing
    store(idx, a, 4)
    idx.pin([a[3]])  # pinning the deepest chunk protects the whole chain
    assert store(idx, c, 4) == 0
    idx.check()
    assert idx.prefix_len(a) == 4
    idx.unpin([a[3]])
    assert store(idx, c, 4) == 4
    assert idx.prefix_len(a) == 0
    # slots being stored are not evictable either
    assert len(idx.reserve(e[:2], None)) == 2  # evicts c's two tail chunks
    # only c's two remaining chunks can make room; e's are in flight
    assert len(idx.reserve(a[:4], None)) == 2
    idx.check()
    assert idx.prefix_len(e, any_state=True) == 2
    assert idx.prefix_len(c) == 0 and len(idx) == 4


def test_failed_store_drops_descendants_and_readiness_is_monotone():
    idx = SlotIndex(8, make_eviction_policy("lru", 8))
    (a,) = chains(1, 5)
    s1 = idx.reserve(a[:2], None)
    s2 = idx.reserve(a[2:5], a[1])
    assert len(s1) == 2 and len(s2) == 3
    idx.commit(a[2:5], [True] * 3)  # children finish first: not ready until the parent is
    assert idx.prefix_len(a) == 0
    idx.commit(a[:2], [True, False])  # a[1] failed: a[1:] must go
    assert idx.prefix_len(a) == 1 and idx.prefix_len(a, any_state=True) == 1
    idx.check()


def test_invalidate_pinned_is_deferred():
    idx = SlotIndex(8, make_eviction_policy("lru", 8))
    (a,) = chains(1, 4)
    store(idx, a, 4)
    idx.pin([a[3]])
    idx.invalidate(a[1])
    assert idx.prefix_len(a) == 1
    assert len(idx) == 4  # a[1..3] are hidden, not freed, while a load reads a[3]
    idx.unpin([a[3]])
    assert len(idx) == 1
    idx.check()


ops = st.lists(
    st.tuples(
        st.sampled_from(["store", "fail_store", "pin", "unpin", "touch", "invalidate"]),
        st.integers(0, 5),
        st.integers(1, 6),
    ),
    max_size=60,
)


@given(ops, st.integers(1, 10), st.sampled_from(["lru", "arc", "chain-arc", "adaptive"]))
def test_random_operations_keep_invariants(sequence, capacity, policy):
    """Lookup vs a naive scan under random store/evict/pin sequences; capacity is never
    exceeded; pinned chains are never evicted."""
    idx = SlotIndex(capacity, make_eviction_policy(policy, capacity))
    all_chains = chains(6, 6)
    pins: list[bytes] = []
    for op, ci, n in sequence:
        keys = all_chains[ci]
        if op in ("store", "fail_store"):
            store(idx, keys, n, ok=(op == "store"))
        elif op == "pin":
            m = idx.prefix_len(keys[:n])
            if m:
                idx.pin([keys[m - 1]])
                pins.append(keys[m - 1])
        elif op == "unpin" and pins:
            idx.unpin([pins.pop()])
        elif op == "touch":
            idx.touch(keys[: idx.prefix_len(keys)])
        elif op == "invalidate":
            idx.invalidate(keys[min(n, 5)])
        idx.check()
        assert len(idx) <= capacity
        for keys in all_chains:
            naive = 0
            while naive < len(keys) and idx.is_ready(keys[naive]):
                naive += 1
            assert idx.prefix_len(keys) == naive
            held = idx.prefix_len(keys, any_state=True)
            for m in range(1, held + 1):  # runs answer as the per-key map does
                assert idx.chain_slots(keys[:m]) == idx.slots_of(keys[:m])
                assert idx.chain_slots(keys[m - 1 : held]) == idx.slots_of(keys[m - 1 : held])
    # every pinned key that was ready when pinned is still there
    for k in pins:
        assert k in idx.entries


def test_a_slot_being_written_is_never_handed_out_again():
    """Invalidating a key whose store is in flight must not free its slot before the
    write ends, or a new key could get the slot while the old write still lands in it."""
    idx = SlotIndex(1, make_eviction_policy("lru", 1))
    (a, b) = chains(2, 1)[0][:1], chains(3, 1)[2][:1]
    assert idx.reserve(a, None) == [0]
    idx.invalidate(a[0])
    assert idx.reserve(b, None) == []  # the only slot is still being written
    idx.commit(a, [True])  # the write ends: the doomed key goes, its slot frees
    assert not idx.has(a[0])
    assert idx.reserve(b, None) == [0]
    idx.check()


def test_chain_slots_across_extended_branched_cut_and_restored_runs():
    """A chain's slots come from runs: one run grown by successive stores, a branch that
    starts its own run, a run cut by eviction and grown again, a restored index's runs;
    every answer equals the per-key map's."""
    idx = SlotIndex(12, make_eviction_policy("lru", 12))
    a, b, *_ = chains(4, 6)  # b shares a's first 2 chunks
    for n in (2, 3, 6):  # chunked prefill: three reserves continuing one chain
        store(idx, a, n)
    assert len({id(idx.entries[k].run) for k in a}) == 1
    store(idx, b, 6)
    assert idx.entries[b[2]].run is not idx.entries[a[2]].run  # a branch: a new run
    for keys in (a, b):
        for i in range(6):
            for j in range(i + 1, 7):
                assert idx.chain_slots(keys[i:j]) == idx.slots_of(keys[i:j])
    idx.check()
    small = SlotIndex(6, make_eviction_policy("lru", 6))
    store(small, a, 6)
    store(small, b, 4)  # evicts a's tail: a's run is cut
    small.check()
    held = small.prefix_len(a)
    assert held < 6 and small.chain_slots(a[:held]) == small.slots_of(a[:held])
    assert store(small, a, 6) == 6  # the cut run grows again
    small.check()
    assert small.chain_slots(a) == small.slots_of(a)
    restored = SlotIndex(12, make_eviction_policy("lru", 12))
    restored.restore([(k, idx.slot_of(k), idx.parent_of(k)) for k in [*a, *b[2:]]])
    restored.check()
    assert restored.chain_slots(a) == idx.chain_slots(a)
    assert restored.chain_slots(b) == idx.chain_slots(b)
