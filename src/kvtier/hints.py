"""Per-request hints from agents and routers, read from vLLM's ``kv_transfer_params``.

Schema (everything optional; see docs/prefetch.md)::

    kv_transfer_params = {"kvtier": {"retain_s": 120, "prefetch_only": false,
                                     "tier_hint": "skip" | "demote"}}

- ``retain_s`` (number of seconds >= 0): keep the request's chain in the CPU tier that long
  after it finishes (a lease; capped by ``retain_max_s`` and by ``retain_max_share`` of the
  tier, see :mod:`kvtier.stack.retain`).
- ``prefetch_only`` (bool): promote the request's prefix into the CPU tier at arrival even
  with ``prefetch`` off, and keep it there after the request (a lease of ``retain_s``, or
  ``prefetch_lease_s`` when none is given). vLLM still schedules the request: send it with
  ``max_tokens: 1``.
- ``tier_hint``: ``"skip"`` stores none of the request's chunks; ``"demote"`` stores its new
  chunks straight into the deepest private tier below the CPU tier, not into the CPU tier.

A hint that is not valid is ignored with one warning line naming the key (once per key
and problem per process) and counted in ``kvtier_invalid_hints{key}``; it never fails the
request. Engine-agnostic: plain mappings in, a frozen dataclass out.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kvtier.metrics import Metrics

log = logging.getLogger("kvtier")

HINTS_KEY = "kvtier"
"""The key of ``kv_transfer_params`` kvtier reads; the rest belongs to other connectors."""
TierHint = Literal["skip", "demote"]
TIER_HINTS: tuple[str, ...] = ("skip", "demote")
_WARNED: set[str] = set()
_WARN_LIMIT = 256  # distinct warnings remembered: a client sending junk cannot grow it


@dataclass(frozen=True)
class Hints:
    """One request's valid hints (defaults: no hint)."""

    retain_s: float = 0.0
    """Seconds to keep the request's chain in the CPU tier after it finishes (0: none)."""
    prefetch_only: bool = False
    """Promote the prefix into the CPU tier at arrival whatever ``prefetch`` says."""
    tier_hint: TierHint | None = None
    """``skip`` (store nothing) or ``demote`` (store below the CPU tier); None: as usual."""

    @property
    def any(self) -> bool:
        return self != NO_HINTS


NO_HINTS = Hints()


def _warn(key: str, problem: str, metrics: Metrics | None) -> None:
    if metrics is not None:
        metrics.inc("invalid_hints", 1, key)
    msg = f"kvtier: kv_transfer_params.{HINTS_KEY}.{key}: {problem}; hint ignored"
    if msg not in _WARNED and len(_WARNED) < _WARN_LIMIT:
        _WARNED.add(msg)
        log.warning("%s", msg)


def parse_hints(params: Mapping[str, Any] | None, metrics: Metrics | None = None) -> Hints:
    """The kvtier hints in a request's ``kv_transfer_params``; :data:`NO_HINTS` when there
    are none. Never raises: each invalid key is warned about and left out."""
    if not params:
        return NO_HINTS
    raw = params.get(HINTS_KEY) if isinstance(params, Mapping) else None
    if raw is None:
        return NO_HINTS
    if not isinstance(raw, Mapping):
        _warn("*", f"expected a mapping, got {type(raw).__name__}", metrics)
        return NO_HINTS
    retain, only, tier = 0.0, False, None
    for key, value in raw.items():
        if key == "retain_s":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok and math.isfinite(value) and value >= 0:
                retain = float(value)
            else:
                _warn(key, f"expected a number of seconds >= 0, got {value!r}", metrics)
        elif key == "prefetch_only":
            if isinstance(value, bool):
                only = value
            else:
                _warn(key, f"expected true or false, got {value!r}", metrics)
        elif key == "tier_hint":
            if value in TIER_HINTS:
                tier = value
            else:
                _warn(key, f"expected one of {', '.join(TIER_HINTS)}, got {value!r}", metrics)
        else:
            _warn(str(key)[:64], "unknown hint (retain_s, prefetch_only, tier_hint)", metrics)
    hints = Hints(retain, only, tier)
    return hints if hints.any else NO_HINTS
