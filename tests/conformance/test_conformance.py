"""Every tier kind through the one conformance suite (kvtier.conformance): cpu, disk,
memory (private and shared), redis (standalone, cluster, MAC, AEAD; real redis-server
processes) and the fault wrapper, off (it must pass everything) and on (failures clean)."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from kvtier.conformance import BuiltTier, CaseContext, KindCase, Tamper, TierConformance
from kvtier.keys import Key, rank_key
from kvtier.stack.registry import register_tier_kind, tier_kinds
from kvtier.tiers.memory import MemoryOptions
from kvtier.tiers.shared import drop_shared_space, shared_space
from tests.support.redis_fixtures import cluster, flush, redis_tamper, server  # noqa: F401  (fixtures)

TEMPLATE = Path(__file__).resolve().parents[2] / "examples" / "template_tier.py"


def _register_template() -> str:
    """Register examples/template_tier.py's kind as a plugin would (once per process)."""
    spec = importlib.util.spec_from_file_location("template_tier", TEMPLATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    if module.NAME not in tier_kinds():
        register_tier_kind(module.KIND)
    return str(module.NAME)


TEMPLATE_KIND = _register_template()

SECRET = hashlib.sha256(b"conformance tenant").hexdigest()
FAULTS = {"seed": 3, "read_fail_rate": 0.2, "write_fail_rate": 0.2, "slow_rate": 0.05}
FAULTS["slow_seconds"] = 0.002


def disk(ctx: CaseContext, **extra: Any) -> dict[str, Any]:
    return {"kind": "disk", "path": str(ctx.tmp_path / "disk"), "threads": 2, **extra}


def shared_memory(ctx: CaseContext, **extra: Any) -> dict[str, Any]:
    url = f"memory://conformance-{ctx.unique}"
    ctx.finalizer(lambda: drop_shared_space(url))
    return {"kind": "memory", "shared": True, "url": url, **extra}


def memory_tamper(tier: BuiltTier) -> Tamper:
    opts = tier.spec.options
    assert isinstance(opts, MemoryOptions) and opts.url
    space = shared_space(opts.url, 0)

    def drop(key: Key, rank: int) -> None:
        space.drop(rank_key(key, rank))

    return Tamper(
        lambda k, r: space.get_many([rank_key(k, r)])[0],
        lambda k, r, v: space.overwrite(rank_key(k, r), v),
        drop,
    )


def redis(fixture: str, mode: str = "off", **extra: Any) -> Any:
    """A redis tier on the ``server`` or ``cluster`` fixture, emptied first; ``mode`` "mac"
    or "aead" gives it a secret (from the environment)."""

    def entry(ctx: CaseContext) -> dict[str, Any]:
        url = ctx.fixture(fixture).url
        flush(url)
        out: dict[str, Any] = {"kind": "redis", "url": url, "probe_wait_ms": 5000, **extra}
        if mode != "off":
            ctx.setenv("KVT_CONFORMANCE_SECRET", SECRET)
            out.update(secret_env="KVT_CONFORMANCE_SECRET", encrypt=mode == "aead")
        return out

    return entry


class TestEveryKind(TierConformance):
    cases = (
        KindCase("cpu", {"kind": "cpu"}),
        KindCase("cpu-arc", {"kind": "cpu", "eviction": "arc"}),
        KindCase("disk", disk),
        KindCase("memory", {"kind": "memory"}),
        KindCase("memory-shared", shared_memory, tamper=memory_tamper),
        # The template medium a new kind starts from (examples/template_tier.py).
        KindCase("template", {"kind": TEMPLATE_KIND}),
        KindCase("template-wipe", {"kind": TEMPLATE_KIND, "wipe_on_close": True}),
        KindCase("template+faults", {"kind": TEMPLATE_KIND, "faults": FAULTS}, faulty=True),
        KindCase("redis", redis("server"), tamper=redis_tamper),
        KindCase("redis-cluster", redis("cluster"), tamper=redis_tamper),
        KindCase("redis-mac", redis("server", "mac"), tamper=redis_tamper),
        KindCase("redis-aead", redis("server", "aead"), tamper=redis_tamper),
        # The fault wrapper with nothing to inject passes everything the kind passes.
        KindCase("cpu+faults-off", {"kind": "cpu", "faults": {}}),
        KindCase("disk+faults-off", lambda ctx: disk(ctx, faults={"seed": 1})),
        KindCase(
            "memory-shared+faults-off",
            lambda ctx: shared_memory(ctx, faults={}),
            tamper=memory_tamper,
        ),
        KindCase("redis+faults-off", redis("server", faults={}), tamper=redis_tamper),
        # With faults on, failures must be clean.
        KindCase("cpu+faults", {"kind": "cpu", "faults": FAULTS}, faulty=True),
        KindCase("disk+faults", lambda ctx: disk(ctx, faults=FAULTS), faulty=True),
        KindCase(
            "memory-shared+faults", lambda ctx: shared_memory(ctx, faults=FAULTS), faulty=True
        ),
        KindCase("redis+faults", redis("server", faults=FAULTS), faulty=True),
    )


def test_every_kind_and_the_fault_wrapper_have_cases():
    kinds: set[str] = set()
    for case in TestEveryKind.cases:
        entry = case.entry if isinstance(case.entry, dict) else None
        kinds.add(entry["kind"] if entry else case.id.split("+")[0].split("-")[0])
    assert set(tier_kinds()) <= kinds
    assert any("faults-off" in c.id for c in TestEveryKind.cases)
    assert any(c.faulty for c in TestEveryKind.cases)
