"""A worker's data plane on a remote store: one value per chunk and rank, payload + envelope.

Writes seal every chunk into a single value, the payload followed by its envelope
(:mod:`kvtier.tiers.envelope`: key, parent, namespace, length, payload checksum), and, on a
tier with a secret, a MAC or AES-GCM around both (:mod:`kvtier.tiers.remote.auth`), so no
metadata can be evicted apart from its data. They skip keys already present (another engine
stored them): one EXISTS per write job, then SETs of the rest, each value sent from its
source's own memory part by part, each part checksummed (or, on a tier with a secret,
MACed or encrypted instead: the tag covers what the checksum would, and the envelope says
so) just before it is sent (with a secret, values of SEAL_AHEAD_BYTES and more are sealed on a
helper thread while the ones before them are sent: :mod:`kvtier.tiers.remote.ahead`).
Reads send a batch's GETs and check each value as it arrives; a value that is missing,
truncated, stored under another key or namespace, fails its checksum or its tag, fails
that chunk, and so does a timeout or a dead server (the engine recomputes).

Self-healing: a value that is present but fails a check (of another length or Redis type
included: reads fetch at most one byte more than a good value) is deleted after the read,
all such names in one round trip, and its name remembered, so the next store of that
chunk sets it again instead of skipping it as present (even if the delete failed); such
values are counted (``auth_failures``: a bad tag, ``bad_values``: any other check) and so
are the deletes (``healed``). Values are opaque
bytes: nothing read is unpickled or evaluated.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, wait
from typing import Any, cast

import numpy as np
import torch

from kvtier.contract import Segments, SlotStore
from kvtier.keys import Key
from kvtier.tiers.envelope import HEADER_BYTES, unwrap
from kvtier.tiers.remote.ahead import HelperThreads
from kvtier.tiers.remote.auth import MODE_MAC, ValueAuth
from kvtier.tiers.remote.client import RemoteClient, RemoteUnavailable
from kvtier.tiers.remote.heal import Healer
from kvtier.tiers.remote.keyspace import KeySpace
from kvtier.tiers.remote.plain import PlainParts
from kvtier.tiers.remote.streams import WRONG_TYPE

log = logging.getLogger("kvtier")

OPEN_AHEAD_BYTES = 1 << 20
"""Sealed values at least this long are opened on a second thread while the next reply is
read. On this (heavily shared, 2-core) machine that read 1.2x faster at 1 and 4 MiB
values and 0.6x at 256 KiB (a thread hand-off per value costs more than it overlaps)."""

SEAL_AHEAD_BYTES = 256 << 10
"""Sealed values at least this long are sealed ahead on a second thread while the sender
sends (:mod:`kvtier.tiers.remote.ahead`); shorter ones inline, where a hand-off per value
weighs more per byte. The measurement behind the threshold
(``benchmarks/remote_tier.py --inline-sealing``) is in docs/benchmarks.md, "Measurements
behind design choices"."""


class RemoteStore(SlotStore):
    """One rank's key-addressed store on a :class:`RemoteClient` (slot numbers are ignored).

    ``namespace``: this rank's ``Namespace.digest()``, sealed into and checked on every
    value. ``auth``: the tier's MAC or AEAD (None without a secret; its namespace and
    payload length must be this store's). ``batch_bytes`` caps one pipelined round trip (a
    job's chunks go in several). ``seal_ahead_bytes``: with ``auth``, values at least
    this long are sealed ahead of the send on a helper thread
    (:mod:`kvtier.tiers.remote.ahead`), shorter ones (all with None) part by part inline,
    each just before it is sent.
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
        seal_ahead_bytes: int | None = SEAL_AHEAD_BYTES,
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
        self.healer = Healer(client)
        """Bad values deleted after a read, their names set again (``healer.healed``)."""
        self._reported: dict[str, int] = {}
        # Under a tag, the envelope's own payload checksum would be a second pass over
        # every byte that detects nothing the tag does not.
        self.parts = PlainParts(slot_bytes, checksum=auth is None)
        """How each value is cut into parts and checksummed as it is sent (to read)."""
        self.seal_ahead_bytes = seal_ahead_bytes
        sealed = auth is not None
        self.threads = HelperThreads(
            self.value_bytes,
            seal_ahead_bytes if sealed else None,
            open_ahead=sealed and self.value_bytes >= OPEN_AHEAD_BYTES,
        )
        """The sealer and opener threads (:mod:`kvtier.tiers.remote.ahead`)."""

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
        trip each: each value's parts sent as they are checksummed
        (:mod:`kvtier.tiers.remote.plain`, :mod:`kvtier.tiers.remote.streams`) and sealed
        (inline, or ahead on a helper thread: :meth:`HelperThreads.sealing`), the replies
        read at the batch's end. A failed EXISTS fails the job's chunks, a failed batch its own."""
        names = self.keyspace.names(keys, self.rank)
        try:
            ok = self.client.exists_each(names)
        except RemoteUnavailable:
            self.failed_writes += len(keys)
            return [False] * len(keys)
        healer = self.healer
        todo = healer.to_write(names, ok)
        self.skipped_writes += len(keys) - len(todo)

        auth = self.auth

        def plain(j: int) -> Iterator[Any]:
            i = batch[j]
            return self.parts(keys[i], parents[i] if parents else None, src[i], self.namespace)

        def parts(j: int) -> Iterator[Any]:
            """Value j sealed part by part as it is sent."""
            return auth.seal(names[batch[j]], plain(j)) if auth else plain(j)

        def ahead(j: int, buffer: Any) -> Sequence[Any]:
            """Value j sealed at once, on the helper thread (or while waiting for it): a
            MAC of host memory goes with views of it, anything else into ``buffer``."""
            assert auth is not None
            if auth.mode == MODE_MAC and all(g.device.type == "cpu" for _, g in src[batch[j]]):
                return auth.mac_pieces(names[batch[j]], plain(j))
            return [auth.seal_into(names[batch[j]], plain(j), buffer())]

        for lo, hi in self._spans(len(todo)):
            batch = todo[lo:hi]
            sealed = [names[i] for i in batch]
            try:
                with healer.setting(sealed), self.threads.sealing(len(batch), ahead, parts) as each:
                    wrote = self.client.set_streamed(sealed, self.value_bytes, each, self.ttl_s)
            except RemoteUnavailable:
                wrote = [False] * len(batch)
            for i, w in zip(batch, wrote, strict=True):
                ok[i] = w
                if w:
                    healer.written(names[i])
            self.failed_writes += wrote.count(False)
        return ok

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        """One round trip per batch: every read sent, then each value checked and scattered
        as soon as it is read (:mod:`kvtier.tiers.remote.streams`). Sealed values are opened
        (MAC or AES-GCM) on this store's opener thread while the next reply is read (both
        release the interpreter), all done before this returns.

        No read fetches more than ``value_bytes + 1`` bytes of a value (a longer one is a
        bad value), so a batch holds at most ``batch * (value_bytes + 1)`` bytes of replies
        whatever the store holds. Every name that answered something other than a good
        value (wrong length or type, a failed check, missing by now) is healed after the
        read in one round trip, even when a later batch failed (the breaker is then open:
        the heal goes through it)."""
        ok: list[bool] = []
        names = self.keyspace.names(keys, self.rank)
        bad: list[bytes] = []
        since = self.healer.tick
        opener = self.threads.opener()
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
                self.client.get_each(names[lo:hi], consume, self.value_bytes)
            except RemoteUnavailable:
                wait(opening)
                good[:] = [False] * (hi - lo)  # some may be scattered: the engine recomputes
            for f in opening:
                f.result()  # a bug raises here, as it would unthreaded
            self.bad_reads += good.count(False)
            ok += good
        if bad:
            self.healer.heal(bad, since)
        return ok

    @property
    def healed(self) -> int:
        """Bad values deleted after they were read (names that existed when deleted)."""
        return self.healer.healed

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
        if value is WRONG_TYPE:
            self.bad_values += 1  # a list, hash, ... under a chunk name
            return False
        if not value:
            return False  # missing by now (or an empty value): healed, not counted
        plain: bytes | None = value
        if self.auth is not None:
            # unwrap reads any buffer: the opened value may be a view of a reused buffer.
            plain = cast("bytes | None", self.auth.open(name, value))
            if plain is None:
                self.auth_failures += 1
                return False
        payload = unwrap(
            plain,
            key,
            self.namespace,
            self.slot_bytes,
            tail=True,
            tag_checked=self.auth is not None,
        )
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
        self.threads.close()
        self.client.close()
