"""The tier contract: what every tier kind implements, and what the rest of kvtier may assume
of a tier. The bottom layer of kvtier: it imports only :mod:`kvtier.keys`,
:mod:`kvtier.sources`, :mod:`kvtier.options`, :mod:`kvtier.errors` and :mod:`kvtier.units`;
the tier implementations, the stack, the transfer engine and the config import it
(``tests/test_imports.py`` holds every layer to that, docs/architecture.md draws it).

A tier stores fixed-size *chunks* (``chunk_bytes`` each) under ``KEY_BYTES``-byte keys
(:mod:`kvtier.keys`). Chunks form chains: chunk i's parent is chunk i-1 of the same token
sequence. Inside an engine the scheduler and the workers may be different processes, so a
tier is two objects, both built by its kind (:class:`TierKind`, :mod:`kvtier.contract.kind`)
from its spec (:class:`TierSpec`, :mod:`kvtier.contract.spec`):

- the scheduler owns a :class:`TierIndex` (:mod:`kvtier.contract.index`: keys, states,
  eviction: which chunk is where);
- every worker owns a :class:`SlotStore` (:mod:`kvtier.contract.store`: the bytes of each
  slot, its rank's shard, and the copy paths it declares).

The scheduler decides which slot a chunk goes to; the worker only moves bytes. What a kind
can do is its :class:`Capabilities`; what a store does wrong on purpose (tests) is a
:class:`FaultPlan` (:mod:`kvtier.contract.faults`). The suite in :mod:`kvtier.conformance`
checks a kind against this contract (docs/tiers.md).
"""

from kvtier.contract.faults import FAULT_KEYS, FaultPlan, opt_faults, parse_faults
from kvtier.contract.index import (
    NO_SLOT,
    PENDING,
    IndexListener,
    KeyAddressedIndex,
    Pending,
    TierIndex,
)
from kvtier.contract.kind import Capabilities, TierContext, TierKind, fixed
from kvtier.contract.spec import EDGE_KEYS, ON_EVICT, ON_HIT, ON_STORE, TierOptions, TierSpec
from kvtier.contract.store import Buffers, Segments, SlotStore, chunk_buffers

__all__ = [
    "EDGE_KEYS",
    "FAULT_KEYS",
    "NO_SLOT",
    "ON_EVICT",
    "ON_HIT",
    "ON_STORE",
    "PENDING",
    "Buffers",
    "Capabilities",
    "FaultPlan",
    "IndexListener",
    "KeyAddressedIndex",
    "Pending",
    "Segments",
    "SlotStore",
    "TierContext",
    "TierIndex",
    "TierKind",
    "TierOptions",
    "TierSpec",
    "chunk_buffers",
    "fixed",
    "opt_faults",
    "parse_faults",
]
