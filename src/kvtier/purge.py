"""``kvtier purge``: what to remove (every chunk, or one namespace's) and the run over tiers.

A namespace is what :class:`~kvtier.keys.Namespace` hashes: the model identity, the KV
layout digest, the parallel layout and the deployment's namespace text (a tenant). Stored
chunks carry only digests of it (remote names the chain digest, disk headers each rank's
digest), so a namespace is selected by its parts, all four, exactly as the engine logs them
at start ("kvtier: namespace ..."), or by a digest that ``kvtier purge --list`` shows.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.keys import KEY_BYTES, Namespace

_PARALLEL = re.compile(r"tp(\d+)pp(\d+)")


@dataclass(frozen=True)
class PurgeTarget:
    """Exactly one of: ``every`` (all of kvtier's chunks), ``namespace`` (its chunks on
    every rank) or ``digest`` (the chunks whose stored namespace digest this is)."""

    every: bool = False
    """Every kvtier chunk, whatever its namespace."""
    namespace: Namespace | None = None
    """One namespace by its parts (its ``rank`` is ignored: every rank's chunks go)."""
    digest: bytes | None = None
    """A stored digest: remote names carry the chain digest, disk headers a rank digest."""

    def __post_init__(self) -> None:
        given = [self.every, self.namespace is not None, self.digest is not None]
        if given.count(True) != 1:
            raise ConfigError("purge: give exactly one of --all, --model (with --layout), --digest")
        if self.digest is not None and len(self.digest) != KEY_BYTES:
            raise ConfigError(
                f"purge: --digest must be {2 * KEY_BYTES} hex digits, got {2 * len(self.digest)}"
            )

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
        assert self.digest is not None
        return f"digest {self.digest.hex()}"


def selector_args(ns: Namespace) -> str:
    """The ``kvtier purge`` arguments that select ``ns`` (what the engine logs at start)."""
    model, _, revision = ns.model.rpartition("@")
    args = ["--model", model, "--layout", ns.layout_digest, "--parallel", ns.parallel]
    if revision:
        args += ["--revision", revision]
    if ns.extra:
        args += ["--namespace", ns.extra]
    return " ".join(shlex.quote(a) for a in args)


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
        raise ConfigError("purge: --namespace needs --model and --layout (see --help)")
    return PurgeTarget(every=every, digest=parse_digest(digest) if digest is not None else None)


def progress_printer(label: str, every: int = 10_000) -> Callable[[int], None]:
    """A progress callback printing to stderr each time ``every`` more chunks are counted."""
    state = {"next": every}

    def report(count: int) -> None:
        if count >= state["next"]:
            print(f"{label}: {count:,} chunks so far", file=sys.stderr, flush=True)
            state["next"] = count + every

    return report
