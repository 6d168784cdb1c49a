"""Planted values that are not a good value's size or type (issue 45, findings 1, 2, 8), on
a real redis-server where kvtier runs as the least-privilege ACL user of docs/security.md
and the attacker holds that same user (huge values through SET) or a broader one (lists,
hashes and sets under chunk names).

What must hold: a read never fetches more than a good value's size plus one byte of any
value (the server's own count of bytes sent is the witness), never times out or opens the
circuit breaker because of a planted value, loads the good chunks of the same batch, and
leaves no planted value behind: every one is deleted in one round trip (the server's
count of UNLINK calls), and the next store writes the honest value."""

from __future__ import annotations

import pytest
import redis
import torch

from kvtier.tools.redis_server import RedisServer
from tests.support.redis_fixtures import CHUNK_BYTES, chain, flush, payload, segs, server  # noqa: F401  (fixture)
from tests.support.remote_stores import ACL_PASSWORD, MODES, SECRET_A, acl_line, make_store, read

MiB = 1 << 20


@pytest.fixture(scope="module")
def acl_server():
    with RedisServer(acl=[acl_line()]) as s:
        yield s


def _acl_url(s: RedisServer) -> str:
    return f"redis://kvtier:{ACL_PASSWORD}@127.0.0.1:{s.port}"


def _stats(admin: redis.Redis) -> tuple[int, dict[str, int]]:
    """Bytes the server has sent to clients, and calls per command so far."""
    sent = int(admin.info("stats")["total_net_output_bytes"])
    calls = {
        k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in admin.info("commandstats").items()
    }
    return sent, calls


def _stored_again_and_loaded(store, keys, data) -> None:
    """The next store writes every chunk (healed names are not skipped as present) and a
    read then loads them all, byte for byte."""
    n = len(keys)
    assert store.write([-1] * n, keys, segs(data)) == [True] * n
    ok, out = read(store, keys)
    assert ok == [True] * n and torch.equal(out, data)


def _plant(attacker: redis.Redis, admin: redis.Redis, name: bytes, how: str, size: int) -> None:
    if how == "huge":  # the ACL user itself: SET is all it needs
        attacker.set(name, b"\0" * size)
    elif how == "list":
        admin.delete(name)
        admin.rpush(name, b"x" * 16)
    elif how == "hash":
        admin.delete(name)
        admin.hset(name, b"f", b"v")
    elif how == "set":
        admin.delete(name)
        admin.sadd(name, b"m")
    elif how == "zset":
        admin.delete(name)
        admin.zadd(name, {b"m": 1.0})
    elif how == "short":
        attacker.set(name, b"\x01")
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("mode", ["off", *MODES])
def test_huge_values_are_never_downloaded_and_good_chunks_load(acl_server, mode):
    """Finding 1: four 64 MiB values planted by the ACL user under chunk names of a hit.
    The read sends at most value_bytes + 1 bytes of each, within a 0.3 s timeout, loads the
    good chunks, keeps the breaker closed and deletes the four in one UNLINK."""
    admin = redis.Redis(port=acl_server.port)
    admin.flushall()
    attacker = redis.Redis(port=acl_server.port, username="kvtier", password=ACL_PASSWORD)
    store = make_store(_acl_url(acl_server), mode, SECRET_A)
    store.client.timeout_s = 0.3
    keys, data = chain(12, salt=45), payload(12, 45)
    try:
        assert store.write([-1] * 12, keys, segs(data)) == [True] * 12
        names = store.keyspace.names(keys, 0)
        bad = [1, 4, 7, 10]
        for i in bad:
            _plant(attacker, admin, names[i], "huge", 64 * MiB)
        sent0, calls0 = _stats(admin)
        ok, out = read(store, keys)
        sent1, calls1 = _stats(admin)
        assert ok == [i not in bad for i in range(12)]
        good = [i for i in range(12) if i not in bad]
        assert torch.equal(out[good], data[good])
        # 12 values at most a byte over, plus framing and the two INFO replies' slack.
        assert sent1 - sent0 < 12 * (store.value_bytes + 1) + (64 << 10)
        assert store.client.available
        assert admin.exists(*[names[i] for i in bad]) == 0
        assert calls1.get("unlink", 0) - calls0.get("unlink", 0) == 1
        assert calls1.get("del", 0) == calls0.get("del", 0)
        assert store.bad_values + store.auth_failures == 4 and store.healed == 4
        # The next store writes the honest values; the one after loads everything.
        _stored_again_and_loaded(store, keys, data)
    finally:
        store.close()
        attacker.close()
        admin.close()


@pytest.mark.parametrize("mode", ["off", *MODES])
@pytest.mark.parametrize("how", ["list", "hash", "set", "zset"])
def test_values_of_another_type_are_bad_values_and_healed(acl_server, mode, how):
    """Finding 2: a list, hash, set or sorted set under a chunk name was a miss forever (every
    probe present, every load failing, every store skipping it as present, no counter).
    Now it is a counted bad value, deleted by the read, and the next store writes it."""
    admin = redis.Redis(port=acl_server.port)
    admin.flushall()
    store = make_store(_acl_url(acl_server), mode, SECRET_A)
    keys, data = chain(4, salt=46), payload(4, 46)
    try:
        assert store.write([-1] * 4, keys, segs(data)) == [True] * 4
        names = store.keyspace.names(keys, 0)
        _plant(admin, admin, names[2], how, 0)
        ok, _ = read(store, keys)
        assert ok == [True, True, False, True]
        assert store.bad_values == 1 and store.healed == 1
        assert admin.exists(names[2]) == 0
        assert store.client.available
        _stored_again_and_loaded(store, keys, data)
        assert store.skipped_writes == 3
    finally:
        store.close()
        admin.close()


def test_thousands_of_planted_values_are_healed_in_one_round_trip(acl_server):
    """Finding 8: 4,000 one-byte values planted by the ACL user under one load's chunk
    names cost 4,000 DELs (one round trip each) on main. Now the read's heal is a handful of
    multi-key UNLINKs sent together, and every planted value is gone."""
    admin = redis.Redis(port=acl_server.port)
    admin.flushall()
    attacker = redis.Redis(port=acl_server.port, username="kvtier", password=ACL_PASSWORD)
    store = make_store(_acl_url(acl_server), "off", None)
    n = 4000
    keys = chain(n, salt=47)
    names = store.keyspace.names(keys, 0)
    try:
        p = attacker.pipeline(transaction=False)
        for name in names:
            p.set(name, b"\x01")
        p.execute()
        _, calls0 = _stats(admin)
        out = torch.zeros(n, CHUNK_BYTES, dtype=torch.uint8)
        assert store.read([-1] * n, keys, segs(out)) == [False] * n
        _, calls1 = _stats(admin)
        unlinks = calls1.get("unlink", 0) - calls0.get("unlink", 0)
        assert 1 <= unlinks <= -(-n // 1024)
        assert calls1.get("del", 0) == calls0.get("del", 0)
        assert store.healed == n and store.bad_values == n
        assert admin.dbsize() == 0
    finally:
        store.close()
        attacker.close()
        admin.close()


def test_an_acl_user_without_getrange_is_named_in_a_warning(caplog):
    """A kvtier user granted by an older version (``+get``, no ``+getrange``): loads are
    misses, never errors, and one warning names the grant to add."""
    import logging

    from kvtier.tiers.remote import streams

    old = acl_line().replace("+getrange", "+get")
    caplog.set_level(logging.WARNING, logger="kvtier")
    streams._NOPERM_WARNED.clear()
    with RedisServer(acl=[old]) as s:
        store = make_store(_acl_url(s), "off", None)
        keys, data = chain(2, salt=48), payload(2, 48)
        try:
            assert store.write([-1] * 2, keys, segs(data)) == [True] * 2
            assert read(store, keys)[0] == [False, False]
            assert read(store, keys)[0] == [False, False]
        finally:
            store.close()
    assert caplog.text.count("+getrange") == 1


def test_key_secret_alone_stops_rewrites_of_existing_values(server):  # noqa: F811
    """Finding 3: with a deployment key_secret and no tier secret, someone who may SCAN,
    GET and SET rewrote an existing value with a fresh envelope (public format, unkeyed
    checksum) over their own payload, and the victim loaded it (main). Now such a tier
    MACs its values under a secret derived from the key secret: the rewrite is refused,
    counted and healed, and the next store writes the honest value."""
    from kvtier.config import KVTierConfig
    from kvtier.contract.kind import TierContext
    from kvtier.keys import Namespace, chunk_keys
    from kvtier.stack.build import build_stores
    from kvtier.tiers.envelope import HEADER_BYTES, parse_envelope, wrap

    flush(server.url)
    ns = Namespace("model", "layout", "tp1pp1", "tenant", secret=b"k" * 32)
    cfg = KVTierConfig.from_dict(
        {"tiers": [{"kind": "cpu"}, {"kind": "redis", "url": server.url, "timeout_ms": 3000}]}
    )
    store = build_stores(cfg, TierContext(CHUNK_BYTES, ns))["redis"]
    raw = redis.Redis.from_url(server.url)
    keys, data = chunk_keys(list(range(12)), 4, ns.seed()), payload(3, 49)
    evil = bytes(range(256)) * (CHUNK_BYTES // 256)
    try:
        assert store.write([-1] * 3, keys, segs(data)) == [True] * 3
        for name in raw.scan_iter(match="kvt4:*"):
            value = raw.get(name)
            # Wherever the envelope sits (last, or before a tag), a well-formed forgery.
            for at in (len(value) - HEADER_BYTES, len(value) - HEADER_BYTES - 32):
                env = parse_envelope(value[at : at + HEADER_BYTES])
                if env is not None:
                    forged = wrap(env.key, env.parent, env.namespace, evil, tail=True)
                    raw.set(name, forged + value[at + HEADER_BYTES :])
                    break
            else:
                raise AssertionError("no envelope found")
        ok, out = read(store, keys)
        assert ok == [False] * 3 and not any(bytes(row.numpy()) == evil for row in out)
        assert store.auth_failures == 3 and store.healed == 3
        _stored_again_and_loaded(store, keys, data)
    finally:
        store.close()
        raw.close()
