"""Recurrent states of hybrid models (Mamba / gated delta net / linear attention next to
attention): the scheduler side of storing them at chunk boundaries and of hits that need
them.

A hybrid request can resume from a prefix of ``H`` tokens only with the attention KV of
those tokens *and* the recurrent state after exactly ``H`` tokens (every recurrent layer).
The engine offers states at some boundaries (vLLM: ``boundary_state_offloads``, one block
per recurrent KV-cache group, valid until the end of the step that offered them); kvtier
stores the states offered at chunk boundaries, keyed by the chunk key that ends there,
tagged as a state (:func:`state_key`): only that exact prefix restores it.

States live in a tier stack of their own (:meth:`StateCache.stack`), built from the same
tier specs as the attention chunks with a share of each tier's capacity
(``state_share``), so that a slot fits one state without sizing every attention slot for
it (a real state is tens of MB, an attention chunk a few). A state is one "chunk" of that
stack: the job machinery, eviction, write-through and demotion to the tiers below, envelopes
and checks are the attention chunks'.

A hit (:meth:`StateCache.trim`) is the longest prefix whose attention chunks are found and
whose state is present, capped so that at least one token is computed; it always loads
asynchronously (an engine copies the state into its running block before the step's
loads could run: vLLM's ``preprocess_mamba``). A state without its attention prefix is
never a hit (the lookup needs both), and a dropped or failed state makes the hit fall back
to an earlier boundary, or to none.

Single-threaded (the scheduler's thread), like :class:`kvtier.manager.CacheManager`.
"""

from __future__ import annotations

import dataclasses
import os
from collections import deque
from collections.abc import Sequence
from typing import Any

import blake3

from kvtier.config import KVTierConfig, state_faults
from kvtier.contract import IndexListener, TierIndex
from kvtier.contract.spec import TierSpec
from kvtier.jobs import MISSING, StepPlan, TransferJob
from kvtier.keys import Key, Namespace
from kvtier.layout import KVLayout
from kvtier.manager import CacheManager
from kvtier.metrics import Metrics
from kvtier.stack.requests import Hit
from kvtier.stack.stack import TierStack
from kvtier.tiers.disk.kind import STATES_DIR

_TAG = b"kvtier-recurrent-state\x00"


def state_key(chunk_key: Key) -> Key:
    """The key of the recurrent state after the chunk ``chunk_key`` ends: a keyed digest
    of that chunk key (which chains every token before it, the namespace and the key
    secret), of the same length, never equal to an attention chunk's key."""
    return blake3.blake3(_TAG + chunk_key).digest(len(chunk_key))


def split_specs(config: KVTierConfig) -> tuple[tuple[TierSpec, ...], tuple[TierSpec, ...]]:
    """``(attention specs, state specs)`` of the config's stack: each tier's capacity split
    by ``state_share`` (the part that holds states); a tier keeping files keeps the
    states' files in a ``states`` subdirectory of its own (slot sizes differ). The state
    tiers' faults are ``fault_injection``'s "states" (first tier), none else."""
    share = config.state_share
    attn: list[TierSpec] = []
    states: list[TierSpec] = []
    for spec in config.tier_specs():
        cap = spec.capacity or 0
        state_cap = int(cap * share)
        attn.append(dataclasses.replace(spec, capacity=cap - state_cap))
        opts = spec.options
        path = getattr(opts, "path", None)
        if path:
            opts = dataclasses.replace(opts, path=os.path.join(path, STATES_DIR))  # type: ignore[call-arg]
        states.append(
            dataclasses.replace(
                spec, name=spec.label, capacity=state_cap, options=opts, faults=None
            )
        )
    faults = state_faults(config)
    if faults is not None and states:
        states[0] = dataclasses.replace(states[0], faults=faults)
    return tuple(attn), tuple(states)


class _DropStates:
    """Listener on an attention tier's index: a chunk that leaves it takes the state
    keyed from it out of the state tier at the same position (a state without its
    attention prefix is never a hit, and would only hold a slot); then tells the listener
    that was there before, if any."""

    def __init__(self, states: TierIndex, before: IndexListener | None) -> None:
        self.states = states
        self.before = before

    def ready_run(self, keys: list[Key]) -> None:
        if self.before is not None:
            self.before.ready_run(keys)

    def unready(self, key: Key) -> None:
        if self.before is not None:
            self.before.unready(key)

    def removed(self, key: Key) -> None:
        self.states.invalidate(state_key(key))
        if self.before is not None:
            self.before.removed(key)


def link_eviction(attention: TierStack, states: TierStack) -> None:
    """Tie each state tier to its attention tier (same position, same spec): a state
    lives no longer than the chunk that ends at its boundary there. Shared tiers evict on
    their own and are left alone (a lookup needs both anyway)."""
    for a, s in zip(attention.tiers, states.tiers, strict=True):
        if a.shared or s.shared:
            continue
        index: Any = a.index
        if hasattr(index, "listener"):
            index.listener = _DropStates(s.index, index.listener)


@dataclasses.dataclass
class _Offer:
    blocks: dict[int, int]
    """Recurrent group -> engine block holding the state."""


class StateCache:
    """Scheduler-side state keeping for a hybrid model (see the module docstring).

    ``groups``: the engine's recurrent KV-cache group ids, in the order a state's payload
    lists them (a state is one block per group). ``chunk_tokens``: the attention chunk size
    (a state is stored only at a multiple of it).
    """

    def __init__(
        self,
        config: KVTierConfig,
        layout: KVLayout,
        namespace: Namespace,
        stack: TierStack,
        groups: Sequence[int],
        chunk_tokens: int,
        block_tokens: int,
        *,
        num_workers: int = 1,
        metrics: Metrics | None = None,
    ) -> None:
        self.groups = list(groups)
        self.chunk_tokens = chunk_tokens
        self.block_tokens = block_tokens
        # One state is one "chunk" of one block per group: the manager's job table,
        # movement between tiers and job endings serve it unchanged.
        self.cache = CacheManager(
            dataclasses.replace(config, chunk_tokens=0),
            layout,
            namespace,
            1,
            stack,
            num_workers=num_workers,
            metrics=metrics,
            defer_on_inflight_loads=False,
        )
        self.stack = stack
        self._stores: list[TransferJob] = []
        self._hits: dict[str, tuple[int, Key, int]] = {}
        """Request -> (chunk count of its hit, state key, tier position it was found in):
        from lookup to allocation."""
        self._offers: dict[tuple[str, int], _Offer] = {}
        self.stored_offers = 0
        """Boundary states planned for storing (inspection and tests)."""
        self.skipped_offers = 0
        """Offers not stored: off a chunk boundary, keys unknown, present, or no room."""
        self.recent_hits: deque[tuple[str, int]] = deque(maxlen=4096)
        """(request, the boundary in tokens its lookup's state was found at, 0 for none),
        the last lookups' (inspection and tests)."""

    # -- lookups ---------------------------------------------------------------------------

    def trim(self, req_id: str, hit: Hit, keys: Sequence[Key], num_tokens: int) -> Hit | None:
        """The part of ``hit`` (attention chunks found past the engine's own prefix) that
        can be served: up to the last chunk boundary at or before ``num_tokens - 1`` whose
        state is present. None: a tier cannot answer yet (ask again)."""
        c = self.chunk_tokens
        start = hit.start
        top = min(hit.end, num_tokens - 1) // c
        self._hits.pop(req_id, None)
        for k in range(top, start // c, -1):
            if k * c <= start:
                break
            skey = state_key(keys[k - 1])
            found = self.stack.lookup([skey], 0)
            if found is None:
                return None
            if found:
                self._hits[req_id] = (k, skey, found[0][0])
                self.recent_hits.append((req_id, k * c))
                runs = tuple((t, a, min(b, k)) for t, a, b in hit.runs if a < k)
                return Hit(start, k * c, runs)
        self.recent_hits.append((req_id, 0))
        return Hit(start, start, ())

    def allocated(self, req_id: str, group_blocks: Sequence[Sequence[int]], accepted: int) -> None:
        """The engine accepted ``accepted`` external tokens of the request's trimmed hit and
        allocated ``group_blocks`` (every KV-cache group's block list): plan the state load
        into each recurrent group's block at the hit's last position."""
        got = self._hits.pop(req_id, None)
        if got is None or accepted <= 0:
            return
        k, skey, t = got
        pos = k * self.chunk_tokens // self.block_tokens - 1
        blocks = [group_blocks[g][pos] for g in self.groups]
        tier = self.stack[t]
        if tier.shared:
            slots = [-1]  # key-addressed
        elif tier.index.has(skey) and tier.index.is_ready(skey):
            slots = tier.index.chain_slots([skey])
        else:
            # Evicted since the lookup (by a store of the same step): no slot to read,
            # the worker fails the load and the request recomputes.
            slots = [MISSING]
        job = TransferJob(
            job_id=0,
            req_id=req_id,
            kind="load",
            tier=tier.name,
            sync=False,
            keys=[skey],
            slots=slots,
            block_ids=blocks,
        )
        jobs = self.cache.jobs
        jobs.add(job, jobs.hold(tier.index, skey) if slots != [MISSING] else [])
        self.cache.loads.pending.append(job)
        self.cache.metrics.inc("loads", 1, tier.name, "async")

    # -- stores ----------------------------------------------------------------------------

    def offer(
        self, req_id: str, group: int, block: int, boundary: int, keys: Sequence[Key]
    ) -> None:
        """The engine offers the state after ``boundary`` tokens of the request, in
        ``block`` of recurrent group ``group``, until the end of this step; ``keys`` the
        request's chunk keys known so far. Stored once every group offered it."""
        c = self.chunk_tokens
        if boundary <= 0 or boundary % c or len(keys) < boundary // c or group not in self.groups:
            self.skipped_offers += 1
            return
        offer = self._offers.setdefault((req_id, boundary), _Offer({}))
        offer.blocks[group] = block
        if len(offer.blocks) < len(self.groups):
            return
        del self._offers[(req_id, boundary)]
        skey = state_key(keys[boundary // c - 1])
        entry = self.cache.stack[0]
        if entry.shared or entry.index.has(skey):
            # Held already (the tiers below got it through their edges when it was stored;
            # a shared tier's probe may still be out, and must not hold a store back).
            self.skipped_offers += 1
            return
        slots, demotions = self.cache.movement.reserve(0, [skey], None, req_id)
        self._stores += demotions
        if not slots:
            self.skipped_offers += 1
            return
        job = TransferJob(
            job_id=0,
            req_id=req_id,
            kind="store",
            tier=entry.name,
            sync=False,
            keys=[skey],
            slots=slots,
            block_ids=[offer.blocks[g] for g in self.groups],
            parents=[None],
            after=self.cache.movement.after(0, slots),
        )
        self.cache.jobs.add(job)
        self._stores.append(job)
        self.stored_offers += 1
        # Tier events name the state by the chunk that ends at its boundary.
        self.cache.on_store_planned(req_id, boundary // c - 1, job.keys)

    def build_step(self) -> StepPlan:
        """This step's state jobs: loads accepted since the last step, stores of the
        states offered this step (they must run before the step ends), copies between
        tiers. Offers of this step not completed by every group are dropped."""
        plan = self.cache.build_step(())
        plan.stores = [*plan.stores, *self._stores]
        self._stores = []
        self._offers.clear()
        return plan

    def drop(self, keys: Sequence[Key], from_tokens: int) -> int:
        """Forget the states of the chain ``keys`` at every chunk boundary from
        ``from_tokens`` on, in every tier that holds them (tests and operators: what a
        lost state looks like); how many were held."""
        c = self.chunk_tokens
        n = 0
        for k in range(max(1, -(-from_tokens // c)), len(keys) + 1):
            skey = state_key(keys[k - 1])
            for tier in self.stack.tiers:
                if not tier.shared and tier.index.has(skey):
                    tier.index.invalidate(skey)
                    n += 1
        return n

    def forget(self, req_id: str) -> None:
        self._hits.pop(req_id, None)
