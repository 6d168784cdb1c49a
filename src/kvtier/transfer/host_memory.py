"""Host buffers for the CPU tier: pinned when CUDA is present, plain memory otherwise."""

from __future__ import annotations

import torch


def cuda_available() -> bool:
    """True when a CUDA device can be used (pinning is only possible then)."""
    return torch.cuda.is_available()


def alloc_host_buffer(nbytes: int, *, prefault: bool = True) -> torch.Tensor:
    """A 1-D uint8 host tensor of ``nbytes``.

    Pinned (page-locked) when CUDA is available, so device copies can be asynchronous;
    never pinned on CPU-only torch, where ``pin_memory=True`` raises. With ``prefault`` the
    pages are touched now: a first write to fresh pages is page-fault bound (~2 GB/s here),
    which would otherwise land on the first stores.
    """
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda_available())
    if prefault and nbytes:
        buf.zero_()
    return buf
