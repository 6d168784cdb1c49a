"""Tier kinds by name.

Adding a tier kind is one module defining ``KIND = TierKind(...)`` plus one line in
``_BUILTIN`` (or a :func:`register_tier_kind` call from a plugin). Turning a config into
tiers is :mod:`kvtier.stack.build`; parsing a ``tiers`` entry is :mod:`kvtier.stack.parse`.
"""

from __future__ import annotations

import importlib

from kvtier.contract.kind import Capabilities, TierContext, TierKind
from kvtier.contract.spec import TierSpec

__all__ = [
    "Capabilities",
    "TierContext",
    "TierKind",
    "capabilities_of",
    "register_tier_kind",
    "tier_kind",
    "builtin_tier_kinds",
    "tier_kinds",
]


_BUILTIN: dict[str, str] = {
    "cpu": "kvtier.tiers.cpu",
    "disk": "kvtier.tiers.disk.kind",
    "memory": "kvtier.tiers.memory",
    "redis": "kvtier.tiers.remote.kind",
}
"""Kind name -> module defining ``KIND`` (imported on first use)."""
_KINDS: dict[str, TierKind] = {}


def register_tier_kind(kind: TierKind) -> None:
    if kind.name in _KINDS or kind.name in _BUILTIN:
        raise ValueError(f"tier kind {kind.name!r} is registered twice")
    _KINDS[kind.name] = kind


def builtin_tier_kinds() -> tuple[str, ...]:
    """kvtier's own kinds (what its docs describe), without plugins'."""
    return tuple(_BUILTIN)


def tier_kinds() -> tuple[str, ...]:
    return (*_BUILTIN, *_KINDS)


def tier_kind(name: str) -> TierKind:
    kind = _KINDS.get(name)
    if kind is None and name in _BUILTIN:
        kind = importlib.import_module(_BUILTIN[name]).KIND
        assert isinstance(kind, TierKind) and kind.name == name
    if kind is None:
        raise KeyError(f"unknown tier kind {name!r}; known: {', '.join(tier_kinds())}")
    return kind


def capabilities_of(spec: TierSpec) -> Capabilities:
    """What the tier ``spec`` describes can do."""
    return tier_kind(spec.kind).capabilities(spec)
