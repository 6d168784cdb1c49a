"""What kvtier takes from the ``redis`` library beyond its documented client API, in one
place: the connection classes every pool (standalone or per cluster node) is built with,
and how a cluster client is made so that its nodes get them.

Floors (pyproject.toml), kept true by ``make test-floors``, which runs the remote, TLS and
secrets tests on exactly those versions:

* ``redis>=7.4``. What the code calls needs 5.3: ``ConnectionPool.get_connection()``
  without a command name (5.2 requires one; :mod:`kvtier.tiers.remote.streams` and the
  probe call it), the connection's ``_construct_command_packer`` hook and
  ``PythonRespSerializer`` (5.0), ``RedisCluster(url=..., connection_class=...)`` building
  every node's pool with that class. 7.4 is the first release whose ``repr`` of a client
  or pool shows ``password=<REDACTED>`` instead of the password (redis-py #3998), and a
  shared tier's password must not reach a log through a repr.
* ``hiredis>=3.2``. ``hiredis.pack_command`` (the probe's multi-key EXISTS) exists from
  2.2, but redis-py 6.2 and later ignore hiredis older than 3.2 and parse replies in
  Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import redis
from redis.connection import PythonRespSerializer

from kvtier.tiers.remote.secrets import TLSFiles

VALUE_CUTOFF = 6000
"""Arguments longer than this (bytes) go to the socket unjoined (the library's default)."""


def cluster_client(hosts: Sequence[tuple[str, int]], kw: dict[str, Any]) -> Any:
    """A cluster client on the seeds ``hosts``, its nodes' connections of
    ``kw["connection_class"]``: given a URL (the first seed's), the library builds every
    node's pool with that class; given host and port, it drops the argument."""
    (host, port), *seeds = hosts
    nodes = [redis.cluster.ClusterNode(h, p) for h, p in seeds]  # type: ignore[no-untyped-call]
    url = f"redis://[{host}]:{port}" if ":" in host else f"redis://{host}:{port}"
    return redis.RedisCluster(url=url, startup_nodes=nodes, reinitialize_steps=1, **kw)


class _PlainValues:
    """Packs commands with the library's pure-Python packer, which hands each large or
    ``memoryview`` argument to the socket as its own buffer; the default (hiredis's)
    copies every value into one request buffer (pipelined SETs of 256 KiB values ran at
    ~0.55 of the speed here, and on a cluster each copy landed on fresh pages: ~190 minor
    faults per MiB stored)."""

    encoder: Any

    def _construct_command_packer(self, packer: Any) -> Any:
        return packer or PythonRespSerializer(VALUE_CUTOFF, self.encoder.encode)


class Connection(_PlainValues, redis.Connection):
    """A plaintext connection packing with :class:`_PlainValues`."""


class SSLConnection(_PlainValues, redis.SSLConnection):
    """A TLS connection packing with :class:`_PlainValues`; its TLS settings are the
    class's (:func:`tls_connection_class`)."""

    tls: ClassVar[dict[str, Any]] = {}

    def __init__(self, **kw: Any) -> None:
        # The TLS settings ride on the class, not in the pool's keyword arguments: the
        # sync cluster client forwards only the keys it knows to its nodes' pools (which
        # ones depends on the library's version: ssl_check_hostname from 6.1, never
        # ssl_min_version), but it keeps connection_class.
        super().__init__(**{**kw, **self.tls})


def tls_connection_class(tls: TLSFiles) -> type[SSLConnection]:
    """A connection class for every pool of one client: TLS with ``tls``'s files."""
    return type("TLSConnection", (SSLConnection,), {"tls": tls.connection_kwargs()})
