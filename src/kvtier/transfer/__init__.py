"""Worker side: moving KV bytes between the engine's cache and the tiers.

The only package that touches CUDA (streams, events, pinned memory).
"""

from kvtier.transfer.copy import copy_segments
from kvtier.transfer.engine import JobResult, TransferEngine
from kvtier.transfer.host_memory import alloc_host_buffer, cuda_available
from kvtier.transfer.regions import KVRegions

__all__ = [
    "JobResult",
    "KVRegions",
    "TransferEngine",
    "alloc_host_buffer",
    "copy_segments",
    "cuda_available",
]
