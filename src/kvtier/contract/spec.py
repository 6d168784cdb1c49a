"""Tier specs: one entry of the ``tiers`` list, and the edge rules toward the tier above.

A spec is plain, typed data in two parts: the keys every tier has (:class:`TierSpec`: kind,
name, capacity, eviction, hit source, faults, edge rules) and the kind's own options
(``options``: a :class:`TierOptions` dataclass that the kind declares, e.g. a disk tier's
``path``). Parsing and checking a ``tiers`` entry is :mod:`kvtier.stack.parse`; what a kind
does with its spec lives with the kind (:mod:`kvtier.contract.kind`).

Part of the contract layer: it imports no kind, no registry, no policy and not the config.
So ``eviction`` is only checked to be a name here; :func:`kvtier.stack.parse.parse_tier`
checks it names a registered eviction policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvtier.contract.faults import FaultPlan, opt_faults
from kvtier.options import (
    changed_fields,
    choice,
    nonempty,
    opt_choice,
    opt_nonempty,
    opt_size,
    option,
)
from kvtier.sources import HitSource

ON_STORE = ("through", "skip")
ON_EVICT = ("demote", "drop")
ON_HIT = ("fill", "none")
EDGE_KEYS = ("on_store", "on_evict", "on_hit")


@dataclass(frozen=True)
class TierOptions:
    """The options of a kind that has none of its own (cpu); base of every kind's options
    dataclass. Each option is a field made with :func:`kvtier.options.option` (default and
    parser) with its documentation as the attribute docstring under it."""

    def shown(self) -> dict[str, Any]:
        """The options that differ from their defaults, as logs may show them (kinds whose
        options hold credentials mask them here)."""
        return changed_fields(self)


@dataclass(frozen=True)
class TierSpec:
    """One tier of the stack, and (for every tier but the first) the rules of the edge that
    joins it to the tier above. The keys below apply to every kind; a kind's own keys are
    its ``options``."""

    kind: str
    """A registered tier kind: "cpu" (host memory slab), "disk" (slab files), "memory"
    (a dict-backed test tier, private or shared), "redis" (a shared tier on Redis /
    Valkey, standalone or cluster), or one registered by a plugin."""
    name: str = option("", nonempty)
    """Unique tier name (metrics, logs, jobs); default: the kind."""
    capacity: int | None = option(None, opt_size)
    """Bytes (per device); None: the kind's default (cpu: 4GiB, disk: 16GiB, memory:
    64MiB, redis: nominal, the server's ``maxmemory`` bounds it). A shared tier's store
    evicts on its own; its capacity is the store's."""
    eviction: str | None = option(None, opt_nonempty)
    """Eviction policy of this tier (a registered one: the stack's parser checks the
    name); None: the config's ``eviction``."""
    source: str | None = option(None, opt_choice([s.label for s in HitSource]))
    """Hit source label reported for this tier ("host", "p2p", "disk", ...); None: the
    kind's (p2p for a shared tier)."""
    faults: FaultPlan | None = option(None, opt_faults)  # noqa: RUF009 (a field())
    """Testing only: wrap this tier's store in the fault wrapper
    (:mod:`kvtier.tiers.faulty`), e.g. {"seed": 1, "read_fail_rate": 0.2}. Keys: seed,
    read_fail_rate, write_fail_rate, fail_all_reads, fail_all_writes, slow_rate,
    slow_seconds, slow_region, rows. None (default): the store as the kind builds it."""
    on_store: str = option("through", choice(ON_STORE))
    """Edge from the tier above: "through" copies every chunk the tier above stores into
    this tier; "skip" does not."""
    on_evict: str = option("drop", choice(ON_EVICT))
    """Edge from the tier above: "demote" copies what the tier above evicts into this tier
    (write-back); "drop" lets it go."""
    on_hit: str = option("fill", choice(ON_HIT))
    """Edge from the tier above: "fill" stores a hit served from this tier (or deeper) into
    the tier above too; "none" leaves it here, and the request's new chunks are stored
    into the shallowest tier the fill rules reach."""
    options: TierOptions = field(default_factory=TierOptions)
    """The kind's own options (its ``TierKind.options`` dataclass)."""

    @property
    def label(self) -> str:
        return self.name or self.kind

    def __repr__(self) -> str:
        """The keys that differ from their defaults, credentials masked (a config is
        printed in logs and tracebacks; :meth:`to_dict` keeps every value whole)."""
        shown = {**self._common(), **self.options.shown()}
        return f"TierSpec({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def _common(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, **changed_fields(self)}
        if self.faults is not None:
            out["faults"] = self.faults.to_dict()
        return out

    def to_dict(self) -> dict[str, Any]:
        """The keys that differ from their defaults, the kind's options among them: the
        ``tiers`` entry that :func:`kvtier.stack.parse.parse_tier` accepts back."""
        return {**self._common(), **changed_fields(self.options)}
