"""Fault injection: a SlotStore wrapper that fails chosen keys or operations.

The wrapper is chosen by configuration (a tier's ``faults``, or the flat
``fault_injection``) and put around the kind's store by the builder
(:func:`kvtier.stack.build.make_store`); no real tier has fault code of its own. Its
failures are clean by the store contract (per chunk, never a success for wrong bytes), which
the conformance suite checks (:mod:`kvtier.conformance`).

Failures are decided per chunk from a seeded RNG (rates) and/or explicit key sets, so a
test can say "fail every read of chunk 3" or "fail 20% of writes, seed 7" and replay the
same faults. A failed read also scribbles over its destination, as a half-finished copy
would: if anything used those bytes, outputs would change and tests would see it. Slow
copies sleep before they run (a stalled device or a page-faulting slab).

By default the wrapper hides the inner store's batched row path, so every copy goes
through per-chunk ``read``/``write``. With ``FaultPlan.rows`` it keeps that path (the one
the CPU tier really uses) and fails whole row copies instead: a failed row load copies,
scribbles over the engine rows it wrote and raises; a failed row store raises before
copying. The transfer engine turns the exception into a failed job, as it would a real
copy error.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence

import numpy as np
import torch

from kvtier.contract import Buffers, Segments, SlotStore
from kvtier.contract.faults import FaultPlan
from kvtier.keys import Key

__all__ = ["FaultPlan", "FaultyStore", "InjectedFault"]

log = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    """A copy failed on purpose (fault injection)."""


class FaultyStore(SlotStore):
    """Wraps a SlotStore and fails what the FaultPlan says. Counts what it failed."""

    def __init__(self, inner: SlotStore, plan: FaultPlan) -> None:
        self.inner = inner
        self.plan = plan
        self.num_slots = inner.num_slots
        self.slot_bytes = inner.slot_bytes
        self.addressing = inner.addressing
        self._rng = random.Random(plan.seed)
        self._lock = threading.Lock()
        self.failed_reads = 0
        self.failed_writes = 0
        self.slow_ops = 0
        # What the wrapper offers of the inner store's optional copy paths (the contract's
        # declarations): where its jobs queue, and its slots' memory, which a tier-to-tier
        # copy reads in place. Never addresses (every chunk goes through read/write, where
        # faults apply); the row path and partial reads only with ``plan.rows``.
        self.network = inner.network
        self.host_payload = inner.host_payload
        self.partial_reads = plan.rows and inner.partial_reads
        log.warning("kvtier fault injection is active: %s", plan)

    def _fails(self, key: Key, rate: float, keys: set[Key], all_: bool) -> bool:
        with self._lock:
            roll = self._rng.random()
        return all_ or key in keys or roll < rate

    def _maybe_slow(self) -> None:
        p = self.plan
        if p.slow_rate <= 0:
            return
        with self._lock:
            slow = self._rng.random() < p.slow_rate
            self.slow_ops += slow
        if slow:
            time.sleep(p.slow_seconds)

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        self._maybe_slow()
        p = self.plan
        fail = [self._fails(k, p.read_fail_rate, p.fail_read_keys, p.fail_all_reads) for k in keys]
        ok = self.inner.read(slots, keys, dst)
        for i, f in enumerate(fail):
            if f:
                ok[i] = False
                for _, seg in dst[i]:
                    seg.fill_(0x5A)
        with self._lock:
            self.failed_reads += sum(fail)
        return ok

    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        self._maybe_slow()
        p = self.plan
        fail = [
            self._fails(k, p.write_fail_rate, p.fail_write_keys, p.fail_all_writes) for k in keys
        ]
        ok = self.inner.write(slots, keys, src, parents)
        with self._lock:
            self.failed_writes += sum(fail)
        return [o and not f for o, f in zip(ok, fail, strict=True)]

    # -- the batched row path and tier-to-tier copies (see the module docstring) ------------

    def supports_rows(self, engine_regions: Sequence[torch.Tensor]) -> bool:
        return self.plan.rows and self.inner.supports_rows(engine_regions)

    def payload_segments(self, slot: int) -> Segments:
        return self.inner.payload_segments(slot)

    def payload_buffers(self, slots: Sequence[int]) -> Buffers:
        return self.inner.payload_buffers(slots)

    def store_rows(
        self, engine_regions: Sequence[torch.Tensor], slab_row: int, blocks: torch.Tensor
    ) -> None:
        self._maybe_slow()
        p = self.plan
        if self._fails(b"", p.write_fail_rate, set(), p.fail_all_writes):
            with self._lock:
                self.failed_writes += 1
            raise InjectedFault(f"injected: row store at slab row {slab_row} failed")
        self.inner.store_rows(engine_regions, slab_row, blocks)

    def load_rows(
        self,
        engine_arrays: Sequence[np.ndarray],
        slab_row: int,
        blocks: np.ndarray,
        only: Sequence[int] | None = None,
    ) -> None:
        self._maybe_slow()
        p = self.plan
        touched = range(len(engine_arrays)) if only is None else only
        if p.slow_region in touched:
            # A slow copy of one region (one layer's K or V), caught half done: its rows
            # hold garbage until the copy ends. Whatever reads them early reads garbage.
            engine_arrays[p.slow_region][blocks] = 0x5A
            with self._lock:
                self.slow_ops += 1
            time.sleep(p.slow_seconds)
        fail = self._fails(b"", p.read_fail_rate, set(), p.fail_all_reads)
        self.inner.load_rows(engine_arrays, slab_row, blocks, only)
        if fail:
            for r in touched:
                engine_arrays[r][blocks] = 0x5A
            with self._lock:
                self.failed_reads += 1
            raise InjectedFault(f"injected: row load from slab row {slab_row} failed")

    def take_counters(self) -> dict[str, float]:
        return self.inner.take_counters()

    def close(self) -> None:
        self.inner.close()
