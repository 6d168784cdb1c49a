"""Typed kvtier configuration.

Every field carries its own docstring (with units). Build from a plain mapping with
:meth:`KVTierConfig.from_dict`, which is what vLLM's ``kv_connector_extra_config`` holds:
unknown keys and invalid values raise :class:`~kvtier.errors.ConfigError` naming the key and
what it accepts. Sizes accept ints (bytes) or strings such as ``"8GiB"`` or ``"512MiB"``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kvtier.errors import ConfigError
from kvtier.policies.registry import eviction_names
from kvtier.stack.spec import TierSpec, flat_tier_specs, parse_tiers
from kvtier.units import parse_size

WritePolicy = Literal["write-through", "write-back"]
EVICTION_POLICIES: tuple[str, ...] = eviction_names()
"""The registered eviction policies (:mod:`kvtier.policies.registry`)."""
WRITE_POLICIES: tuple[str, ...] = ("write-through", "write-back")
FLAT_TIER_KEYS: tuple[str, ...] = (
    "cpu_bytes",
    "disk_path",
    "disk_bytes",
    "disk_write_policy",
    "disk_threads",
    "disk_eviction",
)
"""The shorthand keys describing a cpu (+ disk) stack; refused next to ``tiers``."""


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


@dataclass(frozen=True)
class KVTierConfig:
    """Configuration of the kvtier cache (scheduler and worker sides read the same one)."""

    chunk_tokens: int = 0
    """Tokens per chunk, the unit of lookup, storage and transfer. Must be a multiple of the
    engine's block size. 0 (default) uses the block size itself: hits are as fine-grained as
    the engine's own prefix cache, and copies stay batched because a request's chunks take
    consecutive slots (one copy per layer per run of slots, whatever the chunk size)."""

    cpu_bytes: int = 4 << 30
    """Capacity of the CPU tier in bytes (per device). The slab is allocated once at start."""

    eviction: str = "adaptive"
    """Eviction policy of the CPU tier (and of every other tier that does not name its own,
    the flat keys' disk tier unless ``disk_eviction`` is set): "adaptive" (default:
    shadow caches pick LRU, chain-arc or adaptive-arc online, held within a stated budget
    of LRU's hits, see :mod:`kvtier.policies.dueling`), "adaptive-arc" (chain-arc that also
    stops storing chains seen for the first time while its ghosts show they do not come
    back in time, :mod:`kvtier.policies.adaptive`; the default before), "chain-arc" (ARC
    adapted to prefix trees, reuse counted once per request,
    :mod:`kvtier.policies.chain_arc`), "lru", or "arc" (classic ARC); any policy
    registered in :mod:`kvtier.policies.registry`. Only the first tier's policy decides
    admission; the tiers below take what their edges bring."""

    disk_eviction: str | None = None
    """Eviction policy of the flat keys' disk tier; None (default) uses ``eviction``."""

    admission_min_seen: int = 1
    """Store a chunk only once it has been seen in at least this many lookups (1 = always)."""

    sync_budget: SyncBudget = field(default_factory=lambda: SyncBudget("auto"))
    """Bytes per engine step that may load within the step: "auto" (default; derived from
    the measured copy bandwidth and the observed step time, no tuning), a size such as
    "64MiB", or 0 / "off" (every hit loads asynchronously)."""

    disk_path: str | None = None
    """Directory of the disk tier; None disables the disk tier."""

    disk_bytes: int = 16 << 30
    """Capacity of the disk tier in bytes (per device)."""

    disk_write_policy: WritePolicy = "write-through"
    """How chunks reach the disk tier.

    "write-through" (default): every chunk stored to the CPU tier is then copied to disk,
    off the engine's path. The disk holds everything the CPU tier does, so a restart or a
    crash loses nothing that was stored, and CPU evictions cost no I/O.

    "write-back": a chunk reaches disk only when the CPU tier evicts it (with any of its
    ancestors the disk lacks, since the disk tier is prefix-closed too). Disk writes drop
    to the chains that fall out of CPU memory, at two costs: what is only in CPU memory is
    lost at a restart, and a store whose slots were just freed waits for their demotion
    to be written (on the worker's copy queue, never on the forward pass)."""

    disk_threads: int = 4
    """I/O threads of the disk tier."""

    namespace: str = ""
    """Extra text mixed into every key, to keep deployments that must not share KV apart."""

    key_secret_env: str | None = None
    """Name of an environment variable holding the secret that keys the chunk-key hash
    (keyed BLAKE3, :mod:`kvtier.keys`); never the secret itself. With a secret, someone who
    reads chunk names in a shared store or disk directory cannot test guessed prompts against
    them nor predict a victim's keys. Every engine sharing a tier needs the same secret (a
    different one is a different namespace: no hits). None (default): no secret."""

    key_secret_file: str | None = None
    """Path of a file holding that secret (its bytes, one trailing newline ignored; at least
    16 bytes); the alternative to ``key_secret_env``. None (default): no secret."""

    store_output_tokens: bool = True
    """Also store chunks made of generated tokens, when the request finishes (multi-turn chat
    re-sends the previous answer as part of the next prompt)."""

    events_remote: bool = False
    """With vLLM's KV events on (``--kv-events-config``), also announce the chunks this
    engine stores into a shared tier (medium "STORAGE", locality "REMOTE"). Off by default:
    every engine reading the shared store would announce the same blocks (a router would
    credit each of them with it), and the store evicts on its own, unseen, so the
    announcements go stale (see docs/events.md)."""

    tiers: tuple[TierSpec, ...] = ()
    """The tier stack, innermost first: a list of mappings with the keys of
    :class:`~kvtier.stack.spec.TierSpec` (``kind``, ``capacity``, ``eviction``, ``path``,
    ``url``, edge rules ``on_store`` / ``on_evict`` / ``on_hit`` toward the tier above...).
    Empty (default): the stack the flat keys describe, a CPU tier of ``cpu_bytes`` and,
    with ``disk_path``, a disk tier below it (``disk_write_policy`` its edge rules)."""

    fault_injection: Mapping[str, Any] | None = None
    """Testing only: make tier reads/writes fail on purpose, e.g. {"seed": 1,
    "read_fail_rate": 0.2} or {"fail_all_reads": true}. Keys (CPU tier): seed,
    read_fail_rate, write_fail_rate, fail_all_reads, fail_all_writes, slow_rate (probability
    that a copy is slow), slow_seconds (how slow, at most 1 s), rows (keep the batched row
    path: faults fail whole row copies); "disk": a mapping of the same keys for the disk
    tier's store. None (default) injects nothing."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> KVTierConfig:
        """Build a config from a mapping; raise ConfigError on unknown keys or bad values."""
        data = dict(data or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(
                f"unknown kvtier config key(s) {', '.join(map(repr, unknown))}; "
                f"accepted keys: {', '.join(sorted(known))}"
            )
        if data.get("tiers"):
            flat = sorted(set(FLAT_TIER_KEYS) & set(data))
            if flat:
                raise ConfigError(
                    f"tiers: give the stack either as 'tiers' or with the flat keys, not both "
                    f"(also given: {', '.join(flat)})"
                )
        if data.get("key_secret_env") and data.get("key_secret_file"):
            raise ConfigError("key_secret_env, key_secret_file: give one of them, not both")
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            kwargs[key] = _PARSERS[key](value, key)
        return cls(**kwargs)

    def __post_init__(self) -> None:
        # Validate direct construction the same way as from_dict.
        for f in dataclasses.fields(self):
            _PARSERS[f.name](getattr(self, f.name), f.name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly mapping that from_dict accepts back."""
        out = dataclasses.asdict(self)
        out["sync_budget"] = str(self.sync_budget)
        out["tiers"] = [t.to_dict() for t in self.tiers]
        if self.tiers:  # the flat keys are the stack's shorthand: one or the other
            for key in FLAT_TIER_KEYS:
                del out[key]
        return out

    def tier_specs(self) -> tuple[TierSpec, ...]:
        """The stack to build: ``tiers``, or the one the flat keys describe."""
        if self.tiers:
            return self.tiers
        return flat_tier_specs(self)


def _eviction(value: object, name: str) -> str:
    from kvtier.policies.registry import eviction_names

    return str(_choice(eviction_names())(value, name))


def _opt_eviction(value: object, name: str) -> str | None:
    return None if value is None else _eviction(value, name)


def _tiers(value: object, name: str) -> tuple[TierSpec, ...]:
    if value is None:
        return ()
    if isinstance(value, Mapping) or not isinstance(value, (list, tuple)):
        # The type only: the value may hold a URL with a password in it.
        raise ConfigError(f"{name}: expected a list of tier mappings, got a {type(value).__name__}")
    return parse_tiers(value, name)


def _int(min_value: int) -> Any:
    def parse(value: object, name: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and value.strip().lstrip("-").isdigit():
                value = int(value)
            else:
                raise ConfigError(f"{name}: expected an integer >= {min_value}, got {value!r}")
        if value < min_value:
            raise ConfigError(f"{name}: must be >= {min_value}, got {value}")
        return value

    return parse


def _choice(choices: tuple[str, ...]) -> Any:
    def parse(value: object, name: str) -> str:
        if value not in choices:
            raise ConfigError(f"{name}: got {value!r}; accepted values: {', '.join(choices)}")
        return str(value)

    return parse


def _opt_choice(choices: tuple[str, ...]) -> Any:
    parse = _choice(choices)

    def parse_opt(value: object, name: str) -> str | None:
        return None if value is None else parse(value, name)

    return parse_opt


def _size(value: object, name: str) -> int:
    if not isinstance(value, (str, int, float)):
        raise ConfigError(f"{name}: expected a byte size such as '8GiB', got {value!r}")
    return parse_size(value, name=name)


def _bool(value: object, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def _opt_path(value: object, name: str) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    raise ConfigError(f"{name}: expected a directory path or null, got {value!r}")


_FAULT_KEYS: dict[str, type] = {
    "seed": int,
    "read_fail_rate": float,
    "write_fail_rate": float,
    "fail_all_reads": bool,
    "fail_all_writes": bool,
    "slow_rate": float,
    "slow_seconds": float,
    "rows": bool,
    "disk": dict,
}


def _faults(value: object, name: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name}: expected a mapping or null, got {value!r}")
    out: dict[str, Any] = {}
    for key, v in value.items():
        kind = _FAULT_KEYS.get(key)
        if kind is dict and name.endswith(".disk"):
            kind = None  # no nesting below "disk"
        if kind is dict:
            out[key] = _faults(v, f"{name}.{key}")
            continue
        if kind is None:
            raise ConfigError(
                f"{name}: unknown key {key!r}; accepted keys: {', '.join(sorted(_FAULT_KEYS))}"
            )
        if kind is float and isinstance(v, (int, float)) and not isinstance(v, bool):
            if not 0.0 <= float(v) <= 1.0:
                raise ConfigError(f"{name}.{key}: must be within [0, 1], got {v!r}")
            out[key] = float(v)
        elif isinstance(v, kind) and not (kind is int and isinstance(v, bool)):
            out[key] = v
        else:
            raise ConfigError(f"{name}.{key}: expected {kind.__name__}, got {v!r}")
    return out


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    return value


def _opt_text(value: object, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name}: expected a non-empty string or null, got {value!r}")
    return value


_PARSERS: dict[str, Any] = {
    "chunk_tokens": _int(0),
    "cpu_bytes": _size,
    "eviction": _eviction,
    "disk_eviction": _opt_eviction,
    "admission_min_seen": _int(1),
    "sync_budget": lambda v, n: SyncBudget.parse(v, name=n),
    "disk_path": _opt_path,
    "disk_bytes": _size,
    "disk_write_policy": _choice(WRITE_POLICIES),
    "disk_threads": _int(1),
    "namespace": _text,
    "key_secret_env": _opt_text,
    "key_secret_file": _opt_text,
    "store_output_tokens": _bool,
    "events_remote": _bool,
    "tiers": _tiers,
    "fault_injection": _faults,
}
