"""The shared remote tier on Redis / Valkey: URL, client, key names, store, index, kind."""

from kvtier.tiers.remote.client import RemoteClient, RemoteUnavailable
from kvtier.tiers.remote.index import RemoteIndex
from kvtier.tiers.remote.keyspace import KeySpace
from kvtier.tiers.remote.store import RemoteStore
from kvtier.tiers.remote.url import RemoteTarget, parse_remote_url

__all__ = [
    "KeySpace",
    "RemoteClient",
    "RemoteIndex",
    "RemoteStore",
    "RemoteTarget",
    "RemoteUnavailable",
    "parse_remote_url",
]
