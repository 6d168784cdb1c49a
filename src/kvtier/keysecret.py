"""The deployment's key secret (``key_secret_env`` / ``key_secret_file``), read once, and
how every secret file is read (:func:`read_private_file`).

The secret keys the chunk-key hash (:attr:`kvtier.keys.Namespace.secret`). It is read when
an engine starts, on the scheduler and on every worker (both need the same namespace
digest), and never logged; a problem with it is one :class:`ConfigError` line naming the
option, so an engine never starts with keys an operator did not intend.

Secret files (this ``key_secret_file``, a redis tier's ``secret_file`` and
``password_file``) must be private, as ssh requires of a private key: a regular file owned
by the user kvtier runs as (or by root), with no permission bits for group or others
(``chmod 600``). A file that others could read has leaked already, and one that others
could change lets them choose the secret; either is refused rather than used.
"""

from __future__ import annotations

import os
import stat
from typing import Protocol

from kvtier.errors import ConfigError


class SecretOptions(Protocol):
    """What :func:`read_key_secret` reads of a config (:class:`kvtier.config.KVTierConfig`
    has both): the options alone, so that the tiers reading private files here stay below
    the config."""

    @property
    def key_secret_env(self) -> str | None: ...

    @property
    def key_secret_file(self) -> str | None: ...


MIN_SECRET_BYTES = 16
"""Shortest accepted secret (128 bits if random)."""
MAX_SECRET_BYTES = 4096


def read_key_secret(config: SecretOptions) -> bytes:
    """The configured secret's bytes; b"" when none is configured."""
    if config.key_secret_env:
        name = config.key_secret_env
        value = os.environ.get(name)
        if value is None:
            raise ConfigError(env_unset("key_secret_env"))
        return _check(value.encode(), "key_secret_env: the environment variable it names")
    if config.key_secret_file:
        path = config.key_secret_file
        data = read_private_file(path, "key_secret_file", MAX_SECRET_BYTES + 2)
        if data.endswith(b"\n"):
            data = data[:-1]
            data = data[:-1] if data.endswith(b"\r") else data
        return _check(data, f"key_secret_file: {path!r}")
    return b""


def env_unset(option: str) -> str:
    """The error for an ``*_env`` option naming a variable that is unset. The name is not
    shown: a secret pasted into the option by mistake would be printed with it."""
    return (
        f"{option}: the environment variable it names is unset (the name is not shown, in "
        "case a secret was put there by mistake: the option holds a variable's name, and "
        "the secret goes into that variable)"
    )


def _check(secret: bytes, where: str) -> bytes:
    if not secret:
        raise ConfigError(f"{where} is empty; it must hold the key secret")
    if len(secret) < MIN_SECRET_BYTES or len(secret) > MAX_SECRET_BYTES:
        raise ConfigError(
            f"{where} holds {len(secret)} bytes; a key secret must be "
            f"{MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes"
        )
    return secret


def read_private_file(path: str, option: str, limit: int) -> bytes:
    """Up to ``limit`` bytes of the secret file ``path``, after checking (on the open file,
    so a path swapped after the check is not read) that it is private: a regular file, owned
    by this process's effective user or by root, with no group or other permission bits.
    Anything else, or a file that cannot be opened, is one ConfigError line naming
    ``option`` and ``path`` (never the content). A link to a private file is followed."""
    try:
        # O_NONBLOCK: opening a FIFO planted at the path must not hang the engine's start.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise ConfigError(f"{option}: cannot read {path!r}: {e.strerror}") from None
    try:
        problem = _not_private(os.fstat(fd), path)
        if problem:
            raise ConfigError(f"{option}: {path!r} {problem}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit)
    except OSError as e:
        raise ConfigError(f"{option}: cannot read {path!r}: {e.strerror}") from None
    finally:
        os.close(fd)


def _not_private(st: os.stat_result, path: str) -> str | None:
    """Why a secret file with status ``st`` is refused; None when it is private."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file; a secret must be in a file of its own"
    uid = os.geteuid()
    if st.st_uid not in (uid, 0):
        return (
            f"is owned by uid {st.st_uid}, not by this process's user (uid {uid}) or root, "
            f"so that user can change the secret; use a file you own (chown {uid} {path})"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return (
            f"has mode {mode:04o}, so group or other users can read or change the secret; "
            f"make it private (chmod 600 {path}), as ssh requires of a key"
        )
    return None
