"""The tests' Redis harness (kvtier.tools.redis_server): where its ports come from, and what
a start on a port another process holds does."""

from __future__ import annotations

import socket

import pytest

from kvtier.tools import redis_server
from kvtier.tools.redis_server import RedisServer, free_port, redis_available

pytestmark = pytest.mark.skipif(not redis_available(), reason="redis-server is not installed")


def test_free_ports_lie_below_the_ephemeral_range():
    """Client sockets take their local ports from the kernel's ephemeral range: a server
    port (or its cluster bus port, +10000) there could be taken before the server binds."""
    low = redis_server._ephemeral_low()
    for _ in range(200):
        port = free_port()
        assert port >= 10000 and port + 10000 < max(low, 21000)


@pytest.fixture
def held_port():
    """A loopback port another socket is listening on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
        s.listen()
        yield s.getsockname()[1]


def test_a_chosen_port_taken_meanwhile_is_replaced(held_port, monkeypatch):
    ports = iter([held_port])
    real = redis_server.free_port
    monkeypatch.setattr(redis_server, "free_port", lambda: next(ports, None) or real())
    server = RedisServer()
    try:
        assert server.port != held_port
        assert redis_server._ping(server.port)
    finally:
        server.close()


def test_a_given_port_that_is_taken_fails_naming_why(held_port):
    with pytest.raises(RuntimeError, match="Address already in use"):
        RedisServer(port=held_port)
