"""The recurrent-state path's scheduler side (:mod:`kvtier.stack.states`) and copies
(:mod:`kvtier.transfer.states`) without an engine: which boundary a hit ends at, what an
offer stores, that a state leaves with its attention chunk, and that the bytes of every
recurrent layer come back exactly (the engine-level checks are tests/vllm/test_hybrid.py)."""

from __future__ import annotations

import time

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import KVTierConfig
from kvtier.contract.kind import TierContext
from kvtier.keys import Namespace
from kvtier.layout import AttentionKind, KVGroup, KVLayout
from kvtier.manager import CacheManager
from kvtier.stack.build import build_stack, build_stores
from kvtier.stack.requests import Hit
from kvtier.stack.states import StateCache, link_eviction, split_specs, state_key
from kvtier.transfer.states import StateMover

C = 4
"""Tokens per chunk = engine block."""
STATE = 96
"""Bytes of one state (two groups: 2 layers of 32 bytes, 1 layer of 32)."""
LAYOUT = KVLayout(
    (
        KVGroup(AttentionKind.FULL, 1, num_kv_heads=1, head_dim=4, dtype="torch.float32"),
        KVGroup(AttentionKind.MAMBA, 3, dtype="torch.float32", state_bytes=32),
    )
)


def _setup(cpu_bytes: int = 1 << 20, share: float = 0.5):
    config = KVTierConfig(cpu_bytes=cpu_bytes, state_share=share)
    ns = Namespace(model="m", layout_digest=LAYOUT.digest())
    attn_specs, state_specs = split_specs(config)
    attn = build_stack(config, TierContext(LAYOUT.chunk_bytes(C), ns), attn_specs)
    states = StateCache(
        config,
        LAYOUT,
        ns,
        build_stack(config, TierContext(STATE, ns), state_specs),
        [1, 2],
        C,
        C,
    )
    link_eviction(attn, states.stack)
    manager = CacheManager(config, LAYOUT, ns, C, attn)
    stores = build_stores(config, TierContext(STATE, ns), state_specs)
    return config, manager, states, stores


def _keys(manager: CacheManager, tokens: list[int]):
    chain = manager.namespace.key_chain(C)
    chain.update(tokens)
    return list(chain.keys)


def test_split_specs_share_capacity_and_keep_states_apart(tmp_path):
    config = KVTierConfig(
        cpu_bytes=1000, disk_path=str(tmp_path), disk_bytes=4000, state_share=0.25
    )
    attn, states = split_specs(config)
    assert [s.capacity for s in attn] == [750, 3000]
    assert [s.capacity for s in states] == [250, 1000]
    assert states[1].options.path == str(tmp_path / "states")  # type: ignore[attr-defined]
    assert attn[1].options.path == str(tmp_path)  # type: ignore[attr-defined]
    faulty = KVTierConfig(cpu_bytes=1000, fault_injection={"states": {"fail_all_reads": True}})
    a, s = split_specs(faulty)
    assert a[0].faults is None and s[0].faults is not None and s[0].faults.fail_all_reads


def test_state_key_is_tagged_and_distinct():
    k = bytes(range(16))
    assert state_key(k) != k and len(state_key(k)) == 16
    assert state_key(k) == state_key(bytes(range(16)))
    assert state_key(k) != state_key(bytes(range(1, 17)))


def _store_states(states: StateCache, stores, keys, boundaries, pages, blocks) -> None:
    for b in boundaries:
        states.offer("r", 1, blocks[0], b, keys)
        states.offer("r", 2, blocks[1], b, keys)
    plan = states.build_step()
    mover = StateMover(pages, stores)
    mover.begin_step(plan)
    mover.end_forward()
    states.cache.on_report(mover.report())


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 12),
    stored=st.sets(st.integers(1, 12)),
    start_chunks=st.integers(0, 3),
)
def test_trim_ends_at_longest_stored_boundary_leaving_a_token(n, stored, start_chunks):
    """A hit covering ``n`` chunks of a prompt is cut at the last boundary (at or below
    ``num_tokens - 1``, above the engine's own prefix) whose state was stored."""
    _, manager, states, stores = _setup()
    tokens = list(range(3, 3 + n * C + 1))  # one token past the last chunk
    keys = _keys(manager, tokens)
    pages = [[torch.zeros(8, 32, dtype=torch.uint8)] * 2, [torch.zeros(8, 32, dtype=torch.uint8)]]
    _store_states(states, stores, keys, sorted(k * C for k in stored if k <= n), pages, (1, 2))
    start = min(start_chunks, n) * C
    hit = Hit(start, n * C, (("cpu", start // C, n),))
    got = states.trim("q", hit, keys, len(tokens))
    assert got is not None
    want = max((k for k in stored if start // C < k <= n), default=0)
    assert got.end == (want * C if want else start), (stored, start, got)
    assert got.start == start
    if want:
        assert got.runs == (("cpu", start // C, want),)


def test_states_load_back_exact_bytes_and_leave_with_their_chunk():
    _, manager, states, stores = _setup()
    g = torch.Generator().manual_seed(0)
    pages = [
        [torch.randint(0, 256, (8, 32), dtype=torch.uint8, generator=g) for _ in range(2)],
        [torch.randint(0, 256, (8, 32), dtype=torch.uint8, generator=g)],
    ]
    want = [p[3].clone() for p in pages[0]] + [pages[1][0][5].clone()]
    tokens = list(range(3, 3 + 3 * C))
    keys = _keys(manager, tokens)
    _store_states(states, stores, keys, [2 * C], pages, (3, 5))
    assert states.stored_offers == 1
    hit = states.trim("q", Hit(0, 3 * C, (("cpu", 0, 3),)), keys, len(tokens))
    assert hit == Hit(0, 2 * C, (("cpu", 0, 2),))
    for group in pages:
        for p in group:
            p.zero_()
    # Group 1's block list [null, 6, ...], group 2's [null, 7, ...]: the hit's last block.
    states.allocated("q", [[0, 1, 2], [0, 6, 0], [0, 7, 0]], 2 * C)
    plan = states.build_step()
    mover = StateMover(pages, stores)
    mover.begin_step(plan)
    mover.start_loads()
    assert mover.transfer_results() == ({"q"}, set())
    got = [p[6] for p in pages[0]] + [pages[1][0][7]]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    states.cache.on_report(mover.report())
    # The attention chunk that ends at the boundary leaves: its state goes with it.
    index = manager.tiers[0].index
    index.commit(keys, [True] * len(index.reserve(keys, None)))
    assert states.stack[0].index.has(state_key(keys[1]))
    index.invalidate(keys[1])
    assert not states.stack[0].index.has(state_key(keys[1]))
    assert states.trim("q2", Hit(0, 3 * C, (("cpu", 0, 3),)), keys, len(tokens)).end == 0


def test_offers_off_boundary_or_incomplete_are_not_stored():
    _, manager, states, _ = _setup()
    keys = _keys(manager, list(range(3, 3 + 3 * C)))
    states.offer("r", 1, 3, C + 1, keys)  # not a chunk boundary
    states.offer("r", 1, 3, 5 * C, keys)  # past the keys known
    states.offer("r", 1, 3, 2 * C, keys)  # group 2 never offers it this step
    assert states.build_step().stores == []
    assert states.skipped_offers == 2 and states.stored_offers == 0
    states.offer("r", 2, 4, 2 * C, keys)  # the next step's offer alone: incomplete
    assert states.build_step().stores == []


def test_a_request_is_received_once_both_sides_are_and_failed_if_either_failed():
    """The worker's combination of the attention and state sides of a hybrid hit (what
    vLLM's ``get_transfer_results`` gets): finished once both finished, failed (and
    finished) if either failed."""
    from kvtier.jobs import TransferJob
    from kvtier.vllm.hybrid import ReceiveParts
    from tests.support.jobs import make_job

    def load(req: str, sync: bool = False) -> TransferJob:
        return make_job("load", "cpu", [b"k"], [0], [1], job_id=0, req_id=req, sync=sync)

    parts = ReceiveParts()
    parts.expect([load("a"), load("b"), load("c"), load("d", sync=True)])
    parts.expect([load("a"), load("b")])
    none: set[str] = set()
    assert parts.results([(none, none), ({"a"}, none)]) == (none, none)  # a's state first
    assert parts.results([({"a", "c"}, none), (none, none)]) == ({"a", "c"}, none)
    assert parts.results([(none, none), ({"b"}, {"b"})]) == (none, none)  # attention loading
    assert parts.results([({"b"}, none), (none, none)]) == ({"b"}, {"b"})


def _served(manager: CacheManager, states: StateCache, req: str, tokens: list[int]) -> int:
    """Tokens of ``tokens`` a lookup would serve (attention chunks and the state at their
    end), asking again while a remote probe is out, as the connector does."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        hit = manager.lookup(req, tokens, 0)
        if hit is not None:
            cut = states.trim(req, hit, manager.requests.chain_keys(req), len(tokens))
            if cut is not None:
                return cut.end
        time.sleep(0.005)
    raise AssertionError("the remote tier never answered")


def test_redis_evicting_a_chunk_leaves_its_state_unused_until_it_expires():
    """Redis evicts on its own (``maxmemory``, ``ttl_s``) and kvtier never sees it, so a
    state there is not removed with its attention chunk. Both are needed for a hit: with a
    chunk of the chain gone (as an eviction deletes it), the hit stops at the last state
    before the gap, the orphaned state is never used, and it goes when its TTL ends. A
    state gone (attention present) makes the hit fall back the same way."""
    import redis

    from kvtier.stack.build import build_stores
    from kvtier.tools.redis_server import RedisServer

    with RedisServer() as server:
        redis_tier = {"kind": "redis", "url": server.url, "ttl_s": 3}
        tiers = [{"kind": "cpu", "capacity": 1 << 20}, redis_tier]
        config = KVTierConfig.from_dict({"tiers": tiers, "state_share": 0.5})
        ns = Namespace(model="m", layout_digest=LAYOUT.digest())
        attn_specs, state_specs = split_specs(config)
        chunk_ctx, state_ctx = TierContext(LAYOUT.chunk_bytes(C), ns), TierContext(STATE, ns)
        attn = build_stack(config, chunk_ctx, attn_specs)
        states = StateCache(
            config, LAYOUT, ns, build_stack(config, state_ctx, state_specs), [1, 2], C, C
        )
        link_eviction(attn, states.stack)
        manager = CacheManager(config, LAYOUT, ns, C, attn)
        stores = [
            build_stores(config, chunk_ctx, attn_specs)["redis"],
            build_stores(config, state_ctx, state_specs)["redis"],
        ]
        raw = redis.Redis.from_url(server.url)
        try:
            tokens = list(range(3, 3 + 4 * C + 1))
            keys = _keys(manager, tokens)
            skeys = [state_key(keys[1]), state_key(keys[3])]  # states at 2 and 4 chunks
            seg = [[(0, torch.ones(n, dtype=torch.uint8))] for n in (LAYOUT.chunk_bytes(C),) * 4]
            # What write-through leaves in Redis: the chain's chunks and two states.
            assert stores[0].write([-1] * 4, keys, seg, [None, *keys[:-1]]) == [True] * 4
            sseg = [[(0, torch.ones(STATE, dtype=torch.uint8))]] * 2
            assert stores[1].write([-1] * 2, skeys, sseg, [None, None]) == [True] * 2
            assert _served(manager, states, "r1", tokens) == 4 * C
            # Redis evicts the third chunk: the hit ends at the state after two chunks.
            space = attn.tiers[1].index.keyspace  # type: ignore[attr-defined]
            raw.delete(space.name(keys[2], 0))
            assert _served(manager, states, "r2", tokens) == 2 * C
            # The state after four chunks is left in Redis, unused...
            state_space = states.stack.tiers[1].index.keyspace  # type: ignore[attr-defined]
            orphan = state_space.name(skeys[1], 0)
            assert raw.exists(orphan)
            # ... a state gone with its chunks present: no hit at all...
            raw.delete(state_space.name(skeys[0], 0))
            assert _served(manager, states, "r3", tokens) == 0
            # ... and the orphan goes when its TTL ends (as the chunks do).
            deadline = time.monotonic() + 10
            while raw.exists(orphan) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not raw.exists(orphan)
        finally:
            raw.close()
            for store in stores:
                store.close()
