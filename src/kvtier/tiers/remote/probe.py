"""The remote index's probe: how many leading chunks of a chain every rank's store holds.

On a standalone server, chunks go in windows of up to COUNT_WINDOW names, each counted by
one multi-key EXISTS, the windows pipelined in one round trip (up to COUNT_DEPTH at a
time): windows fully present move on, the first that is not ends the run. That window is
counted again over its first ``c // ranks`` chunks (the run is no longer), and only when
that too falls short does the Lua probe look for the first miss. A chain present whole
(the usual hit) or a present prefix with an absent tail (the usual partial hit) costs one
or two round trips; the Lua loop, which builds every name on the server, is the slow path
(docs/benchmarks.md). The names are built as rows of an array; hiredis packs the command,
redis-py's pool and parser carry it (no protocol bytes are made here). A cluster counts
each group of chunks (one slot: :meth:`ChainProbe._leading_cluster`); pipelined EXISTS of
every name where scripting is refused.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
import numpy as np
import redis

from kvtier.tiers.remote.keyspace import TAG_CHARS

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


class ChainProbe:
    """The probe of one :class:`~kvtier.tiers.remote.client.RemoteClient` (the module
    docstring), with the probe script's state: its hash once loaded, and whether the
    server runs scripts at all.

    ``library`` returns the library's client (built on first use, inside the caller's
    guard); ``cluster``: whether it is a cluster's; ``exists_many``: the client's
    pipelined, guarded EXISTS, for the probe without scripts. Calls raise the library's
    errors as they are: the client's guard turns them into misses. Thread-safe as the
    library is (the script's hash is written whole).
    """

    def __init__(
        self,
        library: Callable[[], Any],
        cluster: bool,
        exists_many: Callable[[Sequence[bytes]], list[bool]],
    ) -> None:
        self._library = library
        self._cluster = cluster
        self._exists_many = exists_many
        self._script_sha: str | None = None
        self._script_ok = True

    @property
    def script_ok(self) -> bool:
        """Whether the probe may run its script (False once the server refused scripts)."""
        return self._script_ok

    def refuse_scripts(self) -> None:
        """Probe without scripts from now on (e.g. scripting disabled on a managed
        deployment): :meth:`leading_by_exists`."""
        self._script_ok = False

    def leading_by_exists(
        self, prefix: bytes, mids: bytes, width: int, suffixes: Sequence[bytes]
    ) -> int:
        """:meth:`leading` without scripts: every name's EXISTS, pipelined through the
        library (where scripting is refused)."""
        return self._by_exists(chunk_names(prefix, mids, width, suffixes), len(mids) // width)

    def _by_exists(self, names: Sequence[bytes], n: int) -> int:
        """The probe without scripts or slot grouping: ``names`` (every rank's, suffix by
        suffix, as :func:`chunk_names` lists them) in one pipelined EXISTS each, through
        the library (which follows a cluster's redirects); the first chunk any rank lacks."""
        present = self._exists_many(names)
        return min((i % n for i, p in enumerate(present) if not p), default=n)

    def leading(self, prefix: bytes, mids: bytes, width: int, suffixes: Sequence[bytes]) -> int:
        """How many leading chunks exist under every suffix (rank), by counting EXISTS and
        the Lua probe (the class docstring); library errors are raised as they are."""
        if self._cluster:
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
        pool = self._library().connection_pool
        conn = pool.get_connection()
        try:
            for window in windows:
                names = chunk_names(prefix, window, width, suffixes)
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
        client = self._library()
        if self._script_sha is None:
            sha = client.execute_command("SCRIPT", "LOAD", PROBE_SCRIPT, **kw)
            self._script_sha = next(iter(sha.values())) if isinstance(sha, dict) else sha
        try:
            return int(client.execute_command("EVALSHA", self._script_sha, *args, **kw))
        except redis.exceptions.NoScriptError:  # a restarted or new node
            self._script_sha = None
            return int(client.execute_command("EVAL", PROBE_SCRIPT, *args, **kw))

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
        c, n, ranks = self._library(), len(mids) // width, len(suffixes)
        # Runs start where a chunk's tag differs from the one before it (one numpy pass).
        tag = np.frombuffer(mids, dtype=np.uint8).reshape(n, width)[:, :TAG_CHARS]
        heads: list[int] = [0, *(np.flatnonzero((tag[1:] != tag[:-1]).any(axis=1)) + 1).tolist()]
        runs = list(zip(heads, [*heads[1:], n], strict=True))
        # Every name once, suffix by suffix: a run's names are slices of it.
        every = chunk_names(prefix, mids, width, suffixes)
        counts, nodes = _exists_per_run(c, mids, width, runs, every, n * ranks)
        if counts is None:  # a node answered with an error: let the library route it
            return self._by_exists(every, n)
        for r, (lo, hi) in enumerate(runs):
            if counts[r] < (hi - lo) * ranks:
                return lo + self._eval(
                    prefix, mids[lo * width : hi * width], width, suffixes, nodes[r]
                )
        return n


def chunk_names(prefix: bytes, mids: bytes, width: int, suffixes: Sequence[bytes]) -> list[bytes]:
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
