"""The tier conformance suite: what the engine relies on from every tier kind.

Subclass :class:`TierConformance` in a test module and list the kinds to check::

    from kvtier.conformance import KindCase, TierConformance

    class TestMyKind(TierConformance):
        cases = [
            KindCase("mine", {"kind": "mine", "endpoint": "..."}),
            KindCase("mine-faults", {"kind": "mine", "faults": {"seed": 1,
                     "read_fail_rate": 0.3, "write_fail_rate": 0.3}}, faulty=True),
        ]

Each test runs once per case (pytest parametrizes ``case``): the contract tests on every
case without faults, the clean-failure test on every case, the shared-store tests on the
cases that give raw access to their store. A test checks the branch of the contract the
kind's capabilities select (an authoritative index holds, bounds and pins; a shared one
probes and copes), so a kind that declares the wrong capabilities fails.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from kvtier.conformance.case import (
    OTHER_LAYOUT,
    WORLD,
    BuiltTier,
    CaseContext,
    KindCase,
    chain,
    payload,
)
from kvtier.contract import NO_SLOT
from kvtier.keys import Key

Make = Callable[..., BuiltTier]

_EXACT, _ANY, _TAMPER = "exact", "any", "tamper"


def _applies(kind: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def mark(fn: Callable[..., None]) -> Callable[..., None]:
        fn._conformance = kind  # type: ignore[attr-defined]
        return fn

    return mark


exact = _applies(_EXACT)
"""Cases without faults: the exact answers of the contract."""
every = _applies(_ANY)
"""Every case, faults or not."""
tampered = _applies(_TAMPER)
"""Cases with raw access to a shared store, without faults."""


def _wanted(test: str, case: KindCase) -> bool:
    if test == _ANY:
        return True
    if case.faulty:
        return False
    return test == _EXACT or case.tamper is not None


class _Base:
    cases: Sequence[KindCase] = ()
    """The kinds under test (see the module docstring)."""

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "case" not in metafunc.fixturenames:
            return
        test = getattr(metafunc.function, "_conformance", _EXACT)
        cases = [c for c in self.cases if _wanted(test, c)]
        metafunc.parametrize("case", cases, ids=[c.id for c in cases])

    @pytest.fixture
    def make(
        self,
        case: KindCase,
        request: pytest.FixtureRequest,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> Iterator[Make]:
        """``make(chunks=16)``: a fresh tier of the case holding ``chunks`` chunks."""
        ctx = CaseContext(
            tmp_path, request.getfixturevalue, monkeypatch.setenv, request.addfinalizer
        )
        built: list[BuiltTier] = []

        def make(chunks: int = 16) -> BuiltTier:
            tier = BuiltTier.of(case, ctx, chunks)
            built.append(tier)
            return tier

        yield make
        for tier in built:
            tier.close()


def _same(outs: Sequence[torch.Tensor], keys: Sequence[Key], rank: int) -> bool:
    return all(torch.equal(o, payload(k, rank)) for o, k in zip(outs, keys, strict=True))


class _ContractTests(_Base):
    """The index + store contract (kvtier.contract), on one tier of each case."""

    @exact
    def test_capabilities_agree_with_index_and_store(self, make: Make) -> None:
        t = make(8)
        assert t.index.shared == t.caps.shared
        for store in t.stores:
            assert store.slot_bytes == 4096
            assert store.addressing == ("key" if t.caps.shared else "slot")
        keys = chain(4)
        addrs = t.index.reserve(keys, None)
        assert len(addrs) == 4
        if t.caps.shared:
            assert addrs == [NO_SLOT] * 4 and t.index.slots_of(keys) == [NO_SLOT] * 4
        else:
            assert len(set(addrs)) == 4 and all(0 <= a < t.stores[0].num_slots for a in addrs)
        t.index.commit(keys, [False] * 4)

    @exact
    def test_round_trip_on_every_rank(self, make: Make) -> None:
        t = make()
        keys = chain(6, salt=1)
        assert t.leading(keys) == 0
        assert t.store_chain(keys) == [True] * 6
        assert t.leading(keys) == 6 and t.leading(keys, 4) == 6
        for rank in range(WORLD):
            ok, outs = t.read(keys, rank)
            assert ok == [True] * 6 and _same(outs, keys, rank), f"rank {rank}"

    @exact
    def test_a_partial_load_reads_the_right_bytes(self, make: Make) -> None:
        """A load that skips the blocks the engine holds reads part of a payload."""
        t = make()
        keys = chain(2, salt=2)
        t.store_chain(keys)
        part = torch.zeros(1000, dtype=torch.uint8)
        ok = t.stores[1].read(t.index.slots_of(keys[1:]), keys[1:], [[(3000, part)]])
        assert ok == [True] and torch.equal(part, payload(keys[1], 1)[3000:4000])

    @exact
    def test_chains_continue_and_leading_stops_at_the_first_miss(self, make: Make) -> None:
        t = make()
        keys = chain(5, salt=3)
        t.store_chain(keys[:3])
        assert t.leading(keys) == 3 and t.leading(keys, 3) == 3
        assert t.store_chain(keys[3:], parent=keys[2]) == [True, True]
        assert t.leading(keys) == 5
        assert t.leading(chain(3, salt=99)) == 0
        ok, outs = t.read(keys, 0)
        assert ok == [True] * 5 and _same(outs, keys, 0)

    @exact
    def test_present_keys_are_not_stored_again(self, make: Make) -> None:
        t = make()
        keys = chain(4, salt=4)
        t.store_chain(keys[:2])
        if t.caps.shared:
            assert t.index.stored_len(keys) == 0, "a shared store skips present keys itself"
        else:
            assert t.index.stored_len(keys) == 2
            assert t.index.reserve(keys[:2], None) == [], "a present key is never reserved"
        assert t.store_chain(keys)[-2:] == [True, True]
        ok, outs = t.read(keys, 1)
        assert ok == [True] * 4 and _same(outs, keys, 1)

    @exact
    def test_failed_writes_are_never_readable(self, make: Make) -> None:
        t = make()
        keys = chain(3, salt=5)
        addrs = t.index.reserve(keys, None)
        for rank, store in enumerate(t.stores):
            store.write(addrs, keys, [[(0, payload(k, rank))] for k in keys], [None, *keys[:2]])
        t.index.commit(keys, [True, False, True])
        n = t.leading(keys)
        if t.caps.shared:  # the bytes were written whole: other engines may read them
            assert n in (1, 3)
        else:  # a failed chunk leaves with its descendants
            assert n == 1 and not t.index.has(keys[2])

    @exact
    def test_invalidate_drops_a_chunk_and_its_descendants(self, make: Make) -> None:
        t = make()
        keys = chain(5, salt=6)
        t.store_chain(keys)
        gone = t.index.invalidate(keys[2])
        if t.caps.shared:
            assert gone == [], "other engines may hold good copies: the probe decides"
        else:
            assert set(gone) == set(keys[2:]) and t.leading(keys) == 2

    @exact
    def test_capacity_holds_and_what_leads_reads_back(self, make: Make) -> None:
        t = make(6)
        chains = [chain(3, salt=10 + s) for s in range(5)]
        for keys in chains:
            t.store_chain(keys)
        total = 0
        for keys in chains:
            n = t.leading(keys)
            total += n
            ok, outs = t.read(keys[:n], 0)
            assert ok == [True] * n and _same(outs, keys[:n], 0)
        if not t.caps.shared:  # a shared store's bound is its own (e.g. maxmemory)
            assert t.leading(chains[-1]) == 3, "the newest chain is whole"
            assert total <= 6 and t.leading(chains[0]) == 0, "the oldest chain was evicted"
            assert t.index.reserve(chain(2, salt=30), parent=chain(1, salt=31)[0]) == [], (
                "a chain continuing an absent parent is refused"
            )

    @exact
    def test_a_held_chain_survives_eviction(self, make: Make) -> None:
        t = make(6)
        keys = chain(3, salt=40)
        t.store_chain(keys)
        held = t.index.hold(keys[-1])
        assert held != t.caps.shared, "authoritative indexes pin, shared ones cannot"
        for s in range(4):
            t.store_chain(chain(3, salt=41 + s))
        if held:
            assert t.leading(keys) == 3
            ok, outs = t.read(keys, 1)
            assert ok == [True] * 3 and _same(outs, keys, 1)
            t.index.release(keys[-1])

    @exact
    def test_concurrent_loads_and_stores_of_different_chains(self, make: Make) -> None:
        t = make(64)
        errors: list[str] = []
        lock = threading.Lock()  # the index is the scheduler's: one thread at a time

        def engine(salt: int) -> None:
            keys = chain(4, salt=50 + salt)
            for _ in range(5):
                with lock:
                    start = t.index.stored_len(keys)
                    todo = keys[start:]
                    addrs = t.index.reserve(todo, keys[start - 1] if start else None)
                    todo = todo[: len(addrs)]
                oks = [
                    store.write(addrs, todo, [[(0, payload(k, r))] for k in todo], None)
                    for r, store in enumerate(t.stores)
                ]
                with lock:
                    t.index.commit(todo, [all(x) for x in zip(*oks, strict=True)] if todo else [])
                    n = t.leading(keys)
                    held = n > 0 and t.index.hold(keys[n - 1])
                try:
                    for rank in range(WORLD):
                        ok, outs = t.read(keys[:n], rank)
                        if not all(ok) or not _same(outs, keys[:n], rank):
                            errors.append(f"chain {salt} rank {rank}: bad read")
                finally:
                    if held:
                        with lock:
                            t.index.release(keys[n - 1])

        threads = [threading.Thread(target=engine, args=(s,)) for s in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors

    @exact
    def test_a_persistent_tier_is_found_by_the_next_engine(self, make: Make) -> None:
        t = make()
        keys = chain(4, salt=60)
        t.store_chain(keys)
        again = t.reopen()
        if again.caps.persistent:
            assert again.leading(keys) == 4
            for rank in range(WORLD):
                ok, outs = again.read(keys, rank)
                assert ok == [True] * 4 and _same(outs, keys, rank)
        elif not again.caps.shared:  # a private tier of this process: gone with it
            assert again.leading(keys) == 0
        again.close()

    @exact
    def test_the_listener_hears_what_becomes_readable(self, make: Make) -> None:
        t = make()
        heard: list[tuple[str, Key]] = []

        class Listener:
            def ready_run(self, keys: list[Key]) -> None:
                heard.extend(("ready", k) for k in keys)

            def unready(self, key: Key) -> None:
                heard.append(("unready", key))

            def removed(self, key: Key) -> None:
                heard.append(("removed", key))

        if not t.caps.events:
            return  # the kind says it tells nothing; the connector attaches no listener
        t.index.listener = Listener()
        keys = chain(3, salt=70)
        t.store_chain(keys)
        assert heard == [("ready", k) for k in keys], "ready, parents before children"
        heard.clear()
        t.index.invalidate(keys[1])
        unready = {k for e, k in heard if e == "unready"}
        if t.caps.shared:
            assert unready == {keys[1]}
        else:
            assert unready == set(keys[1:]) and {k for e, k in heard if e == "removed"} == unready

    @exact
    def test_close_is_idempotent(self, make: Make) -> None:
        t = make()
        for store in t.stores:
            store.close()
            store.close()


class _SharedStoreTests(_Base):
    """What a shared store must survive: other engines writing it, values gone or bad."""

    @tampered
    def test_a_probe_stops_at_the_first_miss_of_any_rank(self, case: KindCase, make: Make) -> None:
        t = make()
        assert t.caps.shared, "raw access (tamper) is for shared stores"
        raw = case.tamper(t) if case.tamper else None
        assert raw is not None
        keys = chain(8, salt=80)
        t.store_chain(keys)
        raw.drop(keys[5], 0)
        assert t.leading(keys) == 5
        raw.drop(keys[2], 1)  # one rank's shard gone: the chunk is gone
        assert t.leading(keys) == 2
        assert t.leading(keys, 3) == 5, "a probe from a later start sees past a miss"

    @tampered
    def test_bad_values_fail_only_their_chunk(self, case: KindCase, make: Make) -> None:
        t = make()
        raw = case.tamper(t) if case.tamper else None
        assert raw is not None
        keys = chain(6, salt=81)
        t.store_chain(keys)
        good = raw.get(keys[0], 0)
        assert good is not None
        raw.drop(keys[1], 0)  # missing
        raw.put(keys[2], 0, good[: len(good) // 2])  # truncated
        bad = bytearray(good)
        bad[-1] ^= 0xFF
        raw.put(keys[3], 0, bytes(bad))  # corrupt
        raw.put(keys[4], 0, good)  # another key's value under this key
        raw.put(keys[5], 0, b"\x80\x04garbage that is no envelope")
        ok, outs = t.read(keys, 0)
        assert ok == [True, False, False, False, False, False]
        assert torch.equal(outs[0], payload(keys[0], 0))

    @tampered
    def test_the_first_writer_s_bytes_stay(self, make: Make) -> None:
        t = make()
        keys = chain(4, salt=82)
        t.store_chain(keys)
        other = t.another_engine()
        noise = [[(0, torch.full((4096,), 7, dtype=torch.uint8))] for _ in keys]
        assert other.write([NO_SLOT] * 4, keys, noise, None) == [True] * 4
        ok, outs = t.read(keys, 0)
        assert ok == [True] * 4 and _same(outs, keys, 0)

    @tampered
    def test_another_layout_never_validates(self, make: Make) -> None:
        t = make()
        keys = chain(3, salt=83)
        foreign = t.another_engine(OTHER_LAYOUT)
        data = [[(0, payload(k, 0))] for k in keys]
        assert foreign.write([NO_SLOT] * 3, keys, data, None) == [True] * 3
        ok, _ = t.read(keys, 0)
        assert ok == [False] * 3

    @tampered
    def test_engines_writing_one_chain_at_once(self, make: Make) -> None:
        t = make(64)
        keys = chain(16, salt=84)
        errors: list[Any] = []

        def engine() -> None:
            store = t.another_engine()
            data = [[(0, payload(k, 0))] for k in keys]
            for _ in range(5):
                store.write([NO_SLOT] * 16, keys, data, None)
                ok, outs = t.read(keys, 0, store)
                if not all(ok) or not _same(outs, keys, 0):
                    errors.append("bad read")

        threads = [threading.Thread(target=engine) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors
        assert t.leading(keys) == 0, "rank 1 never wrote: the chunks are not whole"


class _FaultTests(_Base):
    """Failures are clean: per chunk, and never a success for bytes that were not written."""

    @every
    def test_failures_are_clean(self, case: KindCase, make: Make) -> None:
        t = make(24)
        rng = random.Random(7)
        chains = [chain(6, salt=90 + s) for s in range(6)]
        failures = 0
        for _ in range(30):
            keys = rng.choice(chains)[: rng.randint(1, 6)]
            start = t.index.stored_len(keys)
            ok = t.store_chain(keys)
            failures += ok.count(False)
            n = t.leading(keys)
            if not t.caps.shared and False in ok:
                assert n <= start + ok.index(False), "a failed write became readable"
            if n == 0:
                continue
            held = t.index.hold(keys[n - 1])
            try:
                for rank in range(WORLD):
                    got, outs = t.read(keys[:n], rank)
                    for i, good in enumerate(got):
                        if good:
                            assert torch.equal(outs[i], payload(keys[i], rank)), "wrong bytes"
                    if False in got:
                        failures += 1
                        t.index.invalidate(keys[got.index(False)])
                        break
            finally:
                if held:
                    t.index.release(keys[n - 1])
        if case.faulty:
            assert failures > 0, "the faults never fired: the test proved nothing"
        else:
            assert failures == 0, "without faults every store and load succeeds"


class TierConformance(_ContractTests, _SharedStoreTests, _FaultTests):
    """The whole suite (see the module docstring)."""
