"""Random planted values under chunk names while two mini engines load and store through one
real redis-server (issue 45): Redis types other than a string, strings of random sizes up
to tens of MiB, random bytes of exactly a good value's length, another chunk's honest value.

Engine A stores a workload; the attacker plants; engines B and C, stepped in turn, serve
the same prompts (loading from and storing to the store at once). What must hold, for
every draw, in plain, MAC and AEAD modes:

- no load ever returns attacker bytes: every attended token's KV equals the oracle's;
- client memory is bounded: the server sends B and C at most ``value_bytes + 1`` bytes per
  value read, plus framing (the server's own count, against its count of reads), whatever
  the planted sizes;
- good chunks keep loading: no planted value opens either client's circuit breaker, and
  engine D afterwards (after one more engine that rewrites what a heal race may have
  dropped) hits every chunk and recomputes none;
- every bad value is gone after one read: once B and C are done, no chunk name holds a
  planted value or a non-string."""

from __future__ import annotations

import random

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.tiers.remote.keyspace import PREFIX
from tests.support.mini_engine import MiniEngine
from tests.support.redis_fixtures import flush, server  # noqa: F401  (fixture)
from tests.support.remote_engines import assert_clean, engine_config, remote_tokens, serve, workload
from tests.support.remote_stores import secrets  # noqa: F401  (fixture)

MiB = 1 << 20
KINDS = ("huge", "random-size", "exact-length", "other-chunk", "empty", "list", "hash", "set")

plant = st.tuples(st.sampled_from(KINDS), st.integers(1, 40 * MiB), st.binary(max_size=64))


def _planted_value(kind: str, size: int, noise: bytes, good: bytes, other: bytes) -> bytes | None:
    rng = random.Random(size)
    if kind == "huge":
        return noise + b"\0" * (size - len(noise))  # up to 40 MiB
    if kind == "random-size":
        return rng.randbytes(size % (3 * len(good)) + 1)
    if kind == "exact-length":
        return (noise + rng.randbytes(len(good)))[: len(good)]
    if kind == "other-chunk":
        return other
    if kind == "empty":
        return b""
    return None  # a Redis type other than a string


def _two_at_once(a: MiniEngine, b: MiniEngine) -> None:
    steps = 0
    busy = lambda e: e.waiting or e.held or e.manager.has_pending_jobs()  # noqa: E731
    while busy(a) or busy(b):
        for e in (a, b):
            if busy(e):
                e.step()
        steps += 1
        assert steps < 6000, "the engines did not drain"


@pytest.mark.parametrize("mode", ["off", "mac", "aead"])
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_planted_values_never_load_stall_or_stay(server, secrets, mode, data):  # noqa: F811
    flush(server.url)
    seed = data.draw(st.integers(0, 1000), label="seed")
    prompts = workload(seed, n=4)
    cfg = engine_config(server.url, mode, secrets["a"])
    serve(cfg, prompts, "a").close()
    admin = redis.Redis.from_url(server.url)
    names = sorted(admin.keys(PREFIX.decode() + "*"))
    assert names
    values = {n: admin.get(n) for n in names}
    good_len = len(values[names[0]])
    chosen = data.draw(
        st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True),
        label="names",
    )
    planted: dict[bytes, bytes | None] = {}
    for name in chosen:
        kind, size, noise = data.draw(plant, label="plant")
        other = values[names[(names.index(name) + 1) % len(names)]]
        v = _planted_value(kind, size, noise, values[name], other)
        if other == values[name] and kind == "other-chunk":
            continue
        admin.delete(name)
        if v is None:
            {"list": admin.rpush, "set": admin.sadd}.get(kind, lambda n, x: admin.hset(n, "f", x))(
                name, b"x"
            )
        else:
            admin.set(name, v)
        planted[name] = v
    sent0 = int(admin.info("stats")["total_net_output_bytes"])
    reads0 = int(admin.info("commandstats").get("cmdstat_getrange", {}).get("calls", 0))

    b, c = MiniEngine(cfg, cpu_chunks=16), MiniEngine(cfg, cpu_chunks=16)
    read: set[bytes] = set()
    for e in (b, c):
        client = e.stores["redis"].client  # type: ignore[attr-defined]

        def get_each(names, consume, limit, real=client.get_each):
            read.update(names)
            return real(names, consume, limit)

        client.get_each = get_each
    for e, tag in ((b, "b"), (c, "c")):
        for i, p in enumerate(prompts):
            e.add(f"{tag}{i}", p)
    _two_at_once(b, c)
    sent1 = int(admin.info("stats")["total_net_output_bytes"])
    reads1 = int(admin.info("commandstats")["cmdstat_getrange"]["calls"])
    for e in (b, c):
        assert_clean(e)  # no attended token over anything but the oracle's KV
        assert e.stores["redis"].client.down_until == 0.0  # type: ignore[attr-defined]
        e.close()
    # Bounded client memory: per value read at most good_len + 1 bytes (+ 16 of framing);
    # 256 KiB for every other reply (probes, EXISTS, SET acks, the INFO replies).
    assert sent1 - sent0 <= (reads1 - reads0) * (good_len + 1 + 16) + (256 << 10)
    # Every bad value read is gone: nothing planted remains, nothing but strings. (A name
    # no engine read keeps its value: a chunk an engine computed itself, e.g. a prompt's
    # last chunk, which vLLM recomputes, is stored as present without being read.)
    assert read & set(planted)
    for name in read & set(planted):
        kind = admin.type(name)
        assert kind in (b"none", b"string"), (name, kind)
        if kind == b"string":
            v = admin.get(name)
            assert v is not None and len(v) == good_len and v != planted[name]
    # Good chunks keep loading: after one more engine (a heal racing an honest store may
    # have dropped it: a miss), every chunk is a hit.
    serve(cfg, prompts, "d").close()
    d = serve(cfg, prompts, "e")
    assert remote_tokens(d) > 0 and d.recomputed == 0
    assert d.manager.metrics.total("remote_bad_values") == 0
    d.close()
    admin.close()
