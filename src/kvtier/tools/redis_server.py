"""Real ``redis-server`` processes for tests and benchmarks: standalone and a 3-master cluster.

Every server binds 127.0.0.1 on a free port, keeps no persistence (``--save ''
--appendonly no``) and lives in a temporary directory; :meth:`RedisServer.stop` (or the
context manager) ends it, and :func:`atexit` stops whatever a crashed test left behind, so
no server outlives the process that started it. Needs ``redis-server`` and ``redis-cli``
on the PATH (``scripts/setup.sh`` installs them).

``tls`` (a :class:`~kvtier.tools.tls_certs.TLSCerts`) serves TLS only (``--port 0``,
``--tls-port``), requiring a client certificate from the same CA; ``acl`` lines
(``user NAME on >PASSWORD ~pattern +command ...``) go into an ACL file beside the default
user, which stays the tests' unrestricted administrator (or takes ``password``).
"""

from __future__ import annotations

import atexit
import contextlib
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from kvtier.tools.tls_certs import TLSCerts

_LIVE: set[RedisServer] = set()


def redis_available() -> bool:
    return shutil.which("redis-server") is not None and shutil.which("redis-cli") is not None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (where it picks client sockets'
    local ports); 32768 where it cannot be read."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free loopback port whose cluster bus port (+10000) is free too (Redis Cluster
    needs both). Both lie below the kernel's ephemeral range: a port in it can be taken,
    between this check and the server's bind, by any client socket's local end (another
    test's connection), which fails the server's start."""
    rng = random.Random()
    top = max(11000, _ephemeral_low() - 10000)
    for _ in range(1000):
        port = rng.randrange(10000, top)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free loopback port pair found")


def _ping(port: int, password: str | None = None, tls: TLSCerts | None = None) -> bool:
    """One RESP PING over a raw socket (start-up probe only; clients use the library)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as raw:
            s: socket.socket = raw
            if tls:
                ctx = ssl.create_default_context(cafile=str(tls.ca))
                ctx.load_cert_chain(str(tls.client_cert), str(tls.client_key))
                ctx.check_hostname = False  # a probe of our own server; tests check names
                s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            if password:
                s.sendall(f"AUTH {password}\r\n".encode())
                s.recv(64)
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` on 127.0.0.1:``port``; restartable (always empty: no persistence)."""

    def __init__(
        self,
        *,
        maxmemory: str | None = None,
        policy: str = "allkeys-lru",
        password: str | None = None,
        cluster: bool = False,
        port: int | None = None,
        extra: Sequence[str] = (),
        tls: TLSCerts | None = None,
        acl: Sequence[str] = (),
    ) -> None:
        self.port = port or free_port()
        self._own_port = port is None
        self._started = False
        self.tls = tls
        self.acl = list(acl)
        self.maxmemory = maxmemory
        self.policy = policy
        self.password = password
        self.cluster = cluster
        self.extra = list(extra)
        self.dir = Path(tempfile.mkdtemp(prefix=f"kvtier-redis-{self.port}-"))
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            self.start()
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def cli(self) -> list[str]:
        """``redis-cli`` arguments reaching this server as its administrator."""
        a = ["-p", str(self.port)]
        if self.tls:
            t = self.tls
            a += ["--tls", "--cacert", str(t.ca), "--cert", str(t.client_cert)]
            a += ["--key", str(t.client_key)]
        if self.password:
            a += ["-a", self.password, "--no-auth-warning"]
        return a

    def args(self) -> list[str]:
        a = [
            "redis-server",
            "--port",
            "0" if self.tls else str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--logfile",
            str(self.dir / "redis.log"),
            "--enable-debug-command",
            "local",
        ]
        if self.maxmemory:
            a += ["--maxmemory", self.maxmemory, "--maxmemory-policy", self.policy]
        if self.password:
            a += ["--requirepass", self.password]
        if self.tls:
            t = self.tls
            a += ["--tls-port", str(self.port), "--tls-cert-file", str(t.server_cert)]
            a += ["--tls-key-file", str(t.server_key), "--tls-ca-cert-file", str(t.ca)]
            a += ["--tls-auth-clients", "yes"]
            if self.cluster:
                a += ["--tls-cluster", "yes"]
        if self.acl:
            acl = self.dir / "users.acl"
            acl.write_text("".join(line + "\n" for line in self.acl))
            acl.chmod(0o600)
            a += ["--aclfile", str(acl)]
        if self.cluster:
            a += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                str(self.dir / "nodes.conf"),
                "--cluster-node-timeout",
                "2000",
                "--cluster-require-full-coverage",
                "no",
            ]
        return a + self.extra

    def start(self) -> None:
        """Start (or restart, empty) the server and wait until it answers. At the first
        start, a port this object chose that another process took meanwhile is replaced
        by another free one (a few times); a restart keeps the port its clients know."""
        for attempt in range(5):
            try:
                self._start()
                self._started = True
                return
            except RuntimeError as e:
                taken = "Address already in use" in str(e)
                if self._started or not (self._own_port and taken) or attempt == 4:
                    raise
                self.port = free_port()

    def _start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        (self.dir / "nodes.conf").unlink(missing_ok=True)
        (self.dir / "redis.log").unlink(missing_ok=True)  # its tail says why a start failed
        self.proc = subprocess.Popen(
            self.args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _LIVE.add(self)
        deadline = time.monotonic() + 10
        while not _ping(self.port, self.password, self.tls):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"redis-server on port {self.port} did not start: {log}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL, as a crash would (the data is gone: no persistence)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: the server stops answering, connections stay open (a hung server)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        _LIVE.discard(self)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RedisCluster:
    """``masters`` cluster-enabled servers joined into one Redis Cluster (no replicas;
    ``cluster-require-full-coverage no``, so losing a master loses only its slots). One
    master gets every slot by itself (``redis-cli --cluster create`` wants three);
    ``tls`` and ``acl`` as for :class:`RedisServer` (TLS on the cluster bus too)."""

    def __init__(
        self,
        masters: int = 3,
        *,
        maxmemory: str | None = None,
        password: str | None = None,
        tls: TLSCerts | None = None,
        acl: Sequence[str] = (),
    ) -> None:
        self.nodes: list[RedisServer] = []
        self.tls = tls
        try:
            for _ in range(masters):
                self.nodes.append(
                    RedisServer(
                        cluster=True, maxmemory=maxmemory, password=password, tls=tls, acl=acl
                    )
                )
            first = self.nodes[0].cli()
            if masters == 1:
                cmd = [*first, "cluster", "addslotsrange", "0", str(16383)]
            else:
                hosts = [f"127.0.0.1:{n.port}" for n in self.nodes]
                cmd = [*first[2:], "--cluster", "create", *hosts, "--cluster-replicas", "0"]
                cmd.append("--cluster-yes")
            subprocess.run(["redis-cli", *cmd], check=True, capture_output=True, timeout=60)
            self.wait_ok()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        scheme = "rediss+cluster" if self.tls else "redis+cluster"
        return f"{scheme}://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def wait_ok(self, timeout: float = 20) -> None:
        """Until every live node reports ``cluster_state:ok`` and sees every slot."""
        deadline = time.monotonic() + timeout
        while True:
            states = [
                subprocess.run(
                    ["redis-cli", *n.cli(), "cluster", "info"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout
                for n in self.nodes
                if n.proc is not None
            ]
            if all("cluster_state:ok" in s for s in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis cluster did not become ready: {states}")
            time.sleep(0.1)

    def close(self) -> None:
        for n in self.nodes:
            n.close()

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.close()
