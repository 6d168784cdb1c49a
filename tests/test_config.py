import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.budget import SyncBudget
from kvtier.config import EVICTION_POLICIES, WRITE_POLICIES, KVTierConfig
from kvtier.contract.kind import TierContext
from kvtier.errors import ConfigError
from kvtier.keys import Namespace
from kvtier.options import option_keys
from kvtier.stack.build import build_stack
from kvtier.stack.parse import COMMON_KEYS
from kvtier.stack.registry import builtin_tier_kinds, tier_kind, tier_kinds
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


# -- one validator for the flat keys and the tiers form -----------------------------------------


# The built-in kinds: tier_kinds() at collection would also hold whatever kind a module
# collected earlier registered (tests/conformance registers examples/template_tier.py's),
# so the collected tests would depend on the collection order.
@pytest.mark.parametrize("kind", builtin_tier_kinds())
def test_a_misspelt_key_lists_exactly_that_kinds_keys(kind):
    with pytest.raises(ConfigError) as e:
        KVTierConfig.from_dict({"tiers": [{"kind": "cpu"}, {"kind": kind, "capacty": 1}]})
    msg = str(e.value)
    head = f"tiers[1]: unknown key(s) 'capacty'; accepted keys for a {kind} tier: "
    assert msg.startswith(head), msg
    listed = msg[len(head) :].split(", ")
    own = option_keys(tier_kind(kind).options)
    assert listed == sorted({*COMMON_KEYS, *own})
    others = {k for name in tier_kinds() for k in option_keys(tier_kind(name).options)}
    assert not (others - set(own)) & set(listed), "another kind's keys are listed"


def test_a_cpu_tier_lists_no_other_kinds_keys():
    with pytest.raises(ConfigError) as e:
        KVTierConfig.from_dict({"tiers": [{"kind": "cpu", "url": "redis://h"}]})
    assert not {"url", "path", "ssl_ca", "threads"} & set(
        str(e.value).rsplit(": ", 1)[1].split(", ")
    )


def _refusal(data):
    try:
        return KVTierConfig.from_dict(data)
    except ConfigError as e:
        return str(e)


FLAT_VALUES = [("cpu_bytes", "capacity", v) for v in ("4", "lots", True, -1, [1], 1.5, "2 KiB")] + [
    ("disk_bytes", "capacity", "x"),
    ("disk_threads", "threads", 0),
    ("disk_threads", "threads", "x"),
    ("disk_threads", "threads", "3"),
    ("disk_threads", "threads", True),
    ("disk_eviction", "eviction", "fifo"),
    ("disk_eviction", "eviction", "lru"),
    ("disk_path", "path", 5),
]


@pytest.mark.parametrize(("flat", "key", "value"), FLAT_VALUES)
def test_the_same_value_gets_the_same_answer_in_both_forms(flat, key, value):
    """A flat key and the tiers key it stands for accept and refuse alike, in the same
    words, each naming its own key."""
    if flat.startswith("disk"):
        base = {"disk_path": "/tmp/kvtier-same-answer"}
        flat_cfg = _refusal({**base, flat: value})
        entry = {"kind": "disk", "path": "/tmp/kvtier-same-answer", key: value}
        tiers_cfg = _refusal({"tiers": [{"kind": "cpu"}, entry]})
        label = "tiers[1]." + key
    else:
        flat_cfg = _refusal({flat: value})
        tiers_cfg = _refusal({"tiers": [{"kind": "cpu", key: value}]})
        label = "tiers[0]." + key
    if isinstance(flat_cfg, str) or isinstance(tiers_cfg, str):
        assert isinstance(flat_cfg, str) and isinstance(tiers_cfg, str), (flat_cfg, tiers_cfg)
        assert flat_cfg.startswith(f"{flat}: ") and tiers_cfg.startswith(f"{label}: ")
        assert flat_cfg[len(flat) :] == tiers_cfg[len(label) :]
        assert repr(value) in flat_cfg or str(value) in flat_cfg, "the value is named"
    else:
        t = 1 if flat.startswith("disk") else 0
        assert flat_cfg.tier_specs()[t] == tiers_cfg.tier_specs()[t]


def test_four_is_four_bytes_in_both_forms():
    assert KVTierConfig.from_dict({"cpu_bytes": "4"}).tier_specs()[0].capacity == 4
    tiers = KVTierConfig.from_dict({"tiers": [{"kind": "cpu", "capacity": "4"}]})
    assert tiers.tier_specs()[0].capacity == 4


def test_kind_defaults_are_the_flat_keys_defaults():
    cfg = KVTierConfig()
    assert tier_kind("cpu").default_capacity == cfg.cpu_bytes
    assert tier_kind("disk").default_capacity == cfg.disk_bytes
    assert tier_kind("disk").options().threads == cfg.disk_threads


def _stack_shape(cfg):
    stack = build_stack(cfg, TierContext(4096, Namespace("m", "l"), restore=False))
    return [
        (
            t.name,
            t.source,
            t.capabilities,
            t.spec,
            t.index.num_slots,
            type(t.index.policy).__name__,
            t.index.record_evictions,
        )
        for t in stack.tiers
    ]


@settings(max_examples=60, deadline=None)
@given(
    cpu=st.integers(0, 1 << 24),
    eviction=st.sampled_from(EVICTION_POLICIES),
    disk=st.none() | st.just("/tmp/kvtier-property-disk"),
    disk_bytes=st.integers(0, 1 << 24),
    threads=st.integers(1, 16),
    disk_eviction=st.none() | st.sampled_from(EVICTION_POLICIES),
    policy=st.sampled_from(WRITE_POLICIES),
    as_text=st.booleans(),
)
def test_flat_keys_and_the_equivalent_tiers_build_equal_stacks(
    cpu, eviction, disk, disk_bytes, threads, disk_eviction, policy, as_text
):
    size = (lambda n: f"{n}B") if as_text else (lambda n: n)
    flat = {"cpu_bytes": size(cpu), "eviction": eviction, "disk_write_policy": policy}
    tiers = [{"kind": "cpu", "capacity": size(cpu)}]
    if disk is not None:
        flat.update(disk_path=disk, disk_bytes=size(disk_bytes), disk_threads=threads)
        back = policy == "write-back"
        entry = {"kind": "disk", "path": disk, "capacity": size(disk_bytes), "threads": threads}
        entry.update(on_store="skip" if back else "through", on_evict="demote" if back else "drop")
        if disk_eviction is not None:
            flat["disk_eviction"] = disk_eviction
            entry["eviction"] = disk_eviction
        tiers.append(entry)
    a = KVTierConfig.from_dict(flat)
    b = KVTierConfig.from_dict({"eviction": eviction, "tiers": tiers})
    assert a.tier_specs() == b.tier_specs()
    assert _stack_shape(a) == _stack_shape(b)
