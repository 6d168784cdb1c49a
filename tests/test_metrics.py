from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvtier.metrics import Metrics, PrometheusExporter


def sample() -> Metrics:
    m = Metrics()
    m.inc("hit_tokens", 100, "host")
    m.inc("hit_tokens", 5, "disk")
    m.inc("loads", 2, "cpu", "sync")
    m.set("sync_budget_bytes", 1 << 20)
    m.observe("sync_budget_used_bytes", 4096)
    return m


def test_merge_round_trip_and_validation():
    m = sample().merge(sample())
    assert m.get("hit_tokens", "host") == 200 and m.get("sync_budget_bytes") == 1 << 20
    assert Metrics.from_dict(m.to_dict()).to_dict() == m.to_dict()
    assert m.take().total("hit_tokens") == 210 and m.is_empty()
    with pytest.raises(KeyError):
        m.inc("no_such_metric")
    with pytest.raises(ValueError):
        m.inc("hit_tokens", 1)  # missing its label


def test_prometheus_export():
    reg = CollectorRegistry()
    PrometheusExporter(reg, {"engine": "0"}).observe(sample())
    text = generate_latest(reg).decode()
    assert 'kvtier_hit_tokens_total{engine="0",source="host"} 100.0' in text
    assert 'kvtier_sync_budget_used_bytes_count{engine="0"} 1.0' in text


@pytest.mark.vllm
def test_vllm_stats_and_prometheus_metrics():
    from prometheus_client import REGISTRY, Counter, Gauge, Histogram

    from kvtier.vllm.stats import KVTierPromMetrics, KVTierStats

    s = KVTierStats.of(sample())
    s.aggregate(KVTierStats.of(sample()))
    assert s.reduce()["hit_tokens_host"] == 200 and not s.is_empty()
    prom = KVTierPromMetrics(
        type("Cfg", (), {"kv_transfer_config": None})(),
        {Counter: Counter, Gauge: Gauge, Histogram: Histogram},
        ["engine"],
        {0: ["0"]},
    )
    prom.observe(s.to_dict(), engine_idx=0)
    assert (
        REGISTRY.get_sample_value("vllm:kvtier_hit_tokens_total", {"engine": "0", "source": "host"})
        == 200
    )
