"""A request's whole life on the scheduler thread, against vLLM's own block hashing.

Used by ``scheduler_overhead.py`` (part (e)). One 128k-token request (16-token chunks and
blocks, SmolLM2's KV layout, one CPU tier with room for twice the chain, the connector's
default policies) goes through everything the vLLM connector calls on the scheduler's
thread, in order, all in the timed region:

- ``lookup`` (the request's keys from its token ids, the policies' ``observe`` of its
  chain, the lookup across tiers), ``plan_load``, ``on_allocated`` (the load jobs),
  ``hit_sources``;
- its prefill in engine steps of ``STEP_TOKENS`` tokens: ``build_step`` with the request
  scheduled (the store of the chunks the step completes: admission, reservation, job),
  then ``on_report`` with every job of that plan successful (loads end, stores commit);
- ``request_finished``, the step that releases it and the report that ends it.

Three variants differ in what the tier holds when the request arrives: ``cold`` nothing
(it stores all 8,192 chunks), ``half`` its first 64k tokens (it loads them and stores the
rest), ``hit`` all of them (it loads the hit; nothing to store). The tier is set up
untimed, with keys computed apart (other objects than the request's own, as another
request's keys are).

The baseline: vLLM's ``get_request_block_hasher`` over a real ``vllm.v1.request.Request``
holding the same 128k tokens, with the engine's default prefix-caching hash (sha256 of the
pickled block tuple) and 16-token blocks, after ``init_none_hash`` with that hash; what
every request of a prefix-caching engine costs on the same thread. Also timed: kvtier's
keys alone (``KeyChain.update`` over the prompt) and, to judge reusing the engine's block
hashes as kvtier's keys, one keyed BLAKE3 over the engine's 32-byte block hashes.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable
from typing import Any

from common import stats_ns
from kvtier import keyhash
from kvtier.config import KVTierConfig, SyncBudget
from kvtier.jobs import JobResult, StepPlan, WorkerReport
from kvtier.keys import Namespace
from kvtier.layout import KVLayout
from kvtier.manager import CacheManager, ScheduledRequest
from kvtier.policies.defaults import tier_eviction_name
from kvtier.stack.build import build_stack
from kvtier.stack.kinds import TierContext
from kvtier.stack.spec import TierSpec
from kvtier.tiers.index import store_at_once

TOKENS = 128 << 10
CHUNK_TOKENS = 16
BLOCK_TOKENS = 16
STEP_TOKENS = 8192
"""Prefill tokens per engine step (vLLM's default token budget with chunked prefill)."""
TAIL_TOKENS = 10
LAYOUT = KVLayout.dense(30, 3, 64, "bfloat16")
VARIANTS = ("cold", "half", "hit")
REQ = "req-life"


def _report(manager: CacheManager, plan: StepPlan) -> None:
    """Every job of ``plan`` ended well (what a worker reports)."""
    results = [
        JobResult(j.job_id, j.req_id, j.kind, j.tier, j.sync, [True] * len(j.keys), 0, 0.0)
        for j in (*plan.loads, *plan.stores)
    ]
    manager.on_report(WorkerReport(results))


def new_manager(variant: str, tokens: list[int]) -> CacheManager:
    """A manager over one CPU tier holding what ``variant`` says of the request's chain."""
    namespace = Namespace("HuggingFaceTB/SmolLM2-135M", LAYOUT.digest())
    n = len(tokens) // CHUNK_TOKENS
    config = KVTierConfig(
        chunk_tokens=CHUNK_TOKENS,
        sync_budget=SyncBudget("fixed", 1 << 40),
        tiers=(
            TierSpec(
                "cpu",
                capacity=2 * n * LAYOUT.chunk_bytes(CHUNK_TOKENS),
                eviction=tier_eviction_name(KVTierConfig(), "cpu"),
            ),
        ),
    )
    stack = build_stack(config, TierContext(LAYOUT.chunk_bytes(CHUNK_TOKENS), namespace, False))
    held = {"cold": 0, "half": n // 2, "hit": n}[variant]
    if held:
        chain = namespace.key_chain(CHUNK_TOKENS)
        chain.update(tokens)
        assert store_at_once(stack[0].index, chain.keys[:held]) == held  # type: ignore[arg-type]
    return CacheManager(config, LAYOUT, namespace, BLOCK_TOKENS, stack)


def lifecycle(manager: CacheManager, tokens: list[int]) -> dict[str, int]:
    """The request's whole life (module docstring); nanoseconds per part."""
    clock = time.perf_counter_ns
    n_tok = len(tokens)
    blocks = list(range(-(-n_tok // BLOCK_TOKENS)))
    t0 = clock()
    hit = manager.lookup(REQ, tokens, 0)
    assert hit is not None
    t1 = clock()
    n_ext, is_async = manager.plan_load(REQ, hit, n_tok)
    manager.on_allocated(REQ, blocks, n_ext, sync=not is_async)
    manager.hit_sources(REQ, n_ext)
    t2 = clock()
    done = n_ext
    while done < n_tok:
        done = min(n_tok, done + STEP_TOKENS)
        plan = manager.build_step([ScheduledRequest(REQ, tokens, done, blocks, n_tok)])
        _report(manager, plan)
    t3 = clock()
    manager.request_finished(REQ, tokens, n_tok, blocks)
    _report(manager, manager.build_step([]))
    t4 = clock()
    assert not manager.has_pending_jobs() and manager.num_requests() == 0
    return {"total": t4 - t0, "lookup": t1 - t0, "load": t2 - t1, "steps": t3 - t2, "finish": t4 - t3}


def measure_lifecycle(variant: str, iters: int, seed: int = 0) -> dict[str, Any]:
    """Median per part of ``iters`` lifecycles, each on a fresh manager (setup untimed)."""
    rng = random.Random(seed)
    parts: dict[str, list[int]] = {}
    for i in range(iters + 1):
        tokens = [rng.randrange(49152) for _ in range(TOKENS + TAIL_TOKENS)]
        manager = new_manager(variant, tokens)
        gc.collect()
        got = lifecycle(manager, tokens)
        stored = len(manager.stack[0].index)
        assert stored == TOKENS // CHUNK_TOKENS, (variant, stored)
        if i == 0:
            continue  # warm-up
        for k, v in got.items():
            parts.setdefault(k, []).append(v)
    return {k: stats_ns(v) for k, v in parts.items()}


def vllm_block_hasher() -> tuple[Callable[[list[int]], Any], str]:
    """``hash(tokens)``: vLLM's block hashes of a request holding ``tokens`` (its default
    prefix-caching hash, 16-token blocks), and the hash's name."""
    from vllm.config.cache import CacheConfig
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    name = CacheConfig().prefix_caching_hash_algo
    fn = get_hash_fn_by_name(name)
    init_none_hash(fn)
    hasher = get_request_block_hasher(BLOCK_TOKENS, fn)
    params = SamplingParams(max_tokens=1)

    def run(tokens: list[int]) -> Any:
        req = Request("r", tokens, params, None)
        return hasher(req)

    return run, name


def measure_vllm_hash(iters: int, seed: int = 0) -> dict[str, Any]:
    """vLLM's block hashing of a 128k-token prompt (median of ``iters``) and the same
    prompt's kvtier keys alone, in alternate iterations (same machine load)."""
    run, name = vllm_block_hasher()
    rng = random.Random(seed)
    tokens = [rng.randrange(49152) for _ in range(TOKENS + TAIL_TOKENS)]
    namespace = Namespace("HuggingFaceTB/SmolLM2-135M", LAYOUT.digest())
    hashes = run(tokens)
    assert len(hashes) == TOKENS // BLOCK_TOKENS
    clock = time.perf_counter_ns
    v: list[int] = []
    k: list[int] = []
    r: list[int] = []
    key = namespace.hash_key
    seed_digest = keyhash.keyed_hash(key, namespace.seed())
    for _ in range(iters + 1):
        gc.collect()
        t0 = clock()
        run(tokens)
        t1 = clock()
        chain = namespace.key_chain(CHUNK_TOKENS)
        chain.update(tokens)
        t2 = clock()
        # Reusing the engine's hashes: keyed BLAKE3 of each (chained already).
        keyhash.chain(key, seed_digest, b"".join(hashes), len(hashes[0]))
        t3 = clock()
        v.append(t1 - t0)
        k.append(t2 - t1)
        r.append(t3 - t2)
    return {
        "hash": name,
        "vllm_block_hash": stats_ns(v[1:]),
        "kvtier_keys": stats_ns(k[1:]),
        "rekey_vllm_hashes": stats_ns(r[1:]),
    }
