"""pytest fixtures and harnesses for tests on real redis-server processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from kvtier.keys import Key
from kvtier.testing.shared_conformance import (
    CHUNK_BYTES,
    NAMESPACE,
    SharedHarness,
    chain,
    payload,
    segs,
)
from kvtier.tiers.remote import KeySpace, RemoteClient, RemoteIndex, RemoteStore, parse_remote_url
from kvtier.tools.redis_server import RedisCluster, RedisServer, redis_available

if not redis_available():  # scripts/setup.sh installs it; without it these tests cannot run
    raise RuntimeError("redis-server is not installed: run scripts/setup.sh")


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    with RedisCluster(3) as c:
        yield c


def raw_client(url: str) -> redis.Redis | redis.RedisCluster:
    t = parse_remote_url(url)
    host, port = t.hosts[0]
    if t.cluster:
        return redis.RedisCluster(host=host, port=port)
    return redis.Redis(host=host, port=port)


def flush(url: str) -> None:
    c = raw_client(url)
    if isinstance(c, redis.RedisCluster):
        c.flushall(target_nodes=redis.RedisCluster.PRIMARIES)
    else:
        c.flushall()
    c.close()


def harness(url: str, world: int, timeout_ms: float = 500) -> SharedHarness:
    """A remote tier (index + one store per rank) on ``url``, emptied first."""
    flush(url)
    target = parse_remote_url(url)
    space = KeySpace(NAMESPACE)
    raw = raw_client(url)

    def client() -> RemoteClient:
        return RemoteClient(target, timeout_s=timeout_ms / 1e3)

    def make_store(rank: int, digest: bytes) -> RemoteStore:
        return RemoteStore(client(), space, CHUNK_BYTES, digest, rank)

    index = RemoteIndex(client(), space, world, wait_s=0.002)
    stores = [make_store(r, NAMESPACE.for_rank(r).digest()) for r in range(world)]

    def get(key: Key, rank: int) -> bytes | None:
        v = raw.get(space.name(key, rank))
        return v if isinstance(v, bytes) else None

    def close() -> None:
        index.close()
        for s in stores:
            s.close()
        raw.close()

    return SharedHarness(
        index,
        list(stores),
        get,
        lambda k, r, v: raw.set(space.name(k, r), v),
        lambda k, r: raw.delete(space.name(k, r)),
        make_store,
        close,
    )


def tier_roundtrip(entry: dict[str, object], n: int = 3, seed: int = 0) -> tuple[list[bool], int]:
    """A redis tier built from the config ``entry`` (as vLLM's extra config gives it):
    store ``n`` chunks through its store, probe them through its index, read them back
    into fresh memory. Returns each chunk's read success (True only when the bytes read
    equal the bytes stored) and the probe's leading count."""
    import torch

    from kvtier.config import KVTierConfig
    from kvtier.testing.shared_conformance import probe
    from kvtier.tiers.remote.kind import client_for

    spec = KVTierConfig.from_dict({"tiers": [{"kind": "cpu"}, entry]}).tiers[1]
    space = KeySpace(NAMESPACE)
    store = RemoteStore(client_for(spec), space, CHUNK_BYTES, NAMESPACE.digest())
    index = RemoteIndex(client_for(spec), space, 1, wait_s=0.002)
    try:
        keys, data = chain(n, salt=seed), payload(n, seed)
        store.write([-1] * n, keys, segs(data))
        leading = probe(index, keys)
        out = torch.zeros_like(data)
        ok = store.read([-1] * n, keys, segs(out))
        same = [o and bool(torch.equal(a, b)) for o, a, b in zip(ok, out, data, strict=True)]
        return same, leading
    finally:
        index.close()
        store.close()
