"""Tier capacities for the simulator: token counts or byte sizes.

Grammar of one capacity (ints are token counts):

- a token count: ``3000000``, ``"3M"``, ``"1.5M tokens"``, ``"500k tok"`` (k/M/G are decimal
  multipliers; no ``B``), or
- a byte size with a byte unit: ``"8GiB"``, ``"512MB"``, ``"4096B"`` (see
  :func:`kvtier.units.parse_size`), turned into tokens with ``bytes_per_token``, or
- a share of the trace's unique KV: ``"5%"`` is 5 % of its distinct blocks (each takes a
  slot), in tokens; it needs ``unique_tokens``, known once the trace is loaded.

A tiered configuration lists one capacity per tier, innermost first: ``("1M", "10M")`` or
the string ``"1M+10M"`` (``,`` also separates).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.units import format_size, parse_size

SMOLLM2_BYTES_PER_TOKEN = 23040
"""KV bytes per token of SmolLM2-135M in bf16: 2 (K, V) x 30 layers x 3 KV heads x 64 x 2 B."""

Capacity = str | int
"""One tier's capacity (see the module docstring)."""

CapacityConfig = Capacity | Sequence[Capacity]
"""Capacities of every tier of one simulated configuration, innermost first."""

_TOKENS_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([kKmMgG]?)\s*(?:tok|toks|tokens?)?\s*$")
_TOKEN_MULT = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3}


@dataclass(frozen=True, slots=True)
class TierCapacity:
    """One tier's size: tokens, the number of ``block_tokens`` slots, and bytes."""

    name: str
    tokens: int
    slots: int
    bytes: int

    def label(self) -> str:
        """E.g. ``cpu 1M tok (21.5 GiB)``."""
        return f"{self.name} {format_tokens(self.tokens)} tok ({format_size(self.bytes)})"


_PERCENT_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*%\s*$")


def parse_capacity(
    value: Capacity,
    *,
    bytes_per_token: int,
    name: str = "capacity",
    unique_tokens: int | None = None,
    block_tokens: int = 1,
) -> int:
    """A capacity in tokens (see the module docstring for accepted forms). A percentage is
    of ``unique_tokens``, rounded down to whole ``block_tokens`` blocks."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a token count or byte size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{name}: must be >= 0, got {value}")
        return value
    if not isinstance(value, str):
        raise ConfigError(
            f"{name}: expected a token count or byte size, got {type(value).__name__}"
        )
    pm = _PERCENT_RE.match(value)
    if pm is not None:
        if unique_tokens is None:
            raise ConfigError(f"{name}: {value!r} is a share of a trace's unique KV; no trace")
        blocks = int(float(pm.group(1)) / 100 * unique_tokens) // max(1, block_tokens)
        return blocks * max(1, block_tokens)
    m = _TOKENS_RE.match(value)
    if m is not None:
        return int(float(m.group(1)) * _TOKEN_MULT[m.group(2).lower()])
    if bytes_per_token <= 0:
        raise ConfigError(f"bytes_per_token: must be > 0, got {bytes_per_token}")
    try:
        nbytes = parse_size(value, name=name)
    except ConfigError:
        raise ConfigError(
            f"{name}: cannot parse {value!r}; use a token count (3000000, 3M, '3M tokens') "
            "or a byte size with a byte unit (8GiB, 512MB)"
        ) from None
    return nbytes // bytes_per_token


def tier_capacities(
    config: CapacityConfig,
    tier_names: Sequence[str],
    *,
    block_tokens: int,
    bytes_per_token: int,
    unique_tokens: int | None = None,
) -> tuple[TierCapacity, ...]:
    """The tiers of one configuration; the i-th capacity is tier ``tier_names[i]``.
    ``unique_tokens`` resolves percentages (see :func:`parse_capacity`)."""
    if isinstance(config, str):
        parts: list[Capacity] = [p for p in re.split(r"[+,]", config) if p.strip()]
    elif isinstance(config, int):
        parts = [config]
    else:
        parts = list(config)
    if not parts:
        raise ConfigError(f"capacities: empty tier list {config!r}")
    if len(parts) > len(tier_names):
        raise ConfigError(
            f"capacities: {config!r} lists {len(parts)} tiers but only "
            f"{len(tier_names)} tier names are given ({', '.join(tier_names)})"
        )
    out = []
    for name, part in zip(tier_names, parts, strict=False):
        tokens = parse_capacity(
            part,
            bytes_per_token=bytes_per_token,
            name=f"capacity of {name}",
            unique_tokens=unique_tokens,
            block_tokens=block_tokens,
        )
        out.append(TierCapacity(name, tokens, tokens // block_tokens, tokens * bytes_per_token))
    return tuple(out)


def format_tokens(n: int) -> str:
    """Compact decimal token count: 3000000 -> '3M', 1500 -> '1.5k'."""
    for mult, suffix in ((1000**3, "G"), (1000**2, "M"), (1000, "k")):
        if n >= mult:
            return f"{n / mult:.3g}{suffix}"
    return str(n)
