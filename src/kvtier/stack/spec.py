"""Tier specs: one entry of the ``tiers`` list, and the edge rules toward the tier above.

A spec is plain, typed data; what a kind does with it lives in the tier registry
(:mod:`kvtier.stack.registry`). Every key is checked here, so a bad entry is refused with one
line naming ``tiers[i].key`` before anything is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvtier.errors import ConfigError
from kvtier.units import parse_size

if TYPE_CHECKING:
    from kvtier.config import KVTierConfig

ON_STORE = ("through", "skip")
ON_EVICT = ("demote", "drop")
ON_HIT = ("fill", "none")


@dataclass(frozen=True)
class TierSpec:
    """One tier of the stack, and (for every tier but the first) the rules of the edge that
    joins it to the tier above."""

    kind: str
    """A registered tier kind: "cpu" (host memory slab), "disk" (slab files), "memory"
    (a dict-backed test tier, private or shared), "redis" (a shared tier on Redis /
    Valkey, standalone or cluster)."""
    name: str = ""
    """Unique tier name (metrics, logs, jobs); default: the kind."""
    capacity: int | None = None
    """Bytes (per device); None: the kind's default (cpu: ``cpu_bytes``, disk:
    ``disk_bytes``, memory: 64 MiB). A shared tier's store evicts on its own; its capacity
    is the store's."""
    eviction: str | None = None
    """Eviction policy of this tier; None: the config's ``eviction``."""
    path: str | None = None
    """Directory (disk); each tensor-parallel rank gets its own subdirectory."""
    url: str | None = None
    """Where a shared tier lives: ``memory://NAME`` names an in-process shared space (tests),
    so two engines in one process share it; ``redis://``, ``rediss://`` (TLS),
    ``redis+cluster://host:port,...`` (or several seeds) a Redis / Valkey deployment
    (:mod:`kvtier.tiers.remote.url`). Credentials in a URL are never logged."""
    threads: int = 4
    """I/O threads (disk)."""
    shared: bool = False
    """A store other engines write and that evicts on its own (memory kind): no prefix
    closure, lookups probe keys and stop at the first miss, no pins."""
    lookup_delay_ms: float = 0.0
    """Testing: a shared tier's lookups answer "not yet" until this long after they were
    first asked (the connector then asks vLLM to retry the request later)."""
    timeout_ms: float = 500.0
    """Remote tiers: the bound on every network wait (connect, send, reply) of one batch;
    a batch that exceeds it is a miss (loads) or a failed store."""
    probe_wait_ms: float = 2.0
    """Remote tiers: how long a lookup may wait for its probe before answering "not yet"
    (the connector then asks vLLM to retry the request later; the scheduler never waits
    longer than this)."""
    password_env: str | None = None
    """Remote tiers: environment variable holding the password when the URL has none
    (default ``KVTIER_REDIS_PASSWORD``; the user, ``KVTIER_REDIS_USERNAME``)."""
    password_file: str | None = None
    """Remote tiers: a file holding the password (one line; a trailing newline is
    dropped), read when the tier's clients are built; wins over ``password_env``. The URL
    must then carry no password."""
    ssl_ca: str | None = None
    """Remote tiers over TLS (``rediss://``): PEM file of the CA(s) the server's
    certificate must chain to; None: the system's trust store."""
    ssl_cert: str | None = None
    """Remote tiers over TLS: PEM client certificate (mutual TLS, the server's
    ``tls-auth-clients yes``); needs ``ssl_key``."""
    ssl_key: str | None = None
    """Remote tiers over TLS: PEM private key of ``ssl_cert`` (unencrypted)."""
    ssl_check_hostname: bool = True
    """Remote tiers over TLS: the server's certificate must name the URL's host (a DNS or
    IP subjectAltName); false only for certificates that name no usable host."""
    ttl_s: int = 0
    """Remote tiers: expire stored chunks after this many seconds (0: never; the server's
    ``maxmemory`` + ``allkeys-lru`` evicts)."""
    secret_env: str | None = None
    """Remote tiers: environment variable holding the tier's secret (at least 32 bytes,
    surrounding whitespace dropped; never the secret itself in the config). With a secret
    every value carries a MAC and names are keyed: engines share chunks only with engines
    holding the same secret, and never load a value someone without it wrote."""
    secret_file: str | None = None
    """Remote tiers: a file holding the tier's secret (instead of ``secret_env``)."""
    encrypt: bool = False
    """Remote tiers: seal every value with AES-256-GCM instead of a MAC (needs a secret),
    so the store holds no readable KV."""
    source: str | None = None
    """Hit source label reported for this tier ("host", "p2p", "disk", ...); None: the
    kind's."""
    on_store: str = "through"
    """Edge from the tier above: "through" copies every chunk the tier above stores into
    this tier; "skip" does not."""
    on_evict: str = "drop"
    """Edge from the tier above: "demote" copies what the tier above evicts into this tier
    (write-back); "drop" lets it go."""
    on_hit: str = "fill"
    """Edge from the tier above: "fill" stores a hit served from this tier (or deeper) into
    the tier above too; "none" leaves it here, and the request's new chunks are stored
    into the shallowest tier the fill rules reach."""

    @property
    def label(self) -> str:
        return self.name or self.kind

    def __repr__(self) -> str:
        """The fields that differ from their defaults, the URL's credentials masked (a
        config is printed in logs and tracebacks; :meth:`to_dict` keeps the URL whole)."""
        shown = self.to_dict()
        if self.url:
            shown["url"] = masked_url(self.url)
        return f"TierSpec({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def to_dict(self) -> dict[str, Any]:
        """The fields that differ from their defaults (what parse_tier accepts back)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name == "kind" or getattr(self, f.name) != f.default
        }


def masked_url(url: str) -> str:
    """``url`` as logs may show it: a remote URL's display form, anything else with
    whatever precedes its last ``@`` replaced by ``***``."""
    from kvtier.tiers.remote.url import parse_remote_url

    try:
        return parse_remote_url(url, environ={}).display
    except ConfigError:
        if "@" not in url:
            return url
        scheme, sep, _ = url.partition("://")
        return f"{scheme + sep if sep and '@' not in scheme else ''}***@{url.rsplit('@', 1)[1]}"


def _text(value: object, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name}: expected a non-empty string, got {value!r}")
    return value


def _opt_text(value: object, name: str) -> str | None:
    if value is None:
        return None
    return _text(value, name)


def _choice(choices: Sequence[str]) -> Any:
    def parse(value: object, name: str) -> str:
        if value not in choices:
            raise ConfigError(f"{name}: got {value!r}; accepted values: {', '.join(choices)}")
        return str(value)

    return parse


def _capacity(value: object, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"{name}: expected a byte size such as '8GiB', got {value!r}")
    return parse_size(value, name=name)


def _threads(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: expected an integer >= 1, got {value!r}")
    return value


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    return value


def _delay(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{name}: expected a number of milliseconds >= 0, got {value!r}")
    return float(value)


def _ms(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{name}: expected a number of milliseconds > 0, got {value!r}")
    return float(value)


def _seconds(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name}: expected a whole number of seconds >= 0, got {value!r}")
    return value


def _kind(value: object, name: str) -> str:
    from kvtier.stack.registry import tier_kinds

    return str(_choice(tier_kinds())(value, name))


def _eviction(value: object, name: str) -> str | None:
    if value is None:
        return None
    from kvtier.policies.registry import eviction_names

    return str(_choice(eviction_names())(value, name))


def _source(value: object, name: str) -> str | None:
    if value is None:
        return None
    from kvtier.sources import HitSource

    return str(_choice([s.label for s in HitSource])(value, name))


_FIELDS: dict[str, Any] = {
    "kind": _kind,
    "name": _text,
    "capacity": _capacity,
    "eviction": _eviction,
    "path": _opt_text,
    "url": _opt_text,
    "threads": _threads,
    "shared": _flag,
    "lookup_delay_ms": _delay,
    "timeout_ms": _ms,
    "probe_wait_ms": _ms,
    "password_env": _opt_text,
    "password_file": _opt_text,
    "ssl_ca": _opt_text,
    "ssl_cert": _opt_text,
    "ssl_key": _opt_text,
    "ssl_check_hostname": _flag,
    "ttl_s": _seconds,
    "secret_env": _opt_text,
    "secret_file": _opt_text,
    "encrypt": _flag,
    "source": _source,
    "on_store": _choice(ON_STORE),
    "on_evict": _choice(ON_EVICT),
    "on_hit": _choice(ON_HIT),
}
_EDGE_KEYS = ("on_store", "on_evict", "on_hit")


def parse_tier(data: object, name: str, first: bool) -> TierSpec:
    """One ``tiers`` entry; ConfigError naming ``name.key`` on anything wrong."""
    if isinstance(data, TierSpec):
        return data
    if not isinstance(data, Mapping):  # not echoed: a URL given here may carry a password
        raise ConfigError(
            f"{name}: expected a mapping with at least 'kind', got a {type(data).__name__}"
        )
    kind = str(data.get("kind"))
    narrow = kind in _KIND_KEYS
    accepted = _KIND_KEYS[kind] if narrow else tuple(_FIELDS)
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ConfigError(
            f"{name}: unknown key(s) {', '.join(map(repr, unknown))}; accepted keys"
            f"{f' for a {kind} tier' if narrow else ''}: {', '.join(sorted(accepted))}"
        )
    if "kind" not in data:
        raise ConfigError(f"{name}: 'kind' is required")
    misplaced = sorted(set(data) - set(accepted) - set(_TOLERATED.get(kind, ())))
    if narrow and misplaced:
        raise ConfigError(
            f"{name}: {', '.join(misplaced)} do(es) not apply to a {kind} tier; accepted keys: "
            f"{', '.join(sorted(accepted))}"
        )
    if first:
        edge = sorted(set(_EDGE_KEYS) & set(data))
        if edge:
            raise ConfigError(
                f"{name}: {', '.join(edge)}: edge rules describe the edge from the tier "
                "above; the first tier has none"
            )
    kwargs = {key: _FIELDS[key](value, f"{name}.{key}") for key, value in data.items()}
    spec = TierSpec(**kwargs)
    if spec.kind == "disk" and not spec.path:
        raise ConfigError(f"{name}.path: a disk tier needs a directory")
    if spec.kind == "redis":
        return _remote(spec, name)
    remote_only = sorted(k for k in (*_REMOTE_KEYS, *_SECRET_KEYS) if k in data and k != "url")
    if remote_only:
        raise ConfigError(
            f"{name}: {', '.join(remote_only)} apply to the redis kind only (got {spec.kind!r})"
        )
    if (spec.shared or spec.lookup_delay_ms) and spec.kind != "memory":
        raise ConfigError(
            f"{name}: shared / lookup_delay_ms apply to the memory kind only (got {spec.kind!r})"
        )
    if spec.lookup_delay_ms and not spec.shared:
        raise ConfigError(f"{name}.lookup_delay_ms: only a shared tier's lookups can wait")
    return spec


_REMOTE_KEYS = (
    "url",
    "timeout_ms",
    "probe_wait_ms",
    "password_env",
    "password_file",
    "ssl_ca",
    "ssl_cert",
    "ssl_key",
    "ssl_check_hostname",
    "ttl_s",
)
"""Keys of the redis kind alone (``url`` is the memory kind's too)."""
_COMMON_KEYS = ("kind", "name", "capacity", "eviction", "source", *_EDGE_KEYS)
_SECRET_KEYS = ("secret_env", "secret_file", "encrypt")
"""The redis kind's value-protection keys (kvtier.tiers.remote.auth)."""
_KIND_KEYS: dict[str, tuple[str, ...]] = {"redis": (*_COMMON_KEYS, *_REMOTE_KEYS, *_SECRET_KEYS)}
"""What a kind accepts, where it is narrower than every key (the error lists these)."""
_TOLERATED: dict[str, tuple[str, ...]] = {"redis": ("shared", "lookup_delay_ms")}
"""Keys a kind accepts without listing them: a redis tier is always shared, and its
lookup_delay_ms gets its own error below."""


def _remote(spec: TierSpec, name: str) -> TierSpec:
    """A redis tier: a URL that parses, always shared."""
    if not spec.url:
        raise ConfigError(f"{name}.url: a redis tier needs a url such as 'redis://host:6379'")
    from kvtier.tiers.remote.url import parse_remote_url

    try:
        target = parse_remote_url(spec.url, environ={})
    except ConfigError as e:  # its message starts "url: ..." and masks credentials
        raise ConfigError(f"{name}.{e}") from None
    from kvtier.tiers.remote.secrets import check_secrets, check_tls

    check_secrets(spec, target, name)
    check_tls(spec, target, name)
    if spec.lookup_delay_ms:
        raise ConfigError(f"{name}.lookup_delay_ms: a redis tier waits for real (probe_wait_ms)")
    from kvtier.tiers.remote.auth import load_secret

    # Loaded now to refuse a bad secret before anything is built; again when the tier is.
    load_secret(spec.secret_env, spec.secret_file, spec.encrypt, name)
    return dataclasses.replace(spec, shared=True)


def parse_tiers(value: Sequence[object], name: str = "tiers") -> tuple[TierSpec, ...]:
    specs = tuple(parse_tier(v, f"{name}[{i}]", i == 0) for i, v in enumerate(value))
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.label in seen:
            raise ConfigError(
                f"{name}[{i}].name: {spec.label!r} is used twice; give each tier its own name"
            )
        seen.add(spec.label)
    if specs and specs[0].shared:
        raise ConfigError(f"{name}[0]: the first tier cannot be shared (it takes every store)")
    return specs


def flat_tier_specs(config: KVTierConfig) -> tuple[TierSpec, ...]:
    """The stack the flat keys describe: cpu (``cpu_bytes``), then disk (``disk_path``)
    with ``disk_write_policy`` as its edge rules."""
    cpu = TierSpec("cpu", capacity=config.cpu_bytes)
    if not config.disk_path:
        return (cpu,)
    back = config.disk_write_policy == "write-back"
    disk = TierSpec(
        "disk",
        capacity=config.disk_bytes,
        path=config.disk_path,
        threads=config.disk_threads,
        eviction=config.disk_eviction,
        on_store="skip" if back else "through",
        on_evict="demote" if back else "drop",
    )
    return (cpu, disk)
