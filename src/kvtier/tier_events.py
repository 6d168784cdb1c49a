"""Tier events: which chunks became readable in each tier and which left it, for KV-aware
routers (engine-agnostic bookkeeping; :mod:`kvtier.vllm.events` turns it into vLLM events).

Where the truth lives: every authoritative tier's index is on the scheduler side, in the
scheduler's thread, and its :class:`~kvtier.contract.IndexListener` hook tells this log
of each change as it happens: a chain of keys committed (``ready_run``), an eviction, a
drop of a failed store or check, a reset (``unready``). No worker-side event is needed.

Identity. A router knows blocks by the engine's block hashes and tokens, never by kvtier's
chunk keys, so a chunk is named ``(source, i)``: the ``i``-th chunk of a request's token
sequence (``source`` is opaque here; the vLLM side reads tokens and block hashes from it
only when it emits). The log keeps names as ranges, never per chunk: a planned store says
"keys are chunks ``first ..`` of ``source``" once (:meth:`TierEvents.learn`, a
:class:`_Record`), and a key where some transfer of chunks starts (a store, or a copy to the
tier below that starts inside a store's range, :meth:`TierEvents.copying`) maps to its
record and position there. A committed chain is then named by one lookup of its first key
and one comparison of its last (chained keys: equal there, equal all along), so a store's
bookkeeping is O(runs), not O(chunks). What each tier holds is kept as announced segments
(a record's range) keyed by their last key: an authoritative index unreadies a chain's keys
deepest first, so a removal always takes a segment's last key, O(1) too. A key with no
start (a demotion's chain, a shared tier's failed check) is named through a per-key map of
every record, built in one C-level pass when first needed and rebuilt when it has grown
twice as large as the live records. A start is forgotten when its key has left every tier
(checked at the next :meth:`TierEvents.take`), and with it a store's record, so what the log
keeps is bounded by what the tiers hold. It exists only while events are on: without a log
nothing is recorded at all.

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
from typing import Any

from kvtier.keys import Key
from kvtier.stack.stack import TierStack
from kvtier.tiers.index import SlotIndex
from kvtier.tiers.runs import chain_overlap

Ident = tuple[object, int]
"""``(source, chunk index in the source's token sequence)``: where a chunk's engine
identity is read from."""

MAX_BLOCKS_PER_TAKE = 16384
"""Engine blocks' worth of events one :meth:`TierEvents.take` returns at most."""


@dataclass(frozen=True, slots=True)
class EventRun:
    """Consecutive events of one kind in one tier.

    A store run is a chain: chunks ``first .. first + count - 1`` of ``source``. A removal
    run lists its chunks' identities in ``removals`` (any sources, any order)."""

    stored: bool
    tier: int
    """Position of the tier in the stack."""
    source: object = None
    first: int = 0
    count: int = 0
    removals: tuple[Ident, ...] = ()

    @property
    def chunks(self) -> tuple[Ident, ...]:
        """Every chunk's identity (a store run's built here: O(chunks))."""
        if not self.stored:
            return self.removals
        return tuple((self.source, i) for i in range(self.first, self.first + self.count))


class _Record:
    """A planned store's (or an announcement's) names: ``keys`` are chunks ``first,
    first + 1, ...`` of ``source``'s sequence. Kept, not copied: never changed after."""

    __slots__ = ("first", "keys", "refs", "source")

    def __init__(self, source: object, first: int, keys: list[Key]) -> None:
        self.source = source
        self.first = first
        self.keys = keys
        self.refs = 0
        """Starts naming a position in it: kept while there is one."""


Named = tuple[_Record, int]
"""A key's record and its position in the record's keys."""


class _Listener:
    """An authoritative tier's listener: its announced segments ``[record, lo, hi]`` (the
    record's keys ``lo .. hi - 1``) by last key, and its restored keys not announced."""

    __slots__ = ("log", "tails", "tier", "unknown")

    def __init__(self, log: TierEvents, tier: int, unknown: set[Key]) -> None:
        self.log = log
        self.tier = tier
        self.tails: dict[Key, list[Any]] = {}
        self.unknown = unknown

    def ready_run(self, keys: list[Key]) -> None:
        log, i, n = self.log, 0, len(keys)
        while i < n:
            named = log.name(keys[i])
            if named is None:  # no identity (restored after the log started): per key
                self.unknown.add(keys[i])
                log.unknown += 1
                i += 1
                continue
            rec, off = named
            m = chain_overlap(rec.keys, off, keys, i)
            self.tails[keys[i + m - 1]] = [rec, off, off + m]
            log.announced[self.tier] += m
            log._push_stored(self.tier, rec.source, rec.first + off, m)
            i += m

    def unready(self, key: Key) -> None:
        seg = self.tails.pop(key, None)
        if seg is not None:  # ``key`` ends it (the deepest of its chain to go)
            rec, lo, hi = seg
            hi -= 1
            self.log._push_removed(self.tier, (rec.source, rec.first + hi))
            self.log.announced[self.tier] -= 1
            if hi > lo:
                seg[2] = hi
                self.tails[rec.keys[hi - 1]] = seg
        elif key in self.unknown:
            self.unknown.discard(key)
            self.log.unknown -= 1

    def removed(self, key: Key) -> None:
        if key in self.log._starts:
            # Forgotten at the next take, not now: an evicted chunk being demoted is
            # reserved in the tier below only after the eviction, in the same call.
            self.log._gone.append(key)


class _SharedListener:
    """A shared tier's: no membership kept (the store evicts unseen), so every store this
    engine makes is told, and every failed check."""

    __slots__ = ("log", "tier")

    def __init__(self, log: TierEvents, tier: int) -> None:
        self.log = log
        self.tier = tier

    def ready_run(self, keys: list[Key]) -> None:
        log, i, n = self.log, 0, len(keys)
        while i < n:
            named = log.name(keys[i])
            if named is None:
                i += 1
                continue
            rec, off = named
            m = chain_overlap(rec.keys, off, keys, i)
            log._push_stored(self.tier, rec.source, rec.first + off, m)
            i += m

    def unready(self, key: Key) -> None:
        named = self.log.name(key)
        if named is not None:
            self.log._push_removed(self.tier, (named[0].source, named[0].first + named[1]))

    def removed(self, key: Key) -> None:
        return None


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
        self._starts: dict[Key, Named] = {}
        """Keys where a planned transfer of named chunks starts -> their name."""
        self._records: set[_Record] = set()
        """Records some start names; ``_record_keys``: their keys in all."""
        self._record_keys = 0
        self._named: dict[Key, Named] = {}
        """Every key of the records in it (see :meth:`name`); ``_unnamed``: records not yet."""
        self._unnamed: list[_Record] = []
        self.announced = [0] * len(stack.tiers)
        """Per authoritative tier, chunks announced readable and not yet removed."""
        self._slot_tiers = [t.index for t in stack.tiers if not t.shared]
        self._listeners: list[_Listener | None] = [None] * len(stack.tiers)
        self._queue: deque[list[Any]] = deque()
        self._gone: list[Key] = []
        """Start keys that left a tier since the last take: their name may be forgotten."""
        self.unknown = 0
        """Readable chunks not announced for want of an identity (restored at start)."""
        for t, tier in enumerate(stack.tiers):
            if not tier.capabilities.events:
                continue
            if tier.shared:
                if shared:
                    tier.index.listener = _SharedListener(self, t)
                continue
            index = tier.index
            assert isinstance(index, SlotIndex)
            held = set(index.ready_keys())  # what a restore put there before us
            listener = self._listeners[t] = _Listener(self, t, held)
            index.listener = listener
            self.unknown += len(held)

    # -- identities ------------------------------------------------------------------------

    def learn(self, source: object, first: int, keys: list[Key]) -> None:
        """``keys`` are chunks ``first, first + 1, ...`` of ``source``'s sequence (a store
        of them is being planned). O(1) (unless its first key starts others' ranges too):
        the list is kept, so it must not change after."""
        if keys:
            self._place(keys[0], _Record(source, first, keys), 0)

    def copying(self, keys: Sequence[Key], start: int) -> None:
        """``keys[start:]`` are about to be copied to a tier below, where ``keys[0]``
        starts a transfer this log knows (a store's or a copy's): name the copy's start so
        the tier below hears its commit at O(1) (:class:`~kvtier.stack.movement.Movement`
        tells it)."""
        i = 0
        while 0 < start < len(keys):
            named = self._starts.get(keys[i])
            if named is None:
                return  # named through the per-key map when committed
            rec, off = named
            m = chain_overlap(rec.keys, off, keys, i)
            if i + m > start:
                self._place(keys[start], rec, off + start - i)
                return
            i += m

    def name(self, key: Key) -> Named | None:
        """``key``'s record and position: its start's, else through the per-key map (built
        here, in one pass over the records not in it yet, when a key needs it)."""
        named = self._starts.get(key)
        if named is None:
            named = self._named.get(key)
            if named is None and self._unnamed:
                for rec in self._unnamed:
                    if rec in self._records:
                        self._named.update(zip(rec.keys, zip(repeat(rec), count()), strict=False))
                self._unnamed.clear()
                named = self._named.get(key)
        return named

    def _place(self, key: Key, rec: _Record, off: int) -> None:
        """Make ``key`` (``rec.keys[off]``) a start naming ``rec`` from ``off`` on. A start
        there already keeps naming what both ranges share: the longer one names the key,
        and where they part the other is placed at its own next key, so every range stays
        reachable from some start and each start names one record."""
        while True:
            old = self._starts.get(key)
            if old is None:
                break
            orec, ooff = old
            m = chain_overlap(orec.keys, ooff, rec.keys, off)
            if m == len(rec.keys) - off:
                return  # covered already
            if m == len(orec.keys) - ooff:  # the new range covers the old one
                self._unref(orec)
                break
            off += m  # they part there: the old one keeps ``key``
            key = rec.keys[off]
        self._starts[key] = (rec, off)
        rec.refs += 1
        if rec.refs == 1:
            self._records.add(rec)
            self._record_keys += len(rec.keys)
            self._unnamed.append(rec)

    def _unref(self, rec: _Record) -> None:
        rec.refs -= 1
        if rec.refs == 0:
            self._records.discard(rec)
            self._record_keys -= len(rec.keys)

    def announce_held(self, source: object, keys: Sequence[Key]) -> int:
        """Announce the chunks of chain ``keys`` (``source``'s, from chunk 0) that a tier
        holds readable but never announced (restored). A no-op unless some are; otherwise
        O(chunks held). Returns how many were announced."""
        if self.unknown <= 0:
            return 0
        n_new = 0
        rec: _Record | None = None
        for t, listener in enumerate(self._listeners):
            if listener is None or not listener.unknown:
                continue
            held = self.stack.tiers[t].index.leading(keys, 0)
            assert isinstance(held, int)  # an authoritative index answers at once
            unknown, i = listener.unknown, 0
            while i < held:
                if keys[i] not in unknown:
                    i += 1
                    continue
                j = i
                while j < held and keys[j] in unknown:
                    unknown.discard(keys[j])
                    j += 1
                if rec is None or len(rec.keys) < held:
                    rec = _Record(source, 0, list(keys[:held]))
                self._place(keys[i], rec, i)
                listener.tails[keys[j - 1]] = [rec, i, j]
                self.announced[t] += j - i
                self._push_stored(t, source, i, j - i)
                n_new += j - i
                i = j
        self.unknown = max(0, self.unknown - n_new)
        return n_new

    def announce_one(self, source: object, index: int, key: Key) -> int:
        """Announce ``key``, chunk ``index`` of ``source``'s sequence, in every tier that
        holds it readable but never announced it (restored); a key that is not a chain
        (a recurrent state: :mod:`kvtier.stack.states`). How many tiers announced it."""
        n = 0
        for t, listener in enumerate(self._listeners):
            if listener is None or key not in listener.unknown:
                continue
            listener.unknown.discard(key)
            rec = _Record(source, index, [key])
            self._place(key, rec, 0)
            listener.tails[key] = [rec, 0, 1]
            self.announced[t] += 1
            self._push_stored(t, source, index, 1)
            n += 1
        self.unknown = max(0, self.unknown - n)
        return n

    # -- recording -----------------------------------------------------------------------

    def _push_stored(self, t: int, source: object, first: int, n: int) -> None:
        """Queue a store run, extending the last one when it continues it (one source's
        consecutive chunks), so a take costs O(runs)."""
        queue = self._queue
        if queue:
            last = queue[-1]
            if last[0] and last[1] == t and last[2] is source and last[3] + last[4] == first:
                last[4] += n
                return
        queue.append([True, t, source, first, n])

    def _push_removed(self, t: int, ident: Ident) -> None:
        queue = self._queue
        if queue:
            last = queue[-1]
            if not last[0] and last[1] == t:
                last[2].append(ident)
                return
        queue.append([False, t, [ident]])

    def _forget_gone(self) -> None:
        starts, tiers = self._starts, self._slot_tiers
        for key in self._gone:
            named = starts.get(key)
            if named is not None and not any(ix.has(key) for ix in tiers):
                del starts[key]
                self._unref(named[0])
        self._gone.clear()
        if len(self._named) > 2 * self._record_keys + 1024:  # mostly forgotten records
            self._named.clear()
            self._unnamed = list(self._records)

    # -- draining --------------------------------------------------------------------------

    def pending(self) -> bool:
        return bool(self._queue)

    def starts(self) -> set[Key]:
        """Keys the log keeps a name for (inspection and tests; each held by some tier
        after a :meth:`take`)."""
        return set(self._starts)

    def take(self) -> list[EventRun]:
        """The events since the last call, oldest first, as runs (at most ``max_blocks``
        engine blocks' worth; the rest waits for the next call). Also forgets the names of
        chunks no tier holds any more."""
        if self._gone:
            self._forget_gone()
        queue = self._queue
        runs: list[EventRun] = []
        budget = max(1, self.max_blocks // self.blocks_per_chunk)
        while queue and budget > 0:
            head = queue[0]
            if head[0]:
                _, t, source, first, n = head
                if n > budget:  # split: the head now, the tail next time
                    runs.append(EventRun(True, t, source, first, budget))
                    head[3], head[4] = first + budget, n - budget
                    break
                runs.append(EventRun(True, t, source, first, n))
            else:
                _, t, chunks = head
                if len(chunks) > budget:
                    runs.append(EventRun(False, t, count=budget, removals=tuple(chunks[:budget])))
                    del chunks[:budget]
                    break
                runs.append(EventRun(False, t, count=len(chunks), removals=tuple(chunks)))
                n = len(chunks)
            queue.popleft()
            budget -= n
        return runs
