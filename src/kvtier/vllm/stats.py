"""kvtier metrics through vLLM's connector stats and Prometheus plumbing."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from kvtier.metrics import METRICS, Metrics


class KVTierStats(KVConnectorStats):
    """A Metrics interval in vLLM's stats container (``data`` is ``Metrics.to_dict()``)."""

    @classmethod
    def of(cls, metrics: Metrics) -> KVTierStats:
        return cls(data=metrics.to_dict())

    def metrics(self) -> Metrics:
        return Metrics.from_dict(self.data)

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        merged = self.metrics().merge(Metrics.from_dict(other.data))
        self.data = merged.to_dict()
        return self

    def reduce(self) -> dict[str, int | float]:
        m = self.metrics()
        out: dict[str, int | float] = {}
        for (source,), v in m.values.get("hit_tokens", {}).items():
            out[f"hit_tokens_{source}"] = int(v)
        for (tier, mode), v in m.values.get("loads", {}).items():
            out[f"loads_{tier}_{mode}"] = int(v)
        out["load_bytes"] = int(m.total("load_bytes"))
        out["store_bytes"] = int(m.total("store_bytes"))
        out["failures"] = int(m.total("failures"))
        out["load_failed_requests"] = int(m.total("load_failed_requests"))
        return out

    def is_empty(self) -> bool:
        return self.metrics().is_empty()


class KVTierPromMetrics(KVConnectorPromMetrics):
    """``vllm:kvtier_<name>`` series, one per kvtier metric, labelled per engine."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._metrics: dict[str, Any] = {}
        buckets = [1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
        for name, (kind, help_, labels) in METRICS.items():
            full = f"vllm:kvtier_{name}"
            names = [*labelnames, *labels]
            if kind == "counter":
                self._metrics[name] = self._counter_cls(full, help_, labelnames=names)
            elif kind == "gauge":
                self._metrics[name] = self._gauge_cls(full, help_, labelnames=names)
            else:
                histogram: Any = self._histogram_cls  # vLLM types it as any metric class
                self._metrics[name] = histogram(full, help_, labelnames=names, buckets=buckets)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        m = Metrics.from_dict(transfer_stats_data)
        engine = [str(v) for v in self.per_engine_labelvalues.get(engine_idx, [])]
        for name, series in m.values.items():
            metric = self._metrics[name]
            for labels, v in series.items():
                child = metric.labels(*engine, *labels)
                if METRICS[name][0] == "counter":
                    child.inc(v)
                else:
                    child.set(v)
        for name, obs in m.observations.items():
            child = self._metrics[name].labels(*engine)
            for v in obs:
                child.observe(v)
