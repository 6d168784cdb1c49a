"""What the conformance suite needs about one tier kind (:class:`KindCase`), and one tier of
it built as an engine builds it (:class:`BuiltTier`): the scheduler's index and one store
per rank, from a ``tiers`` entry, through the registry and the builders (so the fault
wrapper and the capability checks are part of what is tested)."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvtier.contract import Pending, Segments, SlotStore, TierIndex
from kvtier.contract.kind import Capabilities, TierContext
from kvtier.contract.spec import TierSpec
from kvtier.keys import Key, Namespace, chunk_keys
from kvtier.policies.registry import DEFAULT_EVICTION
from kvtier.stack.build import make_index, make_store
from kvtier.stack.parse import parse_tier, resolved
from kvtier.stack.registry import capabilities_of

CHUNK_BYTES = 4096
WORLD = 2
"""Ranks of every built tier: each chunk is stored as one shard per rank."""
NAMESPACE = Namespace("conformance", "layout-digest", f"tp{WORLD}")
OTHER_LAYOUT = Namespace("conformance", "another-layout", f"tp{WORLD}")
"""Same model and tenant (so a shared store names chunks alike), another KV layout: its
bytes must never validate as ours."""


@dataclass
class Tamper:
    """Raw access to the values a shared store holds (one per key and rank), for the tests
    that plant bad values: ``get`` (None: absent), ``put`` (overwrite), ``drop``."""

    get: Callable[[Key, int], bytes | None]
    put: Callable[[Key, int, bytes], None]
    drop: Callable[[Key, int], None]


@dataclass
class CaseContext:
    """What a case's ``entry`` function may use: a fresh directory and name per test,
    pytest fixtures, environment variables (undone after the test), finalizers."""

    tmp_path: Path
    fixture: Callable[[str], Any]
    setenv: Callable[[str, str], None]
    finalizer: Callable[[Callable[[], None]], None]
    unique: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


Entry = Mapping[str, Any] | Callable[[CaseContext], Mapping[str, Any]]


@dataclass(frozen=True)
class KindCase:
    """One configuration of a tier kind under test.

    ``entry``: a ``tiers`` entry (``capacity`` is set by each test), or a function of the
    :class:`CaseContext` returning one; it runs once per test and must leave the backing
    store empty (a shared store: flush it, or name a fresh one). ``tamper``: raw access to
    a shared store's values (the shared-store tests run for cases that give it; every
    shared case should). ``faulty``: the entry turns faults on (its ``faults``), so only the
    clean-failure test applies, and it must see failures.
    """

    id: str
    entry: Entry
    tamper: Callable[[BuiltTier], Tamper] | None = None
    faulty: bool = False


class BuiltTier:
    """One tier of a case: the scheduler's index and one store per rank, as the engine's
    two sides hold them, plus the engine's store and load sequences."""

    def __init__(self, spec: TierSpec, ctx: CaseContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.caps: Capabilities = capabilities_of(spec)
        self.index: TierIndex = make_index(spec, self.context(NAMESPACE))
        self.stores: list[SlotStore] = [self.store_of(NAMESPACE, r) for r in range(WORLD)]
        self._extra: list[SlotStore] = []
        self._closed = False

    @classmethod
    def of(cls, case: KindCase, ctx: CaseContext, chunks: int) -> BuiltTier:
        entry = dict(case.entry(ctx) if callable(case.entry) else case.entry)
        entry["capacity"] = chunks * CHUNK_BYTES
        spec = resolved(parse_tier(entry, f"case {case.id}", first=False), DEFAULT_EVICTION)
        return cls(spec, ctx)

    @staticmethod
    def context(namespace: Namespace, rank: int = 0) -> TierContext:
        return TierContext(CHUNK_BYTES, namespace.for_rank(rank), world=WORLD)

    def store_of(self, namespace: Namespace, rank: int) -> SlotStore:
        """A store of this tier as a worker of rank ``rank`` in ``namespace`` builds it."""
        return make_store(self.spec, self.context(namespace, rank))

    def another_engine(self, namespace: Namespace = NAMESPACE, rank: int = 0) -> SlotStore:
        """A store another engine (of ``namespace``) holds on the same shared store."""
        store = self.store_of(namespace, rank)
        self._extra.append(store)
        return store

    def reopen(self) -> BuiltTier:
        """This tier as a new engine finds it: everything closed, then built again."""
        self.close()
        return BuiltTier(self.spec, self.ctx)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for store in [*self.stores, *self._extra]:
            store.close()
        close = getattr(self.index, "close", None)
        if close is not None:
            close()

    # -- the engine's sequences -------------------------------------------------------------

    def store_chain(self, keys: Sequence[Key], parent: Key | None = None) -> list[bool]:
        """Store ``keys`` (a chain continuing ``parent``) as the engine does: skip what is
        stored, reserve, every rank writes its shard, commit the AND. Returns, per key
        written, whether it was committed (keys skipped as present are not listed)."""
        start = self.index.stored_len(keys)
        todo = list(keys[start:])
        anchor = keys[start - 1] if start else parent
        addrs = self.index.reserve(todo, anchor) if todo else []
        todo = todo[: len(addrs)]
        if not todo:
            return []
        parents: list[Key | None] = [anchor, *todo[:-1]]
        ok = [True] * len(todo)
        for rank, store in enumerate(self.stores):
            got = store.write(addrs, todo, [payload_segs(k, rank) for k in todo], parents)
            assert len(got) == len(todo), "a store answers once per chunk"
            ok = [a and b for a, b in zip(ok, got, strict=True)]
        self.index.commit(todo, ok)
        return ok

    def read(
        self, keys: Sequence[Key], rank: int, store: SlotStore | None = None
    ) -> tuple[list[bool], list[torch.Tensor]]:
        """Read the readable ``keys`` as one rank's load does, into fresh memory (two
        segments per chunk, as engine regions give it); the per-chunk results and bytes."""
        store = self.stores[rank] if store is None else store
        outs = [torch.full((CHUNK_BYTES,), 0xEE, dtype=torch.uint8) for _ in keys]
        h = CHUNK_BYTES // 2
        dst: list[Segments] = [[(0, o[:h]), (h, o[h:])] for o in outs]
        ok = store.read(self.index.slots_of(keys), keys, dst)
        assert len(ok) == len(keys), "a store answers once per chunk"
        return ok, outs

    def leading(self, keys: Sequence[Key], start: int = 0, timeout: float = 10.0) -> int:
        """``leading``, asked again while it answers "not yet" (as the scheduler would)."""
        deadline = time.monotonic() + timeout
        while True:
            n = self.index.leading(keys, start)
            if not isinstance(n, Pending):
                return n
            assert time.monotonic() < deadline, "a lookup never answered"
            time.sleep(0.001)


# -- data -------------------------------------------------------------------------------------


def chain(n: int, salt: int = 0) -> list[Key]:
    """``n`` chunk keys of 4 tokens; chains of distinct salts share no chunk."""
    seed = b"conformance" + salt.to_bytes(8, "little")
    return chunk_keys(list(range(n * 4)), 4, seed)


def payload(key: Key, rank: int) -> torch.Tensor:
    """The bytes rank ``rank`` stores for ``key`` (a function of both: any mix-up shows)."""
    digest = hashlib.shake_256(key + rank.to_bytes(2, "little")).digest(CHUNK_BYTES)
    return torch.frombuffer(bytearray(digest), dtype=torch.uint8)


def payload_segs(key: Key, rank: int) -> Segments:
    data = payload(key, rank)
    h = CHUNK_BYTES // 3  # uneven segments: offsets must be honoured
    return [(0, data[:h]), (h, data[h:])]
