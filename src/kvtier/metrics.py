"""kvtier's counters, gauges and histograms, and their Prometheus export.

:class:`Metrics` is plain data: labelled counters and histogram observations that can be
merged (``merge``), turned into a dict (``to_dict``/``from_dict``, for crossing process
boundaries inside vLLM's stats plumbing) and exported to a ``prometheus_client`` registry.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# name -> (kind, help, label names)
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "hit_tokens": ("counter", "Prompt tokens served from a kvtier tier, by source.", ("source",)),
    "lookup_tokens": ("counter", "Prompt tokens looked up past the engine's own cache.", ()),
    "loads": ("counter", "Load jobs, by tier and mode (sync/async).", ("tier", "mode")),
    "load_bytes": ("counter", "Bytes loaded into the engine, by tier and mode.", ("tier", "mode")),
    "load_seconds": ("counter", "Seconds spent loading, by tier and mode.", ("tier", "mode")),
    "store_bytes": ("counter", "Bytes stored from the engine, by tier.", ("tier",)),
    "store_seconds": ("counter", "Seconds spent storing, by tier.", ("tier",)),
    "stored_chunks": ("counter", "Chunks stored, by tier.", ("tier",)),
    "evictions": ("counter", "Chunks evicted, by tier.", ("tier",)),
    "failures": ("counter", "Failed chunk operations, by tier and operation.", ("tier", "op")),
    "load_failed_requests": (
        "counter",
        "Request loads that failed (the request recomputes from the last good chunk, or "
        "from scratch with several KV-cache groups), by the tier that failed.",
        ("tier",),
    ),
    "unkeyable_requests": (
        "counter",
        "Requests neither loaded nor stored: an input kind chunk keys cannot cover, by kind.",
        ("input",),
    ),
    "remote_auth_failures": (
        "counter",
        "Remote values refused because their MAC or AES-GCM tag failed (forged, changed or "
        "moved), by tier.",
        ("tier",),
    ),
    "remote_bad_values": (
        "counter",
        "Remote values refused by another check (truncated, foreign, checksum), by tier.",
        ("tier",),
    ),
    "remote_healed_values": (
        "counter",
        "Refused remote values deleted so that the next store writes them again, by tier.",
        ("tier",),
    ),
    "prefetch_chunks": (
        "counter",
        "Chunks promoted into the CPU tier at a request's arrival, by source tier.",
        ("tier",),
    ),
    "prefetch_used_chunks": (
        "counter",
        "Prefetched chunks the request they were prefetched for then loaded.",
        (),
    ),
    "prefetch_unused_chunks": (
        "counter",
        "Prefetched chunks their request never loaded (finished, aborted, lease expired, "
        "or its hit ended before them).",
        (),
    ),
    "retained_chunks": (
        "counter",
        "Chunks a retain_s hint asked to keep in the CPU tier (what the share allowed).",
        (),
    ),
    "retain_refused_chunks": (
        "counter",
        "Chunks a retain_s hint asked for beyond retain_max_share of the CPU tier.",
        (),
    ),
    "invalid_hints": ("counter", "Request hints ignored as invalid, by key.", ("key",)),
    "sync_budget_used_bytes": ("histogram", "Sync-load bytes used per engine step.", ()),
    "sync_budget_bytes": ("gauge", "Current per-step sync-load budget in bytes.", ()),
}

BUDGET_BUCKETS = (0, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30, float("inf"))


@dataclass
class Metrics:
    """Labelled values: ``values[name][labels] = number``; histograms keep observations."""

    values: dict[str, dict[tuple[str, ...], float]] = field(default_factory=dict)
    observations: dict[str, list[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def inc(self, name: str, amount: float = 1.0, *labels: str) -> None:
        _check(name, labels)
        with self._lock:
            series = self.values.setdefault(name, {})
            series[labels] = series.get(labels, 0.0) + amount

    def inc_tiers(self, counters: Mapping[str, Mapping[str, float]]) -> None:
        """Add ``{tier: {metric name: amount}}`` (metrics labelled by tier alone)."""
        for tier, counts in counters.items():
            for name, amount in counts.items():
                self.inc(name, amount, tier)

    def set(self, name: str, value: float, *labels: str) -> None:
        _check(name, labels)
        with self._lock:
            self.values.setdefault(name, {})[labels] = value

    def observe(self, name: str, value: float) -> None:
        _check(name, ())
        with self._lock:
            self.observations.setdefault(name, []).append(value)

    def get(self, name: str, *labels: str) -> float:
        return self.values.get(name, {}).get(labels, 0.0)

    def total(self, name: str) -> float:
        return sum(self.values.get(name, {}).values())

    def merge(self, other: Metrics) -> Metrics:
        """Add ``other`` into self (counters add, gauges take other's value)."""
        with self._lock:
            for name, series in other.values.items():
                mine = self.values.setdefault(name, {})
                for labels, v in series.items():
                    if METRICS[name][0] == "gauge":
                        mine[labels] = v
                    else:
                        mine[labels] = mine.get(labels, 0.0) + v
            for name, obs in other.observations.items():
                self.observations.setdefault(name, []).extend(obs)
        return self

    def take(self) -> Metrics:
        """Return the values so far and reset (interval reporting)."""
        with self._lock:
            out = Metrics(self.values, self.observations)
            self.values, self.observations = {}, {}
        return out

    def is_empty(self) -> bool:
        return not self.values and not self.observations

    def to_dict(self) -> dict[str, Any]:
        return {
            "values": {n: [[list(k), v] for k, v in s.items()] for n, s in self.values.items()},
            "observations": {n: list(o) for n, o in self.observations.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Metrics:
        m = cls()
        for name, series in data.get("values", {}).items():
            if name in METRICS:
                m.values[name] = {tuple(k): float(v) for k, v in series}
        for name, obs in data.get("observations", {}).items():
            if name in METRICS:
                m.observations[name] = [float(x) for x in obs]
        return m


def _check(name: str, labels: tuple[str, ...]) -> None:
    spec = METRICS.get(name)
    if spec is None:
        raise KeyError(f"unknown kvtier metric {name!r}")
    if len(labels) != len(spec[2]):
        raise ValueError(f"metric {name!r} takes labels {spec[2]}, got {labels}")


class PrometheusExporter:
    """Mirrors Metrics into ``prometheus_client`` collectors named ``kvtier_<name>``.

    ``extra_labels`` (e.g. ``{"engine": "0"}``) are added to every series.
    """

    def __init__(
        self,
        registry: Any = None,
        extra_labels: Mapping[str, str] | None = None,
        prefix: str = "kvtier_",
    ) -> None:
        import prometheus_client as prom

        self._extra = dict(extra_labels or {})
        kw = {"registry": registry} if registry is not None else {}
        self._collectors: dict[str, Any] = {}
        for name, (kind, help_, labels) in METRICS.items():
            labelnames = [*self._extra, *labels]
            full = prefix + name
            if kind == "counter":
                self._collectors[name] = prom.Counter(full, help_, labelnames, **kw)
            elif kind == "gauge":
                self._collectors[name] = prom.Gauge(full, help_, labelnames, **kw)
            else:
                self._collectors[name] = prom.Histogram(
                    full, help_, labelnames, buckets=BUDGET_BUCKETS, **kw
                )

    def observe(self, metrics: Metrics) -> None:
        """Add an interval's values (counters increase, gauges are set)."""
        extra = tuple(self._extra.values())
        for name, series in metrics.values.items():
            c = self._collectors[name]
            kind = METRICS[name][0]
            for labels, v in series.items():
                child = c.labels(*extra, *labels) if (extra or labels) else c
                if kind == "counter":
                    child.inc(v)
                else:
                    child.set(v)
        for name, obs in metrics.observations.items():
            c = self._collectors[name]
            child = c.labels(*extra) if extra else c
            for v in obs:
                child.observe(v)


def merge_all(items: Iterable[Metrics]) -> Metrics:
    out = Metrics()
    for m in items:
        out.merge(m)
    return out
