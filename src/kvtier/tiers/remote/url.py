"""Where a remote tier lives: ``redis://``, ``rediss://`` (TLS), ``redis+cluster://`` URLs.

Accepted forms (``tiers[i].url``)::

    redis://[user[:password]@]host[:port][/db]          one server (Redis or Valkey)
    rediss://...                                         the same over TLS
    redis+cluster://[user[:password]@]h1:p1,h2:p2,...    a Redis Cluster, by seed nodes
    rediss+cluster://...                                 a cluster over TLS
    redis://h1:p1,h2:p2                                  several seeds also mean a cluster

The password (and ACL user) come from the URL or, when the URL has none, from the
environment variables ``KVTIER_REDIS_PASSWORD`` / ``KVTIER_REDIS_USERNAME`` (names
configurable per tier). They are never logged: :attr:`RemoteTarget.display` and ``repr``
show ``***`` in their place, and errors quote the display form only.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import unquote

from kvtier.errors import ConfigError

PASSWORD_ENV = "KVTIER_REDIS_PASSWORD"
USERNAME_ENV = "KVTIER_REDIS_USERNAME"
DEFAULT_PORT = 6379
_SCHEMES = {
    "redis": (False, False),
    "rediss": (True, False),
    "redis+cluster": (False, True),
    "rediss+cluster": (True, True),
}
"""scheme -> (tls, cluster)."""
_URL_LIST = re.compile(r",(?=\s*rediss?(?:\+cluster)?://)", re.IGNORECASE)


def _hidden(url: str) -> str:
    """``url`` as errors show it: the scheme only (``redis://...``). A malformed URL's
    parts cannot be told apart, so none of them is shown: any could be the password."""
    scheme, sep, _ = url.partition("://")
    return f"{scheme}://..." if sep else "the URL"


@dataclass(frozen=True)
class RemoteTarget:
    """A parsed remote-store URL. ``password`` never appears in ``repr`` or ``display``."""

    hosts: tuple[tuple[str, int], ...]
    """Server (standalone) or seed nodes (cluster)."""
    tls: bool = False
    cluster: bool = False
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @property
    def display(self) -> str:
        """The URL with credentials masked: the only form that goes into logs and errors."""
        scheme = ("rediss" if self.tls else "redis") + ("+cluster" if self.cluster else "")
        auth = ""
        if self.username or self.password:
            auth = f"{self.username or ''}{':***' if self.password else ''}@"
        hosts = ",".join(f"{h}:{p}" for h, p in self.hosts)
        db = f"/{self.db}" if self.db and not self.cluster else ""
        return f"{scheme}://{auth}{hosts}{db}"

    def __repr__(self) -> str:
        return f"RemoteTarget({self.display!r})"


def _host_port(text: str, url: str) -> tuple[str, int]:
    """``host[:port]`` of one seed. Errors show ``url`` (masked) and never the text of a
    malformed part: ``redis://user:S3cr3t`` (host forgotten) reads "S3cr3t" as a port."""
    if text.startswith("["):  # [ipv6]:port
        end = text.find("]")
        host, rest = text[1:end], text[end + 1 :]
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise ConfigError(f"url: no host in {_hidden(url)}")
    if not port_text:
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(
            f"url: the port of a host in {_hidden(url)} is not a number from 1 to 65535 (not "
            "shown: with '@host' forgotten, it is the password); give user:password@host:port"
        )
    return host, int(port_text)


def parse_remote_url(
    url: str,
    *,
    password_env: str = PASSWORD_ENV,
    username_env: str = USERNAME_ENV,
    environ: dict[str, str] | None = None,
) -> RemoteTarget:
    """Parse a remote-store URL; ConfigError naming the URL (credentials masked) if bad."""
    env = os.environ if environ is None else environ
    # A list of full URLs (seeds of one cluster) splits only before a scheme, so a comma in
    # a password cannot cut the first URL's credentials in two (and then show up as a host).
    first, *others = _URL_LIST.split(url)
    if others:
        others = [o.split("://", 1)[-1].split("@")[-1].split("/")[0] for o in others]
        url = ",".join([first, *others])
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        # The text is not shown: it may be a secret pasted in the wrong place.
        said = "has no scheme" if not sep else "has a scheme that is not accepted"
        raise ConfigError(
            f"url: the value (not shown, {len(url)} characters) {said}; accepted schemes: "
            f"{', '.join(s + '://' for s in _SCHEMES)}"
        )
    tls, cluster = _SCHEMES[scheme.lower()]
    auth, at, hostpart = rest.rpartition("@")  # credentials first: a password may hold "?"
    if not at:
        auth, hostpart = "", rest
    hostpart, _, query = hostpart.partition("?")
    if query:
        raise ConfigError("url: query parameters are not supported (use the tier's keys)")
    hostpart, _, path = hostpart.partition("/")
    username = password = None
    if auth:
        user, colon, pw = auth.partition(":")
        username = unquote(user) or None
        password = (unquote(pw) or None) if colon else None  # "user:@h": from env/file
        if not colon:  # redis://secret@host: a bare credential is a password
            username, password = None, unquote(user)
    masked = f"{scheme}://{'***@' if auth else ''}{hostpart}"
    seeds = []
    for item in hostpart.split(","):
        item = item.strip()
        if item:
            seeds.append(_host_port(item, masked))
    if not seeds:
        raise ConfigError(f"url: no host in {_hidden(masked)}")
    if len(seeds) > 1:
        cluster = True
    db = 0
    if path:
        if cluster or not path.isdigit():
            raise ConfigError(
                f"url: the database after '/' in {_hidden(masked)} is not a number (not shown), "
                "or the URL is a cluster's (a cluster has only db 0)"
            )
        db = int(path)
    if password is None:
        password = env.get(password_env) or None
    if username is None:
        username = env.get(username_env) or None
    return RemoteTarget(tuple(seeds), tls, cluster, db, username, password)
