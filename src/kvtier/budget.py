"""The per-step byte budget for sync loads (hits loaded within the engine step).

A sync load of B bytes lengthens the current step by B / bandwidth for *every* request in
the batch; an async load costs only the hit request, about one step of extra waiting. So a
sync load pays off while ``B / bandwidth * batch <= step_time``. The ``auto`` budget is that
break-even point, per step:

    budget = load_bandwidth * forward_step_seconds / batch_requests

with the bandwidth calibrated on the worker at start (then refined by observed sync loads)
and the step time an average of measured forward passes, sync copies excluded, so a larger
budget cannot feed back into a larger step time. Nothing here needs tuning per deployment.
Until both are measured the auto budget is 0 (every hit loads async).

The budget is counted in bytes of host-memory copy. A load from a tier that is not host
memory (the disk tier) is charged what a host copy of the same duration would move: its
bytes times ``bandwidth / tier bandwidth``, the tier's bandwidth measured from its own
finished loads (sync or async; an average, so a cold device read raises the price of the
next ones). Until one of its loads was measured, such a tier is priced ``UNMEASURED_SLOWDOWN``
times the host copy (a restarted engine's first disk hits); its first measured load
replaces that guess.

The configured budget (:class:`SyncBudget`, the config's ``sync_budget``) is defined here,
next to what spends it, so that the load planner is handed it alone, not the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvtier.errors import ConfigError
from kvtier.units import parse_size

_EMA = 0.2
_MIN_OBSERVED_BYTES = 4 << 20
"""Sync loads smaller than this carry too much fixed cost to refine the bandwidth."""
UNMEASURED_SLOWDOWN = 4.0
"""How many times slower than the host copy a tier that is not host memory is assumed to
load until one of its loads was measured: a local NVMe drive's sequential reads against
a host memory copy, the same order on common servers and on this project's machines."""


@dataclass(frozen=True)
class SyncBudget:
    """Per-engine-step byte budget for loads done within the step (sync loads).

    ``mode`` is "auto" (derived from measured copy bandwidth and step time), "fixed"
    (``nbytes`` per step per device) or "off" (every hit loads asynchronously).
    """

    mode: Literal["auto", "fixed", "off"]
    nbytes: int = 0

    @classmethod
    def parse(cls, value: object, *, name: str = "sync_budget") -> SyncBudget:
        """Parse "auto", 0 / "0" / "off" (disabled), or a byte size such as "64MiB"."""
        if isinstance(value, SyncBudget):
            return value
        if isinstance(value, str) and value.strip().lower() == "auto":
            return cls("auto")
        if isinstance(value, str) and value.strip().lower() in ("off", "none"):
            return cls("off")
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{name}: expected 'auto', 'off' or a byte size, got {value!r}")
        try:
            nbytes = parse_size(value, name=name)
        except ConfigError as e:
            raise ConfigError(f"{e} (or 'auto' / 'off')") from None
        return cls("off") if nbytes == 0 else cls("fixed", nbytes)

    def __str__(self) -> str:
        return str(self.nbytes) if self.mode == "fixed" else self.mode


class BudgetTracker:
    """Hands out the per-step sync budget to hits, one reservation per request."""

    def __init__(self, budget: SyncBudget) -> None:
        self.budget = budget
        self.bandwidth: float | None = None
        """Load copy bandwidth, bytes/s."""
        self.tier_bandwidth: dict[str, float] = {}
        """Measured load bandwidth (bytes/s) of each tier that is not host memory, by name."""
        self.step_seconds: float | None = None
        """Average forward-pass seconds per step, sync copies excluded."""
        self.batch = 1
        self.limit = 0
        self._reserved: dict[str, int] = {}
        self.begin_step(1)

    @property
    def used(self) -> int:
        return sum(self._reserved.values())

    def begin_step(self, batch_requests: int) -> None:
        """Start a new step's budget; ``batch_requests`` is the expected batch size."""
        self._reserved.clear()
        self.batch = max(1, batch_requests)
        mode = self.budget.mode
        if mode == "off":
            self.limit = 0
        elif mode == "fixed":
            self.limit = self.budget.nbytes
        elif self.bandwidth is None or self.step_seconds is None:
            self.limit = 0
        else:
            self.limit = int(self.bandwidth * self.step_seconds / self.batch)

    def try_reserve(self, req_id: str, nbytes: int) -> bool:
        """Reserve ``nbytes`` of this step's budget for ``req_id`` (replacing an earlier
        reservation of the same request this step); False when it does not fit."""
        prev = self._reserved.pop(req_id, 0)
        if nbytes <= 0 or self.used + nbytes > self.limit:
            if prev:
                self._reserved[req_id] = prev
            return False
        self._reserved[req_id] = nbytes
        return True

    def release(self, req_id: str) -> None:
        """Give back a reservation that was not used (the hit was not scheduled)."""
        self._reserved.pop(req_id, None)

    def observe_bandwidth(self, bytes_per_second: float) -> None:
        """Calibrated copy bandwidth from the worker."""
        if bytes_per_second > 0:
            self.bandwidth = bytes_per_second

    def observe_sync_load(self, nbytes: int, seconds: float) -> None:
        """Refine the bandwidth from a finished sync load (large ones only)."""
        if nbytes >= _MIN_OBSERVED_BYTES and seconds > 0:
            bw = nbytes / seconds
            self.bandwidth = (
                bw if self.bandwidth is None else (1 - _EMA) * self.bandwidth + _EMA * bw
            )

    def observe_tier_load(self, tier: str, nbytes: int, seconds: float) -> None:
        """A finished load from ``tier`` (not host memory), sync or async (large ones
        only): refines that tier's bandwidth."""
        if nbytes >= _MIN_OBSERVED_BYTES and seconds > 0:
            bw = nbytes / seconds
            old = self.tier_bandwidth.get(tier)
            self.tier_bandwidth[tier] = bw if old is None else (1 - _EMA) * old + _EMA * bw

    def host_bytes(self, tier: str | None, nbytes: int) -> int | None:
        """What loading ``nbytes`` from ``tier`` (None: host memory) costs of the budget:
        the bytes a host copy moves in the same time (``UNMEASURED_SLOWDOWN`` times
        ``nbytes`` until the tier's loads were measured); None while the host copy's
        bandwidth is unknown."""
        if tier is None:
            return nbytes
        if self.bandwidth is None:
            return None
        return int(nbytes * self.slowdown(tier))

    def slowdown(self, tier: str) -> float:
        """How many times slower than the host copy ``tier`` (not host memory) loads: as
        measured, ``UNMEASURED_SLOWDOWN`` until both were measured."""
        bw = self.tier_bandwidth.get(tier)
        if bw is None or self.bandwidth is None:
            return UNMEASURED_SLOWDOWN
        return self.bandwidth / bw

    def observe_step(self, forward_seconds: float) -> None:
        """A measured forward pass (sync copies excluded)."""
        if forward_seconds > 0:
            s = self.step_seconds
            self.step_seconds = (
                forward_seconds if s is None else (1 - _EMA) * s + _EMA * forward_seconds
            )
