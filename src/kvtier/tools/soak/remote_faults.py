"""Real faults on the soak's remote tier: its ``redis-server`` killed, restarted empty, hung.

The server is a private one on loopback (:class:`~kvtier.tools.redis_server.RedisServer`,
no persistence, ``maxmemory`` + ``allkeys-lru``, so it also evicts keys on its own), started
by the soak driver; this thread acts on it at random times from a seed while the kvtier
engine serves. Every fault must end as misses and recompute in the engine, never a wrong
token, a failed request or a crash:

- ``remote_kill``: SIGKILL (a crash), down for ``down_seconds``, then started again empty;
- ``remote_restart``: a clean restart, empty (a restart without persistence);
- ``remote_hang``: SIGSTOP for ``down_seconds`` (longer than the tier's timeout), then
  SIGCONT: calls time out while connections stay open.
"""

from __future__ import annotations

import random
import threading
from collections import Counter

from kvtier.tools.redis_server import RedisServer

KINDS = ("kill", "restart", "hang")


class RemoteFaultInjector:
    """Injects server faults every ``interval`` seconds on average (exponential gaps)."""

    def __init__(
        self,
        server: RedisServer,
        seed: int,
        interval: float,
        kinds: tuple[str, ...] = KINDS,
        down_seconds: float = 0.5,
    ) -> None:
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"remote faults: unknown kinds {sorted(unknown)}")
        self.server = server
        self.rng = random.Random(seed)
        self.interval = interval
        self.kinds = kinds
        self.down_seconds = down_seconds
        self.counts: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvtier-remote-faults", daemon=True)

    def start(self) -> RemoteFaultInjector:
        self._thread.start()
        return self

    def stop(self) -> dict[str, int]:
        """Stop injecting, leave the server up and answering; the faults injected by kind."""
        self._stop.set()
        self._thread.join(timeout=30)
        self.server.resume()
        self.server.start()  # no-op when it is running
        return {f"remote_{k}": n for k, n in sorted(self.counts.items())}

    def _run(self) -> None:
        while not self._stop.wait(self.rng.expovariate(1.0 / self.interval)):
            kind = self.rng.choice(self.kinds)
            if kind == "kill":
                self.server.kill()
                self._stop.wait(self.down_seconds)
                self.server.start()
            elif kind == "restart":
                self.server.stop()
                self.server.start()
            else:
                self.server.pause()
                self._stop.wait(self.down_seconds)
                self.server.resume()
            self.counts[kind] += 1
