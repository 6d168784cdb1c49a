"""Two real vLLM engines (separate processes, as two hosts) on one remote store.

Used by ``remote_tier.py --vllm``. Engine A serves ``conversations`` first turns (a shared
system prompt + a document + a question) and a 4k-token prompt, storing their KV through
its CPU tier into the remote tier. Engine B, a fresh process with an empty CPU tier, then
serves every conversation's continuation (A's prompt + A's answer + a new question) and the
4k-token prompt again. Engine C is B on an emptied remote store: the same engine settings
and CPU binding (a KV connector configured), so it recomputes everything; its TTFTs are the
recompute baseline and its outputs must equal B's.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CHUNK = 32
ENGINE = {"dtype": "float32", "max_num_batched_tokens": 8192, "max_model_len": 8192}


def _run(spec: dict[str, Any], tmp: Path, name: str) -> dict[str, Any]:
    spec_path, out = tmp / f"{name}.json", tmp / f"{name}.out.json"
    spec_path.write_text(json.dumps(spec))
    p = subprocess.run(
        [sys.executable, "-m", "kvtier.vllm.runner", str(spec_path), str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if p.returncode:
        raise RuntimeError(f"engine {name} failed: {p.stderr[-3000:]}")
    return dict(json.loads(out.read_text()))


def _flush(url: str) -> None:
    from kvtier.tiers.remote import RemoteClient, parse_remote_url

    c = RemoteClient(parse_remote_url(url), timeout_s=10)
    if c.target.cluster:
        c.client.flushall(target_nodes=c.client.PRIMARIES)
    else:
        c.client.flushall()
    c.close()


def two_engines(url: str, conversations: int = 6, doc_tokens: int = 700) -> dict[str, Any]:
    from kvtier.bench.prompts import chat_turn, exact_document, followup, tokenizer
    from kvtier.bench.text import question
    from kvtier.models import smollm2_path

    model = smollm2_path()
    tok = tokenizer(model)
    first = [
        chat_turn(
            model, tok.decode(exact_document(model, 50 + i, doc_tokens)) + "\n\n" + question(i)
        )
        for i in range(conversations)
    ]
    long_prompt = chat_turn(
        model, tok.decode(exact_document(model, 99, 4000)) + "\n\n" + question(99)
    )
    cfg = {
        "sync_budget": "1GiB",
        "tiers": [{"kind": "cpu", "capacity": "1GiB"}, {"kind": "redis", "url": url}],
    }

    def spec(requests: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "connector": cfg,
            "engine": ENGINE,
            "inspect": True,
            "program": [{"op": "serve", "name": "s", "requests": requests, "max_concurrency": 1}],
        }

    _flush(url)
    with tempfile.TemporaryDirectory(prefix="kvtier-remote-") as d:
        tmp = Path(d)
        reqs_a = [{"id": f"c{i}", "prompt": p, "max_tokens": 16} for i, p in enumerate(first)]
        reqs_a.append({"id": "long", "prompt": long_prompt, "max_tokens": 4})
        a = _run(spec(reqs_a), tmp, "A")
        done = a["ops"][0]["requests"]
        cont, shared = [], 0
        for i, (p, r) in enumerate(zip(first, done, strict=False)):
            prefix = p + r["output"]
            shared += len(prefix) - 1  # the last sampled token has no KV yet
            cont.append(
                {
                    "id": f"t{i}",
                    "prompt": prefix + followup(model, question(20 + i)),
                    "max_tokens": 16,
                }
            )
        reqs_b = [*cont, {"id": "long", "prompt": long_prompt, "max_tokens": 4}]
        b = _run(spec(reqs_b), tmp, "B")
        _flush(url)
        c = _run(spec(reqs_b), tmp, "C")
    rb, rc = b["ops"][0]["requests"], c["ops"][0]["requests"]
    hit = sum(r.get("hit_sources", {}).get("p2p", 0) for r in rb[:-1])
    ttft_hit, ttft_recompute = rb[-1]["ttft"], rc[-1]["ttft"]
    rows = []
    for name, reqs in (("B (remote store of A)", rb), ("C (empty store: recompute)", rc)):
        rows.append(
            [
                name,
                sum(r.get("hit_sources", {}).get("p2p", 0) for r in reqs),
                f"{statistics.mean(r['ttft'] for r in reqs[:-1]) * 1e3:.0f}",
                f"{reqs[-1]['ttft'] * 1e3:.0f}",
            ]
        )
    identical = [r["output"] for r in rb] == [r["output"] for r in rc]
    return {
        "headers": ["engine", "remote hit tokens", "mean TTFT continuations ms", "TTFT 4k ms"],
        "rows": rows,
        "summary": {
            "second_engine_hit_fraction": hit / shared,
            "ttft_recompute_over_remote_hit_4k": ttft_recompute / ttft_hit,
            "outputs_identical": identical,
        },
        "shared_prefix_tokens": shared,
        "remote_hit_tokens": hit,
        "long_prompt_tokens": len(long_prompt),
        "a": {"ttft": [r["ttft"] for r in done]},
        "b": {"ttft": [r["ttft"] for r in rb], "hit_sources": [r.get("hit_sources") for r in rb]},
        "c": {"ttft": [r["ttft"] for r in rc]},
    }
