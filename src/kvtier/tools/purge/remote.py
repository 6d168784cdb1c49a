"""Removing chunks from a remote store: SCAN MATCH one glob, UNLINK what it finds, in batches.

Contract:

- Scope: only names of kvtier's own shape (:func:`kvtier.tiers.remote.keyspace.is_chunk_name`)
  under the glob(s) of :func:`match_patterns` are counted or removed. Names written under a
  tier secret are keyed: only a purge given the same secret selects a tenant or a model
  among them (``--all`` needs none). The glob is checked again on
  each name it returns (any other key that happens to share the prefix is left alone and
  counted as ``foreign``).
- Batches: SCAN with COUNT ``scan_count`` (every primary of a cluster); each batch of
  matching names goes in one UNLINK (the library splits it per slot in a cluster). UNLINK
  frees values off the server's main thread. A name removed twice (two purges at once) is
  counted once, by the one that removed it.
- Consistency: SCAN returns every name present for the whole scan; chunks written while it
  runs may stay (run it again, or stop the writers first). Engines that held a purged chunk
  see a miss and recompute; nothing stale is ever served (values carry their own checks).
- ``dry_run``: SCAN only; the count is what a purge would remove now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from kvtier.errors import ConfigError
from kvtier.tiers.remote.keyspace import NAME_RE, PREFIX, is_chunk_name, purge_pattern
from kvtier.tools.purge import PurgeTarget

SCAN_COUNT = 1000
"""Names a SCAN step looks at (per node): large enough that a million names cost about a
thousand round trips, small enough that one step never blocks the server for long."""


def match_patterns(target: PurgeTarget, secret: bytes | None = None) -> list[bytes]:
    """SCAN MATCH globs selecting ``target``'s chunks (``secret``: the tier's, for keyed
    names). Labels are hex, so no glob character comes from them."""
    if target.every:
        return [PREFIX + b"*"]
    if target.namespace is not None:
        return [purge_pattern(target.namespace.extra, target.namespace.model, secret)]
    if target.tenant is not None:
        return [purge_pattern(target.tenant, None, secret)]
    if target.labels is not None:
        return [PREFIX + target.labels.encode() + b":*"]
    raise ConfigError(
        "purge: a remote store is selected by --all, --model/--namespace or the TENANT:MODEL "
        "labels --list shows (its names carry no namespace digest)"
    )


def is_kvtier_name(name: bytes) -> bool:
    return is_chunk_name(name)


@dataclass
class RemotePurge:
    """What one purge found: ``chunks`` (values removed, or counted in a dry run),
    ``foreign`` (names under the glob that are not kvtier's: left alone)."""

    chunks: int = 0
    foreign: int = 0


def _batches(client: Any, pattern: bytes, count: int, size: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for name in client.scan_iter(match=pattern, count=count):
        batch.append(bytes(name))
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def purge_remote(
    client: Any,
    target: PurgeTarget,
    *,
    dry_run: bool = False,
    secret: bytes | None = None,
    scan_count: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> RemotePurge:
    """Remove (or count, ``dry_run``) ``target``'s chunks on the library client ``client``
    (``redis.Redis`` or ``redis.RedisCluster``), SCANning ``scan_count`` names a step
    (default SCAN_COUNT); ``secret``: the tier's (keyed names); ``progress(chunks so far)``
    after each batch. Library errors are raised as they are."""
    out = RemotePurge()
    count = scan_count or SCAN_COUNT
    for pattern in match_patterns(target, secret):
        for batch in _batches(client, pattern, count, count):
            glob = pattern.decode()
            mine = [n for n in batch if is_kvtier_name(n) and fnmatchcase(n.decode(), glob)]
            out.foreign += len(batch) - len(mine)
            if not mine:
                continue
            out.chunks += len(mine) if dry_run else int(client.unlink(*mine))
            if progress is not None:
                progress(out.chunks)
    return out


def namespaces_present(client: Any) -> dict[str, int]:
    """Chunks per ``<tenant>:<model>`` label pair (as in the names and ``--digest``), most
    first."""
    counts: dict[str, int] = {}
    for batch in _batches(client, PREFIX + b"*", SCAN_COUNT, SCAN_COUNT):
        for name in batch:
            m = NAME_RE.fullmatch(name)
            if m is not None:
                ns = f"{m.group('tenant').decode()}:{m.group('model').decode()}"
                counts[ns] = counts.get(ns, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def nothing_matched(
    client: Any, target: PurgeTarget, got: RemotePurge, secret: bytes | None
) -> str | None:
    """Why a purge of one tenant or model found nothing, when the store holds other kvtier
    chunks (None when it matched something, selected everything, or the store holds no
    kvtier chunk at all). Keyed and unkeyed names look alike (hex labels), so the hint names
    both causes: names keyed by a secret the purge was not given, or a namespace that
    differs from what the engine logs."""
    if got.chunks or target.every or target.labels is not None:
        return None
    present = namespaces_present(client)
    total = sum(present.values())
    if not total:
        return None
    keyed = (
        "the purge was given no secret: a redis tier with secret_env or secret_file (or, "
        "without one, a deployment with key_secret_env or key_secret_file) keys its names, "
        "so give --secret-env / --secret-file (or --key-secret-env / --key-secret-file) as "
        "the deployment has them"
        if secret is None
        else "the secret given may not be the tier's (names are keyed by it)"
    )
    return (
        f"no chunk matched {target.describe()}, while the store holds {total} kvtier chunks "
        f"under {len(present)} label pair(s) (see --list); {keyed}, or check the namespace "
        "text and model against what the engine logs at start (kvtier: namespace ...)"
    )
