"""Parsing and printing byte sizes ("8GiB", "512MiB", "1.5GB", 4096)."""

from __future__ import annotations

import re

from kvtier.errors import ConfigError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: str | int | float, *, name: str = "size") -> int:
    """Parse a byte size: an int, or a string like "8GiB", "512MiB", "1.5GB", "4096".

    Raises ConfigError naming ``name`` and the accepted forms when the value is invalid
    or negative.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a byte size, got a boolean {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{name}: must be >= 0, got {value}")
        return value
    if isinstance(value, float):
        if value < 0 or value != value:
            raise ConfigError(f"{name}: must be >= 0, got {value}")
        return int(value)
    if not isinstance(value, str):
        raise ConfigError(f"{name}: expected a byte size, got {type(value).__name__}")
    m = _SIZE_RE.match(value)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ConfigError(
            f"{name}: cannot parse {value!r} as a byte size "
            "(use a number with an optional unit: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    return int(float(m.group(1)) * _UNITS[unit])


def format_size(nbytes: float) -> str:
    """Human-readable binary size, e.g. 1536 -> '1.5 KiB'."""
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
