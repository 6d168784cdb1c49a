"""A redis tier's credentials and TLS files: checked when the config is parsed, read when
its clients are built.

Contracts:

* No secret is ever put into a message: errors name the option (``tiers[i].password_file``)
  and the file's path, never its content; a URL is only ever shown masked
  (:attr:`RemoteTarget.display`).
* Password and secret files must be private (mode 0600, owned by the user kvtier runs as,
  or by root), as ssh requires of a key; anything else is refused with the ``chmod`` that
  fixes it.
* A password can come from three places, in this order: the URL (discouraged: vLLM prints
  ``kv_connector_extra_config``, URL included, in its start-up log before kvtier runs, so
  kvtier can only warn), ``password_file``, the environment (``password_env``, default
  ``KVTIER_REDIS_PASSWORD``). A URL password together with ``password_file`` is refused.
* TLS files are loaded into a throw-away :class:`ssl.SSLContext` at parse time, so a
  missing, unreadable or malformed file (or a key that does not match its certificate) is
  one ConfigError naming the option, before any engine starts; a failure to connect later
  (wrong CA, hostname mismatch, no client cert) is a transport error, i.e. misses.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvtier.errors import ConfigError
from kvtier.keysecret import read_private_file

if TYPE_CHECKING:
    from kvtier.tiers.remote.options import RedisOptions
    from kvtier.tiers.remote.url import RemoteTarget

log = logging.getLogger("kvtier")

_WARNED: set[str] = set()
"""Masked URLs already warned about in this process (the config is parsed more than once)."""


@dataclass(frozen=True)
class TLSFiles:
    """What a TLS client presents and trusts; paths to PEM files (None: not used)."""

    ca: str | None = None
    """CA bundle the server's certificate must chain to (None: the system's store)."""
    cert: str | None = None
    """Client certificate (mutual TLS)."""
    key: str | None = None
    """Private key of ``cert``."""
    check_hostname: bool = True
    """Whether the server's certificate must name the host connected to."""

    def connection_kwargs(self) -> dict[str, Any]:
        """The ``redis`` library's keyword arguments for an ``SSLConnection``."""
        return {
            "ssl_ca_certs": self.ca,
            "ssl_certfile": self.cert,
            "ssl_keyfile": self.key,
            "ssl_cert_reqs": "required",
            "ssl_check_hostname": self.check_hostname,
        }


def tls_files(spec: RedisOptions) -> TLSFiles:
    return TLSFiles(spec.ssl_ca, spec.ssl_cert, spec.ssl_key, spec.ssl_check_hostname)


PASSWORD_FILE_MAX = 1 << 16
"""Bytes of a password file read (its first line is the password)."""


def read_password(path: str, option: str = "password_file") -> str:
    """The password in ``path`` (its first line); ConfigError naming ``option`` if the file
    cannot be read, is not private (:func:`kvtier.keysecret.read_private_file`: mode 0600,
    owned by this user) or holds none."""
    try:
        text = read_private_file(path, option, PASSWORD_FILE_MAX).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{option}: cannot read {path!r}: not UTF-8 text") from None
    password = text.splitlines()[0] if text.strip() else ""
    if not password:
        raise ConfigError(f"{option}: {path!r} holds no password (its first line is empty)")
    return password


def check_secrets(spec: RedisOptions, target: RemoteTarget, name: str) -> None:
    """Refuse a password given twice or a password file that cannot be read; warn loudly
    (once per URL and process) when the URL itself carries the password."""
    if spec.password_file:
        if target.password:
            raise ConfigError(
                f"{name}.password_file: the url carries a password too; give it in one place "
                "(password_file)"
            )
        read_password(spec.password_file, f"{name}.password_file")
    if target.password and target.display not in _WARNED:
        _WARNED.add(target.display)
        log.warning(
            "kvtier: %s.url (%s) carries a password in the config text, which vLLM has "
            "already printed in its start-up log (kv_connector_extra_config) and which "
            "process listings may show; give it with password_env (an environment "
            "variable, default KVTIER_REDIS_PASSWORD) or password_file instead",
            name,
            target.display,
        )


def check_tls(spec: RedisOptions, target: RemoteTarget, name: str) -> None:
    """TLS options only on a ``rediss://`` URL; cert and key together; every file loads."""
    given = [k for k in ("ssl_ca", "ssl_cert", "ssl_key") if getattr(spec, k)]
    if not spec.ssl_check_hostname:
        given.append("ssl_check_hostname")
    if given and not target.tls:
        raise ConfigError(
            f"{name}.{given[0]}: TLS options need a TLS url (rediss:// or rediss+cluster://), "
            f"got {target.display!r}"
        )
    if bool(spec.ssl_cert) != bool(spec.ssl_key):
        missing = "ssl_key" if spec.ssl_cert else "ssl_cert"
        raise ConfigError(f"{name}.{missing}: ssl_cert and ssl_key go together (mutual TLS)")
    for option in ("ssl_ca", "ssl_cert", "ssl_key"):
        path = getattr(spec, option)
        if path:
            try:
                with open(path, "rb"):
                    pass
            except OSError as e:
                raise ConfigError(f"{name}.{option}: cannot read {path!r}: {e.strerror}") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if spec.ssl_ca:
        try:
            ctx.load_verify_locations(cafile=spec.ssl_ca)
        except (ssl.SSLError, ValueError) as e:
            raise ConfigError(
                f"{name}.ssl_ca: {spec.ssl_ca!r} is not a PEM CA certificate ({_reason(e)})"
            ) from None
    if spec.ssl_cert and spec.ssl_key:
        try:
            ctx.load_cert_chain(spec.ssl_cert, spec.ssl_key)
        except (ssl.SSLError, ValueError) as e:
            raise ConfigError(
                f"{name}.ssl_cert: {spec.ssl_cert!r} with ssl_key {spec.ssl_key!r} is not a "
                f"PEM certificate and its matching unencrypted key ({_reason(e)})"
            ) from None


def _reason(e: Exception) -> str:
    return getattr(e, "reason", None) or type(e).__name__
