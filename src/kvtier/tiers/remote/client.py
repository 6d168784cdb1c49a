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

import binascii
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import hiredis
import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from kvtier.tiers.remote.keyspace import TAG_CHARS
from kvtier.tiers.remote.library import VALUE_CUTOFF as VALUE_CUTOFF
from kvtier.tiers.remote.library import Connection as _Connection
from kvtier.tiers.remote.library import cluster_client, tls_connection_class
from kvtier.tiers.remote.secrets import TLSFiles
from kvtier.tiers.remote.streams import Consume, Parts, exists_each, get_each, set_streamed
from kvtier.tiers.remote.url import RemoteTarget

log = logging.getLogger("kvtier")

# How many leading chunks have every rank's key. ARGV: the name prefix, the chunks' name
# middles concatenated (each ``width`` bytes), ``width``, chunks per EXISTS, then one name
# suffix per rank.
# One argument for all chunks keeps a 4,096-chunk probe cheap to send and to parse. Names
# are built here, so the keys are undeclared (allow-cross-slot-keys, Redis >= 7.0, lets the
# script touch them); in a cluster it gets one group's chunks (one slot) and goes to the
# node owning it. Each name is
# one concatenation of three strings (Lua 5.1 interns every string it makes: building a name
# in two steps cost a quarter of a 4,096-chunk probe).
PROBE_SCRIPT = (
    "#!lua flags=allow-cross-slot-keys,no-writes\n"
    "local prefix, mids, w, b = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])\n"
    "local sub, call, unpack, floor = string.sub, redis.call, unpack, math.floor\n"
    "local per, nargs = #ARGV - 4, #ARGV\n"
    "local n = #mids / w\n"
    "local i = 0\n"
    "while i < n do\n"
    # A batch of chunks in one multi-key EXISTS; only a batch with a miss goes key by key.
    "  local names, c = {}, 0\n"
    "  local last = math.min(n, i + b) - 1\n"
    "  for j = i, last do\n"
    "    local mid = sub(mids, j * w + 1, (j + 1) * w)\n"
    "    for r = 5, nargs do\n"
    "      c = c + 1\n"
    "      names[c] = prefix .. mid .. ARGV[r]\n"
    "    end\n"
    "  end\n"
    "  if call('EXISTS', unpack(names)) < c then\n"
    "    for k = 1, c do\n"
    "      if call('EXISTS', names[k]) == 0 then return i + floor((k - 1) / per) end\n"
    "    end\n"
    "  end\n"
    "  i = last + 1\n"
    "end\n"
    "return n\n"
)


CLUSTER_SLOTS = 16384
"""Hash slots of a Redis Cluster (a key's slot is CRC16 of its hash tag modulo this)."""

COUNT_WINDOW = 1024
"""Names per counting EXISTS of a probe. A probe sends its windows pipelined, so the
server counts one window while the next is packed (a 4,096-name probe is faster as four
windows than as one EXISTS: docs/benchmarks.md, "Measurements behind design choices")."""

COUNT_DEPTH = 16
"""Counting EXISTS in flight at once; a longer chain goes on in further groups only while
every window so far was present whole."""


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
            "connection_class": _connection_class(target, tls),
        }
        self._kw = kw
        self._client: Any = None
        if not target.cluster:
            host, port = target.hosts[0]
            pool = redis.ConnectionPool(host=host, port=port, db=target.db, **kw)
            self._client = redis.Redis(connection_pool=pool)

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
        ``prefix + mids[i * width : (i + 1) * width] + suffix``.

        On a standalone server, chunks go in windows of up to COUNT_WINDOW names, each
        counted by one multi-key EXISTS, the windows pipelined in one round trip (up to
        COUNT_DEPTH at a time): windows fully present move on, the first that is not ends
        the run. That window is counted again over its first ``c // ranks`` chunks (the run
        is no longer), and only when that too falls short does the Lua probe look for the
        first miss. A chain present whole (the usual hit) or a present prefix with an
        absent tail (the usual partial hit) costs one or two round trips; the Lua loop,
        which builds every name on the server, is the slow path (docs/benchmarks.md).
        The names are built as rows of an array; hiredis packs the command, redis-py's
        pool and parser carry it (no protocol bytes are made here). A cluster counts each
        group of chunks (one slot: :meth:`_leading_cluster`); pipelined EXISTS of every
        name where scripting is refused."""
        if not mids:
            return 0
        if self._script_ok:
            try:
                return self._guard(lambda: self._leading(prefix, mids, width, suffixes))  # type: ignore[no-any-return]
            except RemoteUnavailable as e:
                if "script" not in str(e).lower():
                    raise
                self._script_ok = False  # e.g. scripting disabled on a managed deployment
                self._down_until = 0.0
        return self._leading_by_exists(_names(prefix, mids, width, suffixes), len(mids) // width)

    def _leading_by_exists(self, names: Sequence[bytes], n: int) -> int:
        """The probe without scripts or slot grouping: ``names`` (every rank's, suffix by
        suffix, as :func:`_names` lists them) in one pipelined EXISTS each, through the
        library (which follows a cluster's redirects); the first chunk any rank lacks."""
        present = self.exists_many(names)
        return min((i % n for i, p in enumerate(present) if not p), default=n)

    def _leading(self, prefix: bytes, mids: bytes, width: int, suffixes: Sequence[bytes]) -> int:
        if self.target.cluster:
            return self._leading_cluster(prefix, mids, width, suffixes)
        n, ranks = len(mids) // width, len(suffixes)
        step = max(1, COUNT_WINDOW // ranks)
        group = step * COUNT_DEPTH
        for start in range(0, n, group):
            los = range(start, min(n, start + group), step)
            windows = [mids[lo * width : min(n, lo + step) * width] for lo in los]
            runs = self._count(prefix, windows, width, suffixes)
            for lo, window, count in zip(los, windows, runs, strict=True):
                size, run = len(window) // width, count // ranks
                if run == size:
                    continue
                if run and self._count(prefix, [window[: run * width]], width, suffixes)[0] < (
                    run * ranks
                ):
                    run = self._eval(prefix, window[: run * width], width, suffixes)
                return lo + run
        return n

    def _count(
        self, prefix: bytes, windows: Sequence[bytes], width: int, suffixes: Sequence[bytes]
    ) -> list[int]:
        """How many of each window's chunk names (every rank) exist: one multi-key EXISTS
        a window, all pipelined on one pooled connection, each packed by hiredis in one
        call. redis-py's ``execute_command`` would first walk every argument in Python,
        costing more than the server's own work on the probe (docs/benchmarks.md)."""
        pool = self.client.connection_pool
        conn = pool.get_connection()
        try:
            for window in windows:
                names = _names(prefix, window, width, suffixes)
                conn.send_packed_command([hiredis.pack_command((b"EXISTS", *names))])  # type: ignore[arg-type]  # stub: 1-tuple
            return [int(conn.read_response()) for _ in windows]
        except BaseException:
            conn.disconnect()  # replies may be left unread
            raise
        finally:
            pool.release(conn)

    def _eval(
        self,
        prefix: bytes,
        mids: bytes,
        width: int,
        suffixes: Sequence[bytes],
        node: Any = None,
    ) -> int:
        # 256 chunks per EXISTS: in a cluster the chunks passed are one group's (one slot).
        args: list[Any] = [0, prefix, mids, width, 256, *suffixes]
        kw = {} if node is None else {"target_nodes": node}
        if self._script_sha is None:
            sha = self.client.execute_command("SCRIPT", "LOAD", PROBE_SCRIPT, **kw)
            self._script_sha = next(iter(sha.values())) if isinstance(sha, dict) else sha
        try:
            return int(self.client.execute_command("EVALSHA", self._script_sha, *args, **kw))
        except redis.exceptions.NoScriptError:  # a restarted or new node
            self._script_sha = None
            return int(self.client.execute_command("EVAL", PROBE_SCRIPT, *args, **kw))

    def _leading_cluster(
        self, prefix: bytes, mids: bytes, width: int, suffixes: Sequence[bytes]
    ) -> int:
        """A cluster's probe. Consecutive chunks sharing a group tag (KeySpace) are one
        slot's, so each such run is counted by one multi-key EXISTS; every node gets its
        runs pipelined on one connection, all nodes before any reply is read. The first run
        (in chain order) that is not present whole is searched by the Lua probe on its
        node. A node answering with an error (a slot that moved, a cluster still forming)
        sends the whole chain through the library's pipelined EXISTS, which follows
        redirects and refreshes the slot map; a connection error or timeout is raised as
        it is (the caller's guard makes it a miss)."""
        c, n, ranks = self.client, len(mids) // width, len(suffixes)
        # Runs start where a chunk's tag differs from the one before it (one numpy pass).
        tag = np.frombuffer(mids, dtype=np.uint8).reshape(n, width)[:, :TAG_CHARS]
        heads: list[int] = [0, *(np.flatnonzero((tag[1:] != tag[:-1]).any(axis=1)) + 1).tolist()]
        runs = list(zip(heads, [*heads[1:], n], strict=True))
        # Every name once, suffix by suffix: a run's names are slices of it.
        every = _names(prefix, mids, width, suffixes)
        counts, nodes = _exists_per_run(c, mids, width, runs, every, n * ranks)
        if counts is None:  # a node answered with an error: let the library route it
            return self._leading_by_exists(every, n)
        for r, (lo, hi) in enumerate(runs):
            if counts[r] < (hi - lo) * ranks:
                return lo + self._eval(
                    prefix, mids[lo * width : hi * width], width, suffixes, nodes[r]
                )
        return n

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


def _names(prefix: bytes, mids: bytes, width: int, suffixes: Sequence[bytes]) -> list[bytes]:
    """Every chunk's name under every suffix (suffix by suffix), built as rows of one array
    per suffix (names of one suffix have one length): several times faster than
    concatenating them one by one (docs/benchmarks.md)."""
    n = len(mids) // width
    mid = np.frombuffer(mids, dtype=np.uint8).reshape(n, width)
    names: list[bytes] = []
    for suffix in suffixes:
        size = len(prefix) + width + len(suffix)
        rows = np.empty((n, size), dtype=np.uint8)
        rows[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
        rows[:, len(prefix) : len(prefix) + width] = mid
        rows[:, len(prefix) + width :] = np.frombuffer(suffix, dtype=np.uint8)
        # A fixed-width bytes array lists its items as bytes objects in one C loop; it
        # drops trailing NUL bytes, which no name has (suffixes end in a rank digit).
        names += rows.view(f"S{size}").reshape(n).tolist()
    return names


def _exists_per_run(
    c: Any,
    mids: bytes,
    width: int,
    runs: list[tuple[int, int]],
    every: list[bytes],
    total: int,
) -> tuple[list[int] | None, list[Any]]:
    """For a cluster client ``c``: each run's count of present names (one multi-key EXISTS
    per run, pipelined per node on one connection, every node sent to before any reply is
    read) and each run's node; ``(None, nodes)`` when a node answers with an error (a slot
    that moved, a cluster still forming). ``every``: all names, suffix by suffix (``total``
    of them); a run's names are slices of it. Connection errors are raised as they are."""
    n = len(mids) // width
    owners = c.nodes_manager.slots_cache
    per_node: dict[str, tuple[Any, list[int]]] = {}
    nodes: list[Any] = []
    for r, (lo, _) in enumerate(runs):
        slot = binascii.crc_hqx(mids[lo * width : lo * width + TAG_CHARS], 0) % CLUSTER_SLOTS
        held = owners.get(slot)
        # A slot the cached map lacks: the library's lookup refreshes or raises.
        node = held[0] if held else c.nodes_manager.get_node_from_slot(slot)
        nodes.append(node)
        per_node.setdefault(node.name, (node, []))[1].append(r)
    counts = [0] * len(runs)
    held_conns: list[tuple[Any, Any, list[int]]] = []
    try:
        for node, mine in per_node.values():
            pool = c.get_redis_connection(node).connection_pool
            conn = pool.get_connection()
            held_conns.append((pool, conn, mine))
            packed = []
            for r in mine:
                lo, hi = runs[r]
                names = [nm for q in range(0, total, n) for nm in every[q + lo : q + hi]]
                packed.append(hiredis.pack_command((b"EXISTS", *names)))  # type: ignore[arg-type]  # stub: 1-tuple
            conn.send_packed_command(packed)
        for _, conn, mine in held_conns:
            for r in mine:
                counts[r] = int(conn.read_response())
    except BaseException as e:
        for _, conn, _ in held_conns:
            conn.disconnect()  # replies may be left unread
        if not isinstance(e, redis.exceptions.ResponseError):
            raise
        return None, nodes
    finally:
        for pool, conn, _ in held_conns:
            pool.release(conn)
    return counts, nodes
