import dataclasses

import pytest

from kvtier.config import KVTierConfig, SyncBudget
from kvtier.errors import ConfigError
from kvtier.units import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8GiB", 8 << 30),
        ("512MiB", 512 << 20),
        ("1.5GB", 1_500_000_000),
        ("4096", 4096),
        (" 2 KiB ", 2048),
        (123, 123),
        ("0", 0),
    ],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["8 parsecs", "GiB", "-1", -5, True, "1e9GiB", None])
def test_parse_size_rejects(bad):
    with pytest.raises(ConfigError, match="cpu_bytes"):
        parse_size(bad, name="cpu_bytes")


def test_format_size():
    assert format_size(1536) == "1.5 KiB"
    assert format_size(10) == "10 B"


def test_from_dict_parses_every_field():
    cfg = KVTierConfig.from_dict(
        {
            "cpu_bytes": "1GiB",
            "chunk_tokens": 64,
            "eviction": "arc",
            "disk_eviction": "lru",
            "sync_budget": "64MiB",
            "disk_path": "/tmp/x",
            "store_output_tokens": "false",
            "admission_min_seen": 2,
        }
    )
    assert cfg.cpu_bytes == 1 << 30
    assert cfg.eviction == "arc" and cfg.disk_eviction == "lru"
    assert cfg.sync_budget == SyncBudget("fixed", 64 << 20)
    assert cfg.store_output_tokens is False
    assert KVTierConfig.from_dict(cfg.to_dict()) == cfg


def test_unknown_key_is_named_with_accepted_keys():
    with pytest.raises(ConfigError) as e:
        KVTierConfig.from_dict({"cpu_byte": "1GiB"})
    assert "'cpu_byte'" in str(e.value) and "cpu_bytes" in str(e.value)


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("eviction", "fifo", "adaptive, adaptive-arc, chain-arc, lru, arc"),
        ("disk_eviction", "fifo", "adaptive, adaptive-arc, chain-arc, lru, arc"),
        ("chunk_tokens", -1, ">= 0"),
        ("cpu_bytes", "lots", "cpu_bytes"),
        ("sync_budget", "fast", "auto"),
        ("disk_write_policy", "write-around", "write-through"),
        ("admission_min_seen", 0, ">= 1"),
    ],
)
def test_bad_values_name_the_key(key, value, needle):
    with pytest.raises(ConfigError) as e:
        KVTierConfig.from_dict({key: value})
    assert key in str(e.value) and needle in str(e.value)


def test_sync_budget_forms():
    assert SyncBudget.parse("auto").mode == "auto"
    assert SyncBudget.parse(0).mode == "off"
    assert SyncBudget.parse("off").mode == "off"
    assert SyncBudget.parse("1MiB") == SyncBudget("fixed", 1 << 20)
    assert KVTierConfig().sync_budget.mode == "auto"


def test_every_field_has_a_docstring():
    import ast
    import inspect

    import kvtier.config as mod

    tree = ast.parse(inspect.getsource(mod))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KVTierConfig")
    documented = set()
    body = cls.body
    for i, node in enumerate(body[:-1]):
        nxt = body[i + 1]
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
        ):
            documented.add(node.target.id)
    assert documented == {f.name for f in dataclasses.fields(KVTierConfig)}
