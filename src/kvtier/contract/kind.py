"""What a tier kind is (:class:`TierKind`), what it can do (:class:`Capabilities`) and what
building one needs (:class:`TierContext`).

The one tier contract: a kind builds, from a :class:`~kvtier.contract.TierSpec`, the
scheduler side's :class:`~kvtier.contract.TierIndex` and every worker's
:class:`~kvtier.contract.SlotStore` (see :mod:`kvtier.contract` for what each must
do). The suite in :mod:`kvtier.conformance` checks a kind against it; docs/tiers.md says
how to add one.

Kept apart from the registry (:mod:`kvtier.stack.registry`) so the modules defining kinds
import nothing but the contract (never the stack, nor the config).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvtier.contract.index import TierIndex
from kvtier.contract.spec import TierOptions, TierSpec
from kvtier.contract.store import SlotStore
from kvtier.keys import Namespace
from kvtier.options import Label
from kvtier.sources import HitSource


@dataclass(frozen=True)
class Capabilities:
    """What a tier of some kind can do; the stack, the connector and the events read these
    instead of testing kinds by name."""

    shared: bool = False
    """Other engines write the store and it evicts on its own: the index is key-addressed
    (no slots, no pins, no prefix closure; lookups probe and may answer "not yet"), the
    tier must be the last of the stack and its hits report source p2p by default. Its
    index's ``shared`` must say the same."""
    persistent: bool = False
    """What it holds outlives the engine: a new engine on the same store (same
    namespace) finds the chunks a previous one stored (a disk tier's files, a Redis
    server)."""
    byte_addressable: bool = False
    """Its chunks are bytes in this process's host memory that the engine copies to and
    from directly (the CPU tier's slab): KV events report medium "CPU" for it."""
    sync_loads: bool = False
    """A hit served from it may load within the engine step where the per-step budget
    allows (:mod:`kvtier.budget`): host memory (``byte_addressable``), priced at the
    calibrated copy bandwidth, or a local medium priced at the bandwidth its own loads
    were measured at (the disk tier; a guess until one was measured)."""
    events: bool = True
    """Its index tells a listener (:class:`~kvtier.contract.IndexListener`) when chunks
    become readable and when they leave, so the connector can publish tier events. A
    shared index tells what this engine sees (its own stores, failed checks)."""


@dataclass(frozen=True)
class TierContext:
    """What a kind needs besides its spec to build an index or a store."""

    chunk_bytes: int
    """Payload bytes of one chunk."""
    namespace: Namespace
    """This process's namespace (its ``rank`` is the worker's shard; 0 on the scheduler)."""
    blocks_per_chunk: int = 1
    row_bytes: Sequence[int] = field(default_factory=tuple)
    """Worker side: bytes of one engine block row per KV region (the CPU slab mirrors them);
    empty: one region of ``chunk_bytes`` per chunk."""
    world: int = 1
    """Ranks that each store their shard of every chunk (tensor parallel size)."""
    rank_dirs: bool = True
    """Kinds with files: one subdirectory per rank under the tier's path (the connector);
    False opens the path itself (single-process tools and tests)."""
    restore: bool = True
    """Scheduler side: rebuild persistent tiers' indexes from what they hold (False: the
    simulator, which has no data)."""
    sizing_bytes: int = 0
    """Chunk bytes that capacities are divided by (0: ``chunk_bytes``): the scheduler's
    geometry, so both sides count the same slots even if the engine's chunk differs."""

    def capacity_chunks(self, spec: TierSpec, default: int) -> int:
        """Chunks the spec's capacity holds (``default`` bytes when it names none)."""
        nbytes = spec.capacity if spec.capacity is not None else default
        unit = self.sizing_bytes or self.chunk_bytes
        return nbytes // unit if unit else 0


def fixed(caps: Capabilities) -> Callable[[TierSpec], Capabilities]:
    """The capabilities of a kind whose options do not change them."""
    return lambda spec: caps


@dataclass(frozen=True, kw_only=True)
class TierKind:
    """A kind of tier: its options, defaults and capabilities, and how to build each side
    of it (see the module docstring)."""

    name: str
    source: HitSource
    """Hit source of its hits unless the spec names another."""
    make_index: Callable[[TierSpec, TierContext], TierIndex]
    make_store: Callable[[TierSpec, TierContext], SlotStore]
    default_capacity: int
    """Bytes per device when the spec names no capacity."""
    capabilities: Callable[[TierSpec], Capabilities]
    """What a tier of this spec can do (:func:`fixed` when the options change nothing)."""
    options: type[TierOptions] = TierOptions
    """The kind's own options: their keys, defaults, parsers and docs (its fields)."""
    check: Callable[[TierSpec, Label], TierSpec] | None = None
    """Checks that need several options or the outside world (a URL parses, a secret
    loads), run when a config is parsed; returns the spec to use. ConfigError names the
    option with ``label(key)``."""
    files: Callable[[TierSpec, TierContext, int], str] | None = None
    """Kinds keeping files on this machine: the directory of one rank (soak's fault
    injector and ``kvtier inspect`` read it); None for the others."""
