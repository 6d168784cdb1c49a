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

from kvtier.sources import HitSource
from kvtier.stack.registry import TierContext, TierKind
from kvtier.stack.spec import TierSpec
from kvtier.tiers.base import SlotStore, TierIndex
from kvtier.tiers.remote.auth import ValueAuth, load_secret
from kvtier.tiers.remote.client import RemoteClient
from kvtier.tiers.remote.index import RemoteIndex
from kvtier.tiers.remote.keyspace import KeySpace
from kvtier.tiers.remote.secrets import read_password, tls_files
from kvtier.tiers.remote.store import RemoteStore
from kvtier.tiers.remote.url import PASSWORD_ENV, parse_remote_url

DEFAULT_CAPACITY = 1 << 30
"""Nominal only: the server's ``maxmemory`` bounds what it holds, not kvtier."""


def client_for(spec: TierSpec) -> RemoteClient:
    """A client on the spec's store: the password from the URL, ``password_file`` or the
    environment (in that order), the TLS files of the spec."""
    assert spec.url
    password_env = spec.password_env or PASSWORD_ENV
    env = dict(os.environ)
    if spec.password_file:  # the file wins over the environment
        env.pop(password_env, None)
    target = parse_remote_url(spec.url, password_env=password_env, environ=env)
    if spec.password_file and not target.password:
        target = dataclasses.replace(target, password=read_password(spec.password_file))
    return RemoteClient(target, timeout_s=spec.timeout_ms / 1e3, tls=tls_files(spec))


def secret_for(spec: TierSpec) -> bytes | None:
    """The tier's secret (None without one); ConfigError naming the option otherwise."""
    return load_secret(spec.secret_env, spec.secret_file, spec.encrypt, f"tier {spec.label!r}")


def _index(spec: TierSpec, ctx: TierContext) -> TierIndex:
    space = KeySpace(ctx.namespace, secret_for(spec), spec.encrypt)
    return RemoteIndex(client_for(spec), space, ctx.world, spec.probe_wait_ms / 1e3)


def _store(spec: TierSpec, ctx: TierContext) -> SlotStore:
    secret = secret_for(spec)
    digest = ctx.namespace.digest()
    auth = ValueAuth(secret, spec.encrypt, digest, ctx.chunk_bytes) if secret else None
    return RemoteStore(
        client_for(spec),
        KeySpace(ctx.namespace, secret, spec.encrypt),
        ctx.chunk_bytes,
        digest,
        ctx.namespace.rank,
        num_slots=ctx.capacity_chunks(spec, DEFAULT_CAPACITY),
        ttl_s=spec.ttl_s,
        auth=auth,
    )


KIND = TierKind("redis", HitSource.P2P, False, _index, _store, lambda c: DEFAULT_CAPACITY)
