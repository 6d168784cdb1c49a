"""Mini engines (real manager, worker and transfer engine; every attended token's KV checked
against the oracle) on a CPU tier over a real redis-server's remote tier."""

from __future__ import annotations

import random
from collections.abc import Callable

from kvtier.config import KVTierConfig
from kvtier.sources import HitSource
from tests.support.mini_engine import MiniEngine

CHUNK = 8


def workload(seed: int, n: int = 6) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(1000) for _ in range(3 * CHUNK)]
    return [
        system + [rng.randrange(1000) for _ in range(rng.randrange(1, 4 * CHUNK))] for _ in range(n)
    ]


def drive(e: MiniEngine, hook: Callable[[int], None] | None = None, max_steps: int = 3000) -> None:
    """MiniEngine.run with ``hook(step)`` called before each step."""
    import time

    while (e.waiting or e.held or e.manager.has_pending_jobs()) and max_steps:
        if hook is not None:
            hook(e.steps)
        e.step()
        time.sleep(0.0005)
        max_steps -= 1
    assert max_steps, "the engine did not drain"


def assert_clean(e: MiniEngine) -> None:
    assert e.wrong == 0
    m = e.manager
    assert not m.has_pending_jobs() and m.num_requests() == 0
    assert sum(x.pins for x in m.stack[0].index.entries.values()) == 0
    assert not e.worker.engine.pending()


def remote_tokens(e: MiniEngine) -> int:
    return sum(r.sources.get(HitSource.P2P, 0) for r in e.reqs.values())


def engine_config(url: str, mode: str, secret_file: str | None) -> KVTierConfig:
    redis_tier: dict = {"kind": "redis", "url": url, "timeout_ms": 500}
    if mode != "off":
        redis_tier["secret_file"] = secret_file
        redis_tier["encrypt"] = mode == "aead"
    return KVTierConfig.from_dict(
        {
            "chunk_tokens": CHUNK,
            "sync_budget": "1GiB",
            "tiers": [{"kind": "cpu", "capacity": 16 * 256}, redis_tier],
        }
    )


def serve(cfg: KVTierConfig, prompts, name: str) -> MiniEngine:
    e = MiniEngine(cfg, cpu_chunks=16)
    for i, p in enumerate(prompts):
        e.add(f"{name}{i}", p)
    drive(e)
    assert_clean(e)  # no token ever attended over wrong KV
    return e
