"""A chunk's plain remote value as pieces: its payload from the chunk's segments, then its
envelope (:mod:`kvtier.tiers.envelope`), each piece checksummed just before it is yielded.

What a store sends as it is (no secret) or seals first (:mod:`kvtier.tiers.remote.auth`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import torch

from kvtier.contract import Segments
from kvtier.keys import Key
from kvtier.tiers.envelope import pack_envelope, payload_hasher
from kvtier.tiers.remote.streams import PART_BYTES

_ZEROS = memoryview(bytes(PART_BYTES))
"""What a value holds where no segment covers its payload."""


class PlainParts:
    """Plain values of ``slot_bytes`` payload bytes. Thread-safe: each thread stages device
    segments through its own host buffer. ``checksum=False``: tagged envelopes without a
    payload checksum, for a tier that seals every value with a MAC or AEAD tag."""

    def __init__(self, slot_bytes: int, *, checksum: bool = True) -> None:
        self.slot_bytes = slot_bytes
        self.checksum = checksum
        self._local = threading.local()

    @property
    def staging_held(self) -> bool:
        """Whether the calling thread holds a staging buffer (it sent a device segment)."""
        return getattr(self._local, "buf", None) is not None

    def _staging(self) -> torch.Tensor:
        """This thread's host buffer for one part of a device segment (PART_BYTES), reused
        for every part: a part is sent before the next is asked for."""
        buf: torch.Tensor | None = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = torch.empty(PART_BYTES, dtype=torch.uint8)
        return buf

    def __call__(
        self, key: Key, parent: Key | None, chunk: Segments, namespace: bytes
    ) -> Iterator[Any]:
        """The chunk's value under ``namespace`` (a rank's ``Namespace.digest()``): payload,
        then envelope, as pieces of at most PART_BYTES, each
        added to the checksum just before it is yielded (so it is in cache when sent): host
        segments as views of their own memory, device segments through this thread's host
        buffer, zeros where no segment covers the payload, the envelope last. Segments must
        not overlap nor run past ``slot_bytes``. A source changed while it is sent fails the
        checksum (or tag) on reading (a miss, never wrong bytes)."""
        csum = payload_hasher(key, namespace) if self.checksum else None
        pos = 0
        for off, seg in [*sorted(chunk, key=lambda s: s[0]), (self.slot_bytes, None)]:
            if off < pos:
                raise ValueError(f"segments overlap or overrun the payload at offset {off}")
            for lo in range(pos, off, len(_ZEROS)):  # a gap
                piece = _ZEROS[: min(off, lo + len(_ZEROS)) - lo]
                if csum is not None:
                    csum.update(piece)
                yield piece
            if seg is None:
                break
            if seg.is_cpu:
                # numpy's reshape: a view of contiguous memory (a copy otherwise, as
                # torch's), at a fraction of torch's per-call cost (a few us a segment).
                host = seg.numpy().reshape(-1).data
                flat, count = None, len(host)
            else:
                host, flat = None, seg.reshape(-1)
                count = flat.numel()
            pos = off + count
            for lo in range(0, count, PART_BYTES):
                hi = min(count, lo + PART_BYTES)
                if host is not None:
                    piece = host[lo:hi]
                else:
                    assert flat is not None
                    buf = self._staging()[: hi - lo]
                    buf.copy_(flat[lo:hi])
                    piece = buf.numpy().data
                if csum is not None:
                    csum.update(piece)
                yield piece
        if csum is None:
            yield pack_envelope(key, parent, namespace, 0, self.slot_bytes, 0, tagged=True)
        else:
            yield pack_envelope(key, parent, namespace, 0, self.slot_bytes, csum.intdigest())
