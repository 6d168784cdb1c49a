"""How long a hybrid model's recurrent-state store holds the engine's thread.

kvtier copies an offered state inside ``wait_for_save`` (:mod:`kvtier.transfer.states`),
on the engine's thread, within the step that offered it. This times that copy for a state
shaped like Qwen3-Next-80B's (TP 1): 3 recurrent groups of 12 gated-delta-net layers,
1,097,728 bytes of page content each (conv state 3 x 8192 bf16, then SSM state 32 x 128 x
128 bf16), 39,518,208 bytes in all, through the real path: ``StateCache.offer`` /
``build_step`` on the scheduler side, ``StateMover.end_forward`` on the worker side.

- ``cpu store``: the state into the CPU tier (the first tier: what every offer costs),
  once the tier's memory is faulted in (a tier warms up in the background from start;
  a store that overtakes the warm-up pays the page faults, ~33 ms more here);
- ``disk copy``: the write-through of that state to a disk tier, planned by the next
  step and also run in ``end_forward`` (the page cache absorbs it: not an fsync);
- ``torch copy``: one ``Tensor.copy_`` of the same bytes between two buffers, the
  memory-bandwidth reference.

``--repeats`` states (distinct prompts), each copied once; prints min / median / max.
Usage: ``python benchmarks/state_copy.py [--repeats 10] [--disk DIR] [--threads N]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from kvtier.config import KVTierConfig
from kvtier.contract.kind import TierContext
from kvtier.keys import Namespace
from kvtier.layout import AttentionKind, KVGroup, KVLayout
from kvtier.manager import CacheManager
from kvtier.stack.build import build_stack, build_stores
from kvtier.stack.states import StateCache, split_specs
from kvtier.transfer.states import StateMover

GROUPS, LAYERS, LAYER_BYTES = 3, 12, 3 * 8192 * 2 + 32 * 128 * 128 * 2
STATE = GROUPS * LAYERS * LAYER_BYTES
B = 544  # Qwen3-Next-80B's aligned block (tokens)
LAYOUT = KVLayout(
    (
        KVGroup(AttentionKind.FULL, 12, num_kv_heads=2, head_dim=256, dtype="torch.bfloat16"),
        KVGroup(AttentionKind.MAMBA, GROUPS * LAYERS, dtype="torch.uint8", state_bytes=LAYER_BYTES),
    )
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--disk", default=None, help="disk tier directory (default: a temp dir)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(dir=args.disk) as disk:
        run(args.repeats, disk)


def run(repeats: int, disk: str) -> None:
    cap = 4 * (repeats + 2) * STATE  # room for every state: no eviction while timing
    config = KVTierConfig.from_dict(
        {
            "tiers": [
                {"kind": "cpu", "capacity": cap},
                {"kind": "disk", "path": disk, "capacity": cap},
            ],
            "state_share": 0.5,
        }
    )
    ns = Namespace(model="qwen3-next-like", layout_digest=LAYOUT.digest())
    _, specs = split_specs(config)
    ctx = TierContext(STATE, ns, rank_dirs=False)
    groups = list(range(1, GROUPS + 1))
    states = StateCache(config, LAYOUT, ns, build_stack(config, ctx, specs), groups, B, B)
    keys_of = CacheManager(config, LAYOUT, ns, B, build_stack(config, ctx, specs[:1]))
    pages = [
        [torch.randint(0, 256, (4, LAYER_BYTES), dtype=torch.uint8) for _ in range(LAYERS)]
        for _ in range(GROUPS)
    ]
    stores = build_stores(config, ctx, specs)
    host = getattr(stores["cpu"], "host", None)
    if host is not None:  # the steady state after start-up: the tier's pages faulted in
        host.wait_ready()
    mover = StateMover(pages, stores)
    times: dict[str, list[float]] = {"cpu store": [], "disk copy": [], "torch copy": []}
    src = torch.randint(0, 256, (STATE,), dtype=torch.uint8)
    dst = torch.empty(STATE, dtype=torch.uint8)
    for r in range(repeats + 1):  # the first round warms up (page faults, file creation)
        chain = keys_of.namespace.key_chain(B)
        chain.update([r + 3] * (2 * B))
        for g in groups:
            states.offer(f"r{r}", g, 1 + r % 3, 2 * B, chain.keys)
        for name in ("cpu store", "disk copy"):
            plan = states.build_step()
            assert plan.stores, name
            mover.begin_step(plan)
            t0 = time.perf_counter()
            mover.end_forward()
            dt = time.perf_counter() - t0
            report = mover.report()
            assert all(all(res.ok) for res in report.results), name
            states.cache.on_report(report)
            if r:
                times[name].append(dt)
        t0 = time.perf_counter()
        dst.copy_(src)
        if r:
            times["torch copy"].append(time.perf_counter() - t0)
    mover.close()
    print(f"state of {STATE:,} bytes, {repeats} repeats, torch threads {torch.get_num_threads()}")
    for name, ts in times.items():
        ms = sorted(t * 1e3 for t in ts)
        gbs = STATE / statistics.median(ts) / 1e9
        print(
            f"{name:10s}  min {ms[0]:7.2f} ms  median {statistics.median(ms):7.2f} ms  "
            f"max {ms[-1]:7.2f} ms  ({gbs:.2f} GB/s at the median)"
        )
        print("           each (ms):", " ".join(f"{t * 1e3:.1f}" for t in ts))


if __name__ == "__main__":
    main()
