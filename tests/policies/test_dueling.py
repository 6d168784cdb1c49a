"""The default policy (dueling shadows + a budget against LRU) against LRU itself.

The bound checked is the one :mod:`kvtier.policies.dueling` states for exact shadows (a
tier of at most ``SHADOW_SLOTS`` chunks) and stores that complete, as in ``kvtier sim``:

    hit blocks >= LRU's - BUDGET x blocks requested - longest request - switch_diverged

where ``switch_diverged`` is what the policy measured, at its last switch to LRU, as the
keys LRU held and the tier did not. LRU's figure is a real LRU replay (the tier stack with
``eviction: lru``), not the policy's own shadow; the shadow's exactness is checked too.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.budget import SyncBudget
from kvtier.config import KVTierConfig
from kvtier.keys import chunk_keys
from kvtier.policies.dueling import BUDGET, SHADOW_SLOTS, DuelingPolicy
from kvtier.policies.eviction import LRUPolicy
from kvtier.policies.shadow import ShadowCache
from kvtier.tools.bench.workloads import DEFAULT_TRACE
from kvtier.tools.sim.bounds import lru_pass, next_uses, replay_belady, replay_lru_oracle
from kvtier.tools.sim.simulator import replay_index
from kvtier.tools.sim.trace import SIM_SEED, Trace, load_trace
from tests.support.mini_engine import MiniEngine


@pytest.fixture(scope="module")
def sample() -> Trace:
    return load_trace(DEFAULT_TRACE, limit=600)


def make_trace(paths: list[list[int]], block: int = 4) -> Trace:
    """A trace whose request i walks the prefix tree along ``paths[i]`` (one hash id per
    distinct prefix of choices), each block ``block`` tokens."""
    ids: dict[tuple[int, ...], int] = {}
    keys, tokens = [], []
    for path in paths:
        hash_ids = [ids.setdefault(tuple(path[: j + 1]), len(ids)) for j in range(len(path))]
        keys.append(chunk_keys(hash_ids, 1, SIM_SEED))
        tokens.append(block * len(path))
    return Trace("random", block, [], keys, tokens)


# Paths over 3 choices per level: heavy prefix sharing, some one-off deep chains.
paths = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=14), min_size=1, max_size=160)


def check_bound(trace: Trace, slots: int) -> tuple[int, int]:
    lru = replay_index(trace, [slots], "lru")
    got = replay_index(trace, [slots], "adaptive")
    pol = got.policies[0]
    assert isinstance(pol, DuelingPolicy) and pol.stride == 1
    # The LRU shadow is exact: it counts what the real LRU tier hit.
    assert pol.lru_hit_estimate == lru.hit_blocks[0]
    assert pol.hit_blocks == got.hit_blocks[0]
    n = sum(len(k) for k in trace.keys)
    longest = max(len(k) for k in trace.keys)
    allowed = BUDGET * n + longest + pol.switch_diverged
    assert lru.hit_blocks[0] - got.hit_blocks[0] <= allowed, (lru.hit_blocks, got.hit_blocks)
    return lru.hit_blocks[0], got.hit_blocks[0]


@settings(max_examples=60, deadline=None)
@given(paths, st.integers(1, 60))
def test_default_stays_within_its_stated_bound_of_lru(walks, slots):
    check_bound(make_trace(walks), slots)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([8, 24, 64, 200]))
def test_bound_on_scans_mixed_into_a_hot_set(seed, slots):
    """A hot set of short chains with long one-off chains (scans) in between, so that ARC
    and LRU disagree and the leader switches."""
    import random

    rng = random.Random(seed)
    walks: list[list[int]] = []
    for i in range(300):
        if rng.random() < 0.3:
            walks.append([9, i] + [rng.randrange(3) for _ in range(rng.randrange(5, 30))])
        else:
            walks.append([rng.randrange(4), rng.randrange(3), rng.randrange(2)])
    check_bound(make_trace(walks), slots)


def test_lru_shadow_matches_the_lru_tier_and_oracle_sits_between_lru_and_belady(
    sample: Trace,
) -> None:
    for slots in (150, 900):
        lru = replay_index(sample, [slots], "lru")
        shadow = ShadowCache(LRUPolicy(slots))
        for keys in sample.keys:
            shadow.request(keys)
        assert shadow.hits == lru.hit_blocks[0]
        everything, _ = lru_pass(sample, slots, None)  # the oracle's LRU, storing all
        assert everything.hit_blocks == lru.hit_blocks
        future = next_uses(sample)
        oracle = replay_lru_oracle(sample, slots, future)
        belady = replay_belady(sample, slots, future)
        assert lru.hit_tokens[0] <= oracle.hit_tokens[0] <= belady.hit_tokens[0]
        assert oracle.hit_tokens[0] > lru.hit_tokens[0]  # refusing one-offs pays here


def test_sampled_shadows_are_strided_and_small() -> None:
    pol = DuelingPolicy(40 * SHADOW_SLOTS)
    assert pol.stride == 40
    assert all(s.capacity == SHADOW_SLOTS for s in pol.shadows)
    assert DuelingPolicy(SHADOW_SLOTS).stride == 1


def test_leader_follows_the_shadows_and_keeps_the_tier_consistent() -> None:
    """A scan-heavy trace: ARC's shadows win, the leader leaves LRU and the index stays
    valid through the switches (invariants checked after every request)."""
    import random

    rng = random.Random(3)
    walks = []
    for i in range(600):
        if i % 2:
            walks.append([9, i] + [0] * 12)  # a one-off scan of 14 blocks
        else:
            walks.append([rng.randrange(6), rng.randrange(2)])
    trace = make_trace(walks)
    got = replay_index(trace, [16], "adaptive", check=True)
    lru = replay_index(trace, [16], "lru")
    pol = got.policies[0]
    assert pol.mode != 0 and got.hit_blocks[0] > lru.hit_blocks[0]


def test_default_config_builds_the_dueling_policy() -> None:
    assert KVTierConfig().eviction == "adaptive"
    e = MiniEngine(KVTierConfig(chunk_tokens=8))
    try:
        assert all(type(t.index.policy) is DuelingPolicy for t in e.manager.tiers)
    finally:
        e.close()


def test_default_through_the_engine_path_keeps_kv_exact() -> None:
    """The mini engine drives the manager as vLLM does (chunked stores each step, output
    chunks stored at the end) and checks every attended token's KV against the oracle,
    with documents and chat turns that make the leader switch."""
    from tests.support.chat_traffic import traffic

    cfg = KVTierConfig(chunk_tokens=8, sync_budget=SyncBudget("fixed", 1 << 30))
    e = MiniEngine(cfg, num_blocks=128, cpu_chunks=24)
    try:
        pol = e.manager.tiers[0].index.policy
        assert type(pol) is DuelingPolicy
        for i, tokens in enumerate(traffic(n_docs=12, n_turns=12)):
            e.add(f"r{i}", tokens)
            e.run()
        assert e.wrong == 0
        assert pol.requested > 0 and pol.hit_blocks > 0
        e.manager.tiers[0].index.check()
    finally:
        e.close()
