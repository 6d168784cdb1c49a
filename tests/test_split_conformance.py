"""The index/store split of every tier kind, built through the registry."""

import uuid

from kvtier.stack.registry import tier_kinds
from kvtier.stack.spec import TierSpec
from kvtier.testing.split_conformance import SplitConformance
from kvtier.tiers.shared import drop_shared_space


def test_every_kind_has_a_suite():
    # redis: TestRedisSplit / TestRedisClusterSplit in test_remote_tier.py (real servers)
    assert set(tier_kinds()) == {"cpu", "disk", "memory", "redis"}


class TestCpuSplit(SplitConformance):
    def spec(self, tmp_path):
        return TierSpec("cpu")


class TestCpuArcSplit(SplitConformance):
    def spec(self, tmp_path):
        return TierSpec("cpu", eviction="arc")


class TestDiskSplit(SplitConformance):
    def spec(self, tmp_path):
        return TierSpec("disk", path=str(tmp_path / f"disk-{uuid.uuid4().hex}"), threads=2)


class TestMemorySplit(SplitConformance):
    def spec(self, tmp_path):
        return TierSpec("memory")


class TestSharedMemorySplit(SplitConformance):
    def spec(self, tmp_path):
        url = f"memory://split-{uuid.uuid4().hex}"
        self._url = url
        return TierSpec("memory", shared=True, url=url)

    def teardown_method(self):
        drop_shared_space(getattr(self, "_url", ""))
