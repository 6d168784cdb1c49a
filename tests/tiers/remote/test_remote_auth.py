"""Authenticated and encrypted remote values, keyed names and self-healing, on a real
redis-server: stores, the registry's tier built from config, and the mini engine (real
manager, worker and transfer engine, KV checked against an oracle)."""

from __future__ import annotations

import random

import pytest
import torch
from cryptography.hazmat.primitives.ciphers import algorithms
from cryptography.hazmat.primitives.cmac import CMAC
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import KVTierConfig
from kvtier.errors import ConfigError
from kvtier.jobs import WorkerReport
from kvtier.keys import GROUP_CHUNKS, KEY_BYTES, TAG_BYTES, Namespace
from kvtier.metrics import Metrics, PrometheusExporter
from kvtier.tiers.envelope import HEADER_BYTES, pack_envelope, parse_envelope, unwrap, wrap
from kvtier.tiers.remote import KeySpace, RemoteClient, RemoteIndex, parse_remote_url
from kvtier.tiers.remote.auth import MAC_BYTES, SALT_BYTES, subkey
from kvtier.tiers.remote.client import RemoteUnavailable
from kvtier.tiers.remote.keyspace import PREFIX, is_chunk_name, purge_pattern
from tests.support.redis_fixtures import (  # noqa: F401  (fixtures)
    CHUNK_BYTES,
    NAMESPACE,
    chain,
    cluster,
    flush,
    payload,
    probe,
    raw_client,
    segs,
    server,
)
from tests.support.remote_engines import (
    engine_config,
    remote_tokens,
    serve,
    workload,
)
from tests.support.remote_stores import MODES, SECRET_A, SECRET_B, make_store, read, secrets  # noqa: F401  (fixture)


def forged(raw_value: bytes, mode: str) -> bytes:
    """What someone who may GET and SET, but lacks the secret, plants under a name: in MAC
    mode the envelope is readable, so the forgery is a well-formed value for the same key
    and namespace (right checksum, right length) with other KV and the old tag; otherwise
    bytes of the right length."""
    if mode == "mac":
        plain = raw_value[:-MAC_BYTES]
        env = parse_envelope(plain[-HEADER_BYTES:])
        assert env is not None
        evil = wrap(env.key, env.parent, env.namespace, bytes(env.length), tail=True)
        return evil + raw_value[-MAC_BYTES:]
    return bytes(len(raw_value))


# The conformance suite under a secret (MAC, AEAD): test_conformance.py.


def test_keyed_aead_names_spread_over_a_cluster_and_probe_by_group(cluster):  # noqa: F811
    """Keyed names keep a group's chunks in one slot: the cluster probe (one EXISTS per
    group) finds the first miss, and sealed values round-trip through every node."""
    flush(cluster.url)
    keys, data = chain(3 * GROUP_CHUNKS + 2, salt=57), payload(3 * GROUP_CHUNKS + 2, 7)
    n = len(keys)
    store = make_store(cluster.url, "aead", SECRET_A)
    index = RemoteIndex(
        RemoteClient(parse_remote_url(cluster.url)), store.keyspace, 1, wait_s=0.002
    )
    raw = raw_client(cluster.url)
    try:
        assert store.write([-1] * n, keys, segs(data)) == [True] * n
        slots = {raw.keyslot(nm) for nm in store.keyspace.names(keys, 0)}
        assert len(slots) == 4
        assert probe(index, keys) == n
        raw.delete(store.keyspace.name(keys[GROUP_CHUNKS + 3], 0))
        assert probe(index, keys) == GROUP_CHUNKS + 3
        ok, out = read(store, keys)
        assert ok == [i != GROUP_CHUNKS + 3 for i in range(n)]
        assert torch.equal(out[:GROUP_CHUNKS], data[:GROUP_CHUNKS])
    finally:
        index.close()
        store.close()
        raw.close()


# -- forged and garbage values: refused, counted, healed -----------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_forged_value_is_never_loaded_and_the_honest_store_is_not_skipped(server, mode):  # noqa: F811
    """Values planted before any honest store, under the names the engines use (a SCAN
    user sees them), look present to a probe but never load; each is counted and deleted,
    and the honest store of the same chunks then writes them (none skipped as present)."""
    flush(server.url)
    keys, data = chain(5, salt=51), payload(5, 1)
    honest = make_store(server.url, mode, SECRET_A)
    raw = raw_client(server.url)
    try:
        # A template of a well-formed value, under a scratch engine's names.
        scratch = make_store(server.url, mode, SECRET_A)
        assert scratch.write([-1] * 5, keys, segs(payload(5, 2))) == [True] * 5
        names = honest.keyspace.names(keys, 0)
        for name in names:
            raw.set(name, forged(raw.get(name), mode))
        index = RemoteIndex(
            RemoteClient(parse_remote_url(server.url)), honest.keyspace, 1, wait_s=0.002
        )
        assert probe(index, keys) == 5  # present, as far as names go
        ok, out = read(honest, keys)
        assert ok == [False] * 5 and not out.any()
        assert (honest.auth_failures, honest.bad_values, honest.healed) == (5, 0, 5)
        assert probe(index, keys) == 0 and raw.exists(*names) == 0
        assert honest.take_counters() == {
            "remote_auth_failures": 5.0,
            "remote_healed_values": 5.0,
        }
        assert honest.take_counters() == {}
        assert honest.write([-1] * 5, keys, segs(data)) == [True] * 5
        assert honest.skipped_writes == 0
        ok, out = read(honest, keys)
        assert ok == [True] * 5 and torch.equal(out, data)
        index.close()
        scratch.close()
    finally:
        honest.close()
        raw.close()


@pytest.mark.parametrize("mode", ["off", *MODES])
def test_garbage_value_healed(server, mode):  # noqa: F811
    """A stored value changed in place (a flipped byte, a cut) fails its check; the next
    store of that chunk overwrites it and a later load hits. Also when the delete itself
    fails: the store remembers the name and sets it although it exists."""
    flush(server.url)
    keys, data = chain(4, salt=52), payload(4, 3)
    store = make_store(server.url, mode, SECRET_A)
    raw = raw_client(server.url)
    try:
        assert store.write([-1] * 4, keys, segs(data)) == [True] * 4
        names = store.keyspace.names(keys, 0)
        v = bytearray(raw.get(names[1]))
        v[len(v) // 3] ^= 0x01
        raw.set(names[1], bytes(v))
        raw.set(names[2], raw.get(names[2])[:-7])
        ok, _ = read(store, keys)
        assert ok == [True, False, False, True]
        counted = store.auth_failures if mode != "off" else store.bad_values
        assert counted == 2 and store.healed == 2
        assert store.write([-1] * 4, keys, segs(data)) == [True] * 4
        assert store.skipped_writes == 2  # the two honest ones
        ok, out = read(store, keys)
        assert ok == [True] * 4 and torch.equal(out, data)
        # The delete fails (the server refuses it): the next store overwrites anyway.
        raw.set(names[0], b"garbage")

        def refuse(names, breaker=True):
            raise RemoteUnavailable("delete refused")

        store.client.delete = refuse  # type: ignore[method-assign]
        assert read(store, keys)[0] == [False, True, True, True]
        assert raw.get(names[0]) == b"garbage" and store.healed == 2
        assert store.write([-1] * 4, keys, segs(data)) == [True] * 4
        ok, out = read(store, keys)
        assert ok == [True] * 4 and torch.equal(out, data)
    finally:
        store.close()
        raw.close()


# -- engines (the mini engine: real manager, worker, transfer engine; KV against an oracle) --


@pytest.mark.parametrize("mode", MODES)
def test_engines_never_load_forged_values_and_heal_them(server, secrets, mode):  # noqa: F811
    """Every value engine A stored is replaced by a forgery. Engines B and C (same secret)
    never attend over one (the oracle), recompute instead, count and delete each forgery
    they read, and store their own: a chunk B computed but never read from the store may
    keep its forgery (present, so B's store skips it) until C reads and refuses it. Then no
    forgery is left, and engine D hits every chunk, recomputing none."""
    flush(server.url)
    prompts = workload(11)
    cfg = engine_config(server.url, mode, secrets["a"])
    serve(cfg, prompts, "a").close()
    raw = raw_client(server.url)
    names = raw.keys(PREFIX.decode() + "*")
    assert names
    planted = {forged(raw.get(name), mode) for name in names}
    for name in names:
        raw.set(name, forged(raw.get(name), mode))
    refused = 0
    for name in ("b", "c"):
        e = serve(cfg, prompts, name)  # assert_clean: no token over a forged value's KV
        m = e.manager.metrics
        refused += m.get("remote_auth_failures", "redis")
        assert m.get("remote_healed_values", "redis") == m.get("remote_auth_failures", "redis")
        assert m.get("failures", "redis", "load") > 0 or name == "c"
        assert name == "c" or e.recomputed > 0
        e.close()
    assert refused >= len(names)
    assert not planted & {raw.get(n) for n in raw.keys(PREFIX.decode() + "*")}
    d = serve(cfg, prompts, "d")
    assert remote_tokens(d) > 0 and d.recomputed == 0
    assert d.manager.metrics.get("remote_auth_failures", "redis") == 0
    d.close()
    raw.close()


def test_engines_with_different_secrets_share_nothing(server, secrets):  # noqa: F811
    """Different secrets (or none, or MAC against AEAD on one secret): zero hits, no
    errors, no value refused (their names differ); the same secret hits."""
    flush(server.url)
    prompts = workload(12)
    mac_a = engine_config(server.url, "mac", secrets["a"])
    serve(mac_a, prompts, "a").close()
    others = (
        engine_config(server.url, "mac", secrets["b"]),
        engine_config(server.url, "aead", secrets["a"]),
        engine_config(server.url, "off", None),
    )
    for i, cfg in enumerate(others):
        e = serve(cfg, prompts, f"o{i}")
        m = e.manager.metrics
        assert remote_tokens(e) == 0 and e.recomputed == 0
        assert m.total("failures") == 0 and m.total("remote_auth_failures") == 0
        e.close()
    again = serve(mac_a, prompts, "again")
    assert remote_tokens(again) > 0 and again.recomputed == 0
    again.close()


# -- encryption at rest ---------------------------------------------------------------------------


def _blocks(b: bytes, size: int = 16) -> set[bytes]:
    return {b[i : i + size] for i in range(0, len(b) - size + 1, size)}


def test_two_runs_with_different_secrets_leave_no_common_payload_bytes(server):  # noqa: F811
    """The same KV stored under two secrets: no 16-byte block of one run's values (at any
    offset) is in the other's, nor any block of the plaintext; every value has its own
    salt. In MAC mode the plaintext is there (the check can fail)."""
    flush(server.url)
    keys, data = chain(4, salt=53), payload(4, 4)
    raw = raw_client(server.url)
    runs = []
    for secret in (SECRET_A, SECRET_B):
        store = make_store(server.url, "aead", secret)
        assert store.write([-1] * 4, keys, segs(data)) == [True] * 4
        runs.append([raw.get(n) for n in store.keyspace.names(keys, 0)])
        store.close()
    plain = {blk for row in data for blk in _blocks(row.numpy().tobytes())}
    for a, b in zip(*runs, strict=True):
        assert not any(blk in b for blk in _blocks(a)), "a block of run A's value in run B's"
        assert not any(blk in a or blk in b for blk in plain), "plaintext at rest"
    # Rewrites of one chunk draw a fresh salt and nonce every time.
    store = make_store(server.url, "aead", SECRET_A)
    name = store.keyspace.name(keys[0], 0)
    heads = set()
    for _ in range(32):
        raw.delete(name)
        assert store.write([-1], keys[:1], segs(data[:1])) == [True]
        heads.add(raw.get(name)[: SALT_BYTES + 12])
    assert len(heads) == 32
    mac = make_store(server.url, "mac", SECRET_A)
    assert mac.write([-1], keys[:1], segs(data[:1])) == [True]
    assert data[0].numpy().tobytes() in raw.get(mac.keyspace.name(keys[0], 0))
    mac.close()
    store.close()
    raw.close()


# -- keyed names and purge patterns ---------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(min_size=KEY_BYTES, max_size=KEY_BYTES), min_size=1, max_size=40))
def test_keyed_names_are_aes_cmac_of_tag_and_key(keys):
    """The batched CMAC against the library's CMAC, message by message; a group's chunks
    share their tag; no byte of a key shows in its name."""
    space = KeySpace(NAMESPACE, SECRET_A)
    mids = space.mids(keys)
    k = subkey(SECRET_A, "chunks-mac")

    def cmac(msg: bytes) -> bytes:
        c = CMAC(algorithms.AES(k))
        c.update(msg)
        return c.finalize()

    w = space.width
    for i, key in enumerate(keys):
        tag = cmac(key[:TAG_BYTES].ljust(31, b"\0") + b"\x01")[:TAG_BYTES]
        rest = cmac(key.ljust(31, b"\0") + b"\x02")[: min(16, KEY_BYTES - TAG_BYTES)]
        assert mids[i * w : (i + 1) * w] == tag.hex().encode() + b"}" + rest.hex().encode()
        assert key.hex().encode() not in space.name(key, 0)


def test_keyed_names_keep_a_group_in_one_slot():
    keys = chain(2 * GROUP_CHUNKS, salt=54)
    space = KeySpace(NAMESPACE, SECRET_A, encrypt=True)
    names = space.names(keys, 1)
    tags = [n[n.index(b"{") : n.index(b"}")] for n in names]
    assert len(set(tags[:GROUP_CHUNKS])) == 1 and len(set(tags)) == 2
    plain = KeySpace(NAMESPACE).name(keys[0], 0)
    assert plain.startswith(PREFIX) and keys[0].hex().encode() in plain.replace(b"}", b"")
    assert set(names).isdisjoint(KeySpace(NAMESPACE, SECRET_B, True).names(keys, 1))
    assert set(names).isdisjoint(KeySpace(NAMESPACE, SECRET_A, False).names(keys, 1))


@pytest.mark.parametrize("secret", [None, SECRET_A])
def test_purge_patterns_select_one_tenant_or_model(server, secret):  # noqa: F811
    flush(server.url)
    raw = raw_client(server.url)
    keys = chain(3, salt=55)
    made: dict[tuple[str, str], set[bytes]] = {}
    for tenant in ("alpha", "beta"):
        for model in ("m1", "m2"):
            ns = Namespace(model, "layout", "tp1", tenant)
            names = KeySpace(ns, secret).names(keys, 0)
            for n in names:
                raw.set(n, b"x")
            made[tenant, model] = set(names)
    raw.set(b"other:alpha", b"x")

    def scan(tenant, model) -> set[bytes]:
        return set(raw.scan_iter(match=purge_pattern(tenant, model, secret), count=1000))

    assert scan("alpha", None) == made["alpha", "m1"] | made["alpha", "m2"]
    assert scan(None, "m2") == made["alpha", "m2"] | made["beta", "m2"]
    assert scan("beta", "m1") == made["beta", "m1"]
    assert scan(None, None) == set().union(*made.values())
    assert all(is_chunk_name(n) for n in scan(None, None))
    cut = next(iter(made["beta", "m1"]))[:-2]
    assert not is_chunk_name(b"other:alpha") and not is_chunk_name(cut)
    assert scan("gamma", None) == set()
    other = SECRET_B if secret else SECRET_A  # the wrong secret (or one where none was)
    assert not set(raw.scan_iter(match=purge_pattern("alpha", None, other)))
    assert b"alpha" not in purge_pattern("alpha", "m1", secret)
    raw.close()


# -- configuration ---------------------------------------------------------------------------------


def _cfg(redis_tier: dict) -> KVTierConfig:
    tier = {"kind": "redis", "url": "redis://127.0.0.1:1", **redis_tier}
    return KVTierConfig.from_dict({"tiers": [{"kind": "cpu"}, tier]})


@pytest.mark.parametrize(
    ("entry", "env", "start"),
    [
        ({"secret_file": "/nonexistent/kvtier-secret"}, {}, "tiers[1].secret_file: cannot read"),
        ({"secret_env": "KVT_TEST_SECRET"}, {}, "tiers[1].secret_env: the environment variable it"),
        ({"secret_env": "KVT_TEST_SECRET"}, {"KVT_TEST_SECRET": ""}, "tiers[1].secret_env: the"),
        ({"secret_env": "KVT_TEST_SECRET"}, {"KVT_TEST_SECRET": "short-pw"}, "tiers[1].secret_env"),
        ({"encrypt": True}, {}, "tiers[1].encrypt: encryption needs a secret"),
        (
            {"secret_env": "KVT_TEST_SECRET", "secret_file": "/x"},
            {"KVT_TEST_SECRET": "y" * 40},
            "tiers[1].secret_file: give secret_env or secret_file",
        ),
        ({"secret_env": ""}, {}, "tiers[1].secret_env: expected a non-empty string"),
        ({"encrypt": "yes"}, {}, "tiers[1].encrypt: expected true or false"),
    ],
)
def test_bad_secret_configuration_is_one_line_naming_the_option(monkeypatch, entry, env, start):
    monkeypatch.delenv("KVT_TEST_SECRET", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as e:
        _cfg(entry)
    msg = str(e.value)
    assert msg.startswith(start) and "\n" not in msg, msg
    assert "short-pw" not in msg and "y" * 40 not in msg


def test_memory_tiers_refuse_secret_options():
    with pytest.raises(
        ConfigError, match=r"unknown key\(s\) 'encrypt'; accepted keys for a memory"
    ):
        KVTierConfig.from_dict({"tiers": [{"kind": "cpu"}, {"kind": "memory", "encrypt": True}]})


def test_a_secret_gone_at_build_time_stores_nothing(server, monkeypatch):  # noqa: F811
    """The secret checks out when the config is read and is gone when the tier is built
    (another process, another environment): building fails naming the option, and nothing
    was stored. The secret shows in no repr."""
    from kvtier.contract.kind import TierContext
    from kvtier.stack.build import build_stack, build_stores

    flush(server.url)
    secret = "s" * 48
    monkeypatch.setenv("KVT_TEST_SECRET", secret)
    cfg = KVTierConfig.from_dict(
        {
            "tiers": [
                {"kind": "cpu", "capacity": "1MiB"},
                {"kind": "redis", "url": server.url, "secret_env": "KVT_TEST_SECRET"},
            ]
        }
    )
    ctx = TierContext(CHUNK_BYTES, NAMESPACE)
    stores = build_stores(cfg, ctx)
    assert secret not in repr(cfg) + repr(stores["redis"].auth) + repr(cfg.tiers[1])  # type: ignore[attr-defined]
    stores["redis"].close()
    monkeypatch.delenv("KVT_TEST_SECRET")
    for build in (build_stores, build_stack):
        with pytest.raises(
            ConfigError,
            match=r"tier 'redis'\.secret_env: the environment variable it names is unset",
        ):
            build(cfg, ctx)
    assert raw_client(server.url).dbsize() == 0


# -- metrics plumbing ------------------------------------------------------------------------------


def test_worker_reports_carry_store_counters_to_kvtier_metrics():
    import prometheus_client

    a = WorkerReport(counters={"redis": {"remote_auth_failures": 2.0}})
    b = WorkerReport(counters={"redis": {"remote_auth_failures": 1.0, "remote_healed_values": 3}})
    merged = a.merge(b)
    assert merged.counters == {"redis": {"remote_auth_failures": 3.0, "remote_healed_values": 3.0}}
    m = Metrics()
    m.inc_tiers(merged.counters)
    reg = prometheus_client.CollectorRegistry()
    PrometheusExporter(reg).observe(m)
    got = reg.get_sample_value("kvtier_remote_auth_failures_total", {"tier": "redis"})
    assert got == 3.0


def test_random_corruption_never_loads(server):  # noqa: F811
    """Any single flipped byte of an AEAD or MAC value, anywhere, fails that chunk."""
    flush(server.url)
    rng = random.Random(5)
    raw = raw_client(server.url)
    for mode in MODES:
        store = make_store(server.url, mode, SECRET_A)
        keys, data = chain(8, salt=56), payload(8, 6)
        assert store.write([-1] * 8, keys, segs(data)) == [True] * 8
        names = store.keyspace.names(keys, 0)
        for name in names:
            v = bytearray(raw.get(name))
            v[rng.randrange(len(v))] ^= 1 << rng.randrange(8)
            raw.set(name, bytes(v))
        assert read(store, keys)[0] == [False] * 8 and store.auth_failures == 8
        store.close()
    raw.close()


def test_sealing_ahead_stops_cleanly_on_bad_segments(server):  # noqa: F811
    """AEAD parts are encrypted one ahead on the store's sealer thread: segments that
    overrun the payload raise from the write as they do unsealed, nothing half-sent is
    stored, and the store goes on working."""
    flush(server.url)
    store = make_store(server.url, "aead", SECRET_A)
    raw = raw_client(server.url)
    try:
        keys, data = chain(2, salt=58), payload(2, 8)
        bad = [[(0, data[0]), (CHUNK_BYTES // 2, data[1][: CHUNK_BYTES // 2 + 1])]]
        with pytest.raises(ValueError, match="overlap or overrun"):
            store.write([-1], keys[:1], bad)
        assert raw.dbsize() == 0
        assert store.write([-1] * 2, keys, segs(data)) == [True] * 2
        ok, out = read(store, keys)
        assert ok == [True] * 2 and torch.equal(out, data)
    finally:
        store.close()
        raw.close()


def test_sealed_values_skip_the_payload_checksum_that_plain_tiers_need(server):  # noqa: F811
    """Under a tag the envelope is tagged and carries no payload checksum (the tag covers
    the payload); a plain tier never accepts a tagged envelope, so nobody can switch a
    plain value's checksum off by setting the flag."""
    flush(server.url)
    raw = raw_client(server.url)
    keys, data = chain(3, salt=71), payload(3, 71)
    for mode in ["off", *MODES]:
        store = make_store(server.url, mode, SECRET_A)
        assert store.write([-1] * 3, keys, segs(data)) == [True] * 3
        if mode != "aead":  # AEAD values are ciphertext: their envelope is not readable
            value = raw.get(store.keyspace.names(keys, 0)[0])
            plain = value[:-MAC_BYTES] if mode == "mac" else value
            env = parse_envelope(plain[-HEADER_BYTES:])
            assert env is not None and env.tagged == (mode == "mac")
            assert (env.checksum == 0) == (mode == "mac")
        ok, out = read(store, keys)
        assert ok == [True] * 3 and torch.equal(out, data)
        store.close()
    # A plain value whose envelope claims a tag: a bad value, not a payload taken unchecked.
    plain_store = make_store(server.url, "off", None)
    name = plain_store.keyspace.names(keys[:1], 0)[0]
    env = pack_envelope(
        keys[0], None, NAMESPACE.for_rank(0).digest(), 0, CHUNK_BYTES, 0, tagged=True
    )
    raw.set(name, bytes(CHUNK_BYTES) + env)
    assert read(plain_store, keys[:1])[0] == [False] and plain_store.bad_values == 1
    plain_store.close()
    raw.close()


def test_tagged_envelopes_open_only_for_a_caller_that_checked_the_tag():
    key, ns, body = chain(1, salt=72)[0], NAMESPACE.digest(), bytes(range(256)) * 4
    tagged = body + pack_envelope(key, None, ns, 0, len(body), 0, tagged=True)
    assert unwrap(tagged, key, ns, len(body), tail=True) is None
    assert bytes(unwrap(tagged, key, ns, len(body), tail=True, tag_checked=True) or b"") == body
    with pytest.raises(ValueError, match="no payload checksum"):
        pack_envelope(key, None, ns, 0, len(body), 1, tagged=True)
