"""The scheduler's shared index over a remote store: probes off the scheduler's thread.

No membership of its own (other engines write the store, which evicts on its own): a lookup
probes the chain's keys, every rank's, in one round trip (per cluster node) that stops at
the first miss. The probe runs on a background thread; :meth:`RemoteIndex.leading` waits for
it at most ``wait_s`` and otherwise answers PENDING (the connector asks vLLM to ask again
later), picking the answer up on a later call. Answers are used once and never cached: any
key may vanish at any time, and a load that finds one gone fails that chunk into recompute.
A probe that times out or finds the server down answers "no hit".
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence

from kvtier.contract import PENDING, KeyAddressedIndex, Pending
from kvtier.keys import Key
from kvtier.tiers.remote.client import RemoteClient, RemoteUnavailable
from kvtier.tiers.remote.keyspace import KeySpace

log = logging.getLogger("kvtier")
_STALE_S = 60.0


class _Ask:
    __slots__ = ("answer", "done", "t0")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.answer = 0
        self.t0 = time.monotonic()


class RemoteIndex(KeyAddressedIndex):
    """The shared :class:`~kvtier.contract.TierIndex` of a remote tier.

    ``world``: ranks that each store their shard (a chunk counts only when all did).
    ``wait_s``: how long :meth:`leading` may wait for a probe before answering PENDING.
    Single-threaded use (the scheduler's thread); the probe thread is internal.
    """

    def __init__(
        self, client: RemoteClient, keyspace: KeySpace, world: int = 1, wait_s: float = 0.002
    ) -> None:
        self.client = client
        self.keyspace = keyspace
        self.world = world
        self.wait_s = wait_s
        self._asks: dict[tuple[Key, Key, int], _Ask] = {}
        self._queue: queue.SimpleQueue[tuple[list[Key], int, _Ask] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="kvtier-probe", daemon=True)
        self._thread.start()
        self.pending_answers = 0
        """Lookups answered PENDING."""
        self.probes = 0
        """Probes sent (one round trip per node each)."""
        self.probe_seconds = 0.0

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            keys, start, ask = item
            t0 = time.perf_counter()
            try:
                ks = self.keyspace
                tail = keys[start:]
                mids, width = ks.mids(tail), ks.width
                ask.answer = start + self.client.leading(
                    ks.prefix, mids, width, ks.suffixes(self.world)
                )
            except RemoteUnavailable:
                ask.answer = start  # down or slow: no hit, the engine computes
            except Exception:  # a bug must not kill the prober: no hit
                log.exception("kvtier: remote probe failed")
                ask.answer = start
            self.probes += 1
            self.probe_seconds += time.perf_counter() - t0
            ask.done.set()

    def leading(self, keys: Sequence[Key], start: int = 0) -> int | Pending:
        if start >= len(keys):
            return start
        tag = (keys[start], keys[-1], start)
        ask = self._asks.get(tag)
        if ask is None:
            if not self.client.available:
                return start  # the breaker is open: answer "no hit" without a round trip
            ask = self._asks[tag] = _Ask()
            self._queue.put((list(keys), start, ask))
            if len(self._asks) > 4096:
                self._forget_stale()
        if not ask.done.wait(self.wait_s):
            self.pending_answers += 1
            return PENDING
        del self._asks[tag]
        return ask.answer

    def _forget_stale(self) -> None:
        """Drop answers nobody came back for (requests that went away)."""
        now = time.monotonic()
        self._asks = {
            t: a for t, a in self._asks.items() if not a.done.is_set() or now - a.t0 < _STALE_S
        }

    def is_ready(self, key: Key) -> bool:
        return False  # unknown without a round trip; the scheduler never needs it

    def has(self, key: Key) -> bool:
        return False  # a copy into this tier re-sends ancestors; the store skips present keys

    def clear(self) -> None:
        self._asks.clear()

    def __len__(self) -> int:
        return 0  # unknown: the server holds other engines' chunks too

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
        self.client.close()
