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
holding the same 128k tokens (built untimed), with the engine's default prefix-caching
hash (sha256 of the pickled block tuple) and 16-token blocks, after ``init_none_hash``
with that hash: what every request of a prefix-caching engine costs on the same thread.
Also timed: kvtier's keys alone (``KeyChain.update`` over the prompt) and, to judge
reusing the engine's block hashes as kvtier's keys, a keyed BLAKE3 chain over the engine's
32-byte block hashes (one 96-byte message per block). Every iteration times all of them
on the same prompt, one after the other, so a run's ratios see one machine load.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Callable
from typing import Any

from common import stats_ns
from kvtier import keyhash
from kvtier.budget import SyncBudget
from kvtier.config import KVTierConfig
from kvtier.contract.kind import TierContext
from kvtier.contract.spec import TierSpec
from kvtier.jobs import JobResult, StepPlan, WorkerReport
from kvtier.keys import Namespace
from kvtier.layout import KVLayout
from kvtier.manager import CacheManager, ScheduledRequest
from kvtier.policies.defaults import tier_eviction_name
from kvtier.stack.build import build_stack
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


def lifecycle(
    manager: CacheManager, tokens: list[int], clock: Callable[[], int] = time.perf_counter_ns
) -> dict[str, int]:
    """The request's whole life (module docstring); nanoseconds per part."""
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
    return {
        "total": t4 - t0,
        "lookup": t1 - t0,
        "load": t2 - t1,
        "steps": t3 - t2,
        "finish": t4 - t3,
    }


def vllm_block_hasher() -> tuple[Callable[[list[int]], Any], Callable[[Any], Any], str]:
    """``(new_request, hash, name)``: a real ``vllm.v1.request.Request`` holding the given
    tokens (built without block hashes), vLLM's block hasher of a request (its default
    prefix-caching hash, 16-token blocks, ``init_none_hash`` done) and the hash's name."""
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

    def new_request(tokens: list[int]) -> Any:
        return Request("r", tokens, params, None)

    return new_request, hasher, name


def measure_run(iters: int, seed: int = 0) -> dict[str, Any]:
    """One run: per iteration, on the same fresh 128k-token prompt, vLLM's block hashing,
    kvtier's keys alone, the keyed re-hash of vLLM's hashes, and one lifecycle of each
    variant on a fresh manager (setup untimed); medians in microseconds, and per variant
    the ratio of its median to vLLM's hashing median (same run, same load)."""
    new_request, hasher, name = vllm_block_hasher()
    rng = random.Random(seed)
    tokens = [rng.randrange(49152) for _ in range(TOKENS + TAIL_TOKENS)]
    namespace = Namespace("HuggingFaceTB/SmolLM2-135M", LAYOUT.digest())
    hashes = hasher(new_request(tokens))
    assert len(hashes) == TOKENS // BLOCK_TOKENS
    key = namespace.hash_key
    seed_digest = keyhash.keyed_hash(key, namespace.seed())
    clock = time.perf_counter_ns
    samples: dict[str, list[int]] = {}
    parts: dict[str, dict[str, list[int]]] = {v: {} for v in VARIANTS}

    def timed(name: str, fn: Callable[[], Any]) -> None:
        t0 = clock()
        fn()
        samples.setdefault(name, []).append(clock() - t0)

    for i in range(iters + 1):
        managers = {v: new_manager(v, tokens) for v in VARIANTS}
        request = new_request(tokens)
        gc.collect()
        timed("vllm_block_hash", lambda r=request: hasher(r))
        timed("kvtier_keys", lambda: namespace.key_chain(CHUNK_TOKENS).update(tokens))
        # Reusing the engine's hashes: one keyed BLAKE3 of each (they are chained already).
        blob = b"".join(hashes)
        width = len(hashes[0])
        timed("rekey_vllm_hashes", lambda b=blob, w=width: keyhash.chain(key, seed_digest, b, w))
        for v in VARIANTS:
            got = lifecycle(managers[v], tokens)
            assert len(managers[v].stack[0].index) == TOKENS // CHUNK_TOKENS, v
            for k, ns in got.items():
                parts[v].setdefault(k, []).append(ns)
        if i == 0:  # warm-up
            samples.clear()
            parts = {v: {} for v in VARIANTS}
    out: dict[str, Any] = {"hash": name, **{k: stats_ns(v) for k, v in samples.items()}}
    vllm_us = out["vllm_block_hash"]["median_us"]
    for v in VARIANTS:
        out[v] = {k: stats_ns(x) for k, x in parts[v].items()}
        out[v]["over_vllm_hash"] = out[v]["total"]["median_us"] / vllm_us
    return out
