"""Values streamed to and from the store: each part handled while it is still in cache.

Both directions of a batch (32 MiB) go on one connection per node, commands packed by the
library (``pack_command``) and replies read by its parser, one at a time:

- **SETs**: the caller yields each value as consecutive pieces (its source's own memory,
  PART_BYTES at a time, then the envelope), each checksummed just before it is yielded,
  and every piece goes to the socket as soon as it is yielded: nothing is copied into a
  value buffer. The library packs the SET around a stand-in of the value's length (its
  pure-Python packer hands that buffer on as its own piece) and the pieces are sent in
  its place, so every protocol byte is the library's. Sealing whole values into a buffer
  first (one checksum pass over the staged bytes, then one send) ran at 0.85-0.91 of the
  raw pipelined SET here at 4 MiB values; copied part by part into a buffer, 1.01-1.11;
  sent from the source, 1.11-1.34 (medians, standalone and cluster). That beats the raw
  SET because a part read once (by the checksum) right before the kernel copies it goes
  faster than the kernel's copy of a whole value from memory: the raw SET's own bytes,
  read and sent in 256 KiB parts, ran up to 1.2x its plain speed
  (``benchmarks/remote_tier.py --sends``).
- **GETs**: every read of the batch is sent, then each reply is checked and scattered as
  soon as it is read, and dropped, so its memory is reused for the next (the pipeline held
  all 32 MiB of fresh replies before the first was checked: 0.77-0.84 of the raw pipelined
  GET at 1-4 MiB values; streamed, 0.98-1.03). A read is ``GETRANGE name 0 limit``: it
  never fetches more than ``limit + 1`` bytes, whatever someone with write access made the
  value (a 256 MiB value planted under a chunk name costs one byte more than a good value,
  not a download that outlasts the timeout), and a value of another Redis type answers
  WRONGTYPE, handed on as :data:`WRONG_TYPE` (a bad value, not a miss).

Per-item success; a transport error or timeout is raised as it is (the caller's guard makes
the batch a miss), and connections with a command half sent or replies left unread are
dropped, not reused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import redis

PART_BYTES = 256 << 10
"""Bytes of a value checksummed and sent at a time: small enough to stay in a core's cache
(L2) from the checksum to the send, large enough that a send's Python and system-call costs
stay small."""

JOIN_BELOW = 64 << 10
"""Pieces shorter than this (a command's framing, an envelope, small values' parts) are
joined, up to PART_BYTES, into one send rather than a system call each."""

Parts = Callable[[int], Iterable[Any]]
"""``parts(j)``: item j's value as consecutive pieces (bytes-like, C-contiguous), in order.
Each piece is sent (or copied) before the next is asked for, so a piece's memory may be
reused for the next."""

Consume = Callable[[int, "bytes | None"], None]
"""``consume(j, value)``: item j's value as read: bytes (at most the read's limit + 1;
empty when the name is missing or its value empty), :data:`WRONG_TYPE` (the name holds
another Redis type), or None (another error reply, e.g. a cluster slot that moved); the
value is not used after the call returns."""


class WrongType(bytes):
    """The (empty) value of a name holding a list, hash, set or other non-string type: a
    bad value, which a reader treats like any value of the wrong length."""


WRONG_TYPE = WrongType()


class _Conns:
    """One pooled connection per node a batch touches, with the items sent on each in
    order: ``client``'s own pool on a standalone server; in a ``cluster``, the pool of the
    node owning each name's slot."""

    def __init__(self, client: Any, cluster: bool) -> None:
        self.client, self.cluster = client, cluster
        self.held: dict[str, tuple[Any, Any, list[int]]] = {}  # node -> (pool, conn, items)
        self.node_of: dict[bytes, Any] = {}  # hash tag -> node: a group's names share one
        self.read_all = False

    def route(self, name: bytes, item: int) -> Any:
        c = self.client
        if self.cluster:
            start = name.find(b"{")  # kvtier's names always carry a non-empty tag
            tag = name[start : name.find(b"}", start)] if start >= 0 else name
            n = self.node_of.get(tag)
            if n is None:  # the library's slot and node lookup is slow: once per tag
                n = self.node_of[tag] = c.nodes_manager.get_node_from_slot(c.keyslot(name))
            node = n.name
        else:
            n, node = None, ""
        got = self.held.get(node)
        if got is None:
            pool = c.get_redis_connection(n).connection_pool if n is not None else c.connection_pool
            got = self.held[node] = (pool, pool.get_connection(), [])
        got[2].append(item)
        return got[1]

    def replies(self) -> Any:
        """``(item, reply or ResponseError)`` for every item sent, node by node, in order."""
        for _, conn, items in self.held.values():
            for j in items:
                try:
                    yield j, conn.read_response()
                except redis.exceptions.ResponseError as e:
                    yield j, e
        self.read_all = True

    def release(self) -> None:
        for pool, conn, _ in self.held.values():
            if not self.read_all:
                conn.disconnect()
            pool.release(conn)


class _Out:
    """Bytes bound for one connection, sent in order: pieces of JOIN_BELOW bytes or more go
    to the socket as they are, shorter ones are copied and joined into one send.

    All of them go to one socket. The library reconnects a connection that was closed
    before a send (another thread's ``ConnectionPool.disconnect``, a cluster client's
    ``close``), which would put the rest of a half-sent value at the start of a new
    session, where the server reads it as commands. So a send finding the socket gone or
    replaced raises ConnectionError instead; the caller drops the connection."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.held: list[bytes] = []
        self.size = 0
        self.sock: Any = None  # the socket of the first send; every later one must match

    def put(self, piece: Any) -> None:
        if len(piece) >= JOIN_BELOW:
            self.flush()
            self._send(piece)
            return
        self.held.append(bytes(piece))  # the buffer behind a part is about to be reused
        self.size += len(piece)
        if self.size >= PART_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.held:
            self._send(b"".join(self.held))
            self.held, self.size = [], 0

    def _send(self, data: Any) -> None:
        if self.sock is not None and self.conn._sock is not self.sock:
            raise redis.exceptions.ConnectionError(
                "connection closed while a command was half sent (not resumed on a new one)"
            )
        self.conn.send_packed_command([data], check_health=False)
        self.sock = self.conn._sock


def set_streamed(
    client: Any, cluster: bool, names: Sequence[bytes], length: int, parts: Parts, ttl_s: int
) -> list[bool]:
    """SET ``names[j]`` to the concatenation of ``parts(j)`` (``length`` bytes, for every j),
    each piece sent as soon as it is yielded; per-item success (a value the server refused,
    out of memory or a slot that moved, fails only its item). Pieces that add up to any other
    length raise ValueError before a byte too many is sent (the connection, its command
    half sent, is dropped). A connection whose packer copies values (not kvtier's: see
    ``RemoteClient``) gets each value joined first."""
    conns = _Conns(client, cluster)
    outs: dict[int, _Out] = {}
    extra: tuple[Any, ...] = ("EX", ttl_s) if ttl_s else ()
    # Zeros the allocator maps lazily: never touched, never sent.
    stand_in = np.zeros(length, dtype=np.uint8).data
    try:
        for j, name in enumerate(names):
            conn = conns.route(name, j)
            out = outs.get(id(conn)) or outs.setdefault(id(conn), _Out(conn))
            pieces = conn.pack_command("SET", name, stand_in, *extra)
            at = next((i for i, p in enumerate(pieces) if p is stand_in), None)
            if at is None:
                # Copied piece by piece: a piece's memory may hold the next one.
                value = b"".join(bytes(p) for p in _exactly(length, parts(j)))
                for piece in conn.pack_command("SET", name, value, *extra):
                    out.put(piece)
                continue
            for piece in pieces[:at]:
                out.put(piece)
            for piece in _exactly(length, parts(j)):
                out.put(piece)
            for piece in pieces[at + 1 :]:
                out.put(piece)
        for out in outs.values():
            out.flush()
        ok = [False] * len(names)
        for j, reply in conns.replies():
            ok[j] = reply in (True, b"OK", "OK")
        return ok
    finally:
        conns.release()


def _exactly(length: int, pieces: Iterable[Any]) -> Iterator[memoryview]:
    """``pieces`` as flat byte views, checked to add up to ``length`` bytes: a piece that
    would run past it, or an end short of it, raises ValueError (before that piece is
    handed on). Counted in bytes whatever a buffer's item size, so the count always matches
    what the socket sends."""
    sent = 0
    for piece in pieces:
        view = memoryview(piece)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        sent += len(view)
        if sent > length:
            raise ValueError(f"a value's pieces run past its {length} bytes")
        yield view
    if sent != length:
        raise ValueError(f"a value's pieces add up to {sent} bytes, not {length}")


def _send_each(
    conns: _Conns, command: str, names: Sequence[bytes], args: tuple[Any, ...] = ()
) -> None:
    """``command name *args`` for every name, all of a node's in one send (packed by the
    library)."""
    per_conn: dict[int, tuple[Any, list[Any]]] = {}
    for j, name in enumerate(names):
        conn = conns.route(name, j)
        per_conn.setdefault(id(conn), (conn, []))[1].append((command, name, *args))
    for conn, commands in per_conn.values():
        conn.send_packed_command(conn.pack_commands(commands), check_health=False)


def exists_each(client: Any, cluster: bool, names: Sequence[bytes]) -> list[bool]:
    """Whether each name exists: every EXISTS sent first, then the replies read (faster
    than the library's pipeline and much faster than its cluster pipeline: docs/benchmarks.md,
    "Measurements behind design choices"). An error reply (a slot that moved) counts as
    absent."""
    conns = _Conns(client, cluster)
    try:
        _send_each(conns, "EXISTS", names)
        present = [False] * len(names)
        for j, reply in conns.replies():
            present[j] = reply == 1
        return present
    finally:
        conns.release()


def get_each(
    client: Any, cluster: bool, names: Sequence[bytes], consume: Consume, limit: int
) -> None:
    """Read every name's first ``limit + 1`` bytes at most (``GETRANGE name 0 limit``, all
    sent first), handing each reply to ``consume`` as it is read: a value longer than
    ``limit`` arrives cut at ``limit + 1`` bytes, so the caller sees it is too long without
    the server sending the rest. A WRONGTYPE reply is :data:`WRONG_TYPE`, any other error
    reply None."""
    conns = _Conns(client, cluster)
    try:
        _send_each(conns, "GETRANGE", names, (0, limit))
        for j, reply in conns.replies():
            if isinstance(reply, bytes):
                consume(j, reply)
            elif isinstance(reply, redis.exceptions.ResponseError) and str(reply).startswith(
                "WRONGTYPE"
            ):
                consume(j, WRONG_TYPE)
            else:
                if isinstance(reply, redis.exceptions.NoPermissionError):
                    _warn_noperm()
                consume(j, None)
    finally:
        conns.release()


_NOPERM_WARNED: list[bool] = []


def _warn_noperm() -> None:
    """Once per process: an ACL user granted ``GET`` by an older kvtier lacks ``GETRANGE``."""
    if not _NOPERM_WARNED:
        _NOPERM_WARNED.append(True)
        logging.getLogger("kvtier").warning(
            "kvtier: the store refused GETRANGE (NOPERM): loads are misses until kvtier's "
            "ACL user is granted +getrange (docs/security.md, section 6)"
        )
