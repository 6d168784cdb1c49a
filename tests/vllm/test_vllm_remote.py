"""Two real vLLM engines (two processes, as two hosts would be) sharing one redis-server.

Engine A serves the prompts and stores their KV through its CPU tier into the remote tier;
engine B, a fresh process with an empty CPU tier, serves the same prompts and loads the
shared prefixes from the remote tier: its hit sources show remote (p2p) tokens and its
greedy outputs are token-identical to an engine without kvtier.
"""

from __future__ import annotations

import pytest

from kvtier.tools.redis_server import RedisServer
from tests.support.vllm_runs import (  # the same engine, prompts and runner as test_vllm
    CHUNK,
    PROMPTS,
    assert_clean,
    expected_hit,
    metric,
    outputs,
    phase,
    phases,
    run,
    sources,
)

pytestmark = pytest.mark.vllm


def test_second_engine_loads_what_the_first_stored(tmp_path, baseline):
    with RedisServer() as server:
        cfg = {
            "sync_budget": "1GiB",
            "tiers": [
                {"kind": "cpu", "capacity": "256MiB"},
                # Generous: other jobs share this machine's two cores with the engine.
                {"kind": "redis", "url": server.url, "timeout_ms": 3000},
            ],
        }
        a = run(tmp_path, cfg, program=[phase("p1", 12)], note="engine A")
        assert outputs(a)[0] == outputs(baseline)[0]
        stored = metric(a, "stored_chunks", "redis")
        assert stored > 0
        assert_clean(a)
        b = run(tmp_path, cfg, program=[phase("p1", 12)], note="engine B")
    assert outputs(b)[0] == outputs(baseline)[0]
    # The prompts share prefixes, and B schedules them together: which request loads a
    # shared chunk from the remote tier depends on when its probe answers (a request
    # whose probe is still out is asked again later and may then find the chunks in
    # vLLM's own cache, loaded by another). What does not depend on timing: every chunk A
    # stored comes back from the remote tier exactly once, and every prompt is served
    # from cache, remote or local.
    srcs = sources(b, 0)
    assert all(set(s) <= {"p2p"} for s in srcs), srcs
    assert sum(s.get("p2p", 0) for s in srcs) == stored * CHUNK, (srcs, stored)
    for rec, prompt in zip(phases(b)[0], PROMPTS, strict=True):
        assert rec["num_cached"] >= expected_hit(len(prompt), True), (rec["num_cached"], srcs)
    assert metric(b, "loads", "redis", "async") >= 1
    assert metric(b, "failures", "redis", "load") == 0
    assert_clean(b)


@pytest.mark.slow  # two more engine runs (minutes here); the mini engine covers this path
def test_encrypted_tier_never_loads_forged_values(tmp_path, baseline):
    """An AES-GCM tier (``secret_file``, ``encrypt``) between two real engines: A stores;
    half of what it stored is then overwritten by someone without the secret; B's outputs
    are still token-identical to an engine without kvtier, it loads the honest half from
    the store, and its worker processes count the forgeries into the scheduler's metrics."""
    import random

    import redis

    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef" * 4 + "\n")
    secret.chmod(0o600)  # secret files must be private
    with RedisServer() as server:
        remote = {"kind": "redis", "url": server.url, "timeout_ms": 3000}
        remote.update(secret_file=str(secret), encrypt=True)
        cfg = {"sync_budget": "1GiB", "tiers": [{"kind": "cpu", "capacity": "256MiB"}, remote]}
        a = run(tmp_path, cfg, program=[phase("p1", 12)], note="encrypted A")
        assert outputs(a)[0] == outputs(baseline)[0] and metric(a, "stored_chunks", "redis") > 0
        raw = redis.Redis(port=server.port)
        names = sorted(raw.keys("kvt4:*"))
        for name in random.Random(0).sample(names, len(names) // 2):
            value = raw.get(name)
            raw.set(name, bytes(len(value)))
        raw.close()
        b = run(tmp_path, cfg, program=[phase("p1", 12)], note="encrypted B")
    assert outputs(b)[0] == outputs(baseline)[0]
    assert sum(s.get("p2p", 0) for s in sources(b, 0)) > 0
    assert metric(b, "remote_auth_failures", "redis") > 0
    assert metric(b, "remote_healed_values", "redis") == metric(b, "remote_auth_failures", "redis")
    assert_clean(b)
