"""The remote store's client: pipelined batches over the ``redis`` library (with ``hiredis``).

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
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from kvtier.tiers.remote.url import RemoteTarget

log = logging.getLogger("kvtier")

# Index (0-based, in ARGV) of the first key that does not exist; #ARGV when all do. Keys go
# in ARGV, not KEYS, and the script may touch keys of several slots: in a cluster it is sent
# to the node that owns every key passed (allow-cross-slot-keys, Redis >= 7.0).
PROBE_SCRIPT = (
    "#!lua flags=allow-cross-slot-keys,no-writes\n"
    "for i = 1, #ARGV do\n"
    "  if redis.call('EXISTS', ARGV[i]) == 0 then return i - 1 end\n"
    "end\n"
    "return #ARGV\n"
)


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
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._down_until = 0.0
        self._lock = threading.Lock()
        self._script_sha: str | None = None
        self._script_ok = True
        kw: dict[str, Any] = {
            "username": target.username,
            "password": target.password,
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            "retry": Retry(NoBackoff(), 0),
            "max_connections": max_connections,
            "health_check_interval": 0,
        }
        if target.tls:
            kw["ssl"] = True
        self.client: Any
        if target.cluster:
            nodes = [redis.cluster.ClusterNode(h, p) for h, p in target.hosts]  # type: ignore[no-untyped-call]
            self.client = self._guard(
                lambda: redis.RedisCluster(startup_nodes=nodes, reinitialize_steps=1, **kw)
            )
        else:
            host, port = target.hosts[0]
            self.client = redis.Redis(host=host, port=port, db=target.db, **kw)

    # -- failure handling ----------------------------------------------------------------

    def _guard(self, call: Any) -> Any:
        """Run ``call``; any library error becomes RemoteUnavailable and opens the breaker."""
        if time.monotonic() < self._down_until:
            raise RemoteUnavailable(f"{self.target.display}: unavailable (backing off)")
        try:
            return call()
        except redis.RedisError as e:
            self._down_until = time.monotonic() + self.backoff_s
            # The library's messages carry hosts and reasons, never the password.
            msg = f"{self.target.display}: {type(e).__name__}: {e}"
            log.warning("kvtier: remote tier %s", msg)
            raise RemoteUnavailable(msg) from None

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

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
        per-item success."""

        def run() -> list[Any]:
            p = self._pipeline()
            for k, v in items:
                p.set(k, v, ex=ttl_s or None)
            return list(p.execute(raise_on_error=False))

        return [v is True for v in self._guard(run)]

    def delete(self, keys: Sequence[bytes]) -> None:
        self._guard(lambda: [self.client.delete(k) for k in keys])

    # -- probe ---------------------------------------------------------------------------

    def leading(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` exist, in one round trip per node holding them (a Lua
        loop that stops at the first miss); pipelined EXISTS where scripting is refused."""
        if not keys:
            return 0
        if self._script_ok:
            try:
                return self._guard(lambda: self._leading_script(keys))  # type: ignore[no-any-return]
            except RemoteUnavailable as e:
                if "script" not in str(e).lower() and "NOSCRIPT" not in str(e):
                    raise
                self._script_ok = False  # e.g. scripting disabled on a managed deployment
                self._down_until = 0.0
        present = self.exists_many(keys)
        return present.index(False) if False in present else len(keys)

    def _eval(self, keys: Sequence[bytes], node: Any = None) -> int:
        if self._script_sha is None:
            load = ["SCRIPT", "LOAD", PROBE_SCRIPT]
            if self.target.cluster:
                self._script_sha = self.client.execute_command(*load, target_nodes="primaries")
                if isinstance(self._script_sha, dict):
                    self._script_sha = next(iter(self._script_sha.values()))
            else:
                self._script_sha = self.client.execute_command(*load)
        args = ["EVALSHA", self._script_sha, 0, *keys]
        try:
            if node is None:
                return int(self.client.execute_command(*args))
            return int(self.client.execute_command(*args, target_nodes=node))
        except redis.exceptions.NoScriptError:  # a restarted or new node
            args[:2] = ["EVAL", PROBE_SCRIPT]
            self._script_sha = None
            if node is None:
                return int(self.client.execute_command(*args))
            return int(self.client.execute_command(*args, target_nodes=node))

    def _leading_script(self, keys: Sequence[bytes]) -> int:
        if not self.target.cluster:
            return self._eval(keys)
        # Group by owning node, keeping each group in chain order; the chain's leading run
        # ends at the first miss of any node.
        c = self.client
        groups: dict[str, tuple[Any, list[int], list[bytes]]] = {}
        for i, k in enumerate(keys):
            node = c.nodes_manager.get_node_from_slot(c.keyslot(k))
            g = groups.setdefault(node.name, (node, [], []))
            g[1].append(i)
            g[2].append(k)
        end = len(keys)
        for node, positions, group in groups.values():
            if positions[0] >= end:
                continue
            n = self._eval(group[: sum(1 for p in positions if p < end)], node)
            if n < len(positions) and positions[n] < end:
                end = positions[n]
        return end

    # -- admin ---------------------------------------------------------------------------

    def info_memory(self) -> dict[str, Any]:
        return dict(self._guard(lambda: self.client.info("memory")))

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already gone: nothing to release
            self.client.close()
