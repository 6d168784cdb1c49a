"""The remote tier on real redis-server processes (standalone and a 3-master cluster), and
the in-process shared tier through the same conformance suite."""

from __future__ import annotations

import logging
import time

import hiredis
import pytest
import redis
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.config import KVTierConfig
from kvtier.errors import ConfigError
from kvtier.keys import GROUP_CHUNKS
from kvtier.tiers.envelope import HEADER_BYTES
from kvtier.tiers.remote import KeySpace, RemoteClient, RemoteIndex, RemoteStore, parse_remote_url
from kvtier.tiers.remote import client as client_module
from kvtier.tiers.remote import plain as plain_module
from kvtier.tiers.remote import probe as probe_module
from kvtier.tiers.remote.client import RemoteUnavailable
from kvtier.tools.redis_server import RedisCluster, RedisServer
from tests.support.redis_fixtures import (  # noqa: F401  (fixtures)
    CHUNK_BYTES,
    NAMESPACE,
    chain,
    cluster,
    flush,
    harness,
    payload,
    probe,
    raw_client,
    segs,
    server,
)

# The conformance suite on every shared tier: test_conformance.py (kvtier.conformance).


# -- URLs and config ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "hosts", "tls", "is_cluster", "db"),
    [
        ("redis://cache:6380/2", (("cache", 6380),), False, False, 2),
        ("redis://cache", (("cache", 6379),), False, False, 0),
        ("rediss://u:pw@cache:6390", (("cache", 6390),), True, False, 0),
        ("redis+cluster://a:7000,b:7001", (("a", 7000), ("b", 7001)), False, True, 0),
        ("rediss+cluster://a:7000", (("a", 7000),), True, True, 0),
        ("redis://a:7000,redis://b:7001", (("a", 7000), ("b", 7001)), False, True, 0),
        ("redis://[::1]:7000", (("::1", 7000),), False, False, 0),
    ],
)
def test_urls(url, hosts, tls, is_cluster, db):
    t = parse_remote_url(url, environ={})
    assert (t.hosts, t.tls, t.cluster, t.db) == (hosts, tls, is_cluster, db)


def test_credentials_from_url_or_environment_are_masked():
    t = parse_remote_url("redis://alice:s3cr%40t@h:1", environ={"KVTIER_REDIS_PASSWORD": "x"})
    assert (t.username, t.password) == ("alice", "s3cr@t")
    assert "s3cr" not in t.display and "s3cr" not in repr(t) and ":***@" in t.display
    t = parse_remote_url("redis://h:1", environ={"KVTIER_REDIS_PASSWORD": "envpw"})
    assert t.password == "envpw" and "envpw" not in repr(t)
    t = parse_remote_url("redis://h:1", password_env="MY_PW", environ={"MY_PW": "other"})
    assert t.password == "other"


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://h:1", "scheme that is not accepted"),
        ("redis://h:99999", "not a number from 1 to 65535"),
        ("redis://:pw@", "no host"),
        ("redis+cluster://a:1/3", "database"),
        # Issue 45, finding 5: '@host' forgotten; on main "bad port 'S3cr3tpw'".
        ("redis://user:S3cr3tpw", "not a number from 1 to 65535"),
        ("redis://user:S3cr3tpw/0", "not a number from 1 to 65535"),
        ("redis://h:1/S3cr3tpw", "database"),
        # A secret pasted where the URL goes.
        ("S3cr3tpw", "has no scheme"),
        ("pw://S3cr3tpw", "not accepted"),
        ("redis://h:1?ssl=1", "query parameters"),
    ],
)
def test_bad_urls_are_refused_in_one_line_naming_the_tier(url, fragment):
    with pytest.raises(ConfigError) as e:
        KVTierConfig.from_dict({"tiers": [{"kind": "cpu"}, {"kind": "redis", "url": url}]})
    msg = str(e.value)
    assert msg.startswith("tiers[1].url:") and fragment in msg and "\n" not in msg
    assert "pw" not in msg and "3cr3t" not in msg


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"kind": "redis"}, "tiers[1].url: a redis tier needs a url"),
        ({"kind": "memory", "timeout_ms": 5}, "unknown key(s) 'timeout_ms'; accepted keys for a"),
        ({"kind": "redis", "url": "redis://h", "timeout_ms": 0}, "tiers[1].timeout_ms"),
        ({"kind": "redis", "url": "redis://h", "ttl_s": -1}, "tiers[1].ttl_s"),
    ],
)
def test_bad_remote_tier_entries(entry, fragment):
    with pytest.raises(ConfigError) as e:
        KVTierConfig.from_dict({"tiers": [{"kind": "cpu"}, entry]})
    assert fragment in str(e.value)


def test_a_redis_tier_is_shared_and_reports_p2p(server):  # noqa: F811
    from kvtier.contract.kind import TierContext
    from kvtier.keys import Namespace
    from kvtier.sources import HitSource
    from kvtier.stack.build import build_stack
    from kvtier.stack.registry import capabilities_of

    cfg = KVTierConfig.from_dict(
        {"tiers": [{"kind": "cpu", "capacity": "1MiB"}, {"kind": "redis", "url": server.url}]}
    )
    assert capabilities_of(cfg.tiers[1]).shared
    stack = build_stack(cfg, TierContext(4096, Namespace("m", "l")))
    assert stack[1].shared and stack[1].source is HitSource.P2P
    stack[1].index.close()  # type: ignore[attr-defined]


def test_password_never_appears_in_logs_or_errors(caplog):
    secret = "hunter2-very-secret"
    with RedisServer(password=secret) as s:
        wrong = parse_remote_url(f"redis://:{secret}-wrong@127.0.0.1:{s.port}")
        right = parse_remote_url(f"redis://default:{secret}@127.0.0.1:{s.port}")
        space = KeySpace(NAMESPACE)
        caplog.set_level(logging.DEBUG)
        bad = RemoteStore(RemoteClient(wrong), space, CHUNK_BYTES, b"n" * 16)
        keys = chain(2)
        assert bad.write([-1, -1], keys, segs(payload(2, 1))) == [False, False]
        good = RemoteStore(RemoteClient(right), space, CHUNK_BYTES, b"n" * 16)
        assert good.write([-1, -1], keys, segs(payload(2, 1))) == [True, True]
        s.kill()
        assert good.read([-1, -1], keys, segs(payload(2, 0))) == [False, False]
        text = caplog.text + "".join(str(r.args) for r in caplog.records)
        assert "remote tier" in caplog.text and secret not in text
        with pytest.raises(ConfigError) as e:
            KVTierConfig.from_dict(
                {"tiers": [{"kind": "cpu"}, {"kind": "redis", "url": f"http://:{secret}@h"}]}
            )
        assert secret not in str(e.value)


# -- faults at the store level -------------------------------------------------------------


@pytest.mark.parametrize("where", ["standalone", "cluster"])
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    n=st.sampled_from([1, 3, 255, 256, 257, 700]),
    world=st.integers(1, 3),
    window=st.sampled_from([probe_module.COUNT_WINDOW, 97]),
    depth=st.sampled_from([probe_module.COUNT_DEPTH, 2]),
)
def test_probe_finds_the_first_chunk_missing_on_any_rank(
    server,  # noqa: F811
    cluster,  # noqa: F811
    where,
    data,
    n,
    world,
    window,
    depth,
):
    """The probe against a naive oracle: chains across the counting windows (pipelined in
    groups of ``depth``) and the script's EXISTS batches (256 chunks), any ranks missing
    anywhere; the answer is the first chunk some rank lacks. A chain present whole never
    runs the script."""
    url = server.url if where == "standalone" else cluster.url
    flush(url)
    space = KeySpace(NAMESPACE)
    client = RemoteClient(parse_remote_url(url), timeout_s=5)
    saved = probe_module.COUNT_WINDOW, probe_module.COUNT_DEPTH
    probe_module.COUNT_WINDOW, probe_module.COUNT_DEPTH = window, depth
    try:
        keys = chain(n, salt=data.draw(st.integers(0, 1 << 30)))
        holes = data.draw(
            st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, world - 1)), max_size=4)
        )
        names = [
            space.name(k, r)
            for i, k in enumerate(keys)
            for r in range(world)
            if (i, r) not in holes
        ]
        for lo in range(0, len(names), 512):
            assert all(client.set_many([(nm, b"x") for nm in names[lo : lo + 512]]))
        want = min((i for i, _ in holes), default=n)
        if where == "standalone":
            client.client.config_resetstat()
        args = space.prefix, space.mids(keys), space.width, space.suffixes(world)
        assert client.leading(*args) == want
        if where == "standalone" and not holes:
            assert "cmdstat_evalsha" not in client.client.info("commandstats")
        # Again with the script known (a cluster sends it to every node at once), and once
        # more after the nodes forgot it (the concurrent send fails and falls back).
        assert client.leading(*args) == want
        if where == "cluster":
            client.client.execute_command("SCRIPT", "FLUSH", target_nodes=client.client.PRIMARIES)
            assert client.leading(*args) == want
            # ... reloading the script, not giving it up as a deployment with scripting
            # disabled makes it do (pipelined EXISTS from then on).
            assert client.probe.script_ok
        # Where scripting is refused: every name's EXISTS, pipelined through the library.
        client.probe.refuse_scripts()
        assert client.leading(*args) == want
    finally:
        probe_module.COUNT_WINDOW, probe_module.COUNT_DEPTH = saved
        client.close()


def test_cluster_probe_counts_a_group_per_exists(cluster):  # noqa: F811
    """In a cluster each group of GROUP_CHUNKS chunks (every rank) lives in one slot, a
    chain's groups spread over the nodes, and a probe of a chain present whole costs one
    EXISTS per group (the per-chunk Lua probe it replaced ran one per chunk)."""
    flush(cluster.url)
    space = KeySpace(NAMESPACE)
    client = RemoteClient(parse_remote_url(cluster.url), timeout_s=5)
    raw = raw_client(cluster.url)
    try:
        keys = chain(40 * GROUP_CHUNKS + 5, salt=77)
        names = [space.name(k, r) for k in keys for r in (0, 1)]
        for lo in range(0, len(names), 512):
            assert all(client.set_many([(nm, b"x") for nm in names[lo : lo + 512]]))
        slots = [{raw.keyslot(space.name(k, r)) for r in (0, 1)} for k in keys]
        for g in range(0, len(keys), GROUP_CHUNKS):
            assert len(set.union(*slots[g : g + GROUP_CHUNKS])) == 1
        nodes = {raw.nodes_manager.get_node_from_slot(next(iter(s))).name for s in slots}
        assert len(nodes) == 3
        raw.config_resetstat(target_nodes=raw.PRIMARIES)
        args = space.prefix, space.mids(keys), space.width, space.suffixes(2)
        assert client.leading(*args) == len(keys)
        stats = raw.info("commandstats", target_nodes=raw.PRIMARIES)
        calls = sum(s.get("cmdstat_exists", {}).get("calls", 0) for s in stats.values())
        assert calls == 41
        # A probe starting inside a group (a lookup past a local hit) still finds the end.
        tail = keys[GROUP_CHUNKS // 2 :]
        got = client.leading(space.prefix, space.mids(tail), space.width, space.suffixes(2))
        assert got == len(tail)
    finally:
        client.close()
        raw.close()


@pytest.mark.parametrize("hole", [None, 5, 230, 650])
def test_probe_goes_on_past_its_first_pipelined_group(server, hole):  # noqa: F811
    """Windows of 97 names, two in flight: a 700-chunk, two-rank chain takes eight groups;
    a miss in any of them (or none) is found where it is."""
    flush(server.url)
    space = KeySpace(NAMESPACE)
    client = RemoteClient(parse_remote_url(server.url), timeout_s=5)
    saved = probe_module.COUNT_WINDOW, probe_module.COUNT_DEPTH
    probe_module.COUNT_WINDOW, probe_module.COUNT_DEPTH = 97, 2
    try:
        keys = chain(700, salt=hole or 0)
        names = [
            space.name(k, r) for i, k in enumerate(keys) for r in (0, 1) if (i, r) != (hole, 1)
        ]
        for lo in range(0, len(names), 512):
            assert all(client.set_many([(nm, b"x") for nm in names[lo : lo + 512]]))
        got = client.leading(space.prefix, space.mids(keys), space.width, space.suffixes(2))
        assert got == (700 if hole is None else hole)
    finally:
        probe_module.COUNT_WINDOW, probe_module.COUNT_DEPTH = saved
        client.close()


def test_stores_set_their_ttl_and_a_refused_set_fails_only_its_chunk(server):  # noqa: F811
    """The zero-copy pipelined SET: ``EX`` as configured; a server that refuses a SET
    (out of memory, noeviction) fails that chunk, and the connection stays usable."""
    flush(server.url)
    space = KeySpace(NAMESPACE)
    client = RemoteClient(parse_remote_url(server.url), timeout_s=5)
    store = RemoteStore(client, space, CHUNK_BYTES, NAMESPACE.digest(), ttl_s=90)
    raw = raw_client(server.url)
    try:
        keys = chain(3, salt=21)
        data = payload(3, 5)
        assert store.write([-1] * 3, keys, segs(data)) == [True] * 3
        assert all(0 < raw.ttl(space.name(k, 0)) <= 90 for k in keys)
        out = torch.zeros(3, CHUNK_BYTES, dtype=torch.uint8)
        assert store.read([-1] * 3, keys, segs(out)) == [True] * 3 and torch.equal(out, data)
        used = int(raw.info("memory")["used_memory"])
        raw.config_set("maxmemory-policy", "noeviction")
        raw.config_set("maxmemory", used + CHUNK_BYTES // 2)
        more = chain(6, salt=22)
        got = store.write([-1] * 6, more, segs(payload(6, 6)))
        assert False in got, got  # refused once memory ran out
        raw.config_set("maxmemory", 0)
        assert store.write([-1] * 6, more, segs(payload(6, 6))) == [True] * 6
    finally:
        raw.config_set("maxmemory", 0)
        store.close()
        raw.close()


def test_stores_send_host_memory_as_it_is_and_zeros_where_it_has_none(server):  # noqa: F811
    """Host segments go to the socket from their own memory (the store's staging buffer,
    for device segments, is never made); bytes a chunk's segments leave uncovered read back
    as zeros after other chunks were stored, and a write split into several round trips
    keeps every chunk's own bytes."""
    flush(server.url)
    space = KeySpace(NAMESPACE)
    client = RemoteClient(parse_remote_url(server.url), timeout_s=5)
    # Three values per round trip: a 7-chunk write takes three.
    per = 3 * (CHUNK_BYTES + HEADER_BYTES)
    store = RemoteStore(client, space, CHUNK_BYTES, NAMESPACE.digest(), batch_bytes=per)
    assert store.batch == 3
    try:
        keys, data = chain(7, salt=31), payload(7, 8)
        assert store.write([-1] * 7, keys, segs(data)) == [True] * 7
        assert not store.parts.staging_held
        out = torch.zeros(7, CHUNK_BYTES, dtype=torch.uint8)
        assert store.read([-1] * 7, keys, segs(out)) == [True] * 7 and torch.equal(out, data)
        # Only the middle of the payload given: the rest must come back zero, not the
        # previous batch's bytes still in the buffer.
        part, lo, hi = chain(2, salt=32), CHUNK_BYTES // 4, 3 * CHUNK_BYTES // 4
        mids = payload(2, 9)
        src = [[(lo, mids[i][lo:hi])] for i in range(2)]
        assert store.write([-1] * 2, part, src) == [True] * 2
        back = torch.full((2, CHUNK_BYTES), 7, dtype=torch.uint8)
        assert store.read([-1] * 2, part, segs(back)) == [True] * 2
        want = torch.zeros(2, CHUNK_BYTES, dtype=torch.uint8)
        want[:, lo:hi] = mids[:, lo:hi]
        assert torch.equal(back, want)
    finally:
        store.close()


@pytest.mark.parametrize("where", ["standalone", "cluster"])
def test_values_sent_in_parts_read_back_whole(
    server,  # noqa: F811
    cluster,  # noqa: F811
    where,
    monkeypatch,
):
    """A value goes out in parts of PART_BYTES (here a third of a chunk, so parts straddle
    the two segments and the gaps between them) with its envelope last; on a cluster the
    chunks spread over nodes, so parts for several connections interleave. Every chunk reads
    back as its own bytes, zeros where no segment covered it."""
    url = server.url if where == "standalone" else cluster.url
    flush(url)
    monkeypatch.setattr(plain_module, "PART_BYTES", CHUNK_BYTES // 3)
    space = KeySpace(NAMESPACE)
    store = RemoteStore(
        RemoteClient(parse_remote_url(url), timeout_s=5), space, CHUNK_BYTES, NAMESPACE.digest()
    )
    try:
        keys = chain(7 * GROUP_CHUNKS, salt=51)[::GROUP_CHUNKS]  # seven groups: seven slots
        data = payload(7, 12)
        q = CHUNK_BYTES // 4
        src = [[(q, row[q : 2 * q]), (3 * q, row[3 * q :]), (0, row[:100])] for row in data]
        assert store.write([-1] * 7, keys, src) == [True] * 7
        out = torch.full((7, CHUNK_BYTES), 9, dtype=torch.uint8)
        assert store.read([-1] * 7, keys, segs(out)) == [True] * 7
        want = data.clone()
        want[:, 100:q] = 0
        want[:, 2 * q : 3 * q] = 0
        assert torch.equal(out, want)
        # Overlapping segments are refused before any of their bytes reach a store, and
        # the connection the refused value was half sent on is not used again.
        bad = chain(2, salt=52)
        with pytest.raises(ValueError, match="overlap"):
            store.write([-1] * 2, bad, [[(0, data[0][:q]), (q - 1, data[0][q:])]] * 2)
        assert store.read([-1] * 2, bad, segs(out[:2])) == [False] * 2
        assert store.write([-1] * 2, bad, segs(data[:2])) == [True] * 2
        assert store.read([-1] * 2, bad, segs(out[:2])) == [True] * 2
        assert torch.equal(out[:2], data[:2])
    finally:
        store.close()


def test_each_piece_is_sent_before_the_next_is_made(server, monkeypatch):  # noqa: F811
    """``set_streamed`` hands every piece to the socket as soon as it is yielded, in place
    of the stand-in the library packed (small pieces joined with the framing around them);
    a packer that copies values (the library's default) gets each value joined first;
    pieces that do not add up to the value's length are refused before a byte too many is
    sent, and the server is left consistent (the next batch on a fresh connection works)."""
    from kvtier.tiers.remote import streams

    flush(server.url)
    part = streams.JOIN_BELOW
    length = 3 * part + 16
    # One buffer for every large piece and one for every tail: each piece must be sent, or
    # copied, before its buffer changes (a tail is joined with later framing, not sent).
    buf, tail = bytearray(part), bytearray(16)
    events: list[tuple[str, int]] = []

    def parts(j, end=16, more=b""):
        tail[:] = bytes([j]) * 16  # while the previous value's tail may still be held
        for k in range(3):
            buf[:] = bytes([10 * j + k]) * part
            events.append(("made", part))
            yield memoryview(buf)
        events.append(("made", 16))
        yield memoryview(tail)[:end]
        if more:
            yield more

    def want(j):
        return b"".join(bytes([10 * j + k]) * part for k in range(3)) + bytes([j]) * 16

    real = client_module._Connection.send_packed_command

    def send(self, command, check_health=True):
        events.extend(("send", len(p)) for p in command)
        return real(self, command, check_health)

    monkeypatch.setattr(client_module._Connection, "send_packed_command", send)
    client = RemoteClient(parse_remote_url(server.url), timeout_s=5)
    try:
        names = [b"{s}a", b"{s}b"]
        assert client.set_streamed(names, length, parts) == [True, True]
        assert client.get_many(names) == [want(0), want(1)]
        # made, sent, made, sent, ...; the 16-byte tail is joined with the framing.
        assert [e for e in events if e[1] >= part] == [("made", part), ("send", part)] * 6
        assert sum(n for kind, n in events if kind == "send") > 2 * length
        with redis.Redis.from_url(server.url) as plain:  # the default packer copies values
            got = streams.set_streamed(plain, False, [b"{s}c"], length, parts, 0)
            assert got == [True] and plain.get(b"{s}c") == want(0)
            # Too short, and too long: bytes past the value that would end it and start a
            # command of their own, large enough to go out unjoined (never sent: the piece
            # that overruns is refused).
            injected = b"\r\n" + hiredis.pack_command((b"SET", b"{s}x", b"X" * part))
            for kw in ({"end": 15}, {"more": injected}):
                with pytest.raises(ValueError, match="pieces"):
                    client.set_streamed([b"{s}d"], length, lambda j, kw=kw: parts(j, **kw))
            assert client.set_streamed([b"{s}e"], length, parts) == [True]
            assert plain.get(b"{s}e") == want(0) and not plain.exists(b"{s}d", b"{s}x")
            # Lengths are counted in bytes whatever a buffer's item size.
            floats = torch.arange(4, dtype=torch.float32).numpy()
            assert client.set_streamed([b"{s}f"], 16, lambda j: [floats.data]) == [True]
            assert plain.get(b"{s}f") == floats.tobytes()
            assert plain.dbsize() == 5, plain.keys()
    finally:
        client.close()


def test_a_failed_batch_fails_only_its_chunks_in_the_pipelines(server):  # noqa: F811
    """Writes and reads go batch by batch, one round trip each: a batch whose round trip
    fails fails its own chunks only,
    the batches around it keep their results, and nothing is left in flight."""
    flush(server.url)
    space = KeySpace(NAMESPACE)
    client = RemoteClient(parse_remote_url(server.url), timeout_s=5)
    store = RemoteStore(
        client, space, CHUNK_BYTES, NAMESPACE.digest(), batch_bytes=2 * (CHUNK_BYTES + HEADER_BYTES)
    )
    calls = {"set_streamed": 0, "get_each": 0}

    def fail_nth(name, n):
        real = getattr(client, name)

        def call(*args, **kwargs):
            calls[name] += 1
            if calls[name] == n:
                raise RemoteUnavailable("injected")
            return real(*args, **kwargs)

        setattr(client, name, call)

    try:
        keys, data = chain(7, salt=41), payload(7, 10)
        fail_nth("set_streamed", 2)
        got = store.write([-1] * 7, keys, segs(data))
        assert got == [True, True, False, False, True, True, True], got
        assert calls["set_streamed"] == 4
        fail_nth("get_each", 3)
        out = torch.zeros(7, CHUNK_BYTES, dtype=torch.uint8)
        got = store.read([-1] * 7, keys, segs(out))
        # Chunks 2-3 were never stored; the GETs of chunks 4-5 fail; the rest is exact.
        assert got == [True, True, False, False, False, False, True], got
        for i in (0, 1, 6):
            assert torch.equal(out[i], data[i])
        assert store.failed_writes == 2 and store.bad_reads == 4
    finally:
        store.close()


@pytest.mark.parametrize("where", ["standalone", "cluster"])
def test_large_values_go_to_the_socket_as_they_are(where, request):
    """Every connection, standalone or to a cluster node, packs a SET around the value's
    own buffer (the library's pure-Python packer), not a copy of it in a request buffer."""
    url = request.getfixturevalue("server" if where == "standalone" else "cluster").url
    client = RemoteClient(parse_remote_url(url), timeout_s=5)
    try:
        c = client.client
        if where == "cluster":
            nodes = c.get_primaries()
            assert len(nodes) == 3
            pools = [c.get_redis_connection(n).connection_pool for n in nodes]
        else:
            pools = [c.connection_pool]
        value = memoryview(bytearray(1 << 16))
        for pool in pools:
            conn = pool.make_connection()
            assert any(piece is value for piece in conn.pack_commands([("SET", b"k", value)]))
        # The library-built pipeline carries them too, and the values arrive whole.
        names = [b"{t}big%d" % i for i in range(3)]
        values = [bytes([i]) * (1 << 17) for i in range(3)]
        assert client.set_many(list(zip(names, map(memoryview, values), strict=True)))
        assert client.get_many(names) == values
        client.delete(names)
    finally:
        client.close()


def test_a_cluster_with_a_password_is_used_with_it_and_misses_without():
    """The cluster client is built from its first seed's URL (see ``library.cluster_client``):
    credentials still reach every node, and wrong ones are misses, never errors."""
    secret = "cluster-secret-42"
    with RedisCluster(3, password=secret) as c:
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in c.nodes)
        space = KeySpace(NAMESPACE)
        keys = chain(3 * GROUP_CHUNKS, salt=5)  # three groups: several nodes
        data = payload(len(keys), 3)
        n = len(keys)
        wrong = RemoteStore(
            RemoteClient(parse_remote_url(f"redis+cluster://default:nope@{hosts}"), timeout_s=2),
            space,
            CHUNK_BYTES,
            b"n" * 16,
        )
        assert wrong.write([-1] * n, keys, segs(data)) == [False] * n
        right_client = RemoteClient(
            parse_remote_url(f"redis+cluster://default:{secret}@{hosts}"), timeout_s=2
        )
        right = RemoteStore(right_client, space, CHUNK_BYTES, b"n" * 16)
        try:
            assert right.write([-1] * n, keys, segs(data)) == [True] * n
            nodes = right_client.client.get_primaries()
            assert sum(right_client.client.get_redis_connection(m).dbsize() > 0 for m in nodes) > 1
            out = torch.zeros_like(data)
            assert right.read([-1] * n, keys, segs(out)) == [True] * n
            assert torch.equal(out, data)
        finally:
            right.close()
            wrong.close()


def test_tls_urls_use_tls_connections_with_the_same_packer():
    client = RemoteClient(parse_remote_url("rediss://127.0.0.1:1"), timeout_s=0.1)
    try:
        pool = client.client.connection_pool
        assert issubclass(pool.connection_class, redis.SSLConnection)
        value = memoryview(bytearray(1 << 16))
        conn = pool.make_connection()
        assert any(piece is value for piece in conn.pack_commands([("SET", b"k", value)]))
    finally:
        client.close()


def test_a_dead_server_is_a_fast_miss_and_a_restarted_one_is_used_again():
    with RedisServer() as s:
        h = harness(s.url, 1, timeout_ms=200)
        try:
            keys = chain(4, salt=7)
            data = payload(4, 11)
            assert h.stores[0].write([-1] * 4, keys, segs(data)) == [True] * 4
            s.kill()
            out = torch.zeros(4, CHUNK_BYTES, dtype=torch.uint8)
            assert h.stores[0].read([-1] * 4, keys, segs(out)) == [False] * 4
            # The breaker is open: until it closes, calls answer "miss" without a network wait.
            assert not h.stores[0].client.available
            assert probe(h.index, keys) == 0
            assert h.stores[0].write([-1] * 4, keys, segs(data)) == [False] * 4
            s.start()  # empty: no persistence
            time.sleep(1.1)  # the breaker closes
            assert probe(h.index, keys) == 0
            assert h.stores[0].write([-1] * 4, keys, segs(data)) == [True] * 4
            assert probe(h.index, keys) == 4
        finally:
            h.close()


def test_a_cluster_down_at_start_is_misses_not_a_failed_start():
    """No seed answers when the engine starts: building the tier succeeds, every call is
    a miss, and nothing raises past the tier (redis-py's cluster client raises its own
    exception class, not a RedisError, when it cannot learn the slot map)."""
    from kvtier.tools.redis_server import free_port

    target = parse_remote_url(f"redis+cluster://127.0.0.1:{free_port()}")
    space = KeySpace(NAMESPACE)
    index = RemoteIndex(RemoteClient(target, timeout_s=0.2), space, 1, wait_s=0.5)
    store = RemoteStore(
        RemoteClient(target, timeout_s=0.2), space, CHUNK_BYTES, NAMESPACE.digest(), 0
    )
    try:
        keys = chain(2, salt=9)
        assert probe(index, keys) == 0
        assert store.write([-1] * 2, keys, segs(payload(2, 3))) == [False] * 2
        out = torch.zeros(2, CHUNK_BYTES, dtype=torch.uint8)
        assert store.read([-1] * 2, keys, segs(out)) == [False] * 2
    finally:
        index.close()
        store.close()


def test_a_slow_server_times_out_into_misses(server):  # noqa: F811
    import threading

    h = harness(server.url, 1, timeout_ms=150)
    try:
        keys = chain(3, salt=8)
        assert h.stores[0].write([-1] * 3, keys, segs(payload(3, 1))) == [True] * 3
        sleeper = threading.Thread(
            target=lambda: RemoteClient(
                parse_remote_url(server.url), timeout_s=5
            ).client.execute_command("DEBUG", "SLEEP", "1")
        )
        sleeper.start()
        time.sleep(0.1)
        out = torch.zeros(3, CHUNK_BYTES, dtype=torch.uint8)
        # Misses, not a read that waited out the server's 1 s sleep and then succeeded.
        assert h.stores[0].read([-1] * 3, keys, segs(out)) == [False] * 3
        sleeper.join()
        time.sleep(1.1)
        assert h.stores[0].read([-1] * 3, keys, segs(out)) == [True] * 3
    finally:
        h.close()


def test_probe_answers_pending_instead_of_blocking(server):  # noqa: F811
    h = harness(server.url, 1)
    try:
        keys = chain(4, salt=9)
        h.stores[0].write([-1] * 4, keys, segs(payload(4, 2)))
        index = RemoteIndex(RemoteClient(parse_remote_url(server.url)), KeySpace(NAMESPACE), 1, 0.0)
        server.pause()
        try:
            from kvtier.contract import PENDING

            # A probe that blocked on the paused server would end in a count, not PENDING.
            assert index.leading(keys, 0) is PENDING
        finally:
            server.resume()
        assert probe(index, keys) == 4
        index.close()
    finally:
        h.close()


def test_network_jobs_have_their_own_queue(server):  # noqa: F811
    """Remote I/O never waits behind disk I/O (nor disk behind a slow server), and a
    remote load never waits behind remote stores."""
    from kvtier.tiers.memory import DictStore
    from kvtier.transfer import KVRegions, TransferEngine
    from tests.support.jobs import make_job

    kv = [torch.zeros(8, 64, dtype=torch.uint8)]
    remote = RemoteStore(
        RemoteClient(parse_remote_url(server.url)), KeySpace(NAMESPACE), 64, b"n" * 16
    )
    stores = {"cpu": DictStore(8, 64), "disk": DictStore(8, 64), "redis": remote}
    engine = TransferEngine(KVRegions.from_tensors(kv, 8), stores, 1)
    try:

        def job(kind, tier, dst=""):
            return make_job(kind, tier, [b"k" * 16], [0], [0], job_id=0, dst_tier=dst)

        assert engine.lane_of(job("load", "redis")) == "net-load"
        assert engine.lane_of(job("copy", "cpu", "redis")) == "net"
        assert engine.lane_of(job("load", "disk")) == "io-load"
        assert engine.lane_of(job("load", "cpu")) == "load"
        assert engine.lane_of(job("copy", "cpu", "disk")) == "io"
        assert engine.lane_of(job("store", "cpu")) == "normal"
    finally:
        engine.close()
