"""Tier events: which chunks became readable in each tier and which left it, for KV-aware
routers (engine-agnostic bookkeeping; :mod:`kvtier.vllm.events` turns it into vLLM events).

Where the truth lives: every authoritative tier's index is on the scheduler side, in the
scheduler's thread, and its :class:`~kvtier.tiers.base.IndexListener` hook tells this log
of each change as it happens: a store or copy committed (``ready``), an eviction, a drop
of a failed store or check, a reset (``unready``). No worker-side event is needed.

Identity. A router knows blocks by the engine's block hashes and tokens, never by kvtier's
chunk keys, so the log keeps, for every chunk some tier holds (or is being stored into),
where its identity can be read: ``(source, i)``, the ``i``-th chunk of a request's token
sequence (``source`` is opaque here; the vLLM side reads tokens and block hashes from it
only when it emits). The map is filled when a store is planned (:meth:`learn`) and loses a
key once the key has left the last tier holding it (checked at the next :meth:`take`), so
it is bounded by the tiers' sizes.
It exists only while events are on: without a log nothing is recorded at all.

Chunks whose identity is unknown are not announced (a placeholder without tokens is useless
to a router once the engine's own copy is gone). That is the case of the chunks a disk tier
restores at a restart: slab headers hold keys, not tokens. They are announced when a request
whose prefix they hold is looked up (:meth:`announce_held`), as many as that request names:
a restart never emits the whole disk in one step, nor ever unless it is used.

Order: parents before children within a tier (stores commit in chain order and promote
parents first); one ``take`` returns at most ``max_blocks`` engine blocks' worth of events,
oldest first, and keeps the rest for the next call, so a large reset is spread over steps.

Shared tiers (``shared=True``) are told only what this engine sees: its own successful
stores and the values that failed a check; the store evicts unseen, so their removals are
never complete. Single-threaded (the scheduler's).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count, repeat

from kvtier.keys import Key
from kvtier.stack.stack import TierStack

Ident = tuple[object, int]
"""``(source, chunk index in the source's token sequence)``: where a chunk's engine
identity is read from."""

MAX_BLOCKS_PER_TAKE = 16384
"""Engine blocks' worth of events one :meth:`TierEvents.take` returns at most."""


@dataclass(frozen=True, slots=True)
class EventRun:
    """Consecutive events of one kind in one tier.

    A store run is a chain: chunks ``first .. first + count - 1`` of one source. A removal
    run lists its chunks' identities (any sources, any order)."""

    stored: bool
    tier: int
    """Position of the tier in the stack."""
    chunks: tuple[Ident, ...]


class _Listener:
    """An authoritative tier's listener (inlined: it runs once per chunk stored)."""

    __slots__ = ("ids", "log", "seen", "tier")

    def __init__(self, log: TierEvents, tier: int) -> None:
        self.log = log
        self.tier = tier
        self.ids = log.identities
        self.seen = log.announced[tier]

    def ready(self, key: Key) -> None:
        ident = self.ids.get(key)
        if ident is None:
            self.log.unknown += 1
        elif key not in self.seen:
            self.seen.add(key)
            self.log._push(True, self.tier, ident)

    def unready(self, key: Key) -> None:
        seen = self.seen
        if key in seen:
            seen.discard(key)
            self.log._push(False, self.tier, self.ids[key])
        elif self.log.unknown > 0:
            self.log.unknown -= 1

    def removed(self, key: Key) -> None:
        if key in self.ids:
            # Forgotten at the next take, not now: an evicted chunk being demoted is
            # reserved in the tier below only after the eviction, in the same call.
            self.log._gone.append(key)


class _SharedListener(_Listener):
    """A shared tier's: no membership kept (the store evicts unseen), so every store this
    engine makes is told, and every failed check."""

    __slots__ = ()

    def ready(self, key: Key) -> None:
        ident = self.ids.get(key)
        if ident is not None:
            self.log._push(True, self.tier, ident)

    def unready(self, key: Key) -> None:
        ident = self.ids.get(key)
        if ident is not None:
            self.log._push(False, self.tier, ident)


class TierEvents:
    """The residency event log of one engine's tier stack (see the module docstring).

    Attaches itself as the listener of every authoritative tier's index (and of shared
    tiers' with ``shared=True``). ``blocks_per_chunk``: engine blocks per chunk (the unit of
    ``max_blocks``).
    """

    def __init__(
        self,
        stack: TierStack,
        blocks_per_chunk: int,
        *,
        shared: bool = False,
        max_blocks: int = MAX_BLOCKS_PER_TAKE,
    ) -> None:
        if blocks_per_chunk <= 0 or max_blocks <= 0:
            raise ValueError("blocks_per_chunk and max_blocks must be > 0")
        self.stack = stack
        self.blocks_per_chunk = blocks_per_chunk
        self.max_blocks = max_blocks
        self.identities: dict[Key, Ident] = {}
        """Chunk key -> identity, for every chunk some tier holds or is being stored into."""
        self.announced: list[set[Key]] = [set() for _ in stack.tiers]
        """Per authoritative tier, the keys announced readable and not yet removed."""
        self._slot_tiers = [t.index for t in stack.tiers if not t.shared]
        self._queue: deque[tuple[bool, int, list[Ident]]] = deque()
        self._gone: list[Key] = []
        """Keys that left a tier since the last take: their identity may be forgotten."""
        self.unknown = 0
        """Readable chunks not announced for want of an identity (restored at start)."""
        for t, tier in enumerate(stack.tiers):
            if (tier.shared and not shared) or not tier.capabilities.events:
                continue
            tier.index.listener = (_SharedListener if tier.shared else _Listener)(self, t)
            if not tier.shared:
                self.unknown += len(tier.index)  # what a restore put there before us

    # -- identities ------------------------------------------------------------------------

    def learn(self, source: object, first: int, keys: Sequence[Key]) -> None:
        """``keys`` are chunks ``first, first + 1, ...`` of ``source``'s sequence (a store
        of them is being planned)."""
        # One C-level pass; a key some tier holds already gets an equivalent identity.
        self.identities.update(zip(keys, zip(repeat(source), count(first)), strict=False))

    def announce_held(self, source: object, keys: Sequence[Key]) -> int:
        """Announce the chunks of chain ``keys`` (``source``'s, from chunk 0) that a tier
        holds readable but never announced (restored). A no-op unless some are; otherwise
        O(chunks held). Returns how many were announced."""
        if self.unknown <= 0:
            return 0
        n_new = 0
        ids = self.identities
        for t, tier in enumerate(self.stack.tiers):
            if tier.shared:
                continue
            held = tier.index.leading(keys, 0)
            assert isinstance(held, int)  # an authoritative index answers at once
            seen = self.announced[t]
            for i in range(held):
                key = keys[i]
                if key in seen:
                    continue
                ident = ids.setdefault(key, (source, i))
                seen.add(key)
                self._push(True, t, ident)
                n_new += 1
        self.unknown = max(0, self.unknown - n_new)
        return n_new

    # -- recording -----------------------------------------------------------------------

    def _push(self, stored: bool, t: int, ident: Ident) -> None:
        """Queue one chunk's event, extending the last run when it continues it (a store
        run is one source's consecutive chunks), so a take costs O(runs)."""
        queue = self._queue
        if queue:
            last = queue[-1]
            if last[0] is stored and last[1] == t:
                chunks = last[2]
                prev = chunks[-1]
                if not stored or (prev[0] is ident[0] and prev[1] + 1 == ident[1]):
                    chunks.append(ident)
                    return
        queue.append((stored, t, [ident]))

    def _forget_gone(self) -> None:
        ids, tiers = self.identities, self._slot_tiers
        for key in self._gone:
            if key in ids and not any(ix.has(key) for ix in tiers):
                del ids[key]
        self._gone.clear()

    # -- draining --------------------------------------------------------------------------

    def pending(self) -> bool:
        return bool(self._queue)

    def take(self) -> list[EventRun]:
        """The events since the last call, oldest first, as runs (at most ``max_blocks``
        engine blocks' worth; the rest waits for the next call). Also forgets the identities
        of chunks no tier holds any more."""
        if self._gone:
            self._forget_gone()
        queue = self._queue
        runs: list[EventRun] = []
        budget = max(1, self.max_blocks // self.blocks_per_chunk)
        while queue and budget > 0:
            stored, t, chunks = queue[0]
            if len(chunks) > budget:  # split: the head now, the tail next time
                runs.append(EventRun(stored, t, tuple(chunks[:budget])))
                del chunks[:budget]
                break
            queue.popleft()
            runs.append(EventRun(stored, t, tuple(chunks)))
            budget -= len(chunks)
        return runs
