"""The ``redis`` tier kind: a shared tier on Redis / Valkey (standalone or Redis Cluster).

Always shared and last in the stack: the scheduler side gets a :class:`RemoteIndex`
(probes), each worker a :class:`RemoteStore` with its own connections. Hit source ``p2p``
(vLLM's label for KV from other engines) unless the spec names another. With a secret
(``secret_env`` / ``secret_file``) both sides load it when built (a ConfigError naming the
option if it cannot be loaded: nothing is stored under a half-applied configuration), the
names are keyed and every value is MACed, or with ``encrypt`` AES-256-GCM sealed.
"""

from __future__ import annotations

import dataclasses
import os

import blake3

from kvtier.contract import SlotStore, TierIndex
from kvtier.contract.kind import Capabilities, TierContext, TierKind, fixed
from kvtier.contract.spec import TierSpec
from kvtier.errors import ConfigError
from kvtier.options import Label, prefix_of
from kvtier.sources import HitSource
from kvtier.tiers.remote.auth import ValueAuth, load_secret
from kvtier.tiers.remote.client import RemoteClient
from kvtier.tiers.remote.index import RemoteIndex
from kvtier.tiers.remote.keyspace import KeySpace
from kvtier.tiers.remote.options import RedisOptions
from kvtier.tiers.remote.secrets import check_secrets, check_tls, read_password, tls_files
from kvtier.tiers.remote.store import RemoteStore
from kvtier.tiers.remote.url import PASSWORD_ENV, parse_remote_url

DEFAULT_CAPACITY = 1 << 30
"""Nominal only: the server's ``maxmemory`` bounds what it holds, not kvtier."""


def options_of(spec: TierSpec) -> RedisOptions:
    assert isinstance(spec.options, RedisOptions), spec
    return spec.options


def _check(spec: TierSpec, label: Label) -> TierSpec:
    """A URL that parses, credentials and TLS files that load, a secret that loads."""
    opts = options_of(spec)
    name = prefix_of(label)
    assert opts.url  # a required option
    try:
        target = parse_remote_url(opts.url, environ={})
    except ConfigError as e:  # its message starts "url: ..." and masks credentials
        raise ConfigError(f"{name}.{e}") from None
    check_secrets(opts, target, name)
    check_tls(opts, target, name)
    # Loaded now to refuse a bad secret before anything is built; again when the tier is.
    load_secret(opts.secret_env, opts.secret_file, opts.encrypt, name)
    return spec


def client_for(spec: TierSpec) -> RemoteClient:
    """A client on the spec's store: the password from the URL, ``password_file`` or the
    environment (in that order), the TLS files of the spec."""
    opts = options_of(spec)
    assert opts.url
    password_env = opts.password_env or PASSWORD_ENV
    env = dict(os.environ)
    if opts.password_file:  # the file wins over the environment
        env.pop(password_env, None)
    target = parse_remote_url(opts.url, password_env=password_env, environ=env)
    if opts.password_file and not target.password:
        target = dataclasses.replace(target, password=read_password(opts.password_file))
    return RemoteClient(target, timeout_s=opts.timeout_ms / 1e3, tls=tls_files(opts))


KEY_SECRET_CONTEXT = "kvtier 2026-12 remote value secret from the key secret v1"
"""BLAKE3 key-derivation context of the value secret a tier without one takes from the
deployment's ``key_secret``."""


def secret_for(spec: TierSpec, key_secret: bytes = b"") -> bytes | None:
    """The tier's secret (None without one); ConfigError naming the option otherwise.

    A tier without ``secret_env`` / ``secret_file`` in a deployment with a ``key_secret``
    takes a value secret derived from it (MAC mode): otherwise someone who may GET and SET
    the store could rewrite an existing value with a well-formed envelope over their own
    payload (its format and checksum are public), which the key secret alone, keying only
    the chunk keys, does not stop."""
    opts = options_of(spec)
    own = load_secret(opts.secret_env, opts.secret_file, opts.encrypt, f"tier {spec.label!r}")
    if own is not None or not key_secret:
        return own
    return blake3.blake3(key_secret, derive_key_context=KEY_SECRET_CONTEXT).hexdigest().encode()


def keyspace_for(spec: TierSpec, ctx: TierContext) -> KeySpace:
    """How the tier names chunks in the store (keyed by its secret, if any)."""
    secret = secret_for(spec, ctx.namespace.secret)
    return KeySpace(ctx.namespace, secret, options_of(spec).encrypt)


def _index(spec: TierSpec, ctx: TierContext) -> TierIndex:
    opts = options_of(spec)
    space = keyspace_for(spec, ctx)
    return RemoteIndex(client_for(spec), space, ctx.world, opts.probe_wait_ms / 1e3)


def _store(spec: TierSpec, ctx: TierContext) -> SlotStore:
    opts = options_of(spec)
    secret = secret_for(spec, ctx.namespace.secret)
    digest = ctx.namespace.digest()
    auth = ValueAuth(secret, opts.encrypt, digest, ctx.chunk_bytes) if secret else None
    return RemoteStore(
        client_for(spec),
        KeySpace(ctx.namespace, secret, opts.encrypt),
        ctx.chunk_bytes,
        digest,
        ctx.namespace.rank,
        num_slots=ctx.capacity_chunks(spec, DEFAULT_CAPACITY),
        ttl_s=opts.ttl_s,
        auth=auth,
    )


KIND = TierKind(
    name="redis",
    source=HitSource.P2P,
    make_index=_index,
    make_store=_store,
    default_capacity=DEFAULT_CAPACITY,
    capabilities=fixed(Capabilities(shared=True, persistent=True)),
    options=RedisOptions,
    check=_check,
)
"""Always shared: its index probes, its store is addressed by key."""
