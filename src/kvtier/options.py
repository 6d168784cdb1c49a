"""Typed options: the value parsers the config and every tier kind share, and the parser of
an options dataclass.

An options dataclass declares each option as a field made with :func:`option`: its
default, the parser that checks a configured value, and (as the attribute docstring under
the field) its documentation. :func:`parse_fields` turns a mapping into the dataclass,
calling each field's parser with the label to name in errors. Every parser raises
:class:`~kvtier.errors.ConfigError` as ``"<label>: <what was expected>, got <value>"``, so
one bad value reads the same whichever form of the config carried it.

A leaf module: it imports nothing of kvtier but the errors and units.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvtier.errors import ConfigError
from kvtier.units import parse_size

Parser = Callable[[object, str], Any]
"""``(value, label) -> parsed value``; ConfigError naming ``label`` when refused."""
Label = Callable[[str], str]
"""Option key -> the name errors give it (``tiers[1].url``, or a flat key such as
``cpu_bytes``)."""


def prefix_of(label: Label) -> str:
    """What ``label`` puts before a key (``tiers[1]``): for messages about a whole entry."""
    return label("").rstrip(".")


def option(default: Any, parse: Parser, required: str = "") -> Any:
    """A dataclass field for an option: its default and its parser. ``required``: the
    option must be given, and this says why when it is not (``"a disk tier needs a
    directory"``); its default then only stands for "not given"."""
    return dataclasses.field(default=default, metadata={"parse": parse, "required": required})


def option_keys(cls: type) -> tuple[str, ...]:
    """The keys of an options dataclass (its fields declared with :func:`option`)."""
    return tuple(f.name for f in dataclasses.fields(cls) if "parse" in f.metadata)


def parse_fields(cls: type, data: Mapping[str, object], label: Label) -> dict[str, Any]:
    """The parsed values of the keys of ``data`` that are options of ``cls``."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in data and "parse" in f.metadata:
            out[f.name] = f.metadata["parse"](data[f.name], label(f.name))
    return out


def check_required(obj: Any, label: Label) -> None:
    """ConfigError naming the first required option of ``obj`` that was not given."""
    for f in dataclasses.fields(obj):
        if f.metadata.get("required") and getattr(obj, f.name) in (None, ""):
            raise ConfigError(f"{label(f.name)}: {f.metadata['required']}, got none")


def changed_fields(obj: Any) -> dict[str, Any]:
    """The options of a dataclass instance that differ from their defaults."""
    return {
        f.name: getattr(obj, f.name)
        for f in dataclasses.fields(obj)
        if "parse" in f.metadata and getattr(obj, f.name) != f.default
    }


# -- value parsers ------------------------------------------------------------------------


def integer(min_value: int) -> Parser:
    """An int >= ``min_value`` (a string of digits is read as one)."""

    def parse(value: object, name: str) -> int:
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: expected an integer >= {min_value}, got {value!r}")
        if value < min_value:
            raise ConfigError(f"{name}: must be >= {min_value}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def boolean(value: object, name: str) -> bool:
    """true or false (the strings "true", "false", "1", "0" too)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def size(value: object, name: str) -> int:
    """A byte size: an int, or a string such as "8GiB" ("4" is 4 bytes)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"{name}: expected a byte size such as '8GiB', got {value!r}")
    return parse_size(value, name=name)


def opt_size(value: object, name: str) -> int | None:
    return None if value is None else size(value, name)


def text(value: object, name: str) -> str:
    """A string (possibly empty)."""
    if not isinstance(value, str):
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    return value


def nonempty(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name}: expected a non-empty string, got {value!r}")
    return value


def opt_nonempty(value: object, name: str) -> str | None:
    """A non-empty string or null."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name}: expected a non-empty string or null, got {value!r}")
    return value


def choice(choices: Sequence[str] | Callable[[], Sequence[str]]) -> Parser:
    """One of ``choices`` (or of what a callable returns when asked: a registry)."""

    def parse(value: object, name: str) -> str:
        accepted = choices() if callable(choices) else choices
        if value not in accepted:
            raise ConfigError(f"{name}: got {value!r}; accepted values: {', '.join(accepted)}")
        return str(value)

    parse.__name__ = "choice"
    return parse


def opt_choice(choices: Sequence[str] | Callable[[], Sequence[str]]) -> Parser:
    parse = choice(choices)

    def parse_opt(value: object, name: str) -> str | None:
        return None if value is None else parse(value, name)

    parse_opt.__name__ = "opt_choice"
    return parse_opt


def millis(value: object, name: str) -> float:
    """A number of milliseconds > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{name}: expected a number of milliseconds > 0, got {value!r}")
    return float(value)


def delay_ms(value: object, name: str) -> float:
    """A number of milliseconds >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{name}: expected a number of milliseconds >= 0, got {value!r}")
    return float(value)


def seconds(value: object, name: str) -> int:
    """A whole number of seconds >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name}: expected a whole number of seconds >= 0, got {value!r}")
    return value


def duration(value: object, name: str) -> float:
    """A number of seconds >= 0 (fractions allowed)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise ConfigError(f"{name}: expected a number of seconds >= 0, got {value!r}")
    return float(value)


def fraction(value: object, name: str) -> float:
    """A number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigError(f"{name}: expected a number between 0 and 1, got {value!r}")
    return float(value)
