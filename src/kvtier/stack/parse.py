"""Parsing a ``tiers`` list: one validator for every form of the config.

Each entry's common keys are :class:`~kvtier.contract.TierSpec`'s fields, the rest are the
kind's own options (its ``TierKind.options`` dataclass): a misspelt key is refused with the
list of exactly that kind's keys, a bad value with ``<label>: <expected>, got <value>``, and
then the kind checks what needs several options (:attr:`TierKind.check`). The flat keys
(``cpu_bytes``, ``disk_path``, ...) are translated into entries by the config and parsed
here too, with their own names as labels, so both forms give the same answers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from kvtier.contract.spec import EDGE_KEYS, TierSpec
from kvtier.errors import ConfigError
from kvtier.options import Label, check_required, choice, opt_choice, option_keys, parse_fields
from kvtier.policies.registry import eviction_names
from kvtier.stack.registry import capabilities_of, tier_kind, tier_kinds

COMMON_KEYS: tuple[str, ...] = ("kind", *option_keys(TierSpec))
"""The keys every kind accepts."""


def parse_common(data: Mapping[str, object], label: Label) -> dict[str, Any]:
    """The keys of ``data`` that every tier has (:class:`TierSpec`'s), parsed. ``eviction``
    must also name a registered policy: a check the contract layer leaves to the stack
    (it does not know the policies)."""
    if data.get("eviction") is not None:
        opt_choice(eviction_names)(data["eviction"], label("eviction"))
    return parse_fields(TierSpec, data, label)


def accepted_keys(kind: str) -> tuple[str, ...]:
    """Every key of a ``kind`` tier entry, sorted."""
    return tuple(sorted({*COMMON_KEYS, *option_keys(tier_kind(kind).options)}))


def parse_tier(
    data: object, name: str, first: bool, labels: Mapping[str, str] | None = None
) -> TierSpec:
    """One ``tiers`` entry; ConfigError naming ``name.key`` (or ``labels[key]``) on anything
    wrong. A TierSpec is taken as it is."""
    if isinstance(data, TierSpec):
        return data
    if not isinstance(data, Mapping):  # not echoed: a URL given here may carry a password
        raise ConfigError(
            f"{name}: expected a mapping with at least 'kind', got a {type(data).__name__}"
        )
    names = dict(labels or {})

    def label(key: str) -> str:
        return names.get(key) or f"{name}.{key}"

    if "kind" not in data:
        raise ConfigError(f"{name}: 'kind' is required")
    kind = tier_kind(choice(tier_kinds)(data["kind"], label("kind")))
    accepted = accepted_keys(kind.name)
    unknown = sorted(set(data) - set(accepted))
    if unknown:
        raise ConfigError(
            f"{name}: unknown key(s) {', '.join(map(repr, unknown))}; accepted keys for a "
            f"{kind.name} tier: {', '.join(accepted)}"
        )
    if first:
        edge = sorted(set(EDGE_KEYS) & set(data))
        if edge:
            raise ConfigError(
                f"{name}: {', '.join(edge)}: edge rules describe the edge from the tier "
                "above; the first tier has none"
            )
    options = kind.options(**parse_fields(kind.options, data, label))
    check_required(options, label)
    spec = TierSpec(kind.name, **parse_common(data, label), options=options)
    return kind.check(spec, label) if kind.check is not None else spec


def parse_tiers(
    value: Sequence[object],
    name: str = "tiers",
    labels: Sequence[Mapping[str, str]] | None = None,
) -> tuple[TierSpec, ...]:
    """A whole ``tiers`` list: every entry, names unique, nothing shared first."""
    specs = tuple(
        parse_tier(v, f"{name}[{i}]", i == 0, labels[i] if labels else None)
        for i, v in enumerate(value)
    )
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.label in seen:
            raise ConfigError(
                f"{name}[{i}].name: {spec.label!r} is used twice; give each tier its own name"
            )
        seen.add(spec.label)
    if specs and capabilities_of(specs[0]).shared:
        raise ConfigError(f"{name}[0]: the first tier cannot be shared (it takes every store)")
    return specs


def tier_spec(entry: Mapping[str, object], name: str = "tier") -> TierSpec:
    """A spec from one entry as a config gives it (tools and tests)."""
    return parse_tier(entry, name, first=False)


def resolved(spec: TierSpec, eviction: str) -> TierSpec:
    """``spec`` with the defaults filled in: the kind's capacity, ``eviction`` (the config's
    policy) when it names none. What the builders are given."""
    capacity = spec.capacity if spec.capacity is not None else tier_kind(spec.kind).default_capacity
    return dataclasses.replace(spec, capacity=capacity, eviction=spec.eviction or eviction)
