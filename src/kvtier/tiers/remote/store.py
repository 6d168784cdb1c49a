"""A worker's data plane on a remote store: one value per chunk and rank, payload + envelope.

Writes seal every chunk into a single value, the payload followed by its envelope
(:mod:`kvtier.tiers.envelope`: key, parent, namespace, length, payload checksum), and, on a
tier with a secret, a MAC or AES-GCM around both (:mod:`kvtier.tiers.remote.auth`), so no
metadata can be evicted apart from its data. They skip keys already present (another engine
stored them): one EXISTS per write job, then SETs of the rest, each value sent from its
source's own memory part by part, each part checksummed (and MACed or encrypted) just
before it is sent. Reads send a batch's GETs and check each value as it arrives; a value
that is missing, truncated, stored under another key or namespace, fails its checksum or
its tag, fails that chunk, and so does a timeout or a dead server (the engine recomputes).

Self-healing: a value that is present but fails a check is deleted after the batch and its
name remembered, so the next store of that chunk sets it again instead of skipping it as
present (even if the delete failed); such values are counted (``auth_failures``: a bad tag,
``bad_values``: any other check) and so are the deletes (``healed``). Values are opaque
bytes: nothing read is unpickled or evaluated.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, cast

import numpy as np
import torch

from kvtier.keys import Key
from kvtier.tiers.base import Segments, SlotStore
from kvtier.tiers.envelope import HEADER_BYTES, pack_envelope, payload_hasher, unseal
from kvtier.tiers.remote.auth import ValueAuth
from kvtier.tiers.remote.client import RemoteClient, RemoteUnavailable
from kvtier.tiers.remote.keyspace import KeySpace
from kvtier.tiers.remote.streams import PART_BYTES

_ZEROS = memoryview(bytes(PART_BYTES))
"""What a value holds where no segment covers its payload."""

log = logging.getLogger("kvtier")

OPEN_AHEAD_BYTES = 1 << 20
"""Sealed values at least this long are opened on a second thread while the next reply is
read. On this (heavily shared, 2-core) machine that read 1.2x faster at 1 and 4 MiB
values and 0.6x at 256 KiB (a thread hand-off per value costs more than it overlaps)."""

SUSPECTS_MAX = 1 << 16
"""Names remembered as holding a bad value (forgotten all at once past this)."""


class RemoteStore(SlotStore):
    """One rank's key-addressed store on a :class:`RemoteClient` (slot numbers are ignored).

    ``namespace``: this rank's ``Namespace.digest()``, sealed into and checked on every
    value. ``auth``: the tier's MAC or AEAD (None without a secret; its namespace and
    payload length must be this store's). ``batch_bytes`` caps one pipelined round trip (a
    job's chunks go in several).
    Failure granularity: per chunk. Thread-safe. ``network = True`` puts its jobs on the
    transfer engine's network queue, apart from disk I/O.
    """

    addressing = "key"
    network = True

    def __init__(
        self,
        client: RemoteClient,
        keyspace: KeySpace,
        slot_bytes: int,
        namespace: bytes,
        rank: int = 0,
        *,
        num_slots: int = 0,
        ttl_s: int = 0,
        batch_bytes: int = 32 << 20,
        auth: ValueAuth | None = None,
    ) -> None:
        self.client = client
        self.keyspace = keyspace
        self.slot_bytes = slot_bytes
        self.num_slots = num_slots
        self.namespace = namespace
        self.rank = rank
        self.ttl_s = ttl_s
        if auth is not None and (auth.namespace, auth.payload_bytes) != (namespace, slot_bytes):
            raise ValueError("auth seals another namespace or payload length than this store")
        self.auth = auth
        self.value_bytes = slot_bytes + HEADER_BYTES + (auth.overhead if auth else 0)
        self.batch = max(1, batch_bytes // max(1, self.value_bytes))
        self.bad_reads = 0
        """Chunks read missing, truncated, foreign or corrupt (or lost to a timeout)."""
        self.skipped_writes = 0
        """Chunks not written because the store already had them."""
        self.failed_writes = 0
        self.auth_failures = 0
        """Values present whose MAC or AES-GCM tag failed (forged, changed, moved)."""
        self.bad_values = 0
        """Values present that failed another check (truncated, foreign, checksum)."""
        self.healed = 0
        """Bad values deleted after they were read."""
        self._suspects: set[bytes] = set()
        # Ticks of this store's SETs (at start and end) and the names being set: a bad
        # value read while this store was setting that name is not deleted (the delete
        # could land after the honest value).
        self._ticks = itertools.count(1)
        self._tick = 0
        self._set_at: dict[bytes, int] = {}
        self._setting: set[bytes] = set()
        self._reported: dict[str, int] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pools: dict[str, ThreadPoolExecutor] = {}

    def _staging(self) -> torch.Tensor:
        """This thread's host buffer for one part of a device segment (PART_BYTES), reused
        for every part: a part is sent before the next is asked for."""
        buf: torch.Tensor | None = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = torch.empty(PART_BYTES, dtype=torch.uint8)
        return buf

    def _parts(self, key: Key, parent: Key | None, chunk: Segments) -> Iterator[Any]:
        """The chunk's value (payload, then envelope) as pieces of at most PART_BYTES, each
        added to the checksum just before it is yielded (so it is in cache when sent): host
        segments as views of their own memory, device segments through this thread's host
        buffer, zeros where no segment covers the payload, the envelope last. Segments must
        not overlap nor run past ``slot_bytes``. A source changed while it is sent fails the
        checksum on reading (a miss, never wrong bytes)."""
        csum = payload_hasher(key, self.namespace)
        pos = 0
        for off, seg in [*sorted(chunk, key=lambda s: s[0]), (self.slot_bytes, None)]:
            if off < pos:
                raise ValueError(f"segments overlap or overrun the payload at offset {off}")
            for lo in range(pos, off, len(_ZEROS)):  # a gap
                piece = _ZEROS[: min(off, lo + len(_ZEROS)) - lo]
                csum.update(piece)
                yield piece
            if seg is None:
                break
            flat = seg.reshape(-1)
            host = flat.numpy().data if seg.device.type == "cpu" else None
            pos = off + flat.numel()
            for lo in range(0, flat.numel(), PART_BYTES):
                hi = min(flat.numel(), lo + PART_BYTES)
                if host is not None:
                    piece = host[lo:hi]
                else:
                    buf = self._staging()[: hi - lo]
                    buf.copy_(flat[lo:hi])
                    piece = buf.numpy().data
                csum.update(piece)
                yield piece
        yield pack_envelope(key, parent, self.namespace, 0, self.slot_bytes, csum.intdigest())

    def _spans(self, n: int) -> list[tuple[int, int]]:
        return [(lo, min(n, lo + self.batch)) for lo in range(0, n, self.batch)]

    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        """One pipelined EXISTS for the whole job skips the keys present (a round trip per
        batch cost ~5 % of a store's speed here), then the rest go in batches of one round
        trip each: each value's parts sent as they are checksummed (:meth:`_parts`,
        :mod:`kvtier.tiers.remote.streams`), the replies read at the batch's end. A failed
        EXISTS fails the job's chunks, a failed batch its own."""
        names = self.keyspace.names(keys, self.rank)
        try:
            ok = self.client.exists_each(names)
        except RemoteUnavailable:
            self.failed_writes += len(keys)
            return [False] * len(keys)
        suspects = self._suspects
        todo = [i for i, p in enumerate(ok) if not p or names[i] in suspects]
        self.skipped_writes += len(keys) - len(todo)

        auth = self.auth

        def parts(j: int) -> Iterator[Any]:
            i = batch[j]
            plain = self._parts(keys[i], parents[i] if parents else None, src[i])
            # Sealed inline: MACing or encrypting each part on a second thread while the
            # one before was sent ran no faster here (256 KiB values: half the speed).
            return auth.seal(names[i], plain) if auth else plain

        for lo, hi in self._spans(len(todo)):
            batch = todo[lo:hi]
            sealed = [names[i] for i in batch]
            self._mark(sealed, True)
            try:
                wrote = self.client.set_streamed(sealed, self.value_bytes, parts, self.ttl_s)
            except RemoteUnavailable:
                wrote = [False] * len(batch)
            finally:
                self._mark(sealed, False)
            for i, w in zip(batch, wrote, strict=True):
                ok[i] = w
                if w:
                    suspects.discard(names[i])
            self.failed_writes += wrote.count(False)
        return ok

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        """One round trip per batch: every GET sent, then each value checked and scattered
        as soon as it is read (:mod:`kvtier.tiers.remote.streams`). Sealed values are opened
        (MAC or AES-GCM) on this store's opener thread while the next reply is read (both
        release the interpreter), all done before this returns."""
        ok: list[bool] = []
        names = self.keyspace.names(keys, self.rank)
        bad: list[bytes] = []
        since = self._tick
        opener = self._opener()
        for lo, hi in self._spans(len(keys)):
            good = [False] * (hi - lo)
            opening: list[Future[None]] = []

            def check(j: int, value: bytes | None, lo: int = lo, good: list[bool] = good) -> None:
                i = lo + j
                good[j] = self._unpack(names[i], keys[i], value, dst[i])
                if value is not None and not good[j]:
                    bad.append(names[i])

            def consume(
                j: int, value: bytes | None, check: Any = check, opening: Any = opening
            ) -> None:
                if opener is None or value is None:
                    check(j, value)
                else:
                    opening.append(opener.submit(check, j, value))

            try:
                self.client.get_each(names[lo:hi], consume)
            except RemoteUnavailable:
                wait(opening)
                good[:] = [False] * (hi - lo)  # some may be scattered: the engine recomputes
            for f in opening:
                f.result()  # a bug raises here, as it would unthreaded
            self.bad_reads += good.count(False)
            ok += good
        if bad:
            self._heal(bad, since)
        return ok

    def _opener(self) -> ThreadPoolExecutor | None:
        """The thread opening this store's sealed values while the next reply is read;
        None (open inline) without a secret or below OPEN_AHEAD_BYTES."""
        if self.auth is None or self.value_bytes < OPEN_AHEAD_BYTES:
            return None
        return self._pool_of("_opening")

    def _pool_of(self, which: str) -> ThreadPoolExecutor:
        with self._lock:
            pool = self._pools.get(which)
            if pool is None:
                pool = self._pools[which] = ThreadPoolExecutor(1, f"kvtier{which}")
            return pool

    def _mark(self, names: list[bytes], start: bool) -> None:
        tick = self._tick = next(self._ticks)
        if len(self._set_at) + len(names) > SUSPECTS_MAX:
            self._set_at.clear()
        for name in names:
            self._set_at[name] = tick
            if start:
                self._setting.add(name)
            else:
                self._setting.discard(name)

    def _heal(self, names: list[bytes], since: int) -> None:
        """Delete values that failed a check (read after tick ``since``), and store those
        names again next time even if present. Names this store was setting meanwhile are
        left alone; a delete racing another engine's honest store may drop that value: a
        miss, never wrong bytes."""
        names = [n for n in names if n not in self._setting and self._set_at.get(n, 0) <= since]
        if not names:
            return
        if len(self._suspects) + len(names) > SUSPECTS_MAX:
            self._suspects.clear()
        self._suspects.update(names)
        try:
            self.client.delete(names)
        except RemoteUnavailable:
            return  # the next store overwrites them anyway
        self.healed += len(names)

    def take_counters(self) -> dict[str, float]:
        """Bad values and heals since the last call (the ``remote_*`` metrics)."""
        now = {
            "remote_auth_failures": self.auth_failures,
            "remote_bad_values": self.bad_values,
            "remote_healed_values": self.healed,
        }
        out = {k: float(v - self._reported.get(k, 0)) for k, v in now.items()}
        self._reported = now
        return {k: v for k, v in out.items() if v}

    def _unpack(self, name: bytes, key: Key, value: bytes | None, chunk: Segments) -> bool:
        if value is None:
            return False
        plain: bytes | None = value
        if self.auth is not None:
            # unseal reads any buffer: the opened value may be a view of a reused buffer.
            plain = cast("bytes | None", self.auth.open(name, value))
            if plain is None:
                self.auth_failures += 1
                return False
        payload = unseal(plain, key, self.namespace, self.slot_bytes, tail=True)
        if payload is None:
            self.bad_values += 1
            return False
        data = np.frombuffer(payload, dtype=np.uint8)
        for off, seg in chunk:
            part = data[off : off + seg.numel()]
            if seg.device.type == "cpu":
                seg.numpy()[...] = part.reshape(seg.shape)
            else:
                seg.copy_(torch.from_numpy(part.copy()).view(seg.shape))
        return True

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown()
        self.client.close()
