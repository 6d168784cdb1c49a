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
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from kvtier.tiers.remote.url import RemoteTarget

log = logging.getLogger("kvtier")

# How many leading chunks have every rank's key. ARGV: the name prefix, the chunks' name
# middles concatenated (each ``width`` bytes), ``width``, chunks per EXISTS, then one name
# suffix per rank.
# One argument for all chunks keeps a 4,096-chunk probe cheap to send and to parse. Names
# are built here, so the script may touch keys of several slots: in a cluster it is sent to
# the node owning every chunk passed (allow-cross-slot-keys, Redis >= 7.0).
PROBE_SCRIPT = (
    "#!lua flags=allow-cross-slot-keys,no-writes\n"
    "local prefix, mids, w, b = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])\n"
    "local n = #mids / w\n"
    "local i = 0\n"
    "while i < n do\n"
    # A batch of chunks in one multi-key EXISTS; only a batch with a miss goes key by key.
    "  local names = {}\n"
    "  local last = math.min(n, i + b) - 1\n"
    "  for j = i, last do\n"
    "    local name = prefix .. string.sub(mids, j * w + 1, (j + 1) * w)\n"
    "    for r = 5, #ARGV do names[#names + 1] = name .. ARGV[r] end\n"
    "  end\n"
    "  if redis.call('EXISTS', unpack(names)) < #names then\n"
    "    local per = #ARGV - 4\n"
    "    for k = 1, #names do\n"
    "      if redis.call('EXISTS', names[k]) == 0 then return i + math.floor((k - 1) / per) end\n"
    "    end\n"
    "  end\n"
    "  i = last + 1\n"
    "end\n"
    "return n\n"
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
        self._kw = kw
        self._client: Any = None
        if not target.cluster:
            host, port = target.hosts[0]
            self._client = redis.Redis(host=host, port=port, db=target.db, **kw)

    @property
    def client(self) -> Any:
        """The library's client. A cluster client is built on first use, inside the
        caller's guard: it contacts a seed to learn the slot map, and a cluster that is
        down when the engine starts must cost misses, not the engine's start."""
        if self._client is None:
            nodes = [redis.cluster.ClusterNode(h, p) for h, p in self.target.hosts]  # type: ignore[no-untyped-call]
            self._client = redis.RedisCluster(startup_nodes=nodes, reinitialize_steps=1, **self._kw)
        return self._client

    # -- failure handling ----------------------------------------------------------------

    def _guard(self, call: Any) -> Any:
        """Run ``call``; any library error becomes RemoteUnavailable and opens the breaker."""
        if time.monotonic() < self._down_until:
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

    def leading(self, prefix: bytes, mids: Sequence[bytes], suffixes: Sequence[bytes]) -> int:
        """How many leading chunks exist under every suffix (rank): chunk i's names are
        ``prefix + mids[i] + suffix``, all ``mids`` of one width. One round trip per node
        holding them (a Lua loop that stops at the first miss); pipelined EXISTS where
        scripting is refused."""
        if not mids:
            return 0
        if self._script_ok:
            try:
                return self._guard(lambda: self._leading_script(prefix, mids, suffixes))  # type: ignore[no-any-return]
            except RemoteUnavailable as e:
                if "script" not in str(e).lower():
                    raise
                self._script_ok = False  # e.g. scripting disabled on a managed deployment
                self._down_until = 0.0
        names = [prefix + m + s for m in mids for s in suffixes]
        present = self.exists_many(names)
        first = present.index(False) if False in present else len(names)
        return first // len(suffixes)

    def _eval(
        self, prefix: bytes, mids: Sequence[bytes], suffixes: Sequence[bytes], node: Any = None
    ) -> int:
        width = len(mids[0])
        # A multi-key EXISTS must stay in one slot in a cluster: one chunk (its ranks share
        # the hash tag) per EXISTS there, 256 chunks per EXISTS on a standalone server.
        batch = 1 if self.target.cluster else 256
        args: list[Any] = [0, prefix, b"".join(mids), width, batch, *suffixes]
        kw = {} if node is None else {"target_nodes": node}
        if self._script_sha is None:
            sha = self.client.execute_command("SCRIPT", "LOAD", PROBE_SCRIPT, **kw)
            self._script_sha = next(iter(sha.values())) if isinstance(sha, dict) else sha
        try:
            return int(self.client.execute_command("EVALSHA", self._script_sha, *args, **kw))
        except redis.exceptions.NoScriptError:  # a restarted or new node
            self._script_sha = None
            return int(self.client.execute_command("EVAL", PROBE_SCRIPT, *args, **kw))

    def _leading_script(
        self, prefix: bytes, mids: Sequence[bytes], suffixes: Sequence[bytes]
    ) -> int:
        if not self.target.cluster:
            return self._eval(prefix, mids, suffixes)
        # Group chunks by owning node (every rank of a chunk shares its hash tag), keeping
        # each group in chain order; the chain's leading run ends at any node's first miss.
        c = self.client
        groups: dict[str, tuple[Any, list[int], list[bytes]]] = {}
        for i, m in enumerate(mids):
            node = c.nodes_manager.get_node_from_slot(c.keyslot(prefix + m + suffixes[0]))
            g = groups.setdefault(node.name, (node, [], []))
            g[1].append(i)
            g[2].append(m)
        end = len(mids)
        for node, positions, group in groups.values():
            if positions[0] >= end:
                continue
            take = sum(1 for p in positions if p < end)
            n = self._eval(prefix, group[:take], suffixes, node)
            if n < take:
                end = positions[n]
        return end

    # -- admin ---------------------------------------------------------------------------

    def info_memory(self) -> dict[str, Any]:
        return dict(self._guard(lambda: self.client.info("memory")))

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already gone: nothing to release
            if self._client is not None:
                self._client.close()
