"""A worker's data plane on a remote store: one value per chunk and rank, envelope + payload.

Writes seal every chunk (:mod:`kvtier.tiers.envelope`: key, parent, namespace, length,
payload checksum) into a single value, so no metadata can be evicted apart from its data,
and skip keys already present (another engine stored them): one pipelined EXISTS per batch,
then SETs of the rest, sent a group at a time as they are sealed. Reads send a batch's GETs
and check each value as it arrives; a value that is missing, truncated, stored under
another key or namespace, or fails its checksum fails that chunk, and so does a timeout or
a dead server (the engine recomputes). Values are opaque bytes: nothing read is unpickled
or evaluated.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import numpy as np
import torch

from kvtier.keys import Key
from kvtier.tiers.base import Segments, SlotStore
from kvtier.tiers.envelope import HEADER_BYTES, pack_envelope, payload_checksum, unseal
from kvtier.tiers.remote.client import RemoteClient, RemoteUnavailable
from kvtier.tiers.remote.keyspace import KeySpace
from kvtier.tiers.remote.streams import GROUP_BYTES

log = logging.getLogger("kvtier")


class RemoteStore(SlotStore):
    """One rank's key-addressed store on a :class:`RemoteClient` (slot numbers are ignored).

    ``namespace``: this rank's ``Namespace.digest()``, sealed into and checked on every
    value. ``batch_bytes`` caps one pipelined round trip (a job's chunks go in several).
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
    ) -> None:
        self.client = client
        self.keyspace = keyspace
        self.slot_bytes = slot_bytes
        self.num_slots = num_slots
        self.namespace = namespace
        self.rank = rank
        self.ttl_s = ttl_s
        self.batch = max(1, batch_bytes // max(1, slot_bytes + HEADER_BYTES))
        self.bad_reads = 0
        """Chunks read missing, truncated, foreign or corrupt (or lost to a timeout)."""
        self.skipped_writes = 0
        """Chunks not written because the store already had them."""
        self.failed_writes = 0
        self._local = threading.local()

    def _staging(self, values: int) -> torch.Tensor:
        """This thread's staging buffer for ``values`` sealed values; grown on demand, then
        reused (fresh memory costs a page fault per 4 KiB, more than the copy into it)."""
        need = values * (HEADER_BYTES + self.slot_bytes)
        buf: torch.Tensor | None = getattr(self._local, "buf", None)
        if buf is None or buf.numel() < need:
            buf = self._local.buf = torch.empty(need, dtype=torch.uint8)
        return buf

    def _seal(self, key: Key, parent: Key | None, chunk: Segments, out: torch.Tensor) -> None:
        """Envelope + payload into ``out`` (``HEADER_BYTES + slot_bytes``): one copy of the
        segments, bytes they do not cover zeroed, the checksum over the staged payload."""
        payload = out[HEADER_BYTES:]
        spans = sorted((off, seg.numel()) for off, seg in chunk)
        pos = 0
        for off, size in spans:
            if off != pos:
                break
            pos += size
        if pos != self.slot_bytes:
            payload.zero_()
        flat = payload.numpy()
        for off, seg in chunk:
            if seg.device.type == "cpu":
                flat[off : off + seg.numel()] = seg.reshape(-1).numpy()
            else:
                payload[off : off + seg.numel()].copy_(seg.reshape(-1))
        view = out.numpy().data
        csum = payload_checksum(view[HEADER_BYTES:], key, self.namespace)
        view[:HEADER_BYTES] = pack_envelope(key, parent, self.namespace, 0, self.slot_bytes, csum)

    def _spans(self, n: int) -> list[tuple[int, int]]:
        return [(lo, min(n, lo + self.batch)) for lo in range(0, n, self.batch)]

    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        """One round trip per batch: a pipelined EXISTS skips the keys present, then the
        rest are sealed a group (~1 MiB) at a time into one reused buffer, each group sent
        as soon as it is sealed (:mod:`kvtier.tiers.remote.streams`), and the replies read."""
        ok: list[bool] = []
        for lo, hi in self._spans(len(keys)):
            part = parents[lo:hi] if parents else None
            ok += self._write_batch(keys[lo:hi], src[lo:hi], part)
        return ok

    def _write_batch(
        self, keys: Sequence[Key], src: Sequence[Segments], parents: Sequence[Key | None] | None
    ) -> list[bool]:
        names = self.keyspace.names(keys, self.rank)
        try:
            present = self.client.exists_many(names)
            todo = [i for i, p in enumerate(present) if not p]
            self.skipped_writes += len(keys) - len(todo)
            size = HEADER_BYTES + self.slot_bytes
            per = max(1, GROUP_BYTES // size)
            stage = self._staging(min(per, len(todo)))
            view = stage.numpy().data

            def fill(lo: int, hi: int) -> list[memoryview]:
                out = []
                for j, i in enumerate(todo[lo:hi]):
                    parent = parents[i] if parents else None
                    self._seal(keys[i], parent, src[i], stage[j * size : (j + 1) * size])
                    out.append(view[j * size : (j + 1) * size])
                return out

            sealed = [names[i] for i in todo]
            wrote = self.client.set_sealed(sealed, fill, per, self.ttl_s) if todo else []
        except RemoteUnavailable:
            self.failed_writes += len(keys)
            return [False] * len(keys)
        ok = list(present)
        for i, w in zip(todo, wrote, strict=True):
            ok[i] = w
        self.failed_writes += ok.count(False)
        return ok

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        """One round trip per batch: every GET sent, then each value checked and scattered
        as soon as it is read (:mod:`kvtier.tiers.remote.streams`)."""
        ok: list[bool] = []
        names = self.keyspace.names(keys, self.rank)
        for lo, hi in self._spans(len(keys)):
            good = [False] * (hi - lo)

            def consume(j: int, value: bytes | None, lo: int = lo, good: list[bool] = good) -> None:
                good[j] = self._unpack(keys[lo + j], value, dst[lo + j])

            try:
                self.client.get_each(names[lo:hi], consume)
            except RemoteUnavailable:
                good[:] = [False] * (hi - lo)  # some may be scattered: the engine recomputes
            self.bad_reads += good.count(False)
            ok += good
        return ok

    def _unpack(self, key: Key, value: bytes | None, chunk: Segments) -> bool:
        payload = unseal(value, key, self.namespace, self.slot_bytes)
        if payload is None:
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
        self.client.close()
