"""What arriving requests ask of the first tier: prefetch on arrival and retention leases.

One object behind the manager's few hooks (:class:`~kvtier.manager.CacheManager`): it owns
the :class:`~kvtier.stack.prefetch.Prefetcher` and the :class:`~kvtier.stack.retain.Retention`
of one engine's scheduler side and answers what the manager's lookup, step, finish and
reset need of them. Single-threaded (the scheduler's thread).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvtier.config import KVTierConfig
from kvtier.hints import NO_HINTS, Hints
from kvtier.jobs import TransferJob
from kvtier.keys import Key
from kvtier.layout import KVLayout
from kvtier.stack.first_tier import FirstTier
from kvtier.stack.movement import Movement
from kvtier.stack.prefetch import Prefetcher
from kvtier.stack.requests import RequestState
from kvtier.stack.retain import Retention
from kvtier.stack.stack import TierStack


class Arrivals:
    """Prefetch and leases of one engine (see the module docstring)."""

    def __init__(
        self,
        config: KVTierConfig,
        layout: KVLayout,
        chunk_tokens: int,
        movement: Movement,
        slowdown: Callable[[str], float | None] = lambda tier: None,
    ) -> None:
        """``slowdown``: the load planner's
        :meth:`~kvtier.stack.loads.LoadPlanner.sync_slowdown` (what prefetch is worth)."""
        self.config = config
        self.chunk_tokens = chunk_tokens
        self.movement = movement
        first = FirstTier(movement.stack, movement.metrics)
        self.prefetch = Prefetcher(
            first,
            movement,
            layout.chunk_bytes(chunk_tokens),
            step_bytes=config.prefetch_step_bytes,
            inflight_bytes=config.prefetch_inflight_bytes,
            lease_s=config.prefetch_lease_s,
            slowdown=slowdown,
        )
        self.retention = Retention(
            first, max_share=config.retain_max_share, max_s=config.retain_max_s
        )
        movement.on_copied = self.prefetch.landed

    def prefetching(self) -> bool:
        """Whether arriving requests are prefetched (config on, a tier to prefetch from)."""
        return self.config.prefetch and self.prefetch.able

    def wants(self, hints: Hints) -> bool:
        """Whether a request arriving with ``hints`` needs state before its first lookup:
        hints to keep, or a prefetch to start."""
        return hints is not NO_HINTS or hints.prefetch_only or self.prefetching()

    def arrive(self, req_id: str, req: RequestState, tokens: Sequence[int], hints: Hints) -> None:
        """A request arrived (before it is scheduled): keep its hints, queue its prefetch
        (at the end of the step; at once for ``prefetch_only``,
        :meth:`~kvtier.stack.prefetch.Prefetcher.arrive`). Costs the key computation its
        first lookup would do anyway."""
        req.hints = hints
        if (hints.prefetch_only or self.prefetching()) and not req.unkeyable:
            req.chain.update(tokens)
            self.prefetch.arrive(req_id, req.chain.keys, now=hints.prefetch_only)

    def observe(self, req_id: str, keys: Sequence[Key]) -> None:
        """The request's first lookup: every tier's policy observes its chain once, but the
        first tier not the chunks prefetched for it (a prefetch and its use count as one
        use)."""
        mine = self.prefetch.observe_limit(req_id)
        for t, tier in enumerate(self.movement.stack.tiers):
            tier.index.observe(keys if t or mine is None else keys[:mine])

    def copies(self) -> list[TransferJob]:
        """Once per engine step: leases that ended, the prefetch backlog retried; then the
        copies planned since the last step (the movement's, prefetches' among them)."""
        self.prefetch.step()
        self.retention.step()
        return self.movement.pending

    def finished(
        self, req_id: str, req: RequestState, tokens: Sequence[int], num_computed: int
    ) -> None:
        """The request finished (its last stores planned): release its prefetch, take the
        lease its ``retain_s`` (or ``prefetch_only``) hint asks for."""
        self.prefetch.finished(req_id)
        hints = req.hints
        retain = hints.retain_s or (self.config.prefetch_lease_s * hints.prefetch_only)
        if retain and not req.unkeyable:
            n = min(num_computed, len(tokens)) // self.chunk_tokens
            self.retention.lease(req_id, req.chain.keys[:n], retain)

    def reset(self) -> None:
        """End every lease, then forget every chunk no job holds (a prefix-cache reset)."""
        self.retention.clear()
        self.movement.stack.clear()


def demote_entry(stack: TierStack, entry: int) -> int:
    """Where a ``tier_hint: demote`` request stores: the deepest private tier below the
    first (``entry`` when there is none: a stack of one tier, or a shared tier below)."""
    t = len(stack) - 1
    while t > 0 and stack[t].shared:
        t -= 1
    return max(t, entry)
