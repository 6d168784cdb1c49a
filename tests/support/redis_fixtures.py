"""pytest fixtures and harnesses for tests on real redis-server processes, and the data
helpers of the shared-tier tests (chains, payloads, split segments, probes)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pytest
import redis
import torch

from kvtier.conformance import CHUNK_BYTES as CONFORMANCE_CHUNK
from kvtier.conformance import NAMESPACE as CONFORMANCE_NAMESPACE
from kvtier.conformance import BuiltTier, Tamper
from kvtier.contract import Pending, SlotStore, TierIndex
from kvtier.keys import Key, Namespace, chunk_keys
from kvtier.tiers.remote import KeySpace, RemoteClient, RemoteIndex, RemoteStore, parse_remote_url
from kvtier.tools.redis_server import RedisCluster, RedisServer, redis_available

CHUNK_BYTES = 8192
NAMESPACE = Namespace("conformance", "layout-digest", "tp2")


@dataclass
class SharedHarness:
    """One shared tier (index + one store per rank) and raw access to its backing store."""

    index: TierIndex
    stores: list[SlotStore]
    """One store per rank (rank r at position r)."""
    raw_get: Callable[[Key, int], bytes | None]
    raw_put: Callable[[Key, int, bytes], None]
    drop: Callable[[Key, int], None]
    make_store: Callable[[int, bytes], SlotStore]
    """Another engine's store: ``(rank, namespace digest)``."""
    close: Callable[[], None]


def chain(n: int, salt: int = 0) -> list[Key]:
    """``n`` chunk keys of 4 tokens; chains of distinct salts share no chunk."""
    seed = b"shared-seed" + salt.to_bytes(8, "little")
    return chunk_keys(list(range(n * 4)), 4, seed)


def payload(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, CHUNK_BYTES), dtype=torch.uint8, generator=g)


def segs(data: torch.Tensor) -> list[list[tuple[int, torch.Tensor]]]:
    """Each chunk as two segments (a split payload, as engine regions give it)."""
    h = CHUNK_BYTES // 2
    return [[(0, row[:h]), (h, row[h:])] for row in data]


def probe(index: TierIndex, keys: Sequence[Key], start: int = 0, timeout: float = 5.0) -> int:
    """``leading``, asked again while it answers PENDING (as the scheduler would)."""
    deadline = time.monotonic() + timeout
    while True:
        n = index.leading(keys, start)
        if not isinstance(n, Pending):
            return n
        assert time.monotonic() < deadline, "a probe never answered"
        time.sleep(0.001)


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
    from kvtier.config import KVTierConfig
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


def redis_tamper(tier: BuiltTier) -> Tamper:
    """Raw access to a conformance case's redis tier: its values by chunk name (keyed by
    the tier's secret, if any)."""
    from kvtier.contract.kind import TierContext
    from kvtier.tiers.remote.kind import keyspace_for, options_of

    url = options_of(tier.spec).url
    assert url
    raw = raw_client(url)
    tier.ctx.finalizer(raw.close)
    space = keyspace_for(tier.spec, TierContext(CONFORMANCE_CHUNK, CONFORMANCE_NAMESPACE))

    def get(key: Key, rank: int) -> bytes | None:
        v = raw.get(space.name(key, rank))
        return v if isinstance(v, bytes) else None

    return Tamper(
        get,
        lambda k, r, v: raw.set(space.name(k, r), v),
        lambda k, r: raw.delete(space.name(k, r)),
    )
