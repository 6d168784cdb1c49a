"""A DiskSlab's checks of a request before any I/O: a malformed one is a caller bug
(ValueError naming what is wrong), never a failed chunk."""

from __future__ import annotations

from collections.abc import Sequence, Sized

import numpy as np

from kvtier.contract import Buffers
from kvtier.keys import Key


def check_slots(
    num_slots: int,
    slots: Sequence[int],
    keys: Sequence[Key],
    segs: Sized,
    parents: Sequence[Key | None] | None = None,
) -> None:
    """ValueError unless there is one key, one segment list (or buffer entry) and, if
    given, one parent per slot, and every slot is below ``num_slots``."""
    if not len(slots) == len(keys) == len(segs):
        raise ValueError(f"{len(slots)} slots, {len(keys)} keys, {len(segs)} segment lists")
    if parents is not None and len(parents) != len(keys):
        raise ValueError(f"{len(parents)} parents for {len(keys)} keys")
    for s in slots:
        if not 0 <= s < num_slots:
            raise ValueError(f"slot {s} out of range [0, {num_slots})")


def check_buffers(bufs: Buffers, n: int, slot_bytes: int, *, whole: bool) -> None:
    """ValueError unless ``bufs`` describes ``n`` whole payloads (gaps, which only
    reads may have, inside the payload): a caller bug, found before any I/O."""
    start, lens, gaps = bufs.start, bufs.lens, bufs.gaps
    if len(start) != n + 1 or (n and (start[0] != 0 or start[-1] != len(bufs.ptrs))):
        raise ValueError(f"buffers for {len(start) - 1} chunks, {n} slots")
    if len(lens) != len(bufs.ptrs) or (n and bool((np.diff(start) < 1).any())):
        raise ValueError("buffers: every chunk needs at least one entry")
    total = np.concatenate([[0], np.cumsum(lens, dtype=np.uint64)])
    if n and bool((total[start[1:]] - total[start[:-1]] != slot_bytes).any()):
        raise ValueError(f"buffers must cover whole {slot_bytes}-byte payloads")
    if gaps.size and (
        whole
        or int(gaps.min()) < 0
        or int(gaps.max()) >= len(lens)
        or bool((bufs.ptrs[gaps] + lens[gaps] > slot_bytes).any())
    ):
        raise ValueError("buffers: gaps only in reads, and inside the payload")
