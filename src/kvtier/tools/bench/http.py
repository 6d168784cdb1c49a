"""Drive a bench workload over HTTP against an OpenAI-compatible server.

The same request schedules as the in-process runner (:mod:`kvtier.vllm.harness.runner`'s
``serve`` op): token-id prompts on ``/v1/completions``, streamed, greedy; arrivals and a
concurrency limit; ``extend`` continues an earlier request with its prompt + output.
TTFT is measured at the client, from sending the request to the first streamed chunk
that carries a token; cached prompt tokens come from the final usage record. Results have
the runner's shape, so :func:`kvtier.tools.bench.report.summarize` reads both. kvtier's hit
tokens by source come per workload from the server's ``/metrics`` (``vllm:kvtier_*``).
Token ids are the bench model's: a server given with ``--server`` must serve that model.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvtier.tools.bench.workloads import next_ready, repetition


async def _one(
    client: Any, url: str, r: dict[str, Any], prompt: list[int], eos: int | None
) -> dict[str, Any]:
    body = {
        "model": "model",
        "prompt": prompt,
        "max_tokens": r.get("max_tokens", 8),
        "temperature": 0.0,
        "ignore_eos": r.get("ignore_eos", False),
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    start = time.perf_counter()
    ttft = None
    out: list[int] = []
    cached = 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")[:300]
            raise RuntimeError(f"server answered {resp.status_code}: {text}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            for choice in chunk.get("choices") or []:
                ids = choice.get("token_ids") or []
                if ids and ttft is None:
                    ttft = time.perf_counter() - start
                out += ids
            usage = chunk.get("usage")
            if usage:
                cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    e2e = time.perf_counter() - start
    return {
        "id": r["id"],
        "prompt_len": len(prompt),
        "ttft": ttft if ttft is not None else e2e,
        "e2e": e2e,
        "output": out,
        "num_cached": cached,
        "_prompt": prompt,
        "_eos": eos,
    }


async def _serve(url: str, op: dict[str, Any], history: dict[str, list[int]]) -> dict[str, Any]:
    import httpx

    eos = op.get("eos_token_id")
    limit = op.get("max_concurrency", 1 << 30)
    pending = sorted(op["requests"], key=lambda r: r.get("arrival", 0.0))
    done: dict[str, dict[str, Any]] = {}
    running: set[asyncio.Task[dict[str, Any]]] = set()
    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        while pending or running:
            now = time.perf_counter() - t0
            while len(running) < limit:
                r = next_ready(pending, now, history)
                if r is None:
                    break
                prompt = list(r["prompt"])
                if r.get("extend"):
                    prev = history[r["extend"]]
                    prompt = (prev[:-1] if prev and prev[-1] == eos else prev) + prompt
                running.add(asyncio.create_task(_one(client, url, r, prompt, eos)))
            if not running:
                await asyncio.sleep(0.005)
                continue
            finished, _ = await asyncio.wait(
                running, timeout=0.05, return_when=asyncio.FIRST_COMPLETED
            )
            for task in finished:
                running.discard(task)
                rec = task.result()
                history[rec["id"]] = rec.pop("_prompt") + rec["output"]
                rec.pop("_eos")
                done[rec["id"]] = rec
    return {
        "name": op.get("name", ""),
        "seconds": time.perf_counter() - t0,
        "requests": [done[r["id"]] for r in op["requests"]],
    }


def serve_over_http(
    url: str, op: dict[str, Any], history: dict[str, list[int]] | None = None
) -> dict[str, Any]:
    """Run one ``serve`` op against the server at ``url``; the runner's result shape."""
    return asyncio.run(_serve(url, op, {} if history is None else history))


def reset_prefix_cache(url: str, connector: bool = True, retries: int = 50) -> bool:
    """POST /reset_prefix_cache (servers in dev mode); retried while blocks are held."""
    import httpx

    for _ in range(retries):
        resp = httpx.post(
            f"{url}/reset_prefix_cache",
            params={"reset_external": str(connector).lower()},
            timeout=30,
        )
        if resp.status_code == 200 and resp.json().get("success", True) is not False:
            return True
        time.sleep(0.2)
    return False


def engine_args(engine: dict[str, Any]) -> list[str]:
    """Server flags equal to the in-process runner's engine settings."""
    args = ["--enforce-eager", "--block-size", "32", "--seed", "0"]
    for key, value in engine.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def run_http_modes(
    url: str | None,
    modes: Sequence[str],
    workloads: Sequence[Any],
    connector_of: Callable[[str], dict[str, Any] | None],
    *,
    model: str,
    engine: dict[str, Any],
    threads: int,
    concurrency: int,
    out_dir: Path,
    bar: Any,
    repeats: int = 1,
) -> dict[str, dict[str, Any]]:
    """Every workload over HTTP, per mode: against ``url`` (one running server, mode
    "server"), or against a server started per mode (same flags and binding); each
    workload ``repeats`` times in a row (:func:`~kvtier.tools.bench.workloads.repetition`)."""
    from kvtier.tools.bench.prompts import tokenizer
    from kvtier.tools.bench.server import Server, ServerSpec, kvtier_hit_tokens, metrics

    eos = getattr(tokenizer(model), "eos_token_id", None)
    raw: dict[str, dict[str, Any]] = {}
    for mode in modes:
        bar.set_postfix_str(f"mode {mode}")
        server = None
        if url is None:
            spec = ServerSpec(model, connector_of(mode), threads, engine_args(engine))
            server = Server(spec, out_dir / f"server-{mode}.log")
        try:
            base = url or (server.url if server else "")
            warm = workloads[0].requests[0]["prompt"][:64]
            serve_over_http(base, {"requests": [{"id": "warmup", "prompt": warm, "max_tokens": 2}]})
            reset_prefix_cache(base)
            ops = []
            for wl, k in ((wl, k) for wl in workloads for k in range(repeats)):
                before = kvtier_hit_tokens(metrics(base))
                op = {
                    "name": wl.name,
                    "requests": repetition(wl.requests, k),
                    "max_concurrency": concurrency,
                    "eos_token_id": eos,
                }
                result = serve_over_http(base, op)
                after = kvtier_hit_tokens(metrics(base))
                result["kvtier_hit_tokens"] = {
                    s: int(after[s] - before.get(s, 0))
                    for s in after
                    if after[s] > before.get(s, 0)
                }
                ops.append(result)
                bar.update(len(wl.requests))
                reset_prefix_cache(base)
            raw[mode] = {"ops": ops, "binding": server.binding() if server else None}
        finally:
            if server is not None:
                server.stop()
    return raw
