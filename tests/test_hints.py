"""Request hints (kvtier.hints, kvtier.stack.retain) on the mini engine, whose KV is checked
against the oracle for every attended token, and the hint parser on arbitrary input."""

from __future__ import annotations

import dataclasses
import logging
import math
import random

from hypothesis import given
from hypothesis import strategies as st

from kvtier.budget import SyncBudget
from kvtier.config import KVTierConfig
from kvtier.hints import NO_HINTS, Hints, parse_hints
from kvtier.metrics import Metrics
from kvtier.sources import HitSource
from tests.support.mini_engine import MiniEngine

C = 8
CFG = KVTierConfig(chunk_tokens=C, sync_budget=SyncBudget("fixed", 1 << 30), eviction="lru")


def prompt(seed: int, chunks: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(chunks * C)]


AGENT = prompt(1, 4)


def engine(tmp_path=None, cfg: KVTierConfig = CFG, cpu_chunks: int = 12) -> MiniEngine:
    disk = tmp_path / "disk" if tmp_path is not None else None
    return MiniEngine(cfg, num_blocks=128, cpu_chunks=cpu_chunks, disk_dir=disk)


def serve(e: MiniEngine, req_id: str, tokens: list[int], hints: Hints = NO_HINTS):
    r = e.add(req_id, tokens, arrive=True, hints=hints)
    e.run()
    return r


def chain(e: MiniEngine, tokens: list[int]) -> list[bytes]:
    from kvtier.keys import KeyChain

    kc = KeyChain(e.manager.namespace.seed(), C)
    kc.update(tokens)
    return list(kc.keys)


def pins(e: MiniEngine) -> int:
    index = e.manager.stack[0].index
    return sum(x.pins for x in index.entries.values())


def metric(e: MiniEngine, name: str, *labels: str) -> float:
    return e.manager.metrics.values.get(name, {}).get(labels, 0.0)


# -- the parser ------------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


@given(
    st.dictionaries(
        st.sampled_from(["retain_s", "prefetch_only", "tier_hint", "other"]), JSON, max_size=4
    )
)
def test_any_hint_mapping_parses_or_is_ignored_never_raises(raw):
    m = Metrics()
    h = parse_hints({"kvtier": raw, "do_remote_prefill": True}, m)
    r = raw.get("retain_s")
    valid_retain = (
        isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) and r >= 0
    )
    assert h.retain_s == (float(r) if valid_retain else 0.0)
    assert h.prefetch_only == (raw.get("prefetch_only") is True)
    assert h.tier_hint == (
        raw.get("tier_hint") if raw.get("tier_hint") in ("skip", "demote") else None
    )
    bad = {k for k in raw if k == "other"}
    bad |= {"retain_s"} if "retain_s" in raw and not valid_retain else set()
    bad |= (
        {"prefetch_only"}
        if "prefetch_only" in raw and not isinstance(raw["prefetch_only"], bool)
        else set()
    )
    bad |= (
        {"tier_hint"}
        if "tier_hint" in raw and raw["tier_hint"] not in ("skip", "demote")
        else set()
    )
    assert {k for (k,) in m.values.get("invalid_hints", {})} == bad


def test_an_invalid_hint_is_one_warning_line_naming_the_key(caplog):
    with caplog.at_level(logging.WARNING, logger="kvtier"):
        h = parse_hints({"kvtier": {"retain_s": -3, "tier_hint": "skip"}})
    assert h == Hints(tier_hint="skip")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "kvtier.retain_s" in lines[0] and "\n" not in lines[0]
    assert parse_hints({"kvtier": "fast please"}) is NO_HINTS
    assert parse_hints(None) is NO_HINTS and parse_hints({"other": 1}) is NO_HINTS


# -- retain_s ----------------------------------------------------------------------------------


def test_retain_keeps_an_agent_chain_through_background_traffic_until_it_expires():
    """Without the hint, background traffic between two turns evicts the agent's chain and
    the next turn recomputes; with ``retain_s`` its chain stays (the background loses what
    the lease holds), and once the lease has expired it is evicted as before."""
    now = [0.0]

    def turn_two_hit(hints: Hints, gap: float) -> int:
        e = engine(cfg=dataclasses.replace(CFG, retain_max_share=0.5))  # 6 of 12 chunks
        e.manager.arrivals.retention.clock = lambda: now[0]
        try:
            serve(e, "t1", AGENT + [5], hints)
            now[0] += gap
            for i in range(4):  # 4 x 4 chunks of background: more than the 12-chunk tier
                serve(e, f"bg{i}", prompt(100 + i, 4) + [1])
            r = serve(e, "t2", AGENT + [5, 6, 7])
            assert e.wrong == 0 and not e.manager.has_pending_jobs()
            hit = r.sources.get(HitSource.HOST, 0)
            e.manager.arrivals.retention.clear()
            assert pins(e) == 0
            return hit
        finally:
            e.close()

    assert turn_two_hit(NO_HINTS, 0) == 0
    assert turn_two_hit(Hints(retain_s=60), 0) == 4 * C
    assert turn_two_hit(Hints(retain_s=60), 61) == 0  # the lease expired before the traffic


def test_leases_stay_within_their_share_and_a_next_turn_replaces_its_lease():
    cfg = dataclasses.replace(CFG, retain_max_share=0.5)  # 6 of 12 chunks
    e = engine(cfg=cfg)
    try:
        ret = e.manager.arrivals.retention
        serve(e, "a1", AGENT + [5], Hints(retain_s=60))
        assert ret.leases() == 1 and ret.covered == 4 and pins(e) == 1
        # The agent's next turn extends the chain: its lease replaces the first one.
        serve(e, "a2", AGENT + [5] * (2 * C), Hints(retain_s=60))
        assert ret.leases() == 1 and ret.covered == 6 and pins(e) == 1
        assert metric(e, "retain_refused_chunks") == 0
        # Another agent: no room left in the share; it gets no lease.
        serve(e, "b1", prompt(2, 3) + [1], Hints(retain_s=60))
        assert ret.leases() == 1 and metric(e, "retain_refused_chunks") == 3
        ret.clear()
        assert pins(e) == 0 and ret.covered == 0
        assert e.wrong == 0
    finally:
        e.close()


# -- tier_hint and prefetch_only ------------------------------------------------------------


def test_tier_hint_skip_stores_nothing(tmp_path):
    e = engine(tmp_path)
    try:
        serve(e, "a", AGENT + [1], Hints(tier_hint="skip"))
        assert metric(e, "stored_chunks", "cpu") == metric(e, "stored_chunks", "disk") == 0
        r = serve(e, "b", AGENT + [2])
        assert r.sources == {} and e.wrong == 0
    finally:
        e.close()


def test_tier_hint_demote_stores_below_the_cpu_tier(tmp_path):
    e = engine(tmp_path)
    try:
        serve(e, "a", AGENT + [1], Hints(tier_hint="demote"))
        assert metric(e, "stored_chunks", "cpu") == 0
        assert metric(e, "stored_chunks", "disk") == 4
        r = serve(e, "b", AGENT + [2])
        assert r.sources == {HitSource.DISK: 4 * C} and e.wrong == 0
    finally:
        e.close()


def test_prefetch_only_promotes_with_prefetch_off_and_keeps_the_chain(tmp_path):
    """prefetch off: a prefetch_only request still prefetches its disk prefix into the CPU
    tier, and its chain stays held there (prefetch_lease_s) after it finishes."""
    e = engine(tmp_path, dataclasses.replace(CFG, retain_max_share=0.5))
    assert not CFG.prefetch
    try:
        serve(e, "fill", AGENT + [1])
        for i in range(3):
            serve(e, f"bg{i}", prompt(100 + i, 4) + [1])
        assert not e.manager.stack[0].index.has(chain(e, AGENT)[0])  # on disk only
        r = serve(e, "warm", AGENT + [2], Hints(prefetch_only=True))
        assert r.sources == {HitSource.HOST: 4 * C}
        assert metric(e, "prefetch_chunks", "disk") == 4
        assert e.manager.arrivals.retention.leases() == 1 and pins(e) == 1
        for i in range(3):
            serve(e, f"bg2{i}", prompt(200 + i, 4) + [1])
        r = serve(e, "real", AGENT + [3])
        assert r.sources == {HitSource.HOST: 4 * C} and e.wrong == 0
    finally:
        e.close()
