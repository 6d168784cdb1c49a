"""Load planning: which hits load within the step (sync) and which asynchronously, the load
jobs of an accepted hit, and what loads in flight mean for later lookups."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from kvtier.budget import BudgetTracker, SyncBudget
from kvtier.jobs import JobResult, TransferJob
from kvtier.keys import Key
from kvtier.layout import KVLayout
from kvtier.metrics import Metrics
from kvtier.sources import HitRun, HitSource, hit_sources
from kvtier.stack.job_table import JobTable
from kvtier.stack.requests import Hit, RequestState
from kvtier.stack.stack import TierStack


class LoadPlanner:
    """Plans loads from the stack's tiers into engine blocks (the scheduler's thread).

    ``pending``: load jobs accepted since the last step (they go into its plan); the sync
    budget is per step (:class:`~kvtier.budget.BudgetTracker`).
    """

    def __init__(
        self,
        budget: SyncBudget,
        layout: KVLayout,
        stack: TierStack,
        jobs: JobTable,
        metrics: Metrics,
        chunk_tokens: int,
        block_tokens: int,
    ) -> None:
        self.layout = layout
        self.sync_loads = True
        """Whether any hit may load within the step. Off for engines that can only be told
        of a failed load per request, before it runs (vLLM with several KV-cache groups:
        a failed sync load there could not be undone)."""
        self.stack = stack
        self.jobs = jobs
        self.metrics = metrics
        self.chunk_tokens = chunk_tokens
        self.block_tokens = block_tokens
        self.blocks_per_chunk = chunk_tokens // block_tokens
        self.budget = BudgetTracker(budget)
        self.pending: list[TransferJob] = []
        self.loading: dict[int, tuple[int, int, list[Key]]] = {}
        """Async loads in flight: job id -> (first chunk, end chunk, the chain's keys)."""
        self.first_chunk: dict[int, int] = {}
        """Every load job in flight: job id -> its first chunk's index in the chain."""
        self.recent_hit_sources: deque[tuple[str, dict[HitSource, int]]] = deque(maxlen=4096)
        self.recent_load_modes: deque[tuple[str, str]] = deque(maxlen=4096)

    def begin_step(self, batch_requests: int) -> None:
        """A new engine step: count the sync budget the last one used, size this one's for
        ``batch_requests`` (:meth:`kvtier.budget.BudgetTracker.begin_step`)."""
        if self.budget.used:
            self.metrics.observe("sync_budget_used_bytes", self.budget.used)
        self.budget.begin_step(batch_requests)
        self.metrics.set("sync_budget_bytes", self.budget.limit)

    def observe_workers(self, load_bandwidth: float, forward_seconds: float) -> None:
        """What a worker report measured (0: nothing): the load bandwidth and the forward
        pass time, the inputs of the ``auto`` budget."""
        if load_bandwidth > 0:
            self.budget.observe_bandwidth(load_bandwidth)
        if forward_seconds > 0:
            self.budget.observe_step(forward_seconds)

    def overlaps_loading(self, keys: Sequence[Key], first: int, end: int) -> bool:
        """Whether chunks ``[first, end)`` of this chain are being loaded asynchronously for
        another request. Chained keys make one comparison per in-flight load enough: two
        chains hold the same chunk i exactly when their keys at i are equal."""
        for c0, c1, other in self.loading.values():
            i = max(first, c0)
            if i < min(end, c1) and keys[i] == other[i]:
                return True
        return False

    def plan(self, req_id: str, hit: Hit, num_tokens: int) -> tuple[int, bool]:
        """``(external tokens, load asynchronously)``.

        Sync (within this step) when every run is in a tier that allows it (host memory,
        or a local medium priced at its measured load speed: the disk tier) and the hit's
        cost fits what is left of this step's budget (host-memory bytes; a slower tier's
        bytes cost more, :meth:`~kvtier.budget.BudgetTracker.host_bytes`); async otherwise.
        A sync hit must leave at least one token to compute, so a hit covering the whole
        sequence is trimmed by one token: the load still copies the whole last chunk, and
        the engine recomputes that token's KV in place, as it does for its own full
        prefix-cache hits.
        """
        n = hit.tokens
        if n <= 0:
            self.budget.release(req_id)
            return 0, False
        sync_tokens = n - 1 if hit.end >= num_tokens else n
        if self.sync_loads and sync_tokens > 0:
            cost = self._sync_cost(hit)
            if cost is not None and self.budget.try_reserve(req_id, cost):
                return sync_tokens, False
        self.budget.release(req_id)
        return n, True

    def sync_slowdown(self, name: str) -> float | None:
        """How many times slower than host memory a hit in tier ``name`` loads within the
        step (1 for host memory); None where it cannot load within the step."""
        tier = self.stack.by_name(name)
        if not (self.sync_loads and tier.sync_loads):
            return None
        return 1.0 if tier.capabilities.byte_addressable else self.budget.slowdown(name)

    def _sync_cost(self, hit: Hit) -> int | None:
        """The hit's charge on the step's budget if it loads within the step, or None where
        a run's tier cannot (see :meth:`plan`). Bytes are shared out among runs by tokens
        (the layout's bound is per hit, not per run)."""
        nbytes = self.layout.load_bytes(hit.tokens)
        cost = 0
        c = self.chunk_tokens
        for name, c0, c1 in hit.runs:
            tier = self.stack.by_name(name)
            if not tier.sync_loads:
                return None
            tokens = min(c1 * c, hit.end) - max(c0 * c, hit.start)
            share = nbytes * tokens // hit.tokens
            run_cost = self.budget.host_bytes(
                None if tier.capabilities.byte_addressable else name, share
            )
            if run_cost is None:
                return None
            cost += run_cost
        return cost

    def allocate(
        self,
        req_id: str,
        req: RequestState | None,
        block_ids: Sequence[int],
        num_external: int,
        sync: bool,
    ) -> int:
        """Build the load job(s) of the first ``num_external`` tokens of the request's hit
        (see CacheManager.on_allocated); the end chunk of what they load. 0 when there is
        nothing to load (no state, no hit, none of it accepted): the request's sync budget
        reservation is released."""
        hit = req.hit if req is not None else None
        if req is None or hit is None or num_external <= 0:
            self.budget.release(req_id)
            if req is not None:
                req.load_runs = []
            return 0
        c, bt, bpc = self.chunk_tokens, self.block_tokens, self.blocks_per_chunk
        start, end = hit.start, hit.start + num_external
        req.load_start = start
        req.load_runs = []
        first_block = start // bt
        end_chunk = -(-end // c)
        keys = req.chain.keys
        deepest = 0
        for tier_name, c0, c1 in hit.runs:
            c1 = min(c1, end_chunk)
            if c1 <= c0:
                continue
            t = self.stack.position[tier_name]
            tier = self.stack[t]
            deepest = max(deepest, t)
            req.load_runs.append(HitRun(max(start, c0 * c), min(end, c1 * c), tier.source))
            b0 = max(first_block, c0 * bpc)
            blocks = block_ids[b0 : c1 * bpc]
            if not isinstance(blocks, list):  # a list's slice is a copy already
                blocks = list(blocks)
            if len(blocks) != c1 * bpc - b0:
                raise ValueError(
                    f"request {req_id}: {len(block_ids)} blocks allocated, the hit needs {c1 * bpc}"
                )
            chunk_keys = keys[c0:c1]
            load = TransferJob(
                job_id=0,
                req_id=req_id,
                kind="load",
                tier=tier_name,
                sync=sync,
                keys=chunk_keys,
                slots=tier.index.chain_slots(chunk_keys),
                block_ids=blocks,
                skip=b0 - c0 * bpc,
            )
            req.jobs.add(self.jobs.add(load, self.jobs.hold(tier.index, chunk_keys[-1])))
            self.first_chunk[load.job_id] = c0
            if not sync:
                self.loading[load.job_id] = (c0, c1, keys)
            self.pending.append(load)
            self.metrics.inc("loads", 1, tier_name, "sync" if sync else "async")
        req.entry = self.stack.entry(deepest)
        self.stack.touch(keys[:end_chunk])
        if not sync:
            self.budget.release(req_id)
        # Recorded here, not when vLLM asks for hit sources: it only asks with stats enabled.
        sources = hit_sources([req.load_runs], start, end)
        self.recent_hit_sources.append((req_id, sources))
        self.recent_load_modes.append((req_id, "sync" if sync else "async"))
        for source, n in sources.items():
            self.metrics.inc("hit_tokens", n, source.label)
        return end_chunk

    def finished(self, job: TransferJob, result: JobResult, req: RequestState | None) -> None:
        """A load ended: a failed chunk (and its descendants) leaves its tier, and the
        request (``req``, if still known) claims no more hits (``load_failed_at``)."""
        self.loading.pop(job.job_id, None)
        c0 = self.first_chunk.pop(job.job_id, 0)
        if not all(result.ok):
            i = result.ok.index(False)
            self.stack.by_name(job.tier).index.invalidate(job.keys[i])
            if req is not None:
                at = c0 + i
                if req.load_failed_at is None or at < req.load_failed_at:
                    req.load_failed_at = at
                    self.metrics.inc("load_failed_requests", 1, job.tier)
        mode = "sync" if job.sync else "async"
        self.metrics.inc("load_bytes", result.nbytes, job.tier, mode)
        self.metrics.inc("load_seconds", result.seconds, job.tier, mode)
        if not self.stack.by_name(job.tier).capabilities.byte_addressable:
            if all(result.ok):  # a failed read's time says nothing of the medium's speed
                self.budget.observe_tier_load(job.tier, result.nbytes, result.seconds)
        elif job.sync:
            self.budget.observe_sync_load(result.nbytes, result.seconds)
