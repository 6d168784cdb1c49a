"""Store planning: the store job of a request's newly complete chunks into its entry tier,
preceded by the demotions the reservation causes (the scheduler's thread)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.jobs import TransferJob
from kvtier.keys import Key
from kvtier.stack.arrivals import demote_entry
from kvtier.stack.job_table import JobTable
from kvtier.stack.movement import Movement
from kvtier.stack.requests import RequestState
from kvtier.stack.stack import TierStack


@dataclass(frozen=True)
class StorePlanner:
    """Plans the stores of requests' new chunks into their entry tiers, over the stack,
    its movement between tiers and the job table; ``chunk_tokens`` and
    ``blocks_per_chunk``: the chunk size in tokens and in engine blocks."""

    stack: TierStack
    movement: Movement
    jobs: JobTable
    chunk_tokens: int
    blocks_per_chunk: int

    def due(self, req: RequestState, limit: int) -> bool:
        """Whether a step ending with ``limit`` of the request's tokens computed (prompt
        tokens only) may store something; False means :meth:`plan` would plan nothing.
        O(1): by prefix closure the entry tier holds the chain up to chunk ``n`` when it
        holds chunk ``n``."""
        n = limit // self.chunk_tokens
        if req.unkeyable or n <= 0:
            return False
        keys = req.chain.keys
        return len(keys) < n or not self.stack[req.entry].index.has(keys[n - 1])

    def plan(
        self,
        req_id: str,
        req: RequestState,
        tokens: Sequence[int],
        limit: int,
        block_ids: Sequence[int],
        admission: Any,
        on_planned: Callable[[str, int, Sequence[Key]], None],
    ) -> list[TransferJob]:
        """The store of the request's chunks complete within its first ``limit`` tokens
        and not yet in its entry tier, after the demotions that reserving their slots
        causes; [] when there is none. ``admission``: the admission policy in force (the
        runner may swap it at run time); ``on_planned(req_id, first chunk, keys)`` is told
        of the store. Only this step's new chunks are copied out: a 128k-token prefill
        stores over many steps, and each step's work stays O(its chunks), not O(the
        chain)."""
        if req.unkeyable or req.hints.tier_hint == "skip":
            return []
        stack, c, bpc = self.stack, self.chunk_tokens, self.blocks_per_chunk
        n_full = min(limit // c, len(block_ids) // bpc)
        if n_full <= 0:
            return []
        chain = req.chain
        if len(chain.keys) < n_full:
            chain.update(tokens, n_full * c)
        t = req.entry if req.hints.tier_hint != "demote" else demote_entry(stack, req.entry)
        tier = stack[t]
        present = tier.index.stored_len(chain.keys, n_full)
        if present >= n_full:
            return []
        keys = chain.keys
        todo = keys[present:n_full]
        todo = todo[: admission.admit_run(todo)]
        if len(stack) == 1:  # a next tier takes what this one stores: store it all
            todo = todo[: tier.index.admit_chain(todo)]
        parent = keys[present - 1] if present else None
        slots, demotions = self.movement.reserve(t, todo, parent, req_id)
        if not slots:
            return demotions
        todo = todo[: len(slots)]
        on_planned(req_id, present, todo)
        store = TransferJob(
            job_id=0,
            req_id=req_id,
            kind="store",
            tier=tier.name,
            sync=False,
            keys=todo,
            slots=slots,
            block_ids=list(block_ids[present * bpc : (present + len(slots)) * bpc]),
            parents=[parent, *todo[:-1]],
            after=self.movement.after(t, slots),
        )
        req.jobs.add(self.jobs.add(store))
        return [*demotions, store]
