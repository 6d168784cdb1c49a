"""Sealing ahead: a second thread seals a batch's values while the sending thread sends.

A sealed store spends its time on its crypto (AES-GCM or keyed BLAKE3) and on the send
(the kernel's copy): docs/security-costs.md has the measured split. Both release the
interpreter, so two threads can do them at once: while the sender sends value j, the
helper seals values after j.

The split is dynamic, and every value is sealed exactly once, by whichever thread gets to
it first:

- the **helper** claims the next value past both the sender's position and its own last
  claim, as long as a buffer is free, and seals it into that buffer (``work``);
- the **sender** takes the values in order: one nobody has claimed it seals itself into
  a free buffer and sends whole, as it sends the helper's (inline, each part just before
  it is sent, only when no buffer is free); one already sealed it sends from its buffer,
  then frees the buffer; one still being sealed by the helper it waits for, sealing the
  next unclaimed value into a free buffer meanwhile, so neither thread idles while there
  is work. Sealed whole, a value goes out in one send: interleaving each part's crypto
  with its own send cost the sender ~5 % more CPU here (more, smaller sends, each with
  its share of the kernel's network work), for no gain in speed.

So a helper that is slow or not scheduled (a busy machine) costs the sender at most the
wait for the one value the helper is sealing; a fast one leaves the sender only sends.
Buffers are the store's, reused batch after batch; at most ``slots`` values are sealed
ahead. Ownership: a buffer is the sealing thread's until the value is marked done, then
the sender's until it is sent, then free. A batch's helper has stopped (nothing of the
batch runs on) when :meth:`SealAhead.batch` exits, even if the send failed half-way.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

AHEAD_BYTES = 4 << 20
"""Bytes of values sealed ahead at most (at least two values)."""

Work = Callable[[int, Callable[[], memoryview]], Sequence[Any]]
"""``work(j, buffer)``: value j sealed ahead, as the pieces to send (in order); ``buffer()``
gives this claim's buffer (``value_bytes`` long) when the pieces must live in one."""

Inline = Callable[[int], Iterator[Any]]
"""``inline(j)``: value j's pieces, each sealed just before it is yielded (as without a
helper)."""

_PENDING = object()


class SealAhead:
    """One store's helper thread and buffers for sealing ahead (see the module docstring).
    One batch at a time: a second concurrent batch gets ``None`` and seals inline."""

    def __init__(self, pool: ThreadPoolExecutor, value_bytes: int) -> None:
        self.pool = pool
        self.value_bytes = value_bytes
        self.slots = max(2, AHEAD_BYTES // max(1, value_bytes))
        self._bufs: list[bytearray | None] = [None] * self.slots
        self._busy = threading.Lock()
        self.by_helper = 0
        """Values the helper thread has sealed (written by it alone; for tests and stats)."""

    def buffer(self, slot: int) -> memoryview:
        buf = self._bufs[slot]
        if buf is None:  # made on first use: a MAC of host memory never needs one
            buf = self._bufs[slot] = bytearray(self.value_bytes)
        return memoryview(buf)

    @contextlib.contextmanager
    def batch(self, n: int, work: Work, inline: Inline) -> Iterator[Any]:
        """``parts(j)`` for ``n`` values (asked for in order 0..n-1, each consumed before
        the next is asked for), with the helper sealing ahead for as long as this lasts;
        ``None`` when another batch holds the helper."""
        if not self._busy.acquire(blocking=False):
            yield None
            return
        run = _Batch(self, n, work, inline)
        helper = None
        try:
            helper = self.pool.submit(run.help)
            yield run.parts
        finally:
            run.stop()
            if helper is not None:
                helper.result()  # the helper's own failure is a bug: raise it here
            self._busy.release()


class _Batch:
    """The shared state of one batch: who sealed what, which buffers are free.

    One lock, two conditions: the sender waits for a value being sealed (``sealed``),
    the helper for a free buffer (``room``). Each side is woken only when the other is
    waiting, and the helper only once half the buffers are free again, so a helper that
    runs ahead is not woken (a system call and a thread switch) for every value sent."""

    def __init__(self, owner: SealAhead, n: int, work: Work, inline: Inline) -> None:
        self.owner, self.n, self.work, self.inline = owner, n, work, inline
        self.lock = threading.Lock()
        self.sealed = threading.Condition(self.lock)
        self.room = threading.Condition(self.lock)
        self.sender_waits = self.helper_waits = False
        self.at = 0  # the value the sender is at (it seals value 0 itself)
        self.next = 1  # the helper's next claim at the earliest
        self.done: dict[int, Any] = {}  # j -> _PENDING, or (slot, pieces or exception)
        self.free = list(range(owner.slots))
        self.wake_at = max(1, owner.slots // 2)
        self.stopped = False

    def _claim(self) -> tuple[int, int] | None:
        """(value, slot) of the next value to seal ahead, or None; under the lock."""
        j = max(self.next, self.at + 1)
        if self.stopped or j >= self.n or not self.free:
            return None
        self.next = j + 1
        self.done[j] = _PENDING
        return j, self.free.pop()

    def _seal(self, j: int, slot: int) -> None:
        """Seal value j into ``slot`` (outside the lock), then mark it done."""
        result: Any
        try:
            result = self.work(j, lambda: self.owner.buffer(slot))
        except BaseException as e:  # handed to the sender, which raises it
            result = e
        with self.lock:
            self.done[j] = (slot, result)
            if self.sender_waits:
                self.sealed.notify()

    def help(self) -> None:
        """The helper's loop: claim, seal, until the batch ends or nothing is left."""
        while True:
            with self.lock:
                while (got := self._claim()) is None:
                    if self.stopped or max(self.next, self.at + 1) >= self.n:
                        return
                    self.helper_waits = True
                    self.room.wait()
                    self.helper_waits = False
            self._seal(*got)
            self.owner.by_helper += 1

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
            self.room.notify()

    def parts(self, j: int) -> Iterator[Any]:
        with self.lock:
            self.at = j
            claimed = self.done.get(j)
            if claimed is None and self.free:
                # Nobody has claimed j (so j >= next): seal it here, into a buffer, and
                # send it whole as the helper's values go.
                self.next = j + 1
                self.done[j] = _PENDING
                slot = self.free.pop()
                self.lock.release()
                try:
                    self._seal(j, slot)
                finally:
                    self.lock.acquire()
                claimed = self.done[j]
            while claimed is _PENDING:
                got = self._claim()  # seal further ahead while the helper is busy
                if got is None:
                    self.sender_waits = True
                    self.sealed.wait()
                    self.sender_waits = False
                else:
                    self.lock.release()
                    try:
                        self._seal(*got)
                    finally:
                        self.lock.acquire()
                claimed = self.done[j]
            if claimed is not None:
                del self.done[j]
        if claimed is None:
            return self.inline(j)
        return self._sealed(*claimed)

    def _sealed(self, slot: int, result: Any) -> Iterator[Any]:
        try:
            if isinstance(result, BaseException):
                raise result
            yield from result
        finally:
            with self.lock:
                self.free.append(slot)
                if self.helper_waits and len(self.free) >= self.wake_at:
                    self.room.notify()


class HelperThreads:
    """A store's helper threads, each started on first use and shut by :meth:`close`: the
    *sealer* (:class:`SealAhead`, for values of ``seal_from`` bytes and more; None: every
    value sealed inline) and the *opener* (``open_ahead``: sealed values opened while the
    next reply is read). Thread-safe."""

    def __init__(self, value_bytes: int, seal_from: int | None, open_ahead: bool) -> None:
        self.value_bytes = value_bytes
        self.seal_from = seal_from
        self.open_ahead = open_ahead
        self._lock = threading.Lock()  # the sealer's start
        self._pools_lock = threading.Lock()
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._ahead: SealAhead | None = None

    @property
    def sealing_ahead(self) -> bool:
        """Whether a batch has been sealed ahead (the sealer started)."""
        return self._ahead is not None

    @contextlib.contextmanager
    def sealing(self, n: int, ahead: Work, inline: Inline) -> Iterator[Inline]:
        """``parts(j)`` for a batch of ``n`` values: sealed ahead on the sealer thread where
        that pays, else ``inline``."""
        least = self.seal_from
        if n < 2 or least is None or self.value_bytes < least:
            yield inline
            return
        with self._lock:
            if self._ahead is None:
                self._ahead = SealAhead(self._pool_of("_sealer"), self.value_bytes)
        with self._ahead.batch(n, ahead, inline) as parts:
            yield parts or inline

    def opener(self) -> ThreadPoolExecutor | None:
        """The opener thread; None (open inline) without ``open_ahead``."""
        return self._pool_of("_opening") if self.open_ahead else None

    def _pool_of(self, which: str) -> ThreadPoolExecutor:
        with self._pools_lock:
            pool = self._pools.get(which)
            if pool is None:
                pool = self._pools[which] = ThreadPoolExecutor(1, f"kvtier{which}")
            return pool

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown()
