"""Which transfer jobs are in flight, and the results of those that ended."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from kvtier.jobs import JobResult


class Completions:
    """The jobs a transfer engine has in flight and the results not yet polled.

    Thread-safe: the engine's thread marks jobs :meth:`started` and polls or waits; the
    lane threads report :meth:`ended`. A job is pending from its start until its result
    is reported; results stay until one :meth:`poll` takes them, in the order they ended.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._results: list[JobResult] = []
        self._pending: set[int] = set()

    def started(self, job_ids: Iterable[int]) -> None:
        with self._cond:
            self._pending.update(job_ids)

    def ended(self, result: JobResult) -> None:
        with self._cond:
            self._pending.discard(result.job_id)
            self._results.append(result)
            self._cond.notify_all()

    def poll(self) -> list[JobResult]:
        """Results reported since the last poll."""
        with self._cond:
            out, self._results = self._results, []
        return out

    def wait(self, job_ids: Iterable[int], timeout: float | None = None) -> bool:
        """Block until none of ``job_ids`` is pending (at most ``timeout`` seconds, None:
        no limit); whether that happened. Their results stay for :meth:`poll`."""
        ids = set(job_ids)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while ids & self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def wait_any(self, job_ids: Iterable[int], timeout: float) -> bool:
        """Block until one of ``job_ids`` is no longer pending (or none is), at most
        ``timeout`` seconds; whether one was."""
        ids = set(job_ids)
        deadline = time.monotonic() + timeout
        with self._cond:
            while ids <= self._pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def pending(self) -> set[int]:
        """A copy of the ids pending now."""
        with self._cond:
            return set(self._pending)
