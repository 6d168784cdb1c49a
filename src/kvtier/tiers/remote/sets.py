"""SETs sent as their values are produced: a batch of values staged a group at a time.

A store seals each value (envelope + payload) into a staging buffer before sending it.
Staging a whole batch (32 MiB) and then sending it through the library's pipeline ran at
0.72-0.78 of the raw pipelined SET here; sealing ~1 MiB at a time into one reused buffer
and handing each group to the socket at once runs at 0.89-1.12 (medians per chunk size,
same batches and round trips; ``benchmarks/remote_tier.py``). Neither the client's send
path nor the pacing alone makes that difference (the raw SET sent the same way ran at the
pipeline's speed); the staging buffer staying in cache is the likely part, not proven.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis

GROUP_BYTES = 1 << 20
"""Bytes a caller stages between two sends: small enough to stay in cache while the socket
copies them, large enough that a send's Python and system-call costs stay small."""

Fill = Callable[[int, int], Sequence[Any]]
"""``fill(lo, hi)``: the values of items ``lo .. hi - 1`` (bytes-like). They may live in one
reused buffer: each is handed to the socket before ``fill`` is called again."""


def set_sealed(
    values_client: Any, cluster: Any, names: Sequence[bytes], fill: Fill, per: int, ttl_s: int
) -> list[bool]:
    """SET ``names[j]`` for every j, the values asked of ``fill`` ``per`` items at a time and
    sent before the next group is asked for; then one reply per item, read in order.

    ``values_client``: a standalone server's client whose connections send large values
    unjoined (None for a cluster); ``cluster``: the library's cluster client, whose node
    connections carry each item to the node owning its name's slot. Per-item success: a
    value the server refused (out of memory, a slot that moved) fails only its item. A
    transport error or timeout is raised as it is (the caller's guard makes the batch a
    miss); connections with replies left unread are dropped, not reused."""
    conns: dict[str, tuple[Any, Any, list[int]]] = {}  # node -> (pool, conn, item order)

    def conn_for(name: bytes) -> tuple[Any, Any, list[int]]:
        if values_client is not None:
            key = ""
            pool = values_client.connection_pool
        else:
            node = cluster.nodes_manager.get_node_from_slot(cluster.keyslot(name))
            key = node.name
            pool = cluster.get_redis_connection(node).connection_pool
        got = conns.get(key)
        if got is None:
            got = conns[key] = (pool, pool.get_connection(), [])
        return got

    extra: tuple[Any, ...] = ("EX", ttl_s) if ttl_s else ()
    done = False
    try:
        for lo in range(0, len(names), per):
            hi = min(len(names), lo + per)
            packed: dict[int, tuple[Any, list[Any]]] = {}
            for j, value in enumerate(fill(lo, hi), lo):
                _, conn, order = conn_for(names[j])
                order.append(j)
                pieces = conn.pack_command("SET", names[j], value, *extra)
                packed.setdefault(id(conn), (conn, []))[1].extend(pieces)
            for conn, pieces in packed.values():
                conn.send_packed_command(pieces, check_health=False)
        ok = [False] * len(names)
        for _, conn, order in conns.values():
            for j in order:
                try:
                    ok[j] = conn.read_response() in (True, b"OK", "OK")
                except redis.exceptions.ResponseError:
                    ok[j] = False
        done = True
        return ok
    finally:
        for pool, conn, _ in conns.values():
            if not done:
                conn.disconnect()  # replies may be left unread
            pool.release(conn)
