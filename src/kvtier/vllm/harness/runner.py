"""Run a request schedule on a real vLLM engine in this process and measure it.

``python -m kvtier.vllm.harness.runner SPEC.json OUT.json`` builds one ``LLM`` (with or without the
kvtier connector) and executes the spec's program. The benchmark commands and the tests use
it in a subprocess per engine configuration, because vLLM keeps process-global state (the
KV connector agent) that cannot be rebuilt inside one process.

SPEC (JSON)::

    {"model": "<dir>" | null (SmolLM2), "engine": {LLM keyword overrides},
     "connector": {kv_connector_extra_config} | null, "by_name": false,
     "multiprocess": false, "inspect": false, "threads": null (see below),
     "kv_events": {KVEventsConfig fields} | null, "inspect_keys": false,
     "program": [
        {"op": "serve", "name": "...", "requests": [{"id": "a", "prompt": [ids],
          "max_tokens": 8, "arrival": 0.0, "extend": "<id of an earlier request>",
          "image": {"seed": 1, "size": 64, "uuid": null} | null}],
         "max_concurrency": 4},
        {"op": "reset_prefix_cache"}, {"op": "drain"}, {"op": "settle"},
        {"op": "stores", "on": false}, {"op": "evict", "tier": "cpu"},
        {"op": "drop_states", "prompt": [ids], "from": 288}]}

``serve`` admits requests at their arrival time (seconds from the op's start) while fewer
than ``max_concurrency`` are running, steps the engine and records per request: TTFT,
end-to-end latency, output token ids, cached prompt tokens and kvtier's hit sources.
A request with ``image`` carries one random RGB image (``size`` x ``size`` pixels drawn
from ``seed``: the same seed is the same image) for the model's image placeholder in
``prompt``, named by the client's ``uuid`` (vLLM's ``multi_modal_uuids``) when one is
given; its result adds ``engine_prompt``, the prompt after vLLM expanded the
placeholder (the image's token positions).
A request with ``extend`` continues an earlier request once that one has finished: its
prompt is that request's prompt + its output (without a final end-of-sequence token) +
``prompt`` (multi-turn chat). ``reset_prefix_cache`` drops the engine's own prefix cache
(and kvtier's tiers too with ``"connector": true``). ``drain`` steps the idle engine until
kvtier has no job in flight. ``settle`` waits until kvtier's CPU tier memory is faulted
in (done in the background after start-up; see :mod:`kvtier.vllm.probe`) and records the
wait in OUT's ``settle`` list. ``stores`` (in-process engines with the connector) turns
kvtier's stores off (``"on": false``: the admission policy refuses every chunk, lookups
and hits go on) or back on, so one engine can measure what its stores cost. ``evict``
(in-process engines) forgets what a kvtier tier holds (default "cpu"), as other traffic
evicting it would: the tiers below keep their copies; ``prefetch`` (``"on": bool``)
turns kvtier's prefetch on arrival on or off. ``drop_states`` (in-process hybrid engines
with the connector) forgets kvtier's recurrent states of ``prompt``'s chain at every
boundary from ``from`` tokens on, as an eviction would. A request with ``extend`` and ``gap``
(seconds) is admitted that long after the request it extends finished (an agent's tool
call). A request's ``kv_transfer_params``
(a mapping) reaches the connector as vLLM's per-request transfer parameters (kvtier's
hints: docs/prefetch.md). OUT holds
every op's results and, with ``inspect``, kvtier's
internal state (in-process engines only), with ``inspect_keys`` also every tier's readable
chunk keys and the key seed. ``kv_events`` turns vLLM's KV events on (``KVEventsConfig``
fields); OUT's ``events_last_seq`` is then the last batch published. With
``$KVTIER_PROGRESS`` set, the number of requests finished so far (all ops) is written to
that file as they finish.

``threads``: the engine's compute threads, set explicitly whether or not a connector is
configured (default :func:`kvtier.tools.bench.binding.default_threads`), so that engines a
benchmark compares compute alike; OUT's ``binding`` is what the model worker measured.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from kvtier import timeline
from kvtier.keys import Key
from kvtier.policies.admission import AdmissionPolicy
from kvtier.tools.bench.binding import binding_env, default_threads
from kvtier.tools.bench.workloads import next_ready

_FINISHED = [0]
"""Requests finished by this process, across ops (the progress counter)."""


def build_llm(spec: dict[str, Any]) -> Any:
    multiprocess = bool(spec.get("multiprocess"))
    if not multiprocess:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    threads = spec.get("threads") or default_threads(multiprocess)
    os.environ.update(binding_env(threads, multiprocess))
    import torch

    torch.set_num_threads(threads)  # in process, before vLLM's worker forbids it
    from vllm import LLM
    from vllm.config import KVTransferConfig

    from kvtier.tools.models import smollm2_path

    kw: dict[str, Any] = {
        "model": spec.get("model") or smollm2_path(),
        "dtype": "bfloat16",
        "max_model_len": 8192,
        "enforce_eager": True,
        "enable_prefix_caching": True,
        "block_size": 32,
        "max_num_seqs": 8,
        "seed": 0,
        "worker_extension_cls": "kvtier.vllm.probe.BindingProbe",
    }
    kw.update(spec.get("engine") or {})
    if spec.get("connector") is not None:
        kvt: dict[str, Any] = {
            "kv_connector": "KVTierConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": spec["connector"],
        }
        if not spec.get("by_name"):
            kvt["kv_connector_module_path"] = "kvtier.vllm"
        kw["kv_transfer_config"] = KVTransferConfig(**kvt)
    if spec.get("kv_events"):
        from vllm.config import KVEventsConfig

        kw["kv_events_config"] = KVEventsConfig(**spec["kv_events"])
    return LLM(**kw)


def _connector(llm: Any) -> Any:
    """The scheduler-side kvtier connector of an in-process engine, or None."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    scheduler = getattr(core, "scheduler", None)
    return getattr(scheduler, "connector", None)


def serve(llm: Any, op: dict[str, Any], history: dict[str, list[int]]) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    conn = _connector(llm)
    eos = getattr(llm.get_tokenizer(), "eos_token_id", None)
    progress = os.environ.get("KVTIER_PROGRESS")
    pending = sorted(op["requests"], key=lambda r: r.get("arrival", 0.0))
    limit = op.get("max_concurrency", 1 << 30)
    running: dict[str, dict[str, Any]] = {}
    done: dict[str, dict[str, Any]] = {}
    finished_at: dict[str, float] = {}
    t0 = time.perf_counter()
    while pending or running:
        now = time.perf_counter() - t0
        while len(running) < limit:
            r = next_ready(pending, now, history, finished_at)
            if r is None:
                break
            prompt = list(r["prompt"])
            if r.get("extend"):
                prev = history[r["extend"]]
                prompt = (prev[:-1] if prev and prev[-1] == eos else prev) + prompt
            sp = SamplingParams(
                temperature=0.0,
                max_tokens=r.get("max_tokens", 8),
                ignore_eos=r.get("ignore_eos", False),
                extra_args=(
                    {"kv_transfer_params": r["kv_transfer_params"]}
                    if r.get("kv_transfer_params") is not None
                    else None
                ),
            )
            tokens = TokensPrompt(prompt_token_ids=prompt)
            if r.get("image") is not None:
                tokens["multi_modal_data"] = {"image": _image(r["image"])}
                if r["image"].get("uuid"):
                    tokens["multi_modal_uuids"] = {"image": [r["image"]["uuid"]]}
            engine.add_request(r["id"], tokens, sp)
            timeline.event("runner.add", req=r["id"], tokens=len(prompt))
            running[r["id"]] = {
                "id": r["id"],
                "prompt_len": len(prompt),
                "prompt": prompt,
                "start": time.perf_counter(),
                "abort_after_tokens": r.get("abort_after_tokens"),
            }
            if r.get("image") is not None:
                running[r["id"]]["engine_prompt"] = None  # filled in when it finishes
        if not running:
            time.sleep(0.005)
            continue
        timeline.event("runner.step_start")
        outs = engine.step()
        timeline.event("runner.step_end", outputs=len(outs))
        for out in outs:
            rec = running.get(out.request_id)
            if rec is None:
                continue
            t = time.perf_counter()
            cut = rec.get("abort_after_tokens")
            if cut is not None and out.outputs and len(out.outputs[0].token_ids) >= cut:
                engine.abort_request([rec["id"]])
                rec.update(
                    aborted=True,
                    e2e=t - rec["start"],
                    ttft=rec.get("ttft", 0.0),
                    output=list(out.outputs[0].token_ids),
                    num_cached=0,
                )
                rec.pop("prompt")
                done[rec["id"]] = running.pop(rec["id"])
                continue
            if "ttft" not in rec and out.outputs and out.outputs[0].token_ids:
                rec["ttft"] = t - rec["start"]
                timeline.event("runner.first_token", req=rec["id"], ttft=rec["ttft"])
            if out.finished:
                rec["e2e"] = t - rec["start"]
                rec["output"] = list(out.outputs[0].token_ids)
                rec["num_cached"] = out.num_cached_tokens or 0
                if "engine_prompt" in rec:
                    rec["engine_prompt"] = list(out.prompt_token_ids or ())
                history[rec["id"]] = rec.pop("prompt") + rec["output"]
                finished_at[rec["id"]] = t - t0
                done[rec["id"]] = running.pop(rec["id"])
                if progress:
                    _FINISHED[0] += 1
                    with open(progress, "w") as f:
                        f.write(str(_FINISHED[0]))
    elapsed = time.perf_counter() - t0
    # A serving engine keeps stepping while kvtier has jobs in flight (vLLM's engine loop
    # asks the connector); this offline loop stops with the last request, so step on.
    drain(llm)
    if conn is not None:
        recorded = {rid.rsplit("-", 1)[0]: s for rid, s in conn.manager.recent_hit_sources}
        modes = {rid.rsplit("-", 1)[0]: m for rid, m in conn.manager.recent_load_modes}
        for rid, rec in done.items():
            rec["hit_sources"] = {s.label: n for s, n in recorded.get(rid, {}).items()}
            rec["load"] = modes.get(rid)
    for rec in done.values():
        rec.pop("start", None)
    return {
        "name": op.get("name", ""),
        "seconds": elapsed,
        "requests": [done[r["id"]] for r in op["requests"]],
    }


def _image(spec: dict[str, Any]) -> Any:
    """The PIL image a request's ``image`` spec names (same seed and size, same pixels)."""
    import numpy as np
    from PIL import Image

    size = int(spec.get("size", 64))
    rng = np.random.default_rng(int(spec["seed"]))
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


class _RefuseAll(AdmissionPolicy):
    def admit(self, key: Key) -> bool:
        return False


def set_stores(llm: Any, on: bool) -> None:
    """Let kvtier store chunks (its own admission policy) or store none (in process)."""
    conn = _connector(llm)
    if conn is None or conn.manager is None:
        raise ValueError("runner: the stores op needs an in-process engine with kvtier")
    manager = conn.manager
    own = manager.__dict__.setdefault("_runner_admission", manager.admission)
    manager.admission = own if on else _RefuseAll()


def drop_states(llm: Any, op: dict[str, Any]) -> int:
    """Forget kvtier's recurrent states of ``op["prompt"]``'s chain from boundary
    ``op["from"]`` (tokens) on, as if they had been evicted (a hybrid model in process);
    how many were held."""
    from kvtier.keyinputs import NO_INPUTS

    conn = _connector(llm)
    if conn is None or conn.states is None:
        raise ValueError("runner: drop_states needs an in-process hybrid engine with kvtier")
    chain = conn.manager.namespace.key_chain(conn.manager.chunk_tokens, NO_INPUTS)
    chain.update(op["prompt"])
    return int(conn.states.cache.drop(chain.keys, int(op["from"])))


def set_prefetch(llm: Any, on: bool) -> None:
    """Turn kvtier's prefetch on arrival on or off (config ``prefetch``) in this process's
    engine; no-op without kvtier (the baseline runs the same program)."""
    import dataclasses

    conn = _connector(llm)
    if conn is not None and conn.manager is not None:
        m = conn.manager
        m.config = m.arrivals.config = dataclasses.replace(m.config, prefetch=on)


def evict(llm: Any, tier: str) -> None:
    """Forget every chunk of kvtier tier ``tier`` that no job holds (what other traffic
    evicting it would do; the tiers below keep their copies). No-op without kvtier in
    this process (the baseline runs the same program)."""
    conn = _connector(llm)
    if conn is None or conn.manager is None:
        return
    drain(llm)
    conn.manager.stack.by_name(tier).index.clear()


def drain(llm: Any, timeout: float = 30.0) -> None:
    """Step the engine until kvtier's jobs in flight are done and reported."""
    conn = _connector(llm)
    if conn is None:
        time.sleep(0.2)  # another process: give its copy threads a moment
        return
    core = llm.llm_engine.engine_core.engine_core
    deadline = time.monotonic() + timeout
    states = getattr(conn, "states", None)

    def pending() -> bool:
        return conn.manager.has_pending_jobs() or (states is not None and states.pending())

    while pending() and time.monotonic() < deadline:
        core.step()
        time.sleep(0.002)
    # Blocks kvtier held for finished requests are released one step after their jobs
    # are reported; let that step happen so a cache reset finds every block free.
    for _ in range(3):
        core.step()


def inspect(llm: Any, keys: bool = False) -> dict[str, Any]:
    """kvtier's scheduler- and worker-side state after the program (in-process only);
    ``keys``: also every authoritative tier's readable chunk keys (hex) and the key seed."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    conn = _connector(llm)
    drain(llm)
    conn.get_kv_connector_stats()  # fold the last interval into the totals
    m = conn.manager
    slot_tiers = [t.index for t in m.tiers if not t.shared]
    for index in slot_tiers:
        index.check()
    worker: Any = getattr(get_kv_transfer_group(), "worker", None)
    out = _inspect_events(conn, keys)
    return (
        out
        | {
            "metrics": conn.totals.to_dict(),
            "hit_sources": [
                [rid, {s.label: n for s, n in srcs.items()}] for rid, srcs in m.recent_hit_sources
            ],
            "steps": m.steps,
            "deferred": m.deferred,
            "pending_jobs": m.has_pending_jobs(),
            "requests": m.num_requests(),
            "pins": sum(e.pins for index in slot_tiers for e in index.entries.values()),
            "leases": m.arrivals.retention.leases(),
            "prefetching": m.arrivals.prefetch.active(),
            "chunks": len(m.tiers[0].index),
            "tier_chunks": {t.name: len(t.index) for t in m.tiers},
            "preemptions": conn.preemptions,
            "chunk_tokens": m.chunk_tokens,
            "namespace": m.namespace.chain_digest().hex(),
            "budget_limit": m.budget.limit,
            "bandwidth": m.budget.bandwidth,
            "step_seconds": m.budget.step_seconds,
            "worker_inflight": len(worker._inflight),
            "failed_reads": getattr(next(iter(worker.engine.stores.values())), "failed_reads", 0),
            "slow_ops": getattr(next(iter(worker.engine.stores.values())), "slow_ops", 0),
            "layered_steps": worker.layered_steps,
        }
        | _inspect_states(conn)
    )


def _inspect_states(conn: Any) -> dict[str, Any]:
    """The recurrent states of a hybrid model (none for other models)."""
    hybrid = getattr(conn, "states", None)
    if hybrid is None:
        return {}
    states = hybrid.cache
    return {
        "states": {
            "stored": states.stored_offers,
            "skipped": states.skipped_offers,
            "tier_states": {t.name: len(t.index) for t in states.stack.tiers},
            "hits": list(states.recent_hits),
            "pending_jobs": states.cache.has_pending_jobs(),
            "tier_keys": {
                t.name: sorted(k.hex() for k in t.index.ready_keys())
                for t in states.stack.tiers
                if not t.shared
            },
        }
    }


def _inspect_events(conn: Any, keys: bool) -> dict[str, Any]:
    m = conn.manager
    out: dict[str, Any] = {}
    if keys:
        out["key_seed"] = m.namespace.seed().hex()
        out["tier_keys"] = {
            t.name: sorted(k.hex() for k in t.index.ready_keys()) for t in m.tiers if not t.shared
        }
    if conn.events is not None:
        out["events"] = {
            "dropped_runs": conn.events.dropped_runs,
            "unknown": conn.events.log.unknown,
            "starts": len(conn.events.log.starts()),
            "announced": {
                t.name: conn.events.log.announced[i] for i, t in enumerate(m.tiers) if not t.shared
            },
            "group": conn.events.group,
        }
    return out


def _flush_events(llm: Any) -> int:
    """Publish what kvtier's events still hold, let the publisher send it; the last
    sequence number published (-1: none)."""
    core = llm.llm_engine.engine_core.engine_core
    conn = _connector(llm)
    for _ in range(100):
        core.step()
        if conn is None or conn.events is None or not conn.events.pending():
            break
    publisher = core.scheduler.kv_event_publisher
    deadline = time.monotonic() + 10.0
    queue = getattr(publisher, "_event_queue", None)
    while queue is not None and not queue.empty() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # the PUB socket sends from its own thread
    buffer = getattr(publisher, "_buffer", None)
    return buffer[-1][0] if buffer else -1


def run(spec: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    llm = build_llm(spec)
    return execute(llm, spec, t0)


def execute(llm: Any, spec: dict[str, Any], t0: float) -> dict[str, Any]:
    """Run ``spec``'s program on ``llm`` (built at ``t0``, a ``perf_counter`` time) and
    return the result :func:`run` writes; the caller owns the engine afterwards."""
    out: dict[str, Any] = {"startup_seconds": time.perf_counter() - t0, "ops": []}
    history: dict[str, list[int]] = {}
    for op in spec["program"]:
        kind = op["op"]
        if kind == "serve":
            out["ops"].append(serve(llm, op, history))
        elif kind == "reset_prefix_cache":
            drain(llm)
            llm.reset_prefix_cache(reset_connector=bool(op.get("connector")))
        elif kind == "drain":
            drain(llm)
        elif kind == "stores":
            set_stores(llm, bool(op["on"]))
        elif kind == "evict":
            evict(llm, str(op.get("tier", "cpu")))
        elif kind == "prefetch":
            set_prefetch(llm, bool(op["on"]))
        elif kind == "drop_states":
            out.setdefault("dropped_states", []).append(drop_states(llm, op))
        elif kind == "settle":
            out.setdefault("settle", []).append(llm.collective_rpc("kvtier_settle")[0])
        else:
            raise ValueError(f"runner: unknown op {kind!r}")
    if spec.get("inspect") and _connector(llm) is not None:
        out["kvtier"] = inspect(llm, bool(spec.get("inspect_keys")))
    if spec.get("kv_events"):
        out["events_last_seq"] = _flush_events(llm)
    out["binding"] = llm.collective_rpc("kvtier_binding")[0]
    out["seconds"] = time.perf_counter() - t0
    return out


def spec_main(
    module: str, body: Callable[[dict[str, Any]], dict[str, Any]], argv: list[str] | None
) -> int:
    """``python -m MODULE SPEC.json OUT.json``: run ``body`` on the spec, write its result."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(f"usage: python -m {module} SPEC.json OUT.json", file=sys.stderr)
        return 2
    with open(args[0]) as f:
        spec = json.load(f)
    result = body(spec)
    with open(args[1], "w") as f:
        json.dump(result, f)
    return 0


def main(argv: list[str] | None = None) -> int:
    return spec_main("kvtier.vllm.harness.runner", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
