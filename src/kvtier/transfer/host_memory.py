"""Host buffers for the CPU tier: pinned when CUDA is present, plain memory otherwise.

Two ways to get one:

- :func:`alloc_host_buffer`: small scratch buffers, allocated (and pre-faulted) at once.
- :class:`HostBuffer`: the CPU tier's slab. Usable as soon as it is returned; its pages are
  made ready (faulted in, and page-locked on CUDA) by a background thread, slice by slice in
  the order the caller gives, so engine start-up does not wait for gigabytes of page faults
  or pinning (seconds for a tier of a few GiB: docs/benchmarks.md, ``startup``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import threading
import time
from collections.abc import Sequence

import torch

log = logging.getLogger(__name__)

MADV_POPULATE_WRITE = 23
"""Linux >= 5.14: fault pages in writable without changing their contents."""
MADV_HUGEPAGE = 14
CUDA_HOST_REGISTER_PORTABLE = 1
SLICE_BYTES = 16 << 20
"""Bytes made ready per step of the background thread: small enough that a stop request is
honoured (and the address-space lock released) within milliseconds, large enough that the
per-call cost vanishes."""
WARM_NICE = 10
"""Niceness of the background thread: the work has to be done once, but the engine's own
threads come first (on a 2-core machine it would otherwise take a core from the forward
pass for as long as it runs)."""


def cuda_available() -> bool:
    """True when a CUDA device can be used (pinning is only possible then)."""
    return torch.cuda.is_available()


def alloc_host_buffer(nbytes: int, *, prefault: bool = True) -> torch.Tensor:
    """A 1-D uint8 host tensor of ``nbytes``.

    Pinned (page-locked) when CUDA is available, so device copies can be asynchronous;
    never pinned on CPU-only torch, where ``pin_memory=True`` raises. With ``prefault`` the
    pages are touched now: a first write to fresh pages is page-fault bound, which would
    otherwise land on the first stores.
    """
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda_available())
    if prefault and nbytes:
        buf.zero_()
    return buf


_libc: ctypes.CDLL | None = None


def _madvise(addr: int, length: int, advice: int) -> int:
    """``madvise`` through ctypes (which releases the GIL for the call); 0 or an errno."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise.restype = ctypes.c_int
    if _libc.madvise(addr, length, advice) == 0:
        return 0
    return ctypes.get_errno() or -1


class HostBuffer:
    """A large host buffer, usable at once, made ready in the background.

    Contract:

    - ``tensor`` (1-D uint8, ``nbytes``) may be read and written from the moment the
      constructor returns. Its initial contents are zero (fresh anonymous memory).
    - Readiness: a daemon thread walks ``spans`` (``(offset, length)`` byte ranges, in the
      given order; default: the whole buffer in SLICE_BYTES pieces) and makes each ready:
      on CPU it faults the pages in with ``MADV_POPULATE_WRITE``, which never changes their
      contents, so it may run while copies use the same pages; on CUDA it page-locks each
      span with ``cudaHostRegister`` (which faults the pages in too). Until a span is
      ready, copies still work: the first touch of a page costs a page fault, and a device
      copy of a span not yet page-locked is synchronous instead of asynchronous.
      :attr:`ready_bytes` and :attr:`ready_spans` say how far it got.
    - CUDA: a copy must never cross two spans (each is its own registration), so the
      caller passes spans aligned to its copy units (the CPU slab: one region x a range of
      slots). Registration failures (e.g. the page-lock limit) stop the thread and are
      logged; copies then stay synchronous, never wrong.
    - ``close()`` stops the thread, waits for it, unregisters what was registered. The
      memory itself is freed when the last tensor view of it is gone. Idempotent.
    """

    def __init__(
        self,
        nbytes: int,
        spans: Sequence[tuple[int, int]] | None = None,
        *,
        background: bool = True,
        huge_pages: bool = True,
        pin: bool | None = None,
    ) -> None:
        self.nbytes = nbytes
        self._pin = cuda_available() if pin is None else pin
        self._map: mmap.mmap | None = None
        if nbytes:
            # Our own anonymous mapping: page-aligned, untouched until used, zero-filled.
            self._map = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self.tensor = torch.frombuffer(self._map, dtype=torch.uint8)
            self.address = self.tensor.data_ptr()
            if huge_pages:
                # Transparent huge pages where the kernel allows them: populating (and
                # later TLB use) costs a fraction of 4 KiB pages. Advisory only.
                _madvise(self.address, nbytes, MADV_HUGEPAGE)
        else:
            self.tensor = torch.empty(0, dtype=torch.uint8)
            self.address = 0
        if spans is None:
            spans = [(o, min(SLICE_BYTES, nbytes - o)) for o in range(0, nbytes, SLICE_BYTES)]
        for off, length in spans:
            if off < 0 or length < 0 or off + length > nbytes:
                raise ValueError(f"span ({off}, {length}) outside a {nbytes}-byte buffer")
        self.spans = tuple(s for s in spans if s[1] > 0)
        """The non-empty spans, in the order they are made ready."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._registered: list[int] = []
        self.ready_spans = 0
        """Spans made ready so far (a prefix of ``spans``)."""
        self.ready_bytes = 0
        """Bytes of those spans."""
        self.ready_seconds: float | None = None
        """Seconds the background work took, once it is complete."""
        self.pinned = False
        """True once every span is page-locked (CUDA only)."""
        self._thread: threading.Thread | None = None
        if self.spans and background:
            self._thread = threading.Thread(target=self._run, name="kvtier-host-warm", daemon=True)
            self._thread.start()
        elif self.spans:
            self._run()

    def _run(self) -> None:
        if self._thread is not None:
            with contextlib.suppress(OSError, AttributeError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WARM_NICE)
        t0 = time.perf_counter()
        populate = not self._pin
        for off, length in self.spans:
            if self._stop.is_set():
                return
            if self._pin:
                if not self._register(off, length):
                    return
            elif populate:
                err = _madvise(self.address + off, length, MADV_POPULATE_WRITE)
                if err:
                    # Older kernel: pages fault on first use instead. Correct, slower start.
                    log.info("kvtier: MADV_POPULATE_WRITE unavailable (errno %d)", err)
                    populate = False
            with self._lock:
                self.ready_spans += 1
                self.ready_bytes += length
        self.pinned = self._pin
        self.ready_seconds = time.perf_counter() - t0

    def _register(self, off: int, length: int) -> bool:
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        # Portable: pinned for every CUDA context, whichever device this thread has current
        # (a new thread starts on device 0; the engine may run on another).
        err = cudart.cudaHostRegister(self.address + off, length, CUDA_HOST_REGISTER_PORTABLE)
        code = int(getattr(err, "value", err))
        if code != 0:
            log.warning(
                "kvtier: cudaHostRegister of %d bytes failed (code %d); the rest of the CPU "
                "tier stays pageable (synchronous device copies)",
                length,
                code,
            )
            return False
        with self._lock:
            self._registered.append(self.address + off)
        return True

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until every span is ready (or the thread stopped); True if all are."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.ready_spans == len(self.spans)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            registered, self._registered = self._registered, []
        if registered:
            cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
            # Every copy that used these pages finished: the transfer engine closes its
            # queues (waiting for their streams) before it closes the stores.
            for addr in registered:
                cudart.cudaHostUnregister(addr)
