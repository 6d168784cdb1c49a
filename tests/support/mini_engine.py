"""A tiny engine that drives kvtier's manager and worker sides the way vLLM does.

KV is synthetic but exact: the KV bytes of token position p are a rolling hash of the
token prefix [0, p], written into every layer and head. So the *oracle* KV of any request
is known, and after each forward pass the engine checks that every token position the
request attends to holds exactly the oracle KV. That is the "never a wrong token" check of
the real engine, without a model.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass, field

import torch

from kvtier.config import KVTierConfig
from kvtier.contract.kind import TierContext
from kvtier.contract.spec import TierSpec
from kvtier.keys import Namespace
from kvtier.layout import KVLayout
from kvtier.manager import CacheManager, ScheduledRequest, resolve_chunk_tokens
from kvtier.stack.build import build_stack, build_stores
from kvtier.tiers.disk.kind import DiskOptions
from kvtier.tiers.faulty import FaultPlan
from kvtier.transfer import KVRegions, TransferEngine
from kvtier.worker import WorkerSide

LAYERS, HEADS, HD2 = 2, 2, 4


def oracle_kv(tokens: list[int]) -> list[int]:
    h, out = 7, []
    for t in tokens:
        h = (h * 31 + t + 1) % 30011
        out.append(h)
    return out


@dataclass
class Req:
    req_id: str
    tokens: list[int]
    blocks: list[int] = field(default_factory=list)
    computed: int = 0
    waiting_load: bool = False
    done: bool = False
    sync_hit: int = 0
    async_hit: int = 0
    sources: dict = field(default_factory=dict)
    failed_loads: int = 0


class MiniEngine:
    def __init__(
        self,
        config: KVTierConfig,
        num_blocks=64,
        block_tokens=4,
        cpu_chunks=16,
        fault: FaultPlan | None = None,
        seed=0,
        disk_dir=None,
        disk_chunks=64,
        disk_fault: FaultPlan | None = None,
        request_failures=False,
    ):
        """``request_failures``: behave as vLLM with several KV-cache groups: every hit
        loads async, and a request whose load failed is sent back to the waiting queue with
        nothing computed and its blocks freed, to be looked up again (``failed_recving``)."""
        self.request_failures = request_failures
        self.bt = block_tokens
        self.kv = [
            torch.zeros(num_blocks, HEADS, block_tokens, HD2, dtype=torch.int16)
            for _ in range(LAYERS)
        ]
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        layout = KVLayout.dense(LAYERS, HEADS, HD2 // 2, "int16")
        ns = Namespace("mini", layout.digest())
        bpc = resolve_chunk_tokens(config, block_tokens) // block_tokens
        self.chunk_bytes = layout.chunk_bytes(bpc * block_tokens)
        if not config.tiers:
            # The flat keys' stack, sized in chunks (cpu_bytes stays the real engine's).
            specs = [TierSpec("cpu", capacity=cpu_chunks * self.chunk_bytes)]
            if disk_dir is not None:
                back = config.disk_write_policy == "write-back"
                specs.append(
                    TierSpec(
                        "disk",
                        capacity=disk_chunks * self.chunk_bytes,
                        options=DiskOptions(path=str(disk_dir), threads=2),
                        eviction=config.disk_eviction,
                        on_store="skip" if back else "through",
                        on_evict="demote" if back else "drop",
                        faults=disk_fault,
                    )
                )
            config = dataclasses.replace(config, tiers=tuple(specs))
        if fault:  # the fault wrapper on the first tier's store, chosen by configuration
            first, *rest = config.tiers
            config = dataclasses.replace(
                config, tiers=(dataclasses.replace(first, faults=fault), *rest)
            )
        self.config = config
        ctx = TierContext(self.chunk_bytes, ns, bpc, rank_dirs=False)
        self.manager = CacheManager(
            config,
            layout,
            ns,
            block_tokens,
            build_stack(config, ctx),
            sync_loads=not request_failures,
        )
        regions = KVRegions.from_tensors(self.kv, num_blocks)
        assert regions.chunk_bytes(bpc) == self.chunk_bytes
        ctx = dataclasses.replace(ctx, row_bytes=tuple(regions.row_bytes))
        self.stores = build_stores(config, ctx)
        self.store = next(iter(self.stores.values()))
        self.disk = next((st for st in self.stores.values() if hasattr(st, "corrupt_reads")), None)
        engine = TransferEngine(regions, self.stores, bpc)
        # Only the auto budget uses the measured bandwidth (tiny rows make measuring slow).
        self.worker = WorkerSide(engine, calibrate=config.sync_budget.mode == "auto")
        self.reqs: dict[str, Req] = {}
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.held: dict[str, list[int]] = {}
        self.steps = 0
        self.wrong = 0
        self.recomputed = 0

    def add(self, req_id: str, tokens: list[int], arrive: bool = False, hints=None) -> Req:
        """Queue a request; ``arrive``: tell the manager first, as vLLM's
        ``on_new_request`` does (its prefetch, its ``hints``)."""
        r = Req(req_id, list(tokens))
        self.reqs[req_id] = r
        self.waiting.append(r)
        if arrive:
            from kvtier.hints import NO_HINTS
            from kvtier.manager import on_new_request

            on_new_request(self.manager, req_id, r.tokens, hints=hints or NO_HINTS)
        return r

    def abort(self, req_id: str) -> None:
        """Abort a request that is still waiting (and holds no blocks): vLLM frees it."""
        r = self.reqs[req_id]
        assert not r.blocks, "abort: only requests without blocks"
        self.waiting.remove(r)
        r.done = True
        self.manager.request_finished(req_id, r.tokens, 0, [])

    def _write(self, r: Req, lo: int, hi: int) -> None:
        kv = oracle_kv(r.tokens[:hi])
        for p in range(lo, hi):
            b, o = r.blocks[p // self.bt], p % self.bt
            for t in self.kv:
                t[b, :, o, :] = kv[p]

    def _check(self, r: Req, upto: int) -> bool:
        kv = oracle_kv(r.tokens[:upto])
        for p in range(upto):
            b, o = r.blocks[p // self.bt], p % self.bt
            for t in self.kv:
                if not bool((t[b, :, o, :] == kv[p]).all()):
                    return False
        return True

    def step(self) -> None:
        m = self.manager
        scheduled: list[Req] = []
        for r in list(self.waiting):
            if r.waiting_load:
                continue
            if r.computed == 0 and not r.blocks:
                hit = m.lookup(r.req_id, r.tokens, 0)
                if hit is None:
                    continue
                n, is_async = m.plan_load(r.req_id, hit, len(r.tokens))
                need = -(-len(r.tokens) // self.bt)
                if need > len(self.free):
                    continue
                r.blocks = [self.free.pop() for _ in range(need)]
                m.on_allocated(r.req_id, r.blocks, n, sync=not is_async)
                r.sources = m.hit_sources(r.req_id, n)
                r.computed = n
                if is_async:
                    r.async_hit = n
                    r.waiting_load = True
                    continue
                r.sync_hit = n
            self.waiting.remove(r)
            scheduled.append(r)
        plan = m.build_step(
            [
                ScheduledRequest(r.req_id, r.tokens, len(r.tokens), r.blocks, len(r.tokens))
                for r in scheduled
            ]
        )
        plan.idle = not scheduled  # as the connector sets it from vLLM's scheduler output
        w = self.worker
        w.begin_step(plan)
        w.start_loads()
        errors = set() if self.request_failures else w.load_errors()
        for r in scheduled:
            bad = [i for i, b in enumerate(r.blocks) if b in errors]
            if bad and bad[0] * self.bt < r.computed:
                # vLLM: truncate at the first failed block and recompute from there.
                r.computed = bad[0] * self.bt
                self.recomputed += 1
            if not self._check(r, r.computed):
                self.wrong += 1
            self._write(r, r.computed, len(r.tokens))
            r.computed = len(r.tokens)
        w.end_forward()
        sending, recving = w.transfer_results()
        if self.request_failures:
            for rid in w.failed_requests(recving):
                # vLLM (_handle_failed_recving): recompute from scratch, after a new lookup.
                r = self.reqs[rid]
                self.free.extend(r.blocks)
                r.blocks, r.computed, r.async_hit, r.waiting_load = [], 0, 0, False
                self.recomputed += 1
                r.failed_loads += 1
                recving.discard(rid)
        else:
            errors |= w.load_errors()
        m.on_report(w.report())
        # vLLM: failed blocks truncate every request still waiting for its async load at
        # once, whether or not its load finished in this step (a request whose load is
        # several jobs may see one job's failure steps before the last job is done).
        for r in self.waiting:
            bad = [i for i, b in enumerate(r.blocks) if b in errors] if r.waiting_load else []
            if bad and bad[0] * self.bt < r.computed:
                r.computed = bad[0] * self.bt
                self.recomputed += 1
        for rid in recving:
            r = self.reqs[rid]
            r.waiting_load = False
            if r.computed == len(r.tokens):
                r.computed -= 1  # a full hit recomputes its last token
        for r in scheduled:
            r.done = True
            if m.request_finished(r.req_id, r.tokens, r.computed, r.blocks):
                self.held[r.req_id] = r.blocks
            else:
                self.free.extend(r.blocks)
            r.blocks = []
        for rid in sending:
            self.free.extend(self.held.pop(rid))
        self.steps += 1

    def run(self, max_steps=2000) -> None:
        """Step until every request ran and every job finished."""
        while (self.waiting or self.held or self.manager.has_pending_jobs()) and max_steps:
            self.step()
            # The fake forward pass is pure Python and never releases the GIL the way a
            # real one does (inside every torch op); give the copy threads their turn.
            time.sleep(0.0002)
            max_steps -= 1
        assert max_steps, "the engine did not drain"

    def close(self) -> None:
        self.worker.close()
