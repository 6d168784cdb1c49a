"""A loopback TCP proxy that cuts a connection after a chosen number of client bytes.

A test harness, not a stand-in: a real server sits behind it and every byte is forwarded
as it is. Each accepted connection gets its own upstream connection and two pump threads.
With ``cut_after = N`` set, a connection forwards exactly its first N client->server bytes
and is then cut: the client's socket is closed at once (its sends and reads fail, as on a
broken network), and the server's is half-closed after those N bytes (FIN, never a reset
that could drop bytes the server has not read yet), so the server sees exactly N bytes and
then the end of the connection. ``recorded`` keeps what each connection forwarded.

With ``stall_over = N`` set, a server->client read of N bytes or more (a value's payload,
not a probe's one-line answer) is held for ``stall_seconds`` before it is forwarded: a
link that answers small commands and times out on data, as a congested one does.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class CutProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.cut_after: int | None = None
        """Client->server bytes a connection forwards before it is cut (None: never)."""
        self.stall_over: int | None = None
        """Server->client reads of at least this many bytes are held (None: never)."""
        self.stall_seconds = 0.0
        self.stalled = 0
        """Reads held so far."""
        self.recorded: list[bytearray] = []
        """Per connection, in accept order: the client->server bytes forwarded."""
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._cut: list[threading.Event] = []  # set once a cut connection's server closed
        self._lock = threading.Lock()
        self._closed = False
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            up = socket.create_connection(self.upstream)
            for s in (client, up):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            record = bytearray()
            ended = threading.Event()
            pumps = [
                threading.Thread(target=self._forward, args=(client, up, record), daemon=True),
                threading.Thread(target=self._back, args=(up, client, ended), daemon=True),
            ]
            with self._lock:
                self.recorded.append(record)
                self._socks += [client, up]
                self._threads += pumps
                if self.cut_after is not None:
                    self._cut.append(ended)
            for t in pumps:
                t.start()

    def _forward(self, client: socket.socket, up: socket.socket, record: bytearray) -> None:
        limit = self.cut_after  # fixed when the connection starts
        try:
            while True:
                data = client.recv(1 << 16)
                if not data:
                    break
                # Recorded before it is sent: once the server answers, the record holds it.
                if limit is not None and len(record) + len(data) >= limit:
                    data = data[: limit - len(record)]
                    record += data
                    up.sendall(data)
                    break
                record += data
                up.sendall(data)
        except OSError:
            pass
        # The client's end goes at once; the server's is half-closed after what it got.
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            up.shutdown(socket.SHUT_WR)

    def _back(self, up: socket.socket, client: socket.socket, ended: threading.Event) -> None:
        """Server->client until the server ends the connection (it has then processed
        everything it was sent)."""
        try:
            while True:
                data = up.recv(1 << 16)
                if not data:
                    break
                if self.stall_over is not None and len(data) >= self.stall_over:
                    self.stalled += 1
                    time.sleep(self.stall_seconds)
                with contextlib.suppress(OSError):
                    client.sendall(data)
        except OSError:
            pass
        ended.set()
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until the server has closed every connection cut so far (so it has run
        every command it was sent). Only connections accepted while ``cut_after`` was set
        are cut, and waited for."""
        with self._lock:
            cut = list(self._cut)
        for ended in cut:
            assert ended.wait(timeout), "the server did not close a cut connection"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks, threads = list(self._socks), list(self._threads)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
        for t in [self._accepting, *threads]:
            t.join(5)
