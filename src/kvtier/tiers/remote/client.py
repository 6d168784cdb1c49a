"""The remote store's client: pipelined batches over the ``redis`` library (with ``hiredis``).

Every command is packed by the library (redis-py's packers, or hiredis's for the probe's
multi-key EXISTS) and carried by its pools and parsers: kvtier writes no protocol bytes.
Every connection (standalone or per cluster node) packs commands with the library's
pure-Python packer, which hands a large value to the socket as it is, where the default
(hiredis) packer copies it into one request buffer (:mod:`kvtier.tiers.remote.library`
holds those classes and whatever else leans on the library's internals).

One :class:`RemoteClient` per process side (the scheduler's prober, each worker's store),
each with its own connection pool. Every call has a timeout (``socket_timeout`` and
``socket_connect_timeout``) and no library retries, so a dead or hung server costs at most
one timeout per batch; after a failure the client answers "unavailable" at once for
``backoff_s`` (a circuit breaker), so the engine keeps serving at full speed while the
server is gone. Methods raise :class:`RemoteUnavailable` on any transport or server error;
callers turn that into misses. Nothing read is ever unpickled or evaluated: values are
opaque bytes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from kvtier.tiers.remote.library import VALUE_CUTOFF as VALUE_CUTOFF
from kvtier.tiers.remote.library import Connection as _Connection
from kvtier.tiers.remote.library import cluster_client, tls_connection_class
from kvtier.tiers.remote.probe import ChainProbe
from kvtier.tiers.remote.secrets import TLSFiles
from kvtier.tiers.remote.streams import Consume, Parts, exists_each, get_each, set_streamed
from kvtier.tiers.remote.url import RemoteTarget

log = logging.getLogger("kvtier")

DELETE_BATCH = 1024
"""Names per UNLINK a heal or purge sends (one round trip carries them all)."""


class RemoteUnavailable(Exception):
    """The store could not answer (down, slow, refused); the message names no secret."""


class RemoteClient:
    """Batched GET / SET / EXISTS / probe against one standalone server or one cluster.

    Thread-safe (redis-py pools connections per thread of use). ``timeout_s`` bounds every
    network wait of a call; ``max_connections`` bounds the pool (per node for a cluster).
    """

    def __init__(
        self,
        target: RemoteTarget,
        *,
        timeout_s: float = 0.5,
        max_connections: int = 16,
        backoff_s: float = 1.0,
        tls: TLSFiles | None = None,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._down_until = 0.0
        kw: dict[str, Any] = {
            "username": target.username,
            "password": target.password,
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            "retry": Retry(NoBackoff(), 0),
            "max_connections": max_connections,
            "health_check_interval": 0,
            "connection_class": _connection_class(target, tls),
        }
        self._kw = kw
        self._client: Any = None
        if not target.cluster:
            host, port = target.hosts[0]
            pool = redis.ConnectionPool(host=host, port=port, db=target.db, **kw)
            self._client = redis.Redis(connection_pool=pool)
        self.probe = ChainProbe(lambda: self.client, target.cluster, self.exists_many)
        """The chain probe behind :meth:`leading` (its script's state)."""

    @property
    def client(self) -> Any:
        """The library's client. A cluster client is built on first use, inside the
        caller's guard: it contacts a seed to learn the slot map, and a cluster that is
        down when the engine starts must cost misses, not the engine's start."""
        if self._client is None:
            self._client = cluster_client(self.target.hosts, self._kw)
        return self._client

    # -- failure handling ----------------------------------------------------------------

    def _guard(self, call: Any, *, breaker: bool = True) -> Any:
        """Run ``call``; any library error becomes RemoteUnavailable and opens the breaker.
        With ``breaker=False`` the call runs even while the breaker is open (and a failure
        still opens it)."""
        if breaker and time.monotonic() < self._down_until:
            raise RemoteUnavailable(f"{self.target.display}: unavailable (backing off)")
        try:
            return call()
        except (redis.RedisError, RedisClusterException) as e:
            self._down_until = time.monotonic() + self.backoff_s
            # The library's messages carry hosts and reasons, never the password.
            msg = f"{self.target.display}: {type(e).__name__}: {e}"
            log.warning("kvtier: remote tier %s", msg)
            raise RemoteUnavailable(msg) from None

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    @property
    def down_until(self) -> float:
        """The ``time.monotonic()`` until which the breaker answers "unavailable"; 0.0
        while it never opened (or was closed again: a refused script is no outage)."""
        return self._down_until

    # -- batches -------------------------------------------------------------------------

    def _pipeline(self) -> Any:
        if self.target.cluster:
            return self.client.pipeline()
        return self.client.pipeline(transaction=False)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Values of ``keys`` in one pipelined round trip; None where missing or where a
        cluster node failed."""

        def run() -> list[Any]:
            p = self._pipeline()
            for k in keys:
                p.get(k)
            return list(p.execute(raise_on_error=False))

        return [v if isinstance(v, bytes) else None for v in self._guard(run)]

    def exists_many(self, keys: Sequence[bytes]) -> list[bool]:
        def run() -> list[Any]:
            p = self._pipeline()
            for k in keys:
                p.exists(k)
            return list(p.execute(raise_on_error=False))

        return [v == 1 for v in self._guard(run)]

    def set_many(self, items: Sequence[tuple[bytes, Any]], ttl_s: int = 0) -> list[bool]:
        """SET each ``(key, value)`` in one pipelined round trip (``EX ttl_s`` when > 0);
        per-item success (a value the server refused, e.g. out of memory, fails only its
        item). Values are bytes or contiguous bytes-like buffers (a ``memoryview`` of a
        staging buffer); they go to the socket as they are, so the caller may reuse their
        memory once this returns."""

        def run() -> list[Any]:
            p = self._pipeline()
            for k, v in items:
                p.set(k, v, ex=ttl_s or None)
            return list(p.execute(raise_on_error=False))

        return [v is True for v in self._guard(run)]

    def set_streamed(
        self, names: Sequence[bytes], length: int, parts: Parts, ttl_s: int = 0
    ) -> list[bool]:
        """:func:`kvtier.tiers.remote.streams.set_streamed` on this store, guarded."""

        def run() -> list[bool]:  # in the guard: a cluster client contacts a seed when built
            return set_streamed(self.client, self.target.cluster, names, length, parts, ttl_s)

        return self._guard(run)  # type: ignore[no-any-return]

    def exists_each(self, names: Sequence[bytes]) -> list[bool]:
        """:func:`kvtier.tiers.remote.streams.exists_each`, guarded: :meth:`exists_many`
        without the library's pipeline (and its redirects), for a store's batches."""
        return self._guard(lambda: exists_each(self.client, self.target.cluster, names))  # type: ignore[no-any-return]

    def get_each(self, names: Sequence[bytes], consume: Consume, limit: int) -> None:
        """:func:`kvtier.tiers.remote.streams.get_each` (at most ``limit + 1`` bytes a
        value), guarded (a failure may follow some)."""
        self._guard(lambda: get_each(self.client, self.target.cluster, names, consume, limit))

    def delete(self, keys: Sequence[bytes], *, breaker: bool = True) -> int:
        """UNLINK ``keys`` (the server frees large values off its main thread) in one
        round trip: one multi-key command of up to DELETE_BATCH names each, pipelined (a
        cluster's library splits them by slot). How many existed. ``breaker=False``: also
        while the breaker is open (a read healing what it found before a failure)."""
        if not keys:
            return 0

        def run() -> int:
            if self.target.cluster:
                return int(self.client.unlink(*keys))
            p = self._pipeline()
            for lo in range(0, len(keys), DELETE_BATCH):
                p.unlink(*keys[lo : lo + DELETE_BATCH])
            return sum(int(n) for n in p.execute())

        return self._guard(run, breaker=breaker)  # type: ignore[no-any-return]

    # -- probe ---------------------------------------------------------------------------

    def leading(self, prefix: bytes, mids: bytes, width: int, suffixes: Sequence[bytes]) -> int:
        """How many leading chunks exist under every suffix (rank): chunk i's names are
        ``prefix + mids[i * width : (i + 1) * width] + suffix``. One or two round trips for
        a chain present whole or a present prefix with an absent tail
        (:mod:`kvtier.tiers.remote.probe`); pipelined EXISTS of every name once the
        server refused the probe's script."""
        if not mids:
            return 0
        probe = self.probe
        if probe.script_ok:
            try:
                return self._guard(lambda: probe.leading(prefix, mids, width, suffixes))  # type: ignore[no-any-return]
            except RemoteUnavailable as e:
                if "script" not in str(e).lower():
                    raise
                probe.refuse_scripts()  # e.g. scripting disabled on a managed deployment
                self._down_until = 0.0
        return probe.leading_by_exists(prefix, mids, width, suffixes)

    # -- admin ---------------------------------------------------------------------------

    def info_memory(self) -> dict[str, Any]:
        return dict(self._guard(lambda: self.client.info("memory")))

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):  # already gone: nothing to release
                self._client.close()


def _connection_class(target: RemoteTarget, tls: TLSFiles | None) -> type[Any]:
    """Every pool's connections: TLS with ``tls``'s files (default: the system's CAs,
    hostname checked) for a ``rediss`` target, on every cluster node too; else plaintext."""
    return tls_connection_class(tls or TLSFiles()) if target.tls else _Connection
