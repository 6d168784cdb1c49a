"""The deployment's key secret (``key_secret_env`` / ``key_secret_file``), read once.

The secret keys the chunk-key hash (:attr:`kvtier.keys.Namespace.secret`). It is read when
an engine starts, on the scheduler and on every worker (both need the same namespace
digest), and never logged; a problem with it is one :class:`ConfigError` line naming the
option, so an engine never starts with keys an operator did not intend.
"""

from __future__ import annotations

import os

from kvtier.config import KVTierConfig
from kvtier.errors import ConfigError

MIN_SECRET_BYTES = 16
"""Shortest accepted secret (128 bits if random)."""
MAX_SECRET_BYTES = 4096


def read_key_secret(config: KVTierConfig) -> bytes:
    """The configured secret's bytes; b"" when none is configured."""
    if config.key_secret_env:
        name = config.key_secret_env
        value = os.environ.get(name)
        if value is None:
            raise ConfigError(f"key_secret_env: environment variable {name!r} is not set")
        return _check(value.encode(), f"key_secret_env: environment variable {name!r}")
    if config.key_secret_file:
        path = config.key_secret_file
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_SECRET_BYTES + 2)
        except OSError as e:
            raise ConfigError(f"key_secret_file: cannot read {path!r}: {e.strerror}") from None
        if data.endswith(b"\n"):
            data = data[:-1]
            data = data[:-1] if data.endswith(b"\r") else data
        return _check(data, f"key_secret_file: {path!r}")
    return b""


def _check(secret: bytes, where: str) -> bytes:
    if not secret:
        raise ConfigError(f"{where} is empty; it must hold the key secret")
    if len(secret) < MIN_SECRET_BYTES or len(secret) > MAX_SECRET_BYTES:
        raise ConfigError(
            f"{where} holds {len(secret)} bytes; a key secret must be "
            f"{MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes"
        )
    return secret
