"""Admission by learned category reuse (kvtier.policies.categories) and its use in the
default policy: checked against a naive reference, inside the real index, and end to end
through the manager with exact KV."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.budget import SyncBudget
from kvtier.config import KVTierConfig
from kvtier.keys import Key, chunk_keys
from kvtier.policies.adaptive import AdaptivePolicy
from kvtier.policies.categories import CATEGORIES, CategoryReuse, category
from kvtier.policies.eviction import EvictionPolicy, LRUPolicy
from kvtier.tiers.index import SlotIndex
from tests.support.chat_traffic import traffic
from tests.support.mini_engine import MiniEngine


class NaiveCategoryReuse:
    """The same definition written out key by key: a list as the FIFO, loops everywhere."""

    def __init__(self, capacity: int, memory: int, window: int) -> None:
        self.capacity, self.memory, self.window = capacity, memory, window
        self.fifo: list[tuple[Key, int]] = []
        self.reused = [0.0] * CATEGORIES
        self.born = [0.0] * CATEGORIES
        self.since = 0

    def observe(self, keys: Sequence[Key], held: int) -> None:
        for key in keys:
            for i, (k, cat) in enumerate(self.fifo):
                if k == key:
                    self.reused[cat] += 1
                    del self.fifo[i]
                    break
        new = len(keys) - held
        if new <= 0:
            return
        cat = category(held, new)
        for key in keys[held:]:
            self.fifo.append((key, cat))
            self.born[cat] += 1
        while len(self.fifo) > self.memory * self.capacity:
            self.fifo.pop(0)
        self.since += new
        if self.since > self.window * self.capacity:
            self.since = 0
            self.reused = [x / 2 for x in self.reused]
            self.born = [x / 2 for x in self.born]


def test_categories_split_continuations_from_fresh_chains_and_bucket_sizes():
    assert category(0, 1) == 0 and category(0, 3) == 1 and category(0, 4) == 2
    assert category(5, 1) == category(1, 1) != category(0, 1)
    assert category(0, 1 << 20) == category(0, 2048) == CATEGORIES // 2 - 1 != category(0, 2047)
    assert category(7, 1 << 20) == CATEGORIES - 1


chains = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 12), st.integers(0, 12)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(chains, st.integers(1, 6), st.integers(1, 3), st.integers(1, 4))
def test_tracker_matches_the_naive_reference(requests, capacity, memory, window):
    """Chains of 8 families sharing prefixes; each request holds some leading chunks."""
    pool = [chunk_keys([f % 3] * 8 + [f] * 96, 8, b"cat") for f in range(8)]
    fast = CategoryReuse(capacity, memory=memory, window=window)
    ref = NaiveCategoryReuse(capacity, memory, window)
    for fam, length, held in requests:
        keys = pool[fam][:length]
        held = min(held, length)
        fast.observe(keys, held)
        ref.observe(keys, held)
        assert list(fast.marks.items()) == ref.fifo
        assert fast.reused == ref.reused and fast.born == ref.born
    for cat in range(CATEGORIES):
        assert fast.rate(cat) == (ref.reused[cat] + 1) / (ref.born[cat] + 1)


def test_a_category_whose_chunks_never_come_back_is_refused():
    cr = CategoryReuse(64)  # no halving within this test
    keys = chunk_keys(list(range(64)), 8, b"trust")
    assert cr.worth_storing(keys) == 8  # nothing marked: an output, a restored chain
    cr.observe(keys, 0)
    assert cr.worth_storing(keys) == 8  # 1 / 9: not enough evidence against it yet
    for i in range(1, 5):  # more fresh 8-chunk chains, none asked for again
        cr.observe(chunk_keys([i] * 64, 8, b"trust"), 0)
    assert cr.rate(category(0, 8)) < cr.threshold
    late = chunk_keys([9] * 64, 8, b"trust")
    cr.observe(late, 0)
    assert cr.worth_storing(late) == 0
    # Another category is untouched by it: a continuation of 8 new chunks.
    cont = chunk_keys([9] * 64 + [3] * 64, 8, b"trust")
    cr.observe(cont, 8)
    assert cr.worth_storing(cont[8:]) == 8


# -- inside the real index -----------------------------------------------------------------


def replay(
    policy: EvictionPolicy, prompts: list[list[int]], idx: SlotIndex | None = None
) -> tuple[int, SlotIndex]:
    """Hit chunks of the prompts, replayed as the manager's only tier does it: each
    request's lookup, then the store of what the tier lacks, cut where the policy's
    admission says. ``idx`` continues an earlier replay."""
    idx = idx or SlotIndex(policy.capacity, policy)
    hits = 0
    for tokens in prompts:
        keys = chunk_keys(tokens, 8, b"mix")
        idx.observe(keys)
        held = idx.prefix_len(keys)
        hits += held
        if held:
            idx.touch(keys[:held])
        todo = keys[held:]
        todo = todo[: policy.admit_chain(todo)]
        slots = idx.reserve(todo, keys[held - 1] if held else None)
        idx.commit(todo[: len(slots)], [True] * len(slots))
        idx.check()
    return hits, idx


def test_one_off_documents_are_refused_and_conversations_kept():
    """A tier of 24 chunks: every document would flush both sessions (LRU loses each
    session's history at every document); the default policy learns that documents do
    not come back, stops storing them, and keeps the sessions and the system prompt."""
    prompts = traffic(n_docs=12, n_turns=12)
    pol = AdaptivePolicy(24)
    got, _ = replay(pol, prompts)
    lru, _ = replay(LRUPolicy(24), prompts)
    assert pol.category_refusals >= 6
    assert pol.categories.rate(category(4, 12)) < pol.categories.threshold
    assert pol.categories.rate(category(4, 1)) > 0.5  # turns: each continues the last
    assert got > lru + 40, (got, lru)


def test_a_refused_category_is_stored_again_once_its_chunks_come_back():
    prompts = traffic(n_docs=12, n_turns=12)
    pol = AdaptivePolicy(24)
    _, idx = replay(pol, prompts)
    docs = category(4, 12)
    assert pol.categories.rate(docs) < pol.categories.threshold
    # The same documents again, each asked twice: refused chunks asked for again are
    # reuses of their category, which reopens it, and the second asks hit.
    again = [p for p in prompts if len(p) > 100 for _ in range(2)]
    refusals = pol.category_refusals
    hits, _ = replay(pol, again, idx)
    assert pol.categories.rate(docs) >= pol.categories.threshold
    assert pol.category_refusals - refusals < len(again) // 2
    assert hits > 4 * len(again) + 12 * 4, hits  # more than the system prompt's chunks


# -- end to end through the manager --------------------------------------------------------


def test_adaptive_arc_refuses_documents_with_exact_kv():
    """The MiniEngine drives the manager as vLLM does (chunked stores each step, output
    chunks stored at the end) and checks every attended token's KV against the oracle."""
    cfg = KVTierConfig(
        chunk_tokens=8, sync_budget=SyncBudget("fixed", 1 << 30), eviction="adaptive-arc"
    )
    e = MiniEngine(cfg, num_blocks=128, cpu_chunks=24)
    try:
        pol = e.manager.tiers[0].index.policy
        assert type(pol) is AdaptivePolicy
        for i, tokens in enumerate(traffic(n_docs=12, n_turns=12)):
            e.add(f"r{i}", tokens)
            e.run()
        assert e.wrong == 0
        assert pol.category_refusals > 0
        assert pol.categories.rate(category(4, 12)) < pol.categories.threshold
        e.manager.tiers[0].index.check()
    finally:
        e.close()
