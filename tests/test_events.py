"""The tier event log (kvtier.tier_events) over real tiers driven by the mini engine.

Oracle: replaying the log's runs (a store adds its chunks, a removal takes them away) must
give exactly each tier index's readable keys, whatever the workload, faults, edge rules and
resets; identities map back to keys through each request's own key chain, computed apart.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.budget import SyncBudget
from kvtier.config import KVTierConfig
from kvtier.contract.spec import TierSpec
from kvtier.keys import Key, chunk_keys
from kvtier.policies import make_eviction_policy
from kvtier.sources import HitSource
from kvtier.stack.stack import StackTier, TierStack
from kvtier.tier_events import EventRun, TierEvents
from kvtier.tiers.faulty import FaultPlan
from kvtier.tiers.index import SlotIndex, store_at_once
from tests.support.mini_engine import MiniEngine

CHUNK = 8
BLOCK = 4  # the mini engine's block size: 2 blocks per chunk


class Source:
    """What the vLLM side keeps per request: its tokens (keys computed independently)."""

    def __init__(self, engine: MiniEngine, tokens: list[int]) -> None:
        chain = engine.manager.namespace.key_chain(CHUNK)
        chain.update(tokens)
        self.keys = chain.keys


def attach(engine: MiniEngine, **kw: int) -> tuple[TierEvents, dict[str, Source]]:
    log = TierEvents(engine.manager.stack, CHUNK // BLOCK, **kw)
    sources: dict[str, Source] = {}

    def planned(req_id: str, first: int, keys: list[Key]) -> None:
        src = sources[req_id]
        assert list(keys) == src.keys[first : first + len(keys)]  # the identity is right
        log.learn(src, first, keys)

    engine.manager.on_store_planned = planned
    engine.manager.movement.on_copy_planned = log.copying
    return log, sources


def add(engine: MiniEngine, sources: dict[str, Source], req_id: str, tokens: list[int]) -> None:
    sources[req_id] = Source(engine, tokens)
    engine.add(req_id, tokens)


def apply(runs: list[EventRun], state: list[set[Key]]) -> None:
    for run in runs:
        keys = [src.keys[i] for src, i in run.chunks]  # type: ignore[attr-defined]
        held = state[run.tier]
        if run.stored:
            first_src, first_i = run.chunks[0]
            assert all(s is first_src for s, _ in run.chunks), "a store run is one chain"
            assert [i for _, i in run.chunks] == list(range(first_i, first_i + len(keys)))
            assert held.isdisjoint(keys), "announced twice"
            held.update(keys)
        else:
            assert set(keys) <= held, "removal of a block never announced"
            held.difference_update(keys)


def drain(log: TierEvents, state: list[set[Key]]) -> None:
    while log.pending():
        apply(log.take(), state)


def check(engine: MiniEngine, log: TierEvents, state: list[set[Key]]) -> None:
    drain(log, state)
    tiers = engine.manager.tiers
    for t, tier in enumerate(tiers):
        assert isinstance(tier.index, SlotIndex)
        tier.index.check()
        assert state[t] == set(tier.index.ready_keys()), tier.name
        assert log.announced[t] == len(state[t])
    log.take()  # forgets the names of chunks gone from every tier
    present = {k for tier in tiers for k in tier.index.entries}
    assert log.starts() <= present  # bounded by what the tiers hold
    assert log.unknown == 0


@settings(max_examples=20, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from(["write-through", "write-back"]),
    st.sampled_from([0.0, 0.25]),
    st.sampled_from([0.0, 0.25]),
    st.booleans(),
)
def test_replayed_log_equals_every_tier_index(
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    policy: str,
    read_fail: float,
    write_fail: float,
    reset: bool,
) -> None:
    rng = random.Random(seed)
    cfg = KVTierConfig(
        chunk_tokens=CHUNK,
        sync_budget=SyncBudget("fixed", 8 * 32) if seed % 2 else SyncBudget("off"),
        eviction="lru",
        disk_write_policy=policy,  # type: ignore[arg-type]
    )
    fault = (
        FaultPlan(seed=seed, read_fail_rate=read_fail, write_fail_rate=write_fail)
        if read_fail or write_fail
        else None
    )
    disk = tmp_path_factory.mktemp("disk")
    e = MiniEngine(cfg, num_blocks=96, cpu_chunks=5, disk_dir=disk, disk_chunks=9, fault=fault)
    try:
        log, sources = attach(e, max_blocks=6)  # small: takes are spread over calls
        state: list[set[Key]] = [set() for _ in e.manager.tiers]
        prefixes = [[rng.randrange(50) for _ in range(rng.randrange(8, 40))] for _ in range(4)]
        for i in range(16):
            toks = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(0, 12))]
            add(e, sources, f"q{i}", toks)
            if rng.random() < 0.5:
                e.step()
                apply(log.take(), state)
            if reset and i == 8:
                e.run()
                e.manager.reset()
        e.run()
        check(e, log, state)
        assert state[0] or state[1] or write_fail, "nothing was ever stored"
    finally:
        e.close()


def test_a_restored_tier_is_announced_only_as_lookups_name_it(tmp_path: Path) -> None:
    """Chunks a restart finds on disk have no identity (no tokens there): nothing is
    announced at start; a lookup naming a held prefix announces that prefix, parents
    first, and nothing more."""
    cfg = KVTierConfig(chunk_tokens=CHUNK, sync_budget=SyncBudget("off"), eviction="lru")
    prompts = [[i] * 32 + [100 + i] for i in range(3)]  # 4 chunks each
    e = MiniEngine(cfg, num_blocks=96, cpu_chunks=16, disk_dir=tmp_path / "d")
    try:
        for i, p in enumerate(prompts):
            e.add(f"w{i}", p)
        e.run()
        assert len(e.manager.tiers[1].index) == 12
    finally:
        e.close()
    e = MiniEngine(cfg, num_blocks=96, cpu_chunks=16, disk_dir=tmp_path / "d")
    try:
        log, _ = attach(e)
        assert log.unknown == 12 and not log.pending()  # no storm at start
        src = Source(e, prompts[1])
        assert log.announce_held(src, src.keys) == 4
        (run,) = log.take()
        assert run.stored and run.tier == 1 and run.chunks == tuple((src, i) for i in range(4))
        assert log.announce_held(src, src.keys) == 0  # once
        assert log.unknown == 8
        # Evicting restored chunks that were never announced says nothing, and forgets them.
        disk = e.manager.tiers[1].index
        assert isinstance(disk, SlotIndex)
        disk.clear()
        assert [r.stored for r in log.take()] == [False]  # only prompts[1]'s chunks
        assert log.unknown == 0 and not log.starts()
    finally:
        e.close()


def test_off_means_no_listener_and_a_shared_tier_only_when_asked() -> None:
    """Without a log nothing listens; a shared tier is listened to only with shared=True,
    and then announces this engine's successful stores and failed checks."""
    from kvtier.contract.kind import TierContext
    from kvtier.keys import Namespace, chunk_keys
    from kvtier.stack.build import build_stack
    from kvtier.stack.parse import tier_spec

    specs = (
        tier_spec({"kind": "cpu", "capacity": 4 * 64}),
        tier_spec(
            {"kind": "memory", "capacity": 8 * 64, "url": "memory://events-test", "shared": True}
        ),
    )
    cfg = KVTierConfig(chunk_tokens=CHUNK, tiers=specs)
    ns = Namespace("m", "layout")
    stack: TierStack = build_stack(cfg, TierContext(64, ns, restore=False))
    assert all(t.index.listener is None for t in stack.tiers)
    TierEvents(stack, 2)
    assert stack[0].index.listener is not None and stack[1].index.listener is None
    stack[0].index.listener = None
    log = TierEvents(stack, 2, shared=True)
    keys = chunk_keys(list(range(3 * CHUNK)), CHUNK, ns.seed())
    cpu = stack[0].index
    assert isinstance(cpu, SlotIndex)
    log.learn("src", 0, keys)
    assert store_at_once(cpu, keys) == 3
    stack[1].index.commit(keys, [True, False, True])
    stack[1].index.invalidate(keys[0])
    runs = log.take()
    assert [(r.stored, r.tier, [i for _, i in r.chunks]) for r in runs] == [
        (True, 0, [0, 1, 2]),
        (True, 1, [0]),
        (True, 1, [2]),
        (False, 1, [0]),
    ]


class Told:
    """An index listener that records what it hears (the protocol's calls, as told)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Key]]] = []

    def ready_run(self, keys: list[Key]) -> None:
        self.calls.append(("ready", list(keys)))

    def unready(self, key: Key) -> None:
        self.calls.append(("unready", [key]))

    def removed(self, key: Key) -> None:
        self.calls.append(("removed", [key]))


def two_tiers(n: int) -> TierStack:
    """A CPU tier above a disk tier, indexes only."""
    return TierStack(
        [
            StackTier(name, source, SlotIndex(n, make_eviction_policy("lru", n)), TierSpec(name))
            for name, source in (("cpu", HitSource.HOST), ("disk", HitSource.DISK))
        ]
    )


def chain(n: int, salt: int = 0, shared: int = 0) -> list[Key]:
    """``n`` chained keys; the first ``shared`` equal for every salt."""
    toks = [7] * (shared * CHUNK) + [salt + 100] * ((n - shared) * CHUNK)
    return chunk_keys(toks, CHUNK, b"batched")


def test_an_index_tells_each_committed_chain_once_parents_first() -> None:
    """A commit's chains reach the listener in one call each: a whole store, a child store
    that finished before its parent (promoted with it), a branch after its parent."""
    idx = SlotIndex(32, make_eviction_policy("lru", 32))
    told = idx.listener = Told()
    a, b = chain(8, 1, shared=3), chain(8, 2, shared=3)
    assert store_at_once(idx, a[:5]) == 5
    assert told.calls == [("ready", a[:5])]
    told.calls.clear()
    idx.reserve(a[5:], a[4])
    idx.reserve(b[3:], b[2])
    idx.commit(b[3:], [True] * 5)  # under a READY parent: told at once
    assert told.calls == [("ready", b[3:])]
    told.calls.clear()
    # A child job ends before its parent's: both are told in the parent's commit.
    c = chain(12, 1, shared=3)
    assert c[:8] == a
    idx.reserve(c[8:], c[7])
    idx.commit(c[8:], [True] * 4)
    assert told.calls == []  # its parent a[7] is not READY yet
    idx.commit(a[5:], [True, True, True])
    assert told.calls == [("ready", c[5:])]
    idx.check()


def test_store_bookkeeping_is_ranges_not_chunks() -> None:
    """A 4,096-chunk store is one start, one announced segment and one run of events; its
    removal, chunk by chunk, takes the segment back deepest first."""
    n = 4096
    stack = two_tiers(n)
    log = TierEvents(stack, 1)
    keys = chain(n)
    log.learn("src", 0, keys)
    assert store_at_once(stack[0].index, keys) == n  # type: ignore[arg-type]
    (run,) = log.take()
    assert (run.stored, run.tier, run.source, run.first, run.count) == (True, 0, "src", 0, n)
    assert log.starts() == {keys[0]} and log.announced == [n, 0]
    assert len(log._listeners[0].tails) == 1  # type: ignore[union-attr]
    cpu = stack[0].index
    assert isinstance(cpu, SlotIndex)
    cpu.invalidate(keys[n - 3])
    (gone,) = log.take()
    assert not gone.stored and gone.chunks == (("src", n - 1), ("src", n - 2), ("src", n - 3))
    assert log.announced == [n - 3, 0]
    cpu.clear()
    log.take()
    assert log.announced == [0, 0] and not log.starts()


def test_names_survive_overlapping_stores_copies_and_demotions() -> None:
    """A shorter store of a held prefix leaves the longer name in place; a store that
    parts from it gets its own start where they part; a copy to the tier below that starts
    inside a store's range is named from the store's start (``copying``); a chain with no
    start (a demotion's) is named through the per-key map."""
    stack = two_tiers(64)
    log = TierEvents(stack, 1)
    cpu, disk = stack[0].index, stack[1].index
    assert isinstance(cpu, SlotIndex) and isinstance(disk, SlotIndex)
    a, b = chain(10, 1, shared=4), chain(10, 2, shared=4)
    log.learn("A", 0, a)
    assert store_at_once(cpu, a) == 10
    log.learn("short", 0, a[:2])  # covered: a's start keeps naming the chain
    log.learn("B", 0, b)  # parts from a at chunk 4: b's rest starts at b[4]
    assert log.starts() == {a[0], b[4]}
    store_at_once(cpu, b)
    runs = log.take()
    assert [(r.source, r.first, r.count) for r in runs] == [("A", 0, 10), ("B", 4, 6)]
    # Write-through with the disk holding a[:3]: the copy of a[3:] is named at a[3].
    assert store_at_once(disk, a[:3]) == 3
    log.copying(a, 3)
    assert a[3] in log.starts()
    assert store_at_once(disk, a[3:]) == 7
    assert [(r.tier, r.source, r.first, r.count) for r in log.take()] == [(1, "A", 0, 10)]
    # A chain of b's starting inside b's range, with no start there (a demotion's): named
    # through the per-key map.
    assert store_at_once(disk, b[4:5]) == 1
    log.take()
    assert b[5] not in log.starts() and not log._named
    assert store_at_once(disk, b[5:7]) == 2
    assert [(r.tier, r.source, r.first, r.count) for r in log.take()] == [(1, "B", 5, 2)]
    assert log.announced == [16, 13] and log.unknown == 0
    cpu.clear()
    disk.clear()
    log.take()
    assert not log.starts() and not log._records
