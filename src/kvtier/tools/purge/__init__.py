"""``kvtier purge``: what to remove (every chunk, or one namespace's) and the run over tiers.

A namespace is what :class:`~kvtier.keys.Namespace` hashes: the model identity, the KV
layout digest, the parallel layout and the deployment's namespace text (a tenant). Disk
headers carry only each rank's digest of all four, so on disk a namespace is selected by
its parts, exactly as the engine logs them at start ("kvtier: namespace ..."), or by a
digest ``kvtier purge --list`` shows. Remote names carry a label of the namespace text and
one of the model (:mod:`kvtier.tiers.remote.keyspace`), so on a remote store the same
selection removes that model's chunks of that tenant under every layout, and a tenant alone
(``--namespace`` without ``--model``) or a label pair from ``--list`` can be selected too.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.keys import NS_BYTES, Namespace

_PARALLEL = re.compile(r"tp(\d+)pp(\d+)")


@dataclass(frozen=True)
class PurgeTarget:
    """Exactly one of: ``every`` (all of kvtier's chunks), ``namespace`` (its chunks on
    every rank), ``tenant`` (a namespace text's chunks, every model: remote stores only),
    ``digest`` (the disk chunks whose stored namespace digest this is) or ``labels`` (the
    remote names' ``<tenant>:<model>`` labels, as ``--list`` shows them)."""

    every: bool = False
    """Every kvtier chunk, whatever its namespace."""
    namespace: Namespace | None = None
    """One namespace by its parts (its ``rank`` is ignored: every rank's chunks go)."""
    digest: bytes | None = None
    """A disk header's stored rank digest."""
    tenant: str | None = None
    """A namespace text: its chunks of every model (remote names label it)."""
    labels: str | None = None
    """A remote names' ``<tenant>:<model>`` label pair (hex, as ``--list`` shows it)."""

    def __post_init__(self) -> None:
        given = [self.every, self.namespace is not None, self.digest is not None]
        given += [self.tenant is not None, self.labels is not None]
        if given.count(True) != 1:
            raise ConfigError(
                "purge: give exactly one of --all, --model (with --layout), --namespace, --digest"
            )
        if self.digest is not None and len(self.digest) != NS_BYTES:
            raise ConfigError(
                f"purge: --digest must be {2 * NS_BYTES} hex digits (a disk digest) or "
                f"TENANT:MODEL labels (a remote one), got {2 * len(self.digest)} digits"
            )
        if self.labels is not None and not re.fullmatch(r"[0-9a-f]+:[0-9a-f]+", self.labels):
            raise ConfigError(f"purge: --digest {self.labels!r} is not TENANT:MODEL hex labels")

    def world(self) -> int:
        """Ranks of the namespace's parallel layout ("tp2pp1": 2)."""
        assert self.namespace is not None
        m = _PARALLEL.fullmatch(self.namespace.parallel)
        if m is None:
            raise ConfigError(
                f"purge: --parallel {self.namespace.parallel!r} is not of the form tpNppM "
                "(as the engine logs it, e.g. tp1pp1)"
            )
        return int(m.group(1)) * int(m.group(2))

    def describe(self) -> str:
        if self.every:
            return "every kvtier chunk"
        if self.namespace is not None:
            ns = self.namespace
            return (
                f"namespace {ns.chain_digest().hex()} (model {ns.model!r}, layout "
                f"{ns.layout_digest}, {ns.parallel}, namespace text {ns.extra!r})"
            )
        if self.tenant is not None:
            return f"namespace text {self.tenant!r}, every model"
        if self.labels is not None:
            return f"remote labels {self.labels}"
        assert self.digest is not None
        return f"digest {self.digest.hex()}"


def parse_digest(text: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ConfigError(f"purge: --digest {text!r} is not hex") from None


def target_of(
    every: bool,
    model: str | None,
    revision: str,
    layout: str | None,
    parallel: str,
    namespace: str,
    digest: str | None,
) -> PurgeTarget:
    """The target the command line names (see ``kvtier purge --help``)."""
    if model is not None or layout is not None:
        if model is None or layout is None:
            raise ConfigError(
                "purge: a namespace is selected by --model and --layout together (with "
                "--parallel and --namespace as the engine logs them): stored chunks carry "
                "only a digest of all four"
            )
        ns = Namespace(f"{model}@{revision}", layout, parallel, namespace)
        return PurgeTarget(namespace=ns)
    if namespace:
        return PurgeTarget(tenant=namespace)
    if digest is not None and ":" in digest:
        return PurgeTarget(labels=digest.lower())
    return PurgeTarget(every=every, digest=parse_digest(digest) if digest is not None else None)


def progress_printer(label: str, every: int = 10_000) -> Callable[[int], None]:
    """A progress callback printing to stderr each time ``every`` more chunks are counted."""
    state = {"next": every}

    def report(count: int) -> None:
        if count >= state["next"]:
            print(f"{label}: {count:,} chunks so far", file=sys.stderr, flush=True)
            state["next"] = count + every

    return report
