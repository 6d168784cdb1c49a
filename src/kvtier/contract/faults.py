"""What the fault wrapper (:mod:`kvtier.tiers.faulty`) makes fail: a :class:`FaultPlan`, and
its parser (a tier's ``faults`` option, the flat ``fault_injection`` key).

Part of the contract layer, apart from the wrapper, so that the tier specs can hold a plan
without importing the store code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtier.errors import ConfigError
from kvtier.keys import Key
from kvtier.options import boolean, integer, option, option_keys, parse_fields


def _fraction(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}: expected a number within [0, 1], got {value!r}")
    if not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{name}: must be within [0, 1], got {value!r}")
    return float(value)


@dataclass
class FaultPlan:
    """Which operations of one tier's store fail, and which are slow (testing only)."""

    seed: int = option(0, integer(0))
    """Seed of the wrapper's random choices: the same seed replays the same faults."""
    read_fail_rate: float = option(0.0, _fraction)
    """Probability that reading one chunk fails (its destination is scribbled over)."""
    write_fail_rate: float = option(0.0, _fraction)
    """Probability that writing one chunk fails."""
    fail_all_reads: bool = option(False, boolean)
    """Every read fails."""
    fail_all_writes: bool = option(False, boolean)
    """Every write fails."""
    slow_rate: float = option(0.0, _fraction)
    """Probability that one operation (a batch read or write, a row copy) is slow."""
    slow_seconds: float = option(0.05, _fraction)
    """How long a slow operation sleeps before it runs (seconds, at most 1)."""
    slow_region: int = option(-1, integer(-1))
    """Row loads (``rows`` on) that copy this engine region (one layer's K or V; -1: none)
    first fill its destination rows with garbage, sleep ``slow_seconds``, then copy: a
    slow copy caught half done, for tests that a layer is never read before it is
    loaded."""
    rows: bool = option(False, boolean)
    """Keep the inner store's batched row path (the CPU tier's); faults then fail whole row
    copies. False: every copy goes through per-chunk reads and writes."""
    fail_read_keys: set[Key] = field(default_factory=set)
    """Reads of these keys always fail (tests build plans with them; not a config key)."""
    fail_write_keys: set[Key] = field(default_factory=set)
    """Writes of these keys always fail (tests build plans with them; not a config key)."""

    @property
    def active(self) -> bool:
        """Whether anything can fail or be slow."""
        return bool(
            self.read_fail_rate
            or self.write_fail_rate
            or self.fail_all_reads
            or self.fail_all_writes
            or self.slow_rate
            or self.slow_region >= 0
            or self.fail_read_keys
            or self.fail_write_keys
        )

    def to_dict(self) -> dict[str, Any]:
        """The configured keys that differ from their defaults (what :func:`parse_faults`
        accepts back; key sets are not configuration and are left out)."""
        return {k: getattr(self, k) for k in FAULT_KEYS if getattr(self, k) != _DEFAULTS[k]}


FAULT_KEYS: tuple[str, ...] = option_keys(FaultPlan)
"""The keys of a fault plan in the configuration."""
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(FaultPlan) if f.name in FAULT_KEYS}


def parse_faults(value: object, name: str) -> FaultPlan:
    """A plan from a mapping of :data:`FAULT_KEYS`; ConfigError naming ``name.key``."""
    if isinstance(value, FaultPlan):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name}: expected a mapping of fault keys, got {value!r}")
    for key in value:
        if key not in FAULT_KEYS:
            raise ConfigError(
                f"{name}: unknown key {key!r}; accepted keys: {', '.join(sorted(FAULT_KEYS))}"
            )
    return FaultPlan(**parse_fields(FaultPlan, value, lambda k: f"{name}.{k}"))


def opt_faults(value: object, name: str) -> FaultPlan | None:
    return None if value is None else parse_faults(value, name)
