"""A redis tier's connection options on a command line (``kvtier purge``): the tier's own
options, parsed by the tier's own parser.

Each of :data:`CLI_KEYS` becomes ``--<key with dashes>``; what is given goes, with the URL,
into a ``redis`` tier entry that :func:`kvtier.stack.parse.parse_tier` parses and checks
exactly as it does an engine's config (password file private, TLS files loaded, cert and
key together, TLS options only on ``rediss://``, the secret's length), with errors naming
the command-line flag. The client is then built by :func:`kvtier.tiers.remote.kind.client_for`,
the engine's own. So a tool reaches every deployment the tier does (a private CA, mutual
TLS, a password file) and a new connection option of the tier only needs its name here.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtier.contract.spec import TierSpec

CLI_KEYS: dict[str, str] = {
    "password_file": "a file holding the password (mode 0600), as the tier's password_file",
    "password_env": "the environment variable holding the password (default "
    "KVTIER_REDIS_PASSWORD), as the tier's password_env",
    "ssl_ca": "PEM CA bundle the server's certificate must chain to (rediss:// only)",
    "ssl_cert": "PEM client certificate for mutual TLS (with --ssl-key)",
    "ssl_key": "PEM private key of --ssl-cert",
    "ssl_check_hostname": "true or false: the server's certificate must name the host "
    "(default true)",
    "secret_env": "the redis tier's secret_env (its names are keyed by it)",
    "secret_file": "the redis tier's secret_file",
}
"""Tier options a tool takes, with their help lines."""

KEY_SECRET_KEYS: dict[str, str] = {
    "key_secret_env": "the deployment's key_secret_env (a redis tier without a secret of its "
    "own keys its names by a secret derived from it)",
    "key_secret_file": "the deployment's key_secret_file",
}
"""Top-level options a tool takes as well (they shape a redis tier's names)."""

TOOL_TIMEOUT_MS = 30_000.0
"""A tool's bound on each network wait (a SCAN step over a large store takes a while)."""


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--password-file``, ``--ssl-ca``, ... (one per :data:`CLI_KEYS`)."""
    for key, text in (CLI_KEYS | KEY_SECRET_KEYS).items():
        parser.add_argument(flag(key), dest=key, default=None, metavar="VALUE", help=text)


def key_secret_from_args(args: argparse.Namespace) -> bytes:
    """The deployment key secret the flags name, read and checked as an engine reads it
    (:func:`kvtier.keysecret.read_key_secret`); b"" when none is given."""
    from kvtier.config import KVTierConfig
    from kvtier.keysecret import read_key_secret

    given = {k: getattr(args, k) for k in KEY_SECRET_KEYS if getattr(args, k, None)}
    return read_key_secret(KVTierConfig.from_dict(given)) if given else b""


def tier_from_args(url: str, args: argparse.Namespace, where: str) -> TierSpec:
    """The redis tier the command line describes (``url`` and the flags given), parsed and
    checked as an engine's config entry; ConfigError naming ``where --flag`` otherwise."""
    from kvtier.stack.parse import parse_tier  # the tier registry: only when a tool runs

    entry: dict[str, Any] = {"kind": "redis", "url": url, "timeout_ms": TOOL_TIMEOUT_MS}
    for key in CLI_KEYS:
        value = getattr(args, key, None)
        if value is not None:
            entry[key] = value
    labels = {key: f"{where} {flag(key)}" for key in CLI_KEYS}
    labels["url"] = f"{where} --remote"
    return parse_tier(entry, where, first=False, labels=labels)
