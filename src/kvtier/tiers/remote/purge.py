"""Removing chunks from a remote store: SCAN MATCH one glob, UNLINK what it finds, in batches.

Contract:

- Scope: only names of kvtier's own shape (:mod:`kvtier.tiers.remote.keyspace`) under the
  glob(s) of :func:`match_patterns` are counted or removed. The glob is checked again on
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

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kvtier.keys import KEY_BYTES
from kvtier.purge import PurgeTarget
from kvtier.tiers.remote.keyspace import PREFIX, TAG_CHARS, prefix_of

SCAN_COUNT = 1000
"""Names a SCAN step looks at (per node): large enough that a million names cost about a
thousand round trips, small enough that one step never blocks the server for long."""

_NAME = re.compile(
    re.escape(PREFIX)
    + rb"(?P<ns>[0-9a-f]{%d}):\{[0-9a-f]{%d}\}[0-9a-f]{%d}:[0-9]+"
    % (2 * KEY_BYTES, TAG_CHARS, 2 * KEY_BYTES - TAG_CHARS)
)
"""Exactly the names kvtier writes (``kvt3:<namespace>:{<tag>}<rest>:<rank>``)."""


def match_patterns(target: PurgeTarget) -> list[bytes]:
    """SCAN MATCH globs selecting ``target``'s chunks: the one place purge knows the
    keyspace's layout. Namespace digests are hex, so no glob character comes from them."""
    if target.every:
        return [PREFIX + b"*"]
    if target.namespace is not None:
        return [prefix_of(target.namespace.chain_digest()) + b"*"]
    assert target.digest is not None
    return [prefix_of(target.digest) + b"*"]


def is_kvtier_name(name: bytes) -> bool:
    return _NAME.fullmatch(name) is not None


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
    scan_count: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> RemotePurge:
    """Remove (or count, ``dry_run``) ``target``'s chunks on the library client ``client``
    (``redis.Redis`` or ``redis.RedisCluster``), SCANning ``scan_count`` names a step
    (default SCAN_COUNT); ``progress(chunks so far)`` after each batch. Library errors are
    raised as they are."""
    out = RemotePurge()
    count = scan_count or SCAN_COUNT
    for pattern in match_patterns(target):
        for batch in _batches(client, pattern, count, count):
            mine = [n for n in batch if is_kvtier_name(n) and n.startswith(pattern[:-1])]
            out.foreign += len(batch) - len(mine)
            if not mine:
                continue
            out.chunks += len(mine) if dry_run else int(client.unlink(*mine))
            if progress is not None:
                progress(out.chunks)
    return out


def namespaces_present(client: Any) -> dict[str, int]:
    """Chunks per namespace digest (hex, as in the names and ``--digest``), most first."""
    counts: dict[str, int] = {}
    for batch in _batches(client, PREFIX + b"*", SCAN_COUNT, SCAN_COUNT):
        for name in batch:
            m = _NAME.fullmatch(name)
            if m is not None:
                ns = m.group("ns").decode()
                counts[ns] = counts.get(ns, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
