"""Scheduler side: lookups, load plans (sync/async), store plans, hit sources, job state.

Engine-agnostic: it speaks token ids, block ids, keys and jobs. The vLLM connector is a
thin adapter over it.

Lookup design: every tier is *prefix-closed* (see :mod:`kvtier.tiers.index`), so "how many
leading chunks does tier t hold" is a binary search, and a hit is at most one run per tier:
the innermost tier serves its prefix, the next tier continues where it stops. A lookup on a
128k-token prompt costs O(tiers * log chunks), not O(chunks).

Pinning: loads pin only the deepest chunk they read in each tier. Prefix closure makes that
enough: an ancestor of a pinned chunk has a child and eviction only takes leaves.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvtier.budget import BudgetTracker
from kvtier.config import KVTierConfig
from kvtier.errors import ConfigError
from kvtier.jobs import JobResult, StepPlan, TransferJob, WorkerReport
from kvtier.keys import Key, KeyChain, Namespace
from kvtier.layout import KVLayout
from kvtier.metrics import Metrics
from kvtier.policies.defaults import admission_policy
from kvtier.sources import HitRun, HitSource, hit_sources
from kvtier.tiers.index import SlotIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TierView:
    """The scheduler's view of one tier: a name, a hit source and its index."""

    name: str
    source: HitSource
    index: SlotIndex


@dataclass(frozen=True)
class Hit:
    """An external hit: tokens ``[start, end)`` found in tiers, as per-tier chunk runs."""

    start: int
    """Tokens the engine already has (its own cache); the hit continues from here."""
    end: int
    """End of the hit in tokens (a chunk boundary)."""
    runs: tuple[tuple[str, int, int], ...]
    """``(tier, first chunk, end chunk)``, innermost tier first, contiguous."""

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ScheduledRequest:
    """A request scheduled in a step, as the store planner needs it."""

    req_id: str
    tokens: Sequence[int]
    """All token ids so far (prompt, then outputs)."""
    computed_after_step: int
    """Tokens whose KV exists once this step's forward pass is done."""
    block_ids: Sequence[int]
    """The request's engine blocks, in token order."""
    prompt_len: int


@dataclass
class _Request:
    chain: KeyChain
    hit: Hit | None = None
    load_runs: list[HitRun] = field(default_factory=list)
    load_start: int = 0
    jobs: set[int] = field(default_factory=set)
    finished: bool = False
    observed: bool = False


@dataclass
class _Job:
    job: TransferJob
    answers: int = 0
    result: JobResult | None = None
    pinned: list[tuple[SlotIndex, Key]] = field(default_factory=list)


def resolve_chunk_tokens(config: KVTierConfig, block_tokens: int, layout: KVLayout) -> int:
    """The chunk size in tokens: configured (checked) or automatic."""
    if config.chunk_tokens:
        if config.chunk_tokens % block_tokens:
            raise ConfigError(
                f"chunk_tokens: {config.chunk_tokens} is not a multiple of the engine block "
                f"size {block_tokens}"
            )
        return config.chunk_tokens
    return block_tokens


class CacheManager:
    """Scheduler-side state of kvtier for one engine.

    Call order per request: ``lookup`` -> ``plan_load`` -> ``on_allocated`` -> ``hit_sources``
    (all during scheduling), ``build_step`` once per engine step, ``on_report`` with every
    worker report, ``request_finished`` once. Single-threaded (the scheduler's thread).
    """

    def __init__(
        self,
        config: KVTierConfig,
        layout: KVLayout,
        namespace: Namespace,
        block_tokens: int,
        tiers: Sequence[TierView],
        *,
        num_workers: int = 1,
        metrics: Metrics | None = None,
        defer_on_inflight_loads: bool = True,
    ) -> None:
        if not tiers:
            raise ConfigError("tiers: at least one tier is needed")
        self.config = config
        self.layout = layout
        self.namespace = namespace
        self.block_tokens = block_tokens
        self.chunk_tokens = resolve_chunk_tokens(config, block_tokens, layout)
        self.blocks_per_chunk = self.chunk_tokens // block_tokens
        self.tiers = list(tiers)
        self._tier_by_name = {t.name: t for t in self.tiers}
        self.num_workers = num_workers
        self.metrics = metrics or Metrics()
        self.budget = BudgetTracker(config.sync_budget)
        self.admission = admission_policy(config, self.tiers[0].index.num_slots)
        self.defer_on_inflight_loads = defer_on_inflight_loads
        self._reqs: dict[str, _Request] = {}
        self._jobs: dict[int, _Job] = {}
        self._next_job = 1
        self._pending_loads: list[TransferJob] = []
        self._pending_release: dict[str, list[int]] = {}
        # Stores planned when a request finished; its blocks stay allocated until they run.
        self._finish_stores: list[TransferJob] = []
        # Write-through copies from the first tier to the next, planned as stores finish.
        self._pending_copies: list[TransferJob] = []
        # Write-back: the first tier's evicted chunks are demoted to the next one instead.
        self.write_back = config.disk_write_policy == "write-back" and len(self.tiers) > 1
        self.tiers[0].index.record_evictions = self.write_back
        # First-tier slots freed by eviction whose bytes a demotion still has to read:
        # slot -> that copy job. Stores into them wait for it (TransferJob.after).
        self._demoting: dict[int, int] = {}
        # Async loads in flight: job id -> (first chunk, end chunk, the chain's keys).
        self._loading: dict[int, tuple[int, int, list[Key]]] = {}
        self.recent_hit_sources: deque[tuple[str, dict[HitSource, int]]] = deque(maxlen=4096)
        """The last requests' hit sources (inspection and tests)."""
        self.recent_load_modes: deque[tuple[str, str]] = deque(maxlen=4096)
        """The last requests' load modes, "sync" or "async" (inspection and tests)."""
        self.steps = 0

    # -- requests --------------------------------------------------------------------------

    def _request(
        self, req_id: str, cache_salt: str | None = None, lora: str | None = None
    ) -> _Request:
        req = self._reqs.get(req_id)
        if req is None:
            seed = self.namespace.seed(cache_salt, lora)
            req = self._reqs[req_id] = _Request(KeyChain(seed, self.chunk_tokens))
        return req

    def lookup(
        self,
        req_id: str,
        tokens: Sequence[int],
        num_computed: int,
        *,
        cache_salt: str | None = None,
        lora: str | None = None,
    ) -> Hit | None:
        """The external hit past ``num_computed`` tokens, or None to ask again later (a chunk
        of the hit is still being loaded for another request, which will make it a local
        hit of the engine's own cache).

        Side-effect free apart from computing the request's keys once.
        """
        req = self._request(req_id, cache_salt, lora)
        req.chain.update(tokens)
        keys = req.chain.keys
        c = self.chunk_tokens
        first = num_computed // c
        if len(keys) <= first:
            req.hit = None
            return Hit(num_computed, num_computed, ())
        if not req.observed:  # once per request: repeated lookups are not reuse
            req.observed = True
            self.admission.observe(keys)
            for tier in self.tiers:
                tier.index.observe(keys)
        runs: list[tuple[str, int, int]] = []
        covered = 0
        for tier in self.tiers:
            n = tier.index.prefix_len(keys)
            if n > covered:
                runs.append((tier.name, max(covered, first), n))
                covered = n
        end_tokens = covered * c
        if end_tokens <= num_computed:
            req.hit = None
            return Hit(num_computed, num_computed, ())
        runs = [r for r in runs if r[2] > r[1]]
        hit = Hit(num_computed, end_tokens, tuple(runs))
        if self.defer_on_inflight_loads and self._overlaps_loading(keys, first, covered):
            return None
        req.hit = hit
        self.metrics.inc("lookup_tokens", max(0, len(tokens) - num_computed))
        return hit

    def _overlaps_loading(self, keys: Sequence[Key], first: int, end: int) -> bool:
        """Whether chunks ``[first, end)`` of this chain are being loaded asynchronously for
        another request. Chained keys make one comparison per in-flight load enough: two
        chains hold the same chunk i exactly when their keys at i are equal."""
        for c0, c1, other in self._loading.values():
            i = max(first, c0)
            if i < min(end, c1) and keys[i] == other[i]:
                return True
        return False

    def plan_load(self, req_id: str, hit: Hit, num_tokens: int) -> tuple[int, bool]:
        """Decide how a hit loads: ``(external tokens, load asynchronously)``.

        Sync (within this step) when the hit is entirely in the first tier (host memory) and
        its bytes fit what is left of this step's budget; async otherwise. A sync hit must
        leave at least one token to compute, so a hit covering the whole sequence is trimmed
        by one token: the load still copies the whole last chunk, and the engine recomputes
        that token's KV in place, as it does for its own full prefix-cache hits.
        """
        n = hit.tokens
        if n <= 0:
            self.budget.release(req_id)
            return 0, False
        host_only = all(t == self.tiers[0].name for t, _, _ in hit.runs)
        sync_tokens = n - 1 if hit.end >= num_tokens else n
        if (
            host_only
            and sync_tokens > 0
            and self.budget.try_reserve(req_id, self.layout.load_bytes(n))
        ):
            return sync_tokens, False
        self.budget.release(req_id)
        return n, True

    def on_allocated(
        self, req_id: str, block_ids: Sequence[int], num_external: int, sync: bool
    ) -> None:
        """The engine allocated ``block_ids`` for the request and accepted ``num_external``
        tokens of its hit: build the load job(s) for the next step."""
        req = self._reqs.get(req_id)
        hit = req.hit if req is not None else None
        if req is None or hit is None or num_external <= 0:
            self.budget.release(req_id)
            if req is not None:
                req.load_runs = []
            return
        c, bt, bpc = self.chunk_tokens, self.block_tokens, self.blocks_per_chunk
        start, end = hit.start, hit.start + num_external
        req.load_start = start
        req.load_runs = []
        first_block = start // bt
        end_chunk = -(-end // c)
        keys = req.chain.keys
        for tier_name, c0, c1 in hit.runs:
            c1 = min(c1, end_chunk)
            if c1 <= c0:
                continue
            tier = self._tier_by_name[tier_name]
            lo_tok = max(start, c0 * c)
            req.load_runs.append(HitRun(lo_tok, min(end, c1 * c), tier.source))
            b0 = max(first_block, c0 * bpc)
            blocks = list(block_ids[b0 : c1 * bpc])
            chunk_keys = keys[c0:c1]
            if len(blocks) != c1 * bpc - b0:
                raise ValueError(
                    f"request {req_id}: {len(block_ids)} blocks allocated, the hit needs {c1 * bpc}"
                )
            index = tier.index
            slots = index.slots_of(chunk_keys)
            deepest = chunk_keys[-1]
            index.pin([deepest])
            job = self._new_job(
                req,
                TransferJob(
                    0, req_id, "load", tier_name, sync, chunk_keys, slots, blocks, b0 - c0 * bpc
                ),
                pinned=[(index, deepest)],
            )
            if not sync:
                self._loading[job.job_id] = (c0, c1, keys)
            self._pending_loads.append(job)
            mode = "sync" if sync else "async"
            self.metrics.inc("loads", 1, tier_name, mode)
        # Reuse refreshes the hit chain in every tier that holds (part of) it: with
        # write-through, a prefix hot in the CPU tier must not age out of the disk tier.
        for tier in self.tiers:
            held = tier.index.prefix_len(keys[:end_chunk])
            if held:
                tier.index.touch(keys[:held])
        if not sync:
            self.budget.release(req_id)
        # Recorded here, not when vLLM asks for hit sources: it only asks with stats enabled.
        sources = hit_sources([req.load_runs], start, end)
        self.recent_hit_sources.append((req_id, sources))
        self.recent_load_modes.append((req_id, "sync" if sync else "async"))
        for source, n in sources.items():
            self.metrics.inc("hit_tokens", n, source.label)

    def hit_sources(self, req_id: str, num_external: int) -> dict[HitSource, int]:
        """Which tier each of the accepted ``num_external`` hit tokens came from."""
        req = self._reqs.get(req_id)
        if req is None or num_external <= 0:
            return {}
        return hit_sources([req.load_runs], req.load_start, req.load_start + num_external)

    def _new_job(
        self, req: _Request, job: TransferJob, pinned: list[tuple[SlotIndex, Key]] | None = None
    ) -> TransferJob:
        job.job_id = self._next_job
        self._next_job += 1
        self._jobs[job.job_id] = _Job(job, pinned=pinned or [])
        req.jobs.add(job.job_id)
        return job

    # -- steps -----------------------------------------------------------------------------

    def build_step(
        self, scheduled: Iterable[ScheduledRequest], preempted: Iterable[str] = ()
    ) -> StepPlan:
        """The plan for this step: loads accepted since the last step, stores of chunks
        this step completes, flushes for preempted requests, block releases."""
        self.steps += 1
        plan = StepPlan(
            loads=self._pending_loads, stores=self._finish_stores, release=self._pending_release
        )
        self._pending_loads, self._pending_release, self._finish_stores = [], {}, []
        plan.stores.extend(self._pending_copies)
        self._pending_copies = []
        n_batch = 0
        for s in scheduled:
            n_batch += 1
            plan.stores += self._plan_store(
                s.req_id, s.tokens, min(s.computed_after_step, s.prompt_len), s.block_ids
            )
        for req_id in preempted:
            req = self._reqs.get(req_id)
            if req is not None:
                plan.flush.extend(j for j in req.jobs if self._jobs[j].job.kind == "store")
        if self.budget.used:
            self.metrics.observe("sync_budget_used_bytes", self.budget.used)
        self.budget.begin_step(n_batch + 1)
        self.metrics.set("sync_budget_bytes", self.budget.limit)
        return plan

    def _plan_store(
        self, req_id: str, tokens: Sequence[int], limit: int, block_ids: Sequence[int]
    ) -> list[TransferJob]:
        """The store of the request's newly complete chunks into the first tier, preceded
        (write-back) by the demotions of the chunks it evicts; [] when there is none."""
        req = self._reqs.get(req_id)
        if req is None:
            req = self._request(req_id)
        c, bpc = self.chunk_tokens, self.blocks_per_chunk
        n_full = min(limit // c, len(block_ids) // bpc)
        if n_full <= 0:
            return []
        req.chain.update(tokens[: n_full * c])
        keys = req.chain.keys[:n_full]
        tier = self.tiers[0]
        present = tier.index.prefix_len(keys, any_state=True)
        if present >= n_full:
            return []
        todo = keys[present:]
        admitted = 0
        while admitted < len(todo) and self.admission.admit(todo[admitted]):
            admitted += 1
        todo = todo[:admitted]
        if len(self.tiers) == 1:  # a next tier takes what this one stores: store it all
            todo = todo[: tier.index.policy.admit_chain(todo)]
        before = tier.index.evictions
        slots = tier.index.reserve(todo, keys[present - 1] if present else None)
        self.metrics.inc("evictions", tier.index.evictions - before, tier.name)
        demotions = self._plan_demotions(req_id) if self.write_back else []
        if not slots:
            return demotions
        todo = todo[: len(slots)]
        blocks = list(block_ids[present * bpc : (present + len(slots)) * bpc])
        parents: list[Key | None] = [keys[present - 1] if present else None, *todo[:-1]]
        demoting = self._demoting  # empty unless write-back: no per-slot work on that path
        after = sorted({demoting[s] for s in slots if s in demoting}) if demoting else []
        store = TransferJob(
            0, req_id, "store", tier.name, False, todo, slots, blocks, parents=parents, after=after
        )
        return [*demotions, self._new_job(req, store)]

    def _plan_demotions(self, req_id: str) -> list[TransferJob]:
        """Write-back: copy jobs moving what the first tier just evicted to the next tier.

        Each evicted chain tail goes with the ancestors the next tier lacks (they stay in
        the first tier too), so that tier stays prefix-closed. The evicted slots are
        recorded in ``_demoting`` until their copy ends; the surviving ancestors are pinned
        through the deepest one. A chain the next tier cannot take (full of pinned chunks)
        is dropped, as eviction without write-back would.
        """
        src, dst = self.tiers[0], self.tiers[1]
        evicted = src.index.take_evicted()
        gone = {key: (slot, parent) for key, slot, parent in evicted}
        inner = {parent for _, _, parent in evicted if parent is not None}
        jobs: list[TransferJob] = []
        for key, _, _ in evicted:
            if key in inner:
                continue  # demoted with its deepest evicted descendant
            chain: list[tuple[Key, int, Key | None]] = []
            cur: Key | None = key
            while cur is not None and not dst.index.has(cur):
                if cur in gone:
                    slot, parent = gone[cur]
                elif src.index.has(cur):
                    slot, parent = src.index.slot_of(cur), src.index.parent_of(cur)
                else:
                    break  # an ancestor is in neither tier: the chain cannot be kept
                chain.append((cur, slot, parent))
                cur = parent
            else:
                if not chain:
                    continue  # already on the next tier: eviction lost nothing
                chain.reverse()
                ancestors = [k for k, _, _ in chain if k not in gone]
                copy = self._copy_to_next(
                    req_id,
                    [k for k, _, _ in chain],
                    [s for _, s, _ in chain],
                    [p for _, _, p in chain],
                    cur,
                    pin=ancestors[-1] if ancestors else None,
                )
                if copy is not None:
                    for k, s in zip(copy.keys, copy.slots, strict=True):
                        if k in gone:
                            self._demoting[s] = copy.job_id
                    jobs.append(copy)
        return jobs

    def _copy_to_next(
        self,
        req_id: str,
        keys: list[Key],
        slots: list[int],
        parents: list[Key | None],
        anchor: Key | None,
        pin: Key | None,
    ) -> TransferJob | None:
        """A copy job of first-tier chunks (a chain continuing ``anchor``) into slots it
        reserves on the next tier, or None when that tier has no room. ``pin``, a
        first-tier key, stays pinned until the copy ends, keeping the chunks it covers
        from eviction while they are read."""
        src, dst = self.tiers[0], self.tiers[1]
        dst_slots = dst.index.reserve(keys, anchor)
        if not dst_slots:
            return None
        m = len(dst_slots)
        if pin is not None and pin not in keys[:m]:
            pin = keys[m - 1] if src.index.has(keys[m - 1]) else None
        if pin is not None:
            src.index.pin([pin])
        copy = TransferJob(
            0,
            req_id,
            "copy",
            src.name,
            False,
            keys[:m],
            slots[:m],
            [],
            dst_tier=dst.name,
            dst_slots=dst_slots,
            parents=parents[:m],
        )
        copy.job_id = self._next_job
        self._next_job += 1
        # Not tied to the request: a copy reads tier slots only, never the engine's blocks.
        self._jobs[copy.job_id] = _Job(copy, pinned=[(src.index, pin)] if pin else [])
        return copy

    def _plan_copy(self, job: TransferJob, ok: Sequence[bool]) -> None:
        """Write-through: copy a finished store's chunks from the first tier to the next.

        Only chunks that reached the first tier are copied, as a chain continuing what the
        next tier already holds. The source chunks are pinned (their deepest key) until the
        copy ends, so eviction cannot hand their slots out while they are read.
        """
        src, dst = self.tiers[0], self.tiers[1]
        n = 0
        while n < len(job.keys) and ok[n] and src.index.is_ready(job.keys[n]):
            n += 1
        keys = job.keys[:n]
        present = dst.index.prefix_len(keys, any_state=True)
        if present >= n:
            return
        anchor = keys[present - 1] if present else job.parents[0]
        copy = self._copy_to_next(
            job.req_id,
            keys[present:],
            job.slots[present:n],
            job.parents[present:n],
            anchor,
            pin=keys[-1],
        )
        if copy is not None:
            self._pending_copies.append(copy)

    def request_finished(
        self, req_id: str, tokens: Sequence[int], num_computed: int, block_ids: Sequence[int]
    ) -> bool:
        """The request is done. Returns True when its blocks must stay allocated until the
        jobs listed in the next plan's ``release`` finish (the worker reports it then)."""
        req = self._reqs.get(req_id)
        if req is None:
            return False
        self.budget.release(req_id)
        if self.config.store_output_tokens:
            self._finish_stores += self._plan_store(req_id, tokens, num_computed, block_ids)
        req.finished = True
        if req.jobs:
            self._pending_release[req_id] = sorted(req.jobs)
            return True
        del self._reqs[req_id]
        return False

    # -- worker reports --------------------------------------------------------------------

    def on_report(self, report: WorkerReport) -> None:
        """Apply a step's worker report: finish jobs, learn bandwidth and step time."""
        if report.load_bandwidth > 0:
            self.budget.observe_bandwidth(report.load_bandwidth)
        if report.forward_seconds > 0:
            self.budget.observe_step(report.forward_seconds)
        for result in report.results:
            entry = self._jobs.get(result.job_id)
            if entry is None:
                continue
            entry.result = result if entry.result is None else entry.result.merge(result)
            entry.answers += 1
            if entry.answers >= self.num_workers:
                self._finish_job(entry)

    def _finish_job(self, entry: _Job) -> None:
        job, result = entry.job, entry.result
        assert result is not None
        del self._jobs[job.job_id]
        tier = self._tier_by_name[job.tier]
        mode = "sync" if job.sync else "async"
        failed = result.ok.count(False)
        if job.kind == "load":
            for index, key in entry.pinned:
                index.unpin([key])
            self._loading.pop(job.job_id, None)
            if failed:
                first_bad = result.ok.index(False)
                tier.index.invalidate(job.keys[first_bad])
            self.metrics.inc("load_bytes", result.nbytes, job.tier, mode)
            self.metrics.inc("load_seconds", result.seconds, job.tier, mode)
            if job.sync:
                self.budget.observe_sync_load(result.nbytes, result.seconds)
        elif job.kind == "copy":
            for index, key in entry.pinned:
                index.unpin([key])
            for slot in job.slots:
                if self._demoting.get(slot) == job.job_id:
                    del self._demoting[slot]
            dst_name = job.dst_tier
            self._tier_by_name[dst_name].index.commit(job.keys, result.ok)
            self.metrics.inc("store_bytes", result.nbytes, dst_name)
            self.metrics.inc("store_seconds", result.seconds, dst_name)
            self.metrics.inc("stored_chunks", len(job.keys) - failed, dst_name)
        else:
            tier.index.commit(job.keys, result.ok)
            self.metrics.inc("store_bytes", result.nbytes, job.tier)
            self.metrics.inc("store_seconds", result.seconds, job.tier)
            self.metrics.inc("stored_chunks", len(job.keys) - failed, job.tier)
            if len(self.tiers) > 1 and job.tier == self.tiers[0].name and not self.write_back:
                self._plan_copy(job, result.ok)
        if failed:
            fail_tier = job.dst_tier if job.kind == "copy" else job.tier
            self.metrics.inc(
                "failures", failed, fail_tier, "store" if job.kind == "copy" else job.kind
            )
        req = self._reqs.get(job.req_id)
        if req is not None:
            req.jobs.discard(job.job_id)
            if req.finished and not req.jobs:
                del self._reqs[job.req_id]

    # -- admin -----------------------------------------------------------------------------

    def reset(self) -> bool:
        """Forget every stored chunk that no job is using (vLLM's reset_prefix_cache)."""
        for tier in self.tiers:
            tier.index.clear()
        return True

    def has_pending_jobs(self) -> bool:
        return bool(self._jobs)

    def num_requests(self) -> int:
        return len(self._reqs)
