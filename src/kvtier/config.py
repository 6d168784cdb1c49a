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

from kvtier.budget import SyncBudget
from kvtier.contract.faults import FaultPlan, parse_faults
from kvtier.contract.spec import TierSpec
from kvtier.errors import ConfigError
from kvtier.options import (
    boolean,
    choice,
    duration,
    fraction,
    integer,
    opt_nonempty,
    option_keys,
    parse_fields,
    size,
    text,
)
from kvtier.policies.registry import DEFAULT_EVICTION, eviction_names
from kvtier.stack.parse import parse_common, parse_tiers, resolved
from kvtier.stack.registry import tier_kind

WritePolicy = Literal["write-through", "write-back"]
EVICTION_POLICIES: tuple[str, ...] = eviction_names()
"""The registered eviction policies (:mod:`kvtier.policies.registry`)."""
WRITE_POLICIES: tuple[str, ...] = ("write-through", "write-back")
LayerLoads = Literal["auto", "on", "off"]
MMKeys = Literal["content", "identifier"]
MM_KEYS: tuple[MMKeys, ...] = ("content", "identifier")
LAYER_LOADS: tuple[str, ...] = ("auto", "on", "off")
FLAT_KEYS: dict[str, tuple[str, str]] = {
    "cpu_bytes": ("cpu", "capacity"),
    "disk_path": ("disk", "path"),
    "disk_bytes": ("disk", "capacity"),
    "disk_threads": ("disk", "threads"),
    "disk_eviction": ("disk", "eviction"),
}
"""Flat key -> (kind, key of that kind's tiers entry) it stands for."""
FLAT_TIER_KEYS: tuple[str, ...] = (*FLAT_KEYS, "disk_write_policy")
"""The shorthand keys describing a cpu (+ disk) stack; refused next to ``tiers``."""


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

    eviction: str = DEFAULT_EVICTION
    """Eviction policy of the CPU tier (and of every other tier that does not name its own,
    the flat keys' disk tier unless ``disk_eviction`` is set): "adaptive" (default:
    shadow caches pick LRU, chain-arc or adaptive-arc online, held within a stated budget
    of LRU's hits, see :mod:`kvtier.policies.dueling`), "adaptive-arc" (chain-arc that also
    stops storing chains seen for the first time while its ghosts show they do not come
    back in time, :mod:`kvtier.policies.adaptive`; the default before), "chain-arc" (ARC
    adapted to prefix trees, reuse counted once per request,
    :mod:`kvtier.policies.chain_arc`), "lru", "arc" (classic ARC), or "lru-doorkeeper"
    (LRU that stores a new chunk only once a second request asks for it,
    :mod:`kvtier.policies.doorkeeper`); any policy registered in
    :mod:`kvtier.policies.registry`. Only the first tier's policy decides
    admission; the tiers below take what their edges bring."""

    disk_eviction: str | None = None
    """Eviction policy of the flat keys' disk tier; None (default) uses ``eviction``."""

    admission_min_seen: int = 1
    """Store a chunk only once it has been seen in at least this many lookups (1 = always)."""

    sync_budget: SyncBudget = field(default_factory=lambda: SyncBudget("auto"))
    """Bytes per engine step that may load within the step: "auto" (default; derived from
    the measured copy bandwidth and the observed step time, no tuning), a size such as
    "64MiB", or 0 / "off" (every hit loads asynchronously). Counted in host-memory copy:
    a disk hit's bytes cost more by how much slower the disk tier's loads measured."""

    layer_loads: LayerLoads = "auto"
    """Whether loads within the step (sync loads) are copied layer by layer while the
    forward runs: each layer's attention waits for that layer's KV alone, with the copy
    one layer ahead of it. "on", "off", or "auto" (default), which is off: on vLLM's CPU
    backend the copy thread competes with the forward's threads for the same cores, and
    layer-wise CPU-tier hits measured slower than whole loads (``benchmarks/vllm_ttft.py``;
    figures in docs/benchmarks.md); GPU engines load whole (a
    host-side wait would not order the GPU's stream). Only CPU-tier hits into host-memory
    KV of one KV-cache group can load layer by layer (the CPU tier's row copies split by
    layer); disk hits always load between steps. Elsewhere "on" acts as "off". Outputs
    are the same in every mode."""

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
    them nor predict a victim's keys, and a redis tier without a secret of its own MACs its
    values under one derived from it (nobody without it can rewrite a stored value). Every
    engine sharing a tier needs the same secret (a different one is a different namespace:
    no hits). None (default): no secret."""

    key_secret_file: str | None = None
    """Path of a file holding that secret (its bytes, one trailing newline ignored; at least
    16 bytes); the alternative to ``key_secret_env``. None (default): no secret."""

    mm_keys: MMKeys = "content"
    """What names a multimodal item (an image, audio clip, video) in the chunk keys.
    "content" (default): a digest of the item's processed tensors, the data the engine's
    encoder runs on; an identifier a client chose (vLLM's ``multi_modal_uuids``) then
    cannot bind other content's KV to it in kvtier's tiers, so kvtier shares an item's KV
    only where the engine itself would compute the same KV. It costs a BLAKE3 pass over the
    processed tensors once per item object (see docs/security.md). "identifier": vLLM's
    item identifier (its mm hash, or the client's uuid unchanged): no hashing, but a client
    that names an item can bind any content to that name for every engine sharing a tier;
    use it only where no client can send ``multi_modal_uuids`` (a proxy strips them)."""

    store_output_tokens: bool = True
    """Also store chunks made of generated tokens, when the request finishes (multi-turn chat
    re-sends the previous answer as part of the next prompt)."""

    events_remote: bool = False
    """With vLLM's KV events on (``--kv-events-config``), also announce the chunks this
    engine stores into a shared tier (medium "STORAGE", locality "REMOTE"). Off by default:
    every engine reading the shared store would announce the same blocks (a router would
    credit each of them with it), and the store evicts on its own, unseen, so the
    announcements go stale (see docs/events.md)."""

    prefetch: bool = False
    """Prefetch on arrival: when a request arrives, the part of its prefix in a tier below
    the CPU tier (disk, Redis...) and not in the CPU tier is copied up into the CPU tier
    while the request waits to be scheduled, so its hit loads from host memory (within
    the step where the sync budget allows). Off (default): slow-tier hits load when vLLM
    schedules the request. Turn it on where requests queue (arrivals faster than the
    engine serves) and prefixes live in a slow tier (Redis, a disk on a slow device); a
    request admitted at once, or whose hit loads within the step about as fast as host
    memory, is not prefetched. See docs/prefetch.md for the measurements. A
    ``prefetch_only`` hint prefetches either way."""

    prefetch_step_bytes: int = 256 << 20
    """Bytes of prefetch copies planned per engine step at most (per device), so a burst of
    arrivals cannot flood the copy lanes that stores and loads share."""

    prefetch_inflight_bytes: int = 1 << 30
    """Bytes of the CPU tier that prefetches may hold at once (copies running, or landed
    and waiting for their request), per device; never more than half the CPU tier.
    Requests past it wait, in arrival order, and are retried each step."""

    prefetch_lease_s: float = 30.0
    """Seconds a prefetch's chunks stay held in the CPU tier while its request is not
    scheduled (counted from when its copies were planned: the arrival, unless it waited for
    room); then they are ordinary chunks again, which the eviction policy may take."""

    retain_max_share: float = 0.25
    """Share of the CPU tier's slots that ``retain_s`` hints may hold together (0 to 1);
    a lease that does not fit covers its chain's leading part that does."""

    retain_max_s: float = 3600.0
    """Longest lease a ``retain_s`` hint gets, in seconds (longer hints are cut to it)."""

    tiers: tuple[TierSpec, ...] = ()
    """The tier stack, innermost first: a list of mappings, each with the common tier keys
    (``kind``, ``name``, ``capacity``, ``eviction``, ``faults``, edge rules ``on_store`` /
    ``on_evict`` / ``on_hit`` toward the tier above...) and the kind's own (a disk tier's
    ``path``, a redis tier's ``url``...). Empty (default): the stack the flat keys
    describe, a CPU tier of ``cpu_bytes`` and, with ``disk_path``, a disk tier below it
    (``disk_write_policy`` its edge rules); the flat keys are translated into those two
    entries and checked by the same code."""

    fault_injection: Mapping[str, Any] | None = None
    """Testing only: the fault wrapper on the first tier's store, e.g. {"seed": 1,
    "read_fail_rate": 0.2} or {"fail_all_reads": true}, with the keys of a tier's
    ``faults`` (seed, read_fail_rate, write_fail_rate, fail_all_reads, fail_all_writes,
    slow_rate, slow_seconds, slow_region, rows); "disk": a mapping of the same keys for
    the tier named "disk"; "states": for the first tier of recurrent states (hybrid
    models). Shorthand for ``faults`` on those tiers (not both). None (default) injects
    nothing."""

    state_share: float = 0.25
    """Hybrid recurrent-state models only: the fraction (0 < x < 1) of every tier's
    capacity that holds recurrent states, in slots of one state each (a state of all
    recurrent layers is tens of MB on real models, an attention chunk a few: one slot
    size for both would waste most of the tier); the rest holds attention chunks. Dense
    models ignore it."""

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
            if key in FLAT_KEYS and kwargs[key] is None and key != "disk_path":
                del kwargs[key]  # null: the default, as a tier entry's null is the kind's
        return cls(**kwargs)

    def __post_init__(self) -> None:
        # Validate direct construction the same way as from_dict.
        for f in dataclasses.fields(self):
            _PARSERS[f.name](getattr(self, f.name), f.name)
        if self.fault_injection and any(t.faults is not None for t in self.tiers):
            raise ConfigError(
                "fault_injection: give faults either per tier ('faults') or here, not both"
            )
        if not self.tiers:
            flat_tier_specs(self)  # the kinds' own checks, as for a tiers entry

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
        """The stack to build: ``tiers``, or the one the flat keys describe, with
        ``fault_injection`` applied and every default filled in (each kind's capacity,
        ``eviction`` where a tier names none)."""
        specs = self.tiers or flat_tier_specs(self)
        if self.fault_injection:
            specs = _with_faults(specs, self.fault_injection)
        return tuple(resolved(spec, self.eviction) for spec in specs)


def flat_tier_specs(config: KVTierConfig) -> tuple[TierSpec, ...]:
    """The stack the flat keys describe: cpu (``cpu_bytes``), then disk (``disk_path``)
    with ``disk_write_policy`` as its edge rules; parsed as the equivalent ``tiers``
    entries are, errors naming the flat keys."""
    entries: list[dict[str, Any]] = [{"kind": "cpu", "capacity": config.cpu_bytes}]
    labels: list[dict[str, str]] = [{"capacity": "cpu_bytes"}]
    if config.disk_path:
        back = config.disk_write_policy == "write-back"
        disk: dict[str, Any] = {
            "kind": "disk",
            "capacity": config.disk_bytes,
            "path": config.disk_path,
            "threads": config.disk_threads,
            "on_store": "skip" if back else "through",
            "on_evict": "demote" if back else "drop",
        }
        if config.disk_eviction is not None:
            disk["eviction"] = config.disk_eviction
        entries.append(disk)
        labels.append({v[1]: k for k, v in FLAT_KEYS.items() if v[0] == "disk"})
    return parse_tiers(entries, labels=labels)


def _with_faults(specs: tuple[TierSpec, ...], faults: Mapping[str, Any]) -> tuple[TierSpec, ...]:
    """``fault_injection`` as the ``faults`` of the first tier and of the tier "disk"."""
    top = {k: v for k, v in faults.items() if k not in ("disk", "states")}
    out = list(specs)
    if top:
        out[0] = dataclasses.replace(out[0], faults=parse_faults(top, "fault_injection"))
    for i, spec in enumerate(out):
        if faults.get("disk") and spec.label == "disk":
            plan = parse_faults(faults["disk"], "fault_injection.disk")
            out[i] = dataclasses.replace(spec, faults=plan)
    return tuple(out)


def _fraction(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ConfigError(f"{name}: expected a number between 0 and 1 (exclusive), got {value!r}")
    return float(value)


def state_faults(config: KVTierConfig) -> FaultPlan | None:
    """The fault plan of the first state tier (``fault_injection``'s "states")."""
    plan = (config.fault_injection or {}).get("states")
    return parse_faults(plan, "fault_injection.states") if plan else None


def _tiers(value: object, name: str) -> tuple[TierSpec, ...]:
    if value is None:
        return ()
    if isinstance(value, Mapping) or not isinstance(value, (list, tuple)):
        # The type only: the value may hold a URL with a password in it.
        raise ConfigError(f"{name}: expected a list of tier mappings, got a {type(value).__name__}")
    return parse_tiers(value, name)


def _flat(flat_key: str) -> Any:
    """The parser of a flat key: that of the tier key it stands for, in its kind."""
    kind, key = FLAT_KEYS[flat_key]

    def parse(value: object, name: str) -> Any:
        if flat_key == "disk_path" and value == "":
            return None  # an empty disk_path disables the disk tier, as null does
        if key in option_keys(TierSpec):
            return parse_common({key: value}, lambda _: name)[key]
        return parse_fields(tier_kind(kind).options, {key: value}, lambda _: name)[key]

    if key == "capacity":
        parse.__name__ = "size"  # a byte size (the option reference prints it so)
    return parse


def _faults(value: object, name: str) -> dict[str, Any] | None:
    """``fault_injection``: a fault plan's keys, plus "disk" and "states" (other plans')."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name}: expected a mapping or null, got {value!r}")
    top = {k: v for k, v in value.items() if k not in ("disk", "states")}
    plan = parse_faults(top, name)
    out: dict[str, Any] = {k: getattr(plan, k) for k in top}
    for sub in ("disk", "states"):
        if sub in value:
            part = value[sub]
            if not isinstance(part, Mapping):
                raise ConfigError(f"{name}.{sub}: expected a mapping, got {part!r}")
            plan = parse_faults(part, f"{name}.{sub}")
            out[sub] = {k: getattr(plan, k) for k in part}
    return out


_PARSERS: dict[str, Any] = {
    "chunk_tokens": integer(0),
    "cpu_bytes": _flat("cpu_bytes"),
    "eviction": choice(eviction_names),
    "disk_eviction": _flat("disk_eviction"),
    "admission_min_seen": integer(1),
    "sync_budget": lambda v, n: SyncBudget.parse(v, name=n),
    "layer_loads": choice(LAYER_LOADS),
    "disk_path": _flat("disk_path"),
    "disk_bytes": _flat("disk_bytes"),
    "disk_write_policy": choice(WRITE_POLICIES),
    "disk_threads": _flat("disk_threads"),
    "namespace": text,
    "key_secret_env": opt_nonempty,
    "key_secret_file": opt_nonempty,
    "mm_keys": choice(MM_KEYS),
    "store_output_tokens": boolean,
    "events_remote": boolean,
    "prefetch": boolean,
    "prefetch_step_bytes": size,
    "prefetch_inflight_bytes": size,
    "prefetch_lease_s": duration,
    "retain_max_share": fraction,
    "retain_max_s": duration,
    "tiers": _tiers,
    "fault_injection": _faults,
    "state_share": lambda v, n: _fraction(v, n),
}
