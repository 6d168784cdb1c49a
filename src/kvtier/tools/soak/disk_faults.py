"""Real faults on a disk tier's files, injected from a background thread.

What the injector does to the directory while an engine serves from it (every action is
a real change to the files, nothing is simulated inside kvtier):

- ``corrupt``: overwrite a few bytes inside the payload of a slot whose header is valid
  (bit rot, a torn or foreign write). The next read of that chunk must fail its checksum.
- ``truncate``: cut a slab file at a random slot boundary (a file shortened by a crash, a
  full disk or an operator). Reads of the slots past the cut come up short; a later write
  there extends the file again, leaving zeroed slots in between, which fail their checksum.
- ``enospc``: fill the directory's filesystem with a ballast file until ``ENOSPC``, hold it
  full for a while, delete it. Writes that need new blocks meanwhile get ``ENOSPC`` from
  the kernel. Only meaningful on a small filesystem (the soak mounts a tmpfs).

The schedule (which fault, which slot, the pauses) comes from a seeded RNG; when it fires
against the engine's own I/O depends on timing. Counts of what was done are kept per kind.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import threading
from collections import Counter
from pathlib import Path

from kvtier.tiers.disk.format import (
    list_slab_files,
    read_superblock,
    scan_headers,
    slab_file_name,
)

log = logging.getLogger(__name__)

KINDS = ("corrupt", "truncate", "enospc")
BALLAST = "soak-ballast.bin"


class DiskFaultInjector:
    """Injects real faults into the slab files under ``path`` (a disk tier rank directory).

    ``kinds``: which of KINDS to use; ``interval``: mean seconds between faults
    (exponential); ``enospc_seconds``: how long the filesystem stays full. Thread-safe
    counters in :attr:`counts`. ``stop()`` ends the thread and removes any ballast.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        seed: int,
        kinds: tuple[str, ...] = KINDS,
        interval: float = 1.0,
        enospc_seconds: float = 1.0,
    ) -> None:
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"disk faults: unknown kinds {sorted(unknown)}; accepted: {KINDS}")
        self.path = Path(path)
        self.kinds = kinds
        self.interval = interval
        self.enospc_seconds = enospc_seconds
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        """Faults done, by kind."""
        self.misses: Counter[str] = Counter()
        """Faults drawn but not possible at that moment (e.g. no valid slot yet)."""
        self._thread = threading.Thread(target=self._run, name="kvtier-soak-disk", daemon=True)

    def start(self) -> DiskFaultInjector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with contextlib.suppress(OSError):
            os.unlink(self.path.parent / BALLAST)

    def inject(self, kind: str) -> bool:
        """One fault of ``kind`` (one of KINDS) now, in the caller's thread, uncounted;
        False when none is possible at the moment (e.g. no valid slot yet)."""
        faults = {"corrupt": self._corrupt, "truncate": self._truncate, "enospc": self._enospc}
        if kind not in faults:
            raise ValueError(f"disk faults: unknown kind {kind!r}; accepted: {KINDS}")
        return faults[kind]()

    def _run(self) -> None:
        while not self._stop.wait(self._rng.expovariate(1.0 / self.interval)):
            kind = self._rng.choice(self.kinds)
            try:
                done = self.inject(kind)
            except OSError as e:  # the engine may be reformatting or closing: try later
                log.info("soak: %s fault not injected: %s", kind, e)
                done = False
            with self._lock:
                (self.counts if done else self.misses)[kind] += 1

    def _valid_slot(self) -> tuple[Path, int, int] | None:
        """(file, payload offset, payload bytes) of a random slot with a valid header."""
        geo = read_superblock(self.path)
        if geo is None:
            return None
        headers = scan_headers(self.path, geo)
        if not headers:
            return None
        h = self._rng.choice(headers)
        fi = h.slot // geo.slots_per_file
        return self.path / slab_file_name(fi), geo.payload_offset(h.slot), geo.slot_bytes

    def _corrupt(self) -> bool:
        found = self._valid_slot()
        if found is None:
            return False
        file, offset, length = found
        fd = os.open(file, os.O_WRONLY)
        try:
            at = offset + self._rng.randrange(max(1, length - 64))
            junk = bytes(self._rng.randrange(256) for _ in range(64))
            os.pwrite(fd, junk, at)
        finally:
            os.close(fd)
        return True

    def _truncate(self) -> bool:
        geo = read_superblock(self.path)
        files = list_slab_files(self.path)
        if geo is None or not files:
            return False
        sized = [
            (f, (f.stat().st_size - geo.header_area) // geo.stride)
            for f in (self.path / slab_file_name(fi) for fi in files)
        ]
        sized = [(f, n) for f, n in sized if n > 1]
        if not sized:
            return False
        file, slots = self._rng.choice(sized)
        keep = self._rng.randrange(slots // 2, slots)  # cut the tail: the newest slots
        # Cut inside the slot, so its payload comes up short too.
        os.truncate(file, geo.payload_offset(keep) + geo.slot_bytes // 2)
        return True

    def _enospc(self) -> bool:
        ballast = self.path.parent / BALLAST
        block = bytes(1 << 20)
        full = False
        fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while not self._stop.is_set():
                try:
                    os.write(fd, block)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    full = True
                    break
        finally:
            os.close(fd)
        if full:
            self._stop.wait(self.enospc_seconds)
        os.unlink(ballast)
        return full
