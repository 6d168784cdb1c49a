"""The options of a ``redis`` tier (typed, documented, parsed here; checked by the kind,
:mod:`kvtier.tiers.remote.kind`), and how a URL may be shown."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtier.contract.spec import TierOptions
from kvtier.errors import ConfigError
from kvtier.options import boolean, millis, opt_nonempty, option, seconds
from kvtier.tiers.remote.url import parse_remote_url


@dataclass(frozen=True)
class RedisOptions(TierOptions):
    """Options of a redis tier (Redis / Valkey, standalone or cluster)."""

    url: str | None = option(
        None, opt_nonempty, "a redis tier needs a url such as 'redis://host:6379'"
    )
    """Where the store lives (required): ``redis://host:port/db``, ``rediss://`` (TLS),
    ``redis+cluster://host:port,...`` (or several seeds) for a Redis Cluster
    (:mod:`kvtier.tiers.remote.url`). Credentials in a URL are never logged; prefer
    ``password_env`` or ``password_file``."""
    timeout_ms: float = option(500.0, millis)
    """The bound on every network wait (connect, send, reply) of one batch; a batch that
    exceeds it is a miss (loads) or a failed store."""
    probe_wait_ms: float = option(2.0, millis)
    """How long a lookup may wait for its probe before answering "not yet" (the connector
    then asks vLLM to retry the request later; the scheduler never waits longer than
    this)."""
    password_env: str | None = option(None, opt_nonempty)
    """Environment variable holding the password when the URL has none (default
    ``KVTIER_REDIS_PASSWORD``; the user, ``KVTIER_REDIS_USERNAME``)."""
    password_file: str | None = option(None, opt_nonempty)
    """A file holding the password (one line; a trailing newline is dropped), read when the
    tier's clients are built; wins over ``password_env``. The URL must then carry no
    password."""
    ssl_ca: str | None = option(None, opt_nonempty)
    """Over TLS (``rediss://``): PEM file of the CA(s) the server's certificate must chain
    to; None: the system's trust store."""
    ssl_cert: str | None = option(None, opt_nonempty)
    """Over TLS: PEM client certificate (mutual TLS, the server's ``tls-auth-clients
    yes``); needs ``ssl_key``."""
    ssl_key: str | None = option(None, opt_nonempty)
    """Over TLS: PEM private key of ``ssl_cert`` (unencrypted)."""
    ssl_check_hostname: bool = option(True, boolean)
    """Over TLS: the server's certificate must name the URL's host (a DNS or IP
    subjectAltName); false only for certificates that name no usable host."""
    ttl_s: int = option(0, seconds)
    """Expire stored chunks after this many seconds (0: never; the server's ``maxmemory`` +
    ``allkeys-lru`` evicts)."""
    secret_env: str | None = option(None, opt_nonempty)
    """Environment variable holding the tier's secret (at least 32 bytes, surrounding
    whitespace dropped; never the secret itself in the config). With a secret every value
    carries a MAC and names are keyed: engines share chunks only with engines holding the
    same secret, and never load a value someone without it wrote."""
    secret_file: str | None = option(None, opt_nonempty)
    """A file holding the tier's secret (instead of ``secret_env``)."""
    encrypt: bool = option(False, boolean)
    """Seal every value with AES-256-GCM instead of a MAC (needs a secret), so the store
    holds no readable KV."""

    def shown(self) -> dict[str, Any]:
        out = super().shown()
        if self.url:
            out["url"] = masked_url(self.url)
        return out


def masked_url(url: str) -> str:
    """``url`` as logs may show it: a remote URL's display form, anything else with
    whatever precedes its last ``@`` replaced by ``***``."""
    try:
        return parse_remote_url(url, environ={}).display
    except ConfigError:
        if "@" not in url:
            return url
        scheme, sep, _ = url.partition("://")
        return f"{scheme + sep if sep and '@' not in scheme else ''}***@{url.rsplit('@', 1)[1]}"
