"""Whether a DiskSlab's operations may run (open, files present), which are in flight, and
the counts of what went wrong in them."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from kvtier.tiers.disk.files import SlabFiles

log = logging.getLogger("kvtier.tiers.disk.slab")


class SlabGate:
    """The way in for every operation on one slab's files.

    :meth:`enter` admits an operation while the slab is open and its files are present
    (a removed file disables the slab for good, logged once); :meth:`close` refuses new
    operations and waits for those in flight, so the files are never closed under one.
    The counters are bumped by the read and write paths (:meth:`count`).
    """

    def __init__(self, files: SlabFiles) -> None:
        self._files = files
        self.corrupt_reads = 0
        self.io_errors = 0
        self.stale_reads = 0
        self.unavailable = False
        self._closed = False
        self._active = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)

    def enter(self, slots: Sequence[int]) -> bool:
        """Admit an operation on ``slots``: True while the slab is open and the files
        holding ``slots`` are still there (none given: no file check), and then it must be
        paired with :meth:`exit`; False: the operation fails every chunk."""
        with self._lock:
            if self._closed or self.unavailable:
                return False
            self._active += 1
        if len(slots) == 0 or not self._files.removed(slots):
            return True
        self._disable()
        self.exit()
        return False

    def exit(self) -> None:
        """An admitted operation is done."""
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._idle.notify_all()

    def _disable(self) -> None:
        """A file the batch touches was unlinked: writes would vanish at close and reads
        hold space the operator freed. Disable the slab (logged once)."""
        with self._lock:
            first = not self.unavailable
            self.unavailable = True
        if first:
            log.error(
                "kvtier disk tier: slab files in %s were removed while in use; the disk "
                "tier is disabled until restart",
                self._files.path,
            )

    def count(self, io: int = 0, corrupt: int = 0, stale: int = 0) -> None:
        """Add to the counters: I/O errors, checksum mismatches, stale keys."""
        with self._lock:
            self.io_errors += io
            self.corrupt_reads += corrupt
            self.stale_reads += stale

    def close(self) -> bool:
        """Refuse new operations and wait for those in flight. False if it was closed
        already (idempotent close)."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            while self._active:
                self._idle.wait()
        return True
