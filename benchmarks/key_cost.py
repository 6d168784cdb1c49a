"""Cost of computing a request's chunk keys: today's keys (format 3, chained keyed BLAKE3,
20 bytes) against the previous ones (format 2, chained xxh3-128, 16 bytes), from the
request's token ids (a Python list, as vLLM hands them over) to the list of keys.

Used by ``scheduler_overhead.py`` (part (c)), which also times the scheduler side of a hit
with previous-format keys in its indexes. The previous construction is written here as the
baseline: key i = xxh3_128(key i-1 || token ids of chunk i as int64), its first TAG_BYTES
replaced by those of the group's first chunk.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from common import stats_ns, time_calls
from kvtier import keyhash
from kvtier.keys import GROUP_CHUNKS, TAG_BYTES, Key, Namespace

LEGACY_KEY_BYTES = 16


def legacy_chunk_keys(tokens: Sequence[int], chunk_tokens: int, seed: bytes) -> list[Key]:
    """The previous keys (format 2), exactly as the previous ``KeyChain.update`` made them."""
    n = len(tokens) // chunk_tokens
    data = np.asarray(tokens[: n * chunk_tokens], dtype="<i8").tobytes()
    step = chunk_tokens * 8
    out: list[Key] = []
    prev = seed
    tag = prev[:TAG_BYTES]
    h, g, t = xxhash.xxh3_128_digest, GROUP_CHUNKS, TAG_BYTES
    for pos, off in enumerate(range(0, n * step, step)):
        prev = h(prev + data[off : off + step])
        if pos % g:
            prev = tag + prev[t:]
        else:
            tag = prev[:t]
        out.append(prev)
    return out


LEGACY_SEED = bytes(LEGACY_KEY_BYTES)


def _time(fn: Any, iters: int) -> dict[str, float]:
    return stats_ns(time_calls(fn, iters, warmup=1))


def _fallback_ms(hit_tokens: int, chunk_tokens: int, iters: int) -> float:
    """Median ms of the blake3-package path (KVTIER_KEYS_NATIVE=0, own process)."""
    code = (
        "import random,time,statistics;from kvtier.keys import Namespace;"
        "from kvtier import keyhash;assert not keyhash.is_native();"
        f"r=random.Random(0);t=[r.randrange(49152) for _ in range({hit_tokens})];"
        "ns=Namespace('m','g');xs=[]\n"
        f"for _ in range({iters}):\n"
        f" a=time.perf_counter();c=ns.key_chain({chunk_tokens});c.update(t);"
        "xs.append(time.perf_counter()-a)\n"
        "print(statistics.median(xs)*1e3)"
    )
    env = dict(os.environ, KVTIER_KEYS_NATIVE="0")
    out = subprocess.check_output([sys.executable, "-c", code], env=env, text=True)
    return float(out.strip().splitlines()[-1])


def measure_key_cost(
    tokens: list[int], chunk_tokens: int, iters: int, *, fallback: bool = False
) -> dict[str, Any]:
    """Per-request key cost (median of ``iters``, microseconds) of each construction."""
    ns = Namespace("HuggingFaceTB/SmolLM2-135M", "layout")
    keyed = Namespace("HuggingFaceTB/SmolLM2-135M", "layout", secret=b"s" * 32)

    def new(n: Namespace) -> Any:
        def run() -> list[Key]:
            chain = n.key_chain(chunk_tokens)
            chain.update(tokens)
            return chain.keys

        return run

    assert isinstance(new(ns)(), list) and keyhash.is_native()
    out: dict[str, Any] = {
        "chunks": len(tokens) // chunk_tokens,
        "legacy_xxh3": _time(lambda: legacy_chunk_keys(tokens, chunk_tokens, LEGACY_SEED), iters),
        "blake3": _time(new(ns), iters),
        "blake3_keyed": _time(new(keyed), iters),
    }
    out["ratio_vs_legacy"] = out["blake3"]["median_us"] / out["legacy_xxh3"]["median_us"]
    out["ratio_keyed_vs_legacy"] = (
        out["blake3_keyed"]["median_us"] / out["legacy_xxh3"]["median_us"]
    )
    if fallback:
        out["blake3_python_fallback_ms"] = _fallback_ms(len(tokens), chunk_tokens, 5)
    return out
