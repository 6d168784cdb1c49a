"""The per-step sync budget and the load planner built on it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.budget import BudgetTracker, SyncBudget
from kvtier.config import KVTierConfig
from kvtier.contract.kind import TierContext
from kvtier.contract.spec import TierSpec
from kvtier.keys import Namespace
from kvtier.layout import KVLayout
from kvtier.manager import CacheManager
from kvtier.stack.build import build_stack

LAYOUT = KVLayout.dense(2, 1, 4, "float32")  # 64 B per token
CHUNK = 16


def test_auto_budget_is_bandwidth_times_step_over_batch():
    b = BudgetTracker(SyncBudget("auto"))
    b.begin_step(3)
    assert b.limit == 0  # nothing measured yet: every hit loads async
    b.observe_bandwidth(8e9)
    b.observe_step(0.05)
    b.begin_step(4)
    assert b.limit == int(8e9 * 0.05 / 4)
    b.observe_step(0.15)  # an average, not the last step
    assert 0.05 < b.step_seconds < 0.15


def test_fixed_and_off():
    b = BudgetTracker(SyncBudget("fixed", 1000))
    b.begin_step(1)
    assert b.try_reserve("a", 600) and not b.try_reserve("b", 600)
    assert b.try_reserve("a", 300)  # replaces a's own reservation
    assert b.used == 300 and b.try_reserve("b", 700) and b.used == 1000
    off = BudgetTracker(SyncBudget("off"))
    off.begin_step(1)
    assert off.limit == 0 and not off.try_reserve("a", 1)


def manager(limit: int, chains: list[list[int]]) -> CacheManager:
    chunk_bytes = LAYOUT.chunk_bytes(CHUNK)
    config = KVTierConfig(
        chunk_tokens=CHUNK,
        sync_budget=SyncBudget("fixed", limit),
        tiers=(TierSpec("cpu", capacity=4096 * chunk_bytes),),
    )
    ns = Namespace("m", LAYOUT.digest())
    stack = build_stack(config, TierContext(chunk_bytes, ns))
    index = stack[0].index
    m = CacheManager(config, LAYOUT, ns, CHUNK, stack)
    for i, toks in enumerate(chains):  # store each chain's whole chunks
        hit = m.lookup(f"s{i}", toks, 0)
        assert hit is not None
        keys = m.requests.chain_keys(f"s{i}")
        slots = index.reserve(keys, None)
        index.commit(keys, [True] * len(slots))
    return m


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 64 * 400),
    st.lists(st.tuples(st.integers(1, 12), st.integers(0, 20)), min_size=1, max_size=8),
)
def test_planner_never_exceeds_the_budget(limit, reqs):
    """Per step: sync bytes never exceed the budget, a sync hit always leaves a token to
    compute, a hit that does not fit loads async in full."""
    chains = [[i * 1000 + t for t in range(n * CHUNK)] for i, (n, _) in enumerate(reqs)]
    m = manager(limit, chains)
    m.build_step([])  # a fresh step and its budget
    used = 0
    for i, ((n, extra), toks) in enumerate(zip(reqs, chains, strict=True)):
        prompt = toks + list(range(extra))
        hit = m.lookup(f"r{i}", prompt, 0)
        assert hit is not None and hit.tokens == n * CHUNK
        tokens, is_async = m.plan_load(f"r{i}", hit, len(prompt))
        cost = LAYOUT.load_bytes(hit.tokens)
        if is_async:
            assert tokens == hit.tokens
            assert used + cost > limit or hit.tokens - (extra == 0) == 0
        else:
            used += cost
            assert tokens < len(prompt)
            assert tokens == hit.tokens - (1 if extra == 0 else 0)
        assert used <= limit == m.budget.limit
        assert m.budget.used == used
