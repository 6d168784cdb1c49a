"""kvtier's worker-side CUDA path on a real GPU: correctness first, then bandwidth.

One self-contained run for a machine with PyTorch and CUDA and nothing else of vLLM's:
it drives kvtier's own worker-side code (``TransferEngine`` and its lanes and streams,
``KVRegions``, the CPU tier's ``CpuSlab`` over a ``HostBuffer``, the disk tier's
``DiskSlab``, ``WorkerSide`` with layer-wise loads) on device tensors shaped like an
engine's KV cache: a dense bf16 layout of a ~8B model (32 layers, 8 KV heads, head size
128, 16-token blocks, one ``[2, blocks, 16, 8, 128]`` tensor per layer) and a
sliding-window/global mix over two block tables (``GroupedRegions``).

Checks (each a section of the JSON report; ``ok`` false for any failed one, exit 1):

- ``round_trip``: chunks stored device -> CPU tier from random blocks, then a large async
  load (load lane) and a small sync load (expedited lane, its own CUDA stream) issued right
  after it into other random blocks; every loaded block is bit-exact with its source. The
  sync load's latency while the async one runs, and alone, and whether the async load was
  still running when the sync one finished (it must not wait behind it).
- ``grouped``: the same store/load round trip through ``GroupedRegions`` (a global group
  and a sliding-window group whose null block a load skips), bit-exact.
- ``bandwidth``: per chunk size (64 KiB - 4 MiB; one region, one block per chunk) a sync
  load and a store of one batch of random blocks through the engine (``submit`` + ``wait``)
  against a pinned ``copy_`` per chunk of the same bytes between the same memory, and the
  link (one pinned ``copy_`` of the whole batch). Summary keys
  ``cuda_min_load_ratio_ge_256k`` / ``cuda_min_store_ratio_ge_256k``: kvtier / per-chunk
  ``copy_`` GB/s, minimum over chunks >= 256 KiB (goal >= 0.9).
- ``disk``: chunks stored device -> disk tier -> device, bit-exact.
- ``pinning``: a CPU tier of ``--tier-gib`` (16 on a GPU): time until the constructor
  returns (start-up) and until the background thread page-locked it all; whether torch
  then sees the memory as pinned.
- ``layered``: a sync load layer by layer (``WorkerSide(layers=...)``) while a stand-in
  forward runs one compute op per layer; one layer's copy first fills its rows with
  garbage and stalls (on the copy stream: ``torch.cuda._sleep``) before copying, and every
  layer read after ``wait_layer`` must equal the source (a layer read before its copy
  finished reads garbage). Then the overlap: forward + whole load vs. layered.

``--dry`` (automatic without CUDA) runs the same code on CPU tensors with small sizes, so
its logic is tested where no GPU is (``tests/test_gpu_check.py``); the CPU tier's slab then
refuses its row path so the engine plans what it plans for device KV (``"segments"``
copies, split by region for layer-wise loads). Dry figures are no GPU figures.

Needs: torch, numpy, xxhash (the disk tier's checksums); not blake3 (keys here are random
bytes; kvtier imports without it), not vLLM. Run from the repository root:
``scripts/gpu_check.sh`` or ``PYTHONPATH=src python3 benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import format_table, machine_info, write_json
from kvtier.contract import Segments, SlotStore
from kvtier.jobs import JobKind, StepPlan, TransferJob
from kvtier.keys import KEY_BYTES, NS_BYTES, Key
from kvtier.tiers.cpu import CpuSlab
from kvtier.tiers.disk.slab import DiskSlab
from kvtier.transfer import KVRegions, TransferEngine, alloc_host_buffer
from kvtier.transfer.groups import NULL_BLOCK, BlockIdCodec, GroupedRegions
from kvtier.worker import WorkerSide

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
GARBAGE = 0x5A
TARGET_RATIO = 0.9
HEADLINE_MIN = 256 * KiB
PIN_TIMEOUT_S = 90
"""The longest the pinning check waits for the tier to be page-locked (then it reports how
far it got): the whole run must fit a device lease with time for a rerun."""


@dataclass(frozen=True)
class Geometry:
    """An engine's KV cache and the tiers' sizes for one run."""

    layers: int
    kv_heads: int
    head_dim: int
    block_tokens: int
    num_blocks: int
    blocks_per_chunk: int
    slots: int
    async_chunks: int
    sync_chunks: int
    sizes: tuple[int, ...]
    batch_bytes: int
    rounds: int
    disk_chunks: int
    stall_s: float

    def shape(self) -> tuple[int, ...]:
        return (2, self.num_blocks, self.block_tokens, self.kv_heads, self.head_dim)


GPU = Geometry(
    layers=32, kv_heads=8, head_dim=128, block_tokens=16, num_blocks=1536,
    blocks_per_chunk=2, slots=320, async_chunks=256, sync_chunks=4,
    sizes=(64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB), batch_bytes=256 * MiB, rounds=5,
    disk_chunks=32, stall_s=0.05,
)  # fmt: skip
"""~8B model (Llama-3-8B's KV shape): 2 MiB per 16-token block, 3 GiB of device KV, a
1.25 GiB CPU tier for the round trips, a 1 GiB async load against a 16 MiB sync one."""
DRY = Geometry(
    layers=4, kv_heads=2, head_dim=16, block_tokens=16, num_blocks=160,
    blocks_per_chunk=2, slots=48, async_chunks=32, sync_chunks=4,
    sizes=(64 * KiB, 256 * KiB), batch_bytes=2 * MiB, rounds=1, disk_chunks=6, stall_s=0.05,
)  # fmt: skip


# -- device helpers (the benchmark's own; kvtier's CUDA use is in kvtier.transfer) --------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_info(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"device": "cpu (dry run: no GPU figures)", "cuda": None}
    props = torch.cuda.get_device_properties(device)
    return {
        "device": torch.cuda.get_device_name(device),
        "cuda": torch.version.cuda,
        "capability": f"{props.major}.{props.minor}",
        "device_memory_gib": round(props.total_memory / GiB, 1),
        "multiprocessors": props.multi_processor_count,
    }


def stall(device: torch.device, seconds: float) -> None:
    """Hold up the current stream (device) or thread (CPU) for ``seconds``."""
    if device.type == "cuda":
        # A spin of ~seconds at ~2 GHz (Hopper's boost clock) on the current stream.
        torch.cuda._sleep(int(seconds * 2e9))  # type: ignore[no-untyped-call]
    else:
        time.sleep(seconds)


def bits(t: torch.Tensor) -> torch.Tensor:
    """Bitwise view for exact comparison (bf16 equality would call -0.0 == 0.0)."""
    return t.contiguous().view(torch.uint8)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(bits(a), bits(b)))


# -- stores ----------------------------------------------------------------------------------


class DeviceLikeSlab(CpuSlab):
    """The CPU tier refusing its row path, as it does for device KV: on a dry run the
    engine then plans what it plans on a GPU (segments, split by region when layered)."""

    def supports_rows(self, engine_regions: Sequence[torch.Tensor]) -> bool:
        return False


class GarbageFirst(SlotStore):
    """A store whose reads first fill the destination rows of payload range
    ``[lo, hi)`` (one region: one layer's K) with garbage and stall, then copy: a slow copy
    of one layer, caught half done. Whatever reads those rows before the copy finished
    reads garbage. Keeps the inner store's ``partial_reads`` (a memory store: a load
    splits by region) and row path."""

    def __init__(self, inner: CpuSlab, lo: int, hi: int, device: torch.device, stall_s: float):
        self.inner = inner
        self.num_slots, self.slot_bytes = inner.num_slots, inner.slot_bytes
        self.partial_reads = inner.partial_reads
        self.lo, self.hi, self.device, self.stall_s = lo, hi, device, stall_s
        self.faults = 0

    def read(
        self, slots: Sequence[int], keys: Sequence[Key], dst: Sequence[Segments]
    ) -> list[bool]:
        hit = [seg for chunk in dst for off, seg in chunk if self.lo <= off < self.hi]
        if hit:
            for seg in hit:
                seg.fill_(GARBAGE)
            stall(self.device, self.stall_s)
            self.faults += 1
        return self.inner.read(slots, keys, dst)

    def write(
        self,
        slots: Sequence[int],
        keys: Sequence[Key],
        src: Sequence[Segments],
        parents: Sequence[Key | None] | None = None,
    ) -> list[bool]:
        return self.inner.write(slots, keys, src, parents)

    def supports_rows(self, engine_regions: Sequence[torch.Tensor]) -> bool:
        return self.inner.supports_rows(engine_regions)

    def close(self) -> None:
        self.inner.close()


def make_slab(dry: bool, slots: int, row_bytes: Sequence[int], bpc: int) -> CpuSlab:
    slab = (DeviceLikeSlab if dry else CpuSlab)(slots, row_bytes, bpc)
    if slab.host is not None:
        # Measured on its own (pinning), not inside the copies; bounded, as there.
        slab.host.wait_ready(timeout=PIN_TIMEOUT_S)
    return slab


# -- jobs -------------------------------------------------------------------------------------


class Jobs:
    """Job ids and random keys for one engine."""

    def __init__(self, bpc: int) -> None:
        self.bpc = bpc
        self._next = 0

    def make(
        self, kind: JobKind, tier: str, sync: bool, slots: Sequence[int], blocks: Sequence[int]
    ) -> TransferJob:
        self._next += 1
        keys = [os.urandom(KEY_BYTES) for _ in slots]
        return TransferJob(
            job_id=self._next,
            req_id=f"r{self._next}",
            kind=kind,
            tier=tier,
            sync=sync,
            keys=keys,
            slots=list(slots),
            block_ids=list(blocks),
        )

    def load_of(self, stored: TransferJob, sync: bool, blocks: Sequence[int]) -> TransferJob:
        """A load of what ``stored`` stored, into ``blocks``."""
        self._next += 1
        return TransferJob(
            job_id=self._next,
            req_id=f"r{self._next}",
            kind="load",
            tier=stored.tier,
            sync=sync,
            keys=stored.keys,
            slots=stored.slots,
            block_ids=list(blocks),
        )


def run_job(eng: TransferEngine, job: TransferJob) -> tuple[bool, float]:
    """Submit, wait; (every chunk ok, seconds)."""
    t0 = time.perf_counter()
    eng.submit(job)
    eng.wait([job.job_id])
    seconds = time.perf_counter() - t0
    results = [r for r in eng.poll() if r.job_id == job.job_id]
    return bool(results) and all(r.all_ok for r in results), seconds


def dense_kv(geo: Geometry, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    return {
        f"model.layers.{i}.self_attn.attn": torch.randn(
            geo.shape(), dtype=torch.bfloat16, device=device, generator=gen
        )
        for i in range(geo.layers)
    }


def blocks_equal(kv: dict[str, torch.Tensor], dst: Sequence[int], src: Sequence[int]) -> bool:
    d = torch.tensor(list(dst), dtype=torch.long)
    s = torch.tensor(list(src), dtype=torch.long)
    return all(same_bits(t[:, d.to(t.device)], t[:, s.to(t.device)]) for t in kv.values())


def spoil(kv: dict[str, torch.Tensor], blocks: Sequence[int]) -> None:
    idx = torch.tensor(list(blocks), dtype=torch.long)
    for t in kv.values():
        t.view(torch.uint8)[:, idx.to(t.device)] = GARBAGE


# -- checks ------------------------------------------------------------------------------


def check_round_trip(geo: Geometry, device: torch.device, dry: bool, seed: int) -> dict[str, Any]:
    """Store random blocks, then a large async load and a small sync load at once."""
    rng = random.Random(seed)
    kv = dense_kv(geo, device, seed)
    regions = KVRegions.from_tensors(kv, geo.num_blocks, block_dim=1)
    bpc = geo.blocks_per_chunk
    slab = make_slab(dry, geo.slots, regions.row_bytes, bpc)
    eng = TransferEngine(regions, {"cpu": slab}, bpc)
    jobs = Jobs(bpc)
    try:
        calibrated = eng.calibrate(nbytes=min(32 * MiB, geo.batch_bytes))
        n_async, n_sync = geo.async_chunks, geo.sync_chunks
        blocks = rng.sample(range(geo.num_blocks), 2 * (n_async + 2 * n_sync) * bpc)
        src_a, blocks = blocks[: n_async * bpc], blocks[n_async * bpc :]
        src_s, blocks = blocks[: n_sync * bpc], blocks[n_sync * bpc :]
        dst_a, blocks = blocks[: n_async * bpc], blocks[n_async * bpc :]
        dst_s, dst_alone = blocks[: n_sync * bpc], blocks[n_sync * bpc : 2 * n_sync * bpc]
        slots = rng.sample(range(geo.slots), n_async + n_sync)
        store_a = jobs.make("store", "cpu", False, slots[:n_async], src_a)
        store_s = jobs.make("store", "cpu", False, slots[n_async:], src_s)
        stored = all(run_job(eng, j)[0] for j in (store_a, store_s))
        # A sync load alone: the expedited lane's latency without competition.
        run_job(eng, jobs.load_of(store_s, True, dst_alone))  # warm-up: the lane's stream
        spoil(kv, dst_alone)
        alone_ok, sync_alone_s = run_job(eng, jobs.load_of(store_s, True, dst_alone))
        spoil(kv, dst_a + dst_s)
        synchronize(device)
        big = jobs.load_of(store_a, False, dst_a)
        small = jobs.load_of(store_s, True, dst_s)
        t0 = time.perf_counter()
        eng.submit(big)
        eng.submit(small)
        eng.wait([small.job_id])
        sync_s = time.perf_counter() - t0
        async_running = big.job_id in eng.pending()
        eng.wait([big.job_id])
        async_s = time.perf_counter() - t0
        results = {r.job_id: r for r in eng.poll()}
        loads_ok = all(results[j.job_id].all_ok for j in (big, small))
        synchronize(device)
        exact = (
            blocks_equal(kv, dst_a, src_a)
            and blocks_equal(kv, dst_s, src_s)
            and blocks_equal(kv, dst_alone, src_s)
        )
        plan_kind = eng.plan(jobs.load_of(store_s, True, dst_s))[0]
    finally:
        eng.close()
    # The async load is large enough to outlast the sync one only on a GPU-sized run.
    overtook_required = not dry
    return {
        "ok": stored
        and alone_ok
        and loads_ok
        and exact
        and (async_running or not overtook_required),
        "bit_exact": exact,
        "plan": plan_kind,
        "block_bytes": regions.block_bytes,
        "regions": len(regions.regions),
        "async_bytes": len(dst_a) * regions.block_bytes,
        "sync_bytes": len(dst_s) * regions.block_bytes,
        "sync_alone_ms": sync_alone_s * 1e3,
        "sync_during_async_ms": sync_s * 1e3,
        "async_ms": async_s * 1e3,
        "async_still_running_when_sync_done": async_running,
        "calibrated_load_gbps": calibrated / 1e9,
    }


def check_grouped(geo: Geometry, device: torch.device, dry: bool, seed: int) -> dict[str, Any]:
    """Round trip through two block tables: a global group and a sliding-window group
    (half the layers each) whose oldest positions hold the null block on load."""
    rng = random.Random(seed)
    kv = dense_kv(geo, device, seed)
    names = list(kv)
    half = len(names) // 2
    groups = [
        KVRegions.from_tensors({n: kv[n] for n in names[:half]}, geo.num_blocks, block_dim=1),
        KVRegions.from_tensors({n: kv[n] for n in names[half:]}, geo.num_blocks, block_dim=1),
    ]
    codec = BlockIdCodec(2, geo.num_blocks)
    regions = GroupedRegions(groups, codec)
    bpc = geo.blocks_per_chunk
    n = min(8, geo.slots)
    slab = make_slab(dry, n, regions.row_bytes, bpc)
    eng = TransferEngine(regions, {"cpu": slab}, bpc)
    jobs = Jobs(bpc)
    try:
        pool = rng.sample(range(1, geo.num_blocks), 4 * n * bpc)  # block 0: the null block
        src = [pool[: n * bpc], pool[n * bpc : 2 * n * bpc]]
        dst = [pool[2 * n * bpc : 3 * n * bpc], pool[3 * n * bpc :]]
        stored, _ = run_job(eng, jobs.make("store", "cpu", False, range(n), codec.encode(src)))
        window = bpc  # the sliding-window group dropped its first chunk's blocks
        dst_win = [NULL_BLOCK] * window + dst[1][window:]
        spoil({k: kv[k] for k in names[:half]}, dst[0])
        spoil({k: kv[k] for k in names[half:]}, dst[1])
        load = jobs.make("load", "cpu", True, range(n), codec.encode([dst[0], dst_win]))
        loaded, _ = run_job(eng, load)
        synchronize(device)
        exact = blocks_equal({k: kv[k] for k in names[:half]}, dst[0], src[0]) and blocks_equal(
            {k: kv[k] for k in names[half:]}, dst[1][window:], src[1][window:]
        )
        # The window's dropped positions were skipped: their blocks keep the garbage.
        skipped = all(
            bool((kv[k].view(torch.uint8)[:, dst[1][:window]] == GARBAGE).all())
            for k in names[half:]
        )
    finally:
        eng.close()
    return {"ok": stored and loaded and exact and skipped, "bit_exact": exact, "chunks": n}


def check_bandwidth(geo: Geometry, device: torch.device, dry: bool, seed: int) -> dict[str, Any]:
    """Per chunk size: kvtier's sync load and store against a per-chunk pinned ``copy_``."""
    rows_out = []
    for size in geo.sizes:
        rows_out.append(_bandwidth_one(size, geo, device, dry, seed))
    big = [r for r in rows_out if r["chunk_bytes"] >= HEADLINE_MIN]
    load_min = min((r["load_ratio"] for r in big), default=None)
    store_min = min((r["store_ratio"] for r in big), default=None)
    return {
        "ok": all(r["bit_exact"] for r in rows_out),
        "sizes": rows_out,
        "min_load_ratio_ge_256k": load_min,
        "min_store_ratio_ge_256k": store_min,
        "target": TARGET_RATIO,
    }


def _best(fn: Callable[[], object], device: torch.device, rounds: int) -> float:
    fn()  # warm-up
    synchronize(device)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _bandwidth_one(
    size: int, geo: Geometry, device: torch.device, dry: bool, seed: int
) -> dict[str, Any]:
    n = max(2, min(4096, geo.batch_bytes // size))
    rows = 2 * n
    gen = torch.Generator(device=device).manual_seed(seed + size)
    pool = torch.randint(0, 256, (rows, size), dtype=torch.uint8, device=device, generator=gen)
    slab = make_slab(dry, n, [size], 1)
    slab.flat[: n * size].copy_(torch.randint(0, 256, (n * size,), dtype=torch.uint8))
    regions = KVRegions.from_tensors([pool], rows, block_dim=0)
    eng = TransferEngine(regions, {"cpu": slab}, 1)
    jobs = Jobs(1)
    rng = random.Random(seed + size)
    load_idx = rng.sample(range(rows), n)
    store_idx = rng.sample(range(rows), n)
    slab_rows = slab.regions[0]
    side = torch.cuda.Stream(device) if device.type == "cuda" else None  # type: ignore[no-untyped-call]

    def engine(kind: JobKind, idx: list[int]) -> Callable[[], None]:
        def go() -> None:
            ok, _ = run_job(eng, jobs.make(kind, "cpu", kind == "load", range(n), idx))
            assert ok, f"{kind} failed"

        return go

    def per_chunk(load: bool, idx: list[int]) -> Callable[[], None]:
        pairs = [(pool[b], slab_rows[i]) for i, b in enumerate(idx)]
        nb = device.type == "cuda"

        def go() -> None:
            with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                for dev_row, host_row in pairs:
                    if load:
                        dev_row.copy_(host_row, non_blocking=nb)
                    else:
                        host_row.copy_(dev_row, non_blocking=nb)
                if side is not None:
                    side.synchronize()

        return go

    # The link: one copy_ of the batch from one pinned allocation (the slab is page-locked
    # span by span, and a copy across two registrations would be a pageable one).
    link_dst = pool[:n].view(-1)
    link_src = alloc_host_buffer(n * size)
    pinned = bool(slab.flat.is_pinned()) if device.type == "cuda" else False

    try:
        # Correctness once: the load lands bit-exact, the store reads back bit-exact.
        expect = slab_rows[:n].clone()
        engine("load", load_idx)()
        synchronize(device)
        exact = same_bits(pool[torch.tensor(load_idx, device=device)].cpu(), expect)
        engine("store", store_idx)()
        synchronize(device)
        exact = exact and same_bits(
            slab_rows[:n], pool[torch.tensor(store_idx, device=device)].cpu()
        )
        nbytes = n * size
        t = {
            "load": _best(engine("load", load_idx), device, geo.rounds),
            "store": _best(engine("store", store_idx), device, geo.rounds),
            "copy_load": _best(per_chunk(True, load_idx), device, geo.rounds),
            "copy_store": _best(per_chunk(False, store_idx), device, geo.rounds),
            "link_load": _best(
                lambda: link_dst.copy_(link_src, non_blocking=True), device, geo.rounds
            ),
            "link_store": _best(
                lambda: link_src.copy_(link_dst, non_blocking=True), device, geo.rounds
            ),
        }
    finally:
        eng.close()
    gbps = {k: nbytes / v / 1e9 for k, v in t.items()}
    return {
        "chunk_bytes": size,
        "chunks": n,
        "bit_exact": exact,
        "pinned": pinned,
        **{f"{k}_gbps": v for k, v in gbps.items()},
        "load_ratio": gbps["load"] / gbps["copy_load"],
        "store_ratio": gbps["store"] / gbps["copy_store"],
        "load_vs_link": gbps["load"] / gbps["link_load"],
        "store_vs_link": gbps["store"] / gbps["link_store"],
    }


def check_disk(geo: Geometry, device: torch.device, seed: int) -> dict[str, Any]:
    """Device -> disk tier -> device, bit-exact."""
    rng = random.Random(seed)
    kv = dense_kv(geo, device, seed)
    regions = KVRegions.from_tensors(kv, geo.num_blocks, block_dim=1)
    bpc, n = geo.blocks_per_chunk, geo.disk_chunks
    with tempfile.TemporaryDirectory(prefix="kvtier-gpu-check-") as tmp:
        disk = DiskSlab(
            Path(tmp) / "disk", n, regions.chunk_bytes(bpc), b"gpu-check".ljust(NS_BYTES, b"\0")
        )
        eng = TransferEngine(regions, {"disk": disk}, bpc)
        jobs = Jobs(bpc)
        try:
            blocks = rng.sample(range(geo.num_blocks), 2 * n * bpc)
            src, dst = blocks[: n * bpc], blocks[n * bpc :]
            store = jobs.make("store", "disk", False, rng.sample(range(n), n), src)
            stored, store_s = run_job(eng, store)
            spoil(kv, dst)
            loaded, load_s = run_job(eng, jobs.load_of(store, False, dst))
            synchronize(device)
            exact = blocks_equal(kv, dst, src)
            plan_kind = eng.plan(jobs.load_of(store, False, dst))[0]
        finally:
            eng.close()
    nbytes = n * regions.chunk_bytes(bpc)
    return {
        "ok": stored and loaded and exact,
        "bit_exact": exact,
        "plan": plan_kind,
        "bytes": nbytes,
        "store_gbps": nbytes / store_s / 1e9,
        "load_gbps": nbytes / load_s / 1e9,
    }


def check_pinning(geo: Geometry, device: torch.device, tier_bytes: int) -> dict[str, Any]:
    """A CPU tier of ``tier_bytes``: start-up (constructor) and background page-locking."""
    row = geo.block_tokens * geo.kv_heads * geo.head_dim * 2
    row_bytes = [row] * (2 * geo.layers)
    slots = max(1, tier_bytes // (geo.blocks_per_chunk * sum(row_bytes)))
    t0 = time.perf_counter()
    slab = CpuSlab(slots, row_bytes, geo.blocks_per_chunk)
    startup = time.perf_counter() - t0
    try:
        host = slab.host
        assert host is not None
        complete = host.wait_ready(timeout=PIN_TIMEOUT_S)
        ready = time.perf_counter() - t0
        pinned_view = bool(slab.regions[-1].is_pinned()) if device.type == "cuda" else False
        want_pinned = device.type == "cuda"
        ok = complete and host.pinned == want_pinned and pinned_view == want_pinned
        return {
            "ok": ok,
            "tier_bytes": host.nbytes,
            "startup_s": startup,
            "ready_s": ready,
            "ready_gbps": host.nbytes / max(ready, 1e-9) / 1e9,
            "ready_bytes": host.ready_bytes,
            "pinned": host.pinned,
            "torch_sees_pinned": pinned_view,
        }
    finally:
        slab.close()


def check_layered(
    geo: Geometry, device: torch.device, dry: bool, seed: int, overlap: bool = True
) -> dict[str, Any]:
    """Layer-wise sync load under a garbage-then-copy fault on one layer; then (with
    ``overlap``) the same without the fault, for the overlap figures."""
    fault = _layered_run(geo, device, dry, seed, faulty_layer=geo.layers // 2)
    if not overlap:
        return {"ok": fault["ok"], "fault": fault}
    plain = _layered_run(geo, device, dry, seed + 1, faulty_layer=None)
    return {
        "ok": fault["ok"] and plain["ok"],
        "fault": fault,
        "overlap": {k: v for k, v in plain.items() if k != "ok"},
    }


def _layered_run(
    geo: Geometry, device: torch.device, dry: bool, seed: int, faulty_layer: int | None
) -> dict[str, Any]:
    rng = random.Random(seed)
    kv = dense_kv(geo, device, seed)
    names = list(kv)
    regions = KVRegions.from_tensors(kv, geo.num_blocks, block_dim=1)
    bpc = geo.blocks_per_chunk
    n = geo.async_chunks // 2 if not dry else geo.sync_chunks * 2
    slab = make_slab(dry, n, regions.row_bytes, bpc)
    store: SlotStore = slab
    if faulty_layer is not None:
        r = regions.layer_regions[names[faulty_layer]][0]
        lo = bpc * sum(regions.row_bytes[:r])
        store = GarbageFirst(slab, lo, lo + bpc * regions.row_bytes[r], device, geo.stall_s)
    eng = TransferEngine(regions, {"cpu": store}, bpc)
    jobs = Jobs(bpc)
    layers = [([name], regs) for name, regs in regions.layer_regions.items()]
    # One stand-in op per layer: on a GPU ~0.3 ms (a 2048^2 matmul), about as long as a
    # layer's copy (16 MiB), so the forward and the load are worth overlapping.
    side, ops = (2048, 1) if not dry else (64, 4)
    weights = torch.randn(side, side, device=device) / side**0.5
    try:
        blocks = rng.sample(range(geo.num_blocks), 2 * n * bpc)
        src, dst = blocks[: n * bpc], blocks[n * bpc :]
        stored, _ = run_job(eng, jobs.make("store", "cpu", False, range(n), src))
        dst_t = torch.tensor(dst, device=device)

        def forward(w: WorkerSide | None) -> list[torch.Tensor]:
            """One stand-in attention per layer: wait for the layer, read its loaded
            blocks, compute."""
            seen = []
            x = weights
            for name in names:
                if w is not None:
                    w.wait_layer(name)
                seen.append(kv[name][:, dst_t].clone())
                for _ in range(ops):
                    x = torch.tanh(x @ weights)
            return seen

        def step(layered: bool) -> tuple[float, list[torch.Tensor], bool, int]:
            spoil(kv, dst)
            synchronize(device)
            w = WorkerSide(eng, calibrate=False, layers=layers if layered else ())
            load = jobs.make("load", "cpu", True, range(n), dst)
            t0 = time.perf_counter()
            w.begin_step(StepPlan(loads=[load]))
            w.start_loads()
            seen = forward(w)
            w.end_forward()
            synchronize(device)
            seconds = time.perf_counter() - t0
            ok = all(r.all_ok for r in w.report().results)
            return seconds, seen, ok, w.layered_steps

        forward(None)  # warm-up (kernels, allocator)
        forward_s = _best(lambda: forward(None), device, 3)
        whole_s, seen_whole, whole_ok, _ = step(layered=False)
        layered_s, seen, layered_ok, layered_steps = step(layered=True)
        src_t = torch.tensor(src, device=device)
        exact = all(same_bits(s, kv[nm][:, src_t]) for s, nm in zip(seen, names, strict=True))
        exact_whole = all(
            same_bits(s, kv[nm][:, src_t]) for s, nm in zip(seen_whole, names, strict=True)
        )
        faults = store.faults if isinstance(store, GarbageFirst) else 0
    finally:
        eng.close()
    load_s = max(whole_s - forward_s, 0.0)
    hidden = (whole_s - layered_s) / load_s if load_s > 0 else 0.0
    return {
        "ok": stored
        and whole_ok
        and layered_ok
        and exact
        and exact_whole
        and layered_steps == 1
        and (faulty_layer is None or faults > 0),
        "layered": layered_steps == 1,
        "bit_exact_as_read_by_each_layer": exact,
        "faulty_layer": faulty_layer,
        "faults_injected": faults,
        "load_bytes": n * regions.chunk_bytes(bpc),
        "forward_ms": forward_s * 1e3,
        "whole_then_forward_ms": whole_s * 1e3,
        "layered_ms": layered_s * 1e3,
        "load_hidden_fraction": hidden,
    }


# -- the run ----------------------------------------------------------------------------------


def run(dry: bool, tier_gib: float, seed: int = 0) -> dict[str, Any]:
    """Every check; the report (``ok``: all passed)."""
    device = torch.device("cpu" if dry else "cuda")
    geo = DRY if dry else GPU
    checks: dict[str, Callable[[], dict[str, Any]]] = {
        "round_trip": lambda: check_round_trip(geo, device, dry, seed),
        "grouped": lambda: check_grouped(geo, device, dry, seed),
        "bandwidth": lambda: check_bandwidth(geo, device, dry, seed),
        "disk": lambda: check_disk(geo, device, seed),
        "pinning": lambda: check_pinning(geo, device, int(tier_gib * GiB)),
        "layered": lambda: check_layered(geo, device, dry, seed),
    }
    report: dict[str, Any] = {
        "machine": machine_info(**device_info(device)),
        "dry": dry,
        "geometry": geo.__dict__ | {"sizes": list(geo.sizes)},
    }
    for name, fn in checks.items():
        t0 = time.perf_counter()
        try:
            report[name] = fn()
        except Exception as e:  # one broken check must not hide the others' results
            report[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        report[name]["seconds"] = time.perf_counter() - t0
        print(
            f"{name}: {'ok' if report[name]['ok'] else 'FAILED'} ({report[name]['seconds']:.1f} s)",
            flush=True,
        )
    bw = report["bandwidth"]
    prefix = "dry" if dry else "cuda"
    report["summary"] = {
        "ok": all(report[n]["ok"] for n in checks),
        **{f"{n}_ok": report[n]["ok"] for n in checks},
        f"{prefix}_min_load_ratio_ge_256k": bw.get("min_load_ratio_ge_256k"),
        f"{prefix}_min_store_ratio_ge_256k": bw.get("min_store_ratio_ge_256k"),
        "sync_during_async_ms": report["round_trip"].get("sync_during_async_ms"),
        "async_ms": report["round_trip"].get("async_ms"),
    }
    return report


def table(report: dict[str, Any]) -> str:
    out = [f"device: {report['machine'].get('device')}  torch {report['machine']['torch']}"
           f"  CUDA {report['machine'].get('cuda')}"]  # fmt: skip
    rows = []
    for r in report["bandwidth"].get("sizes", []):
        rows.append([
            f"{r['chunk_bytes'] // KiB} KiB", r["chunks"],
            f"{r['load_gbps']:.1f}", f"{r['copy_load_gbps']:.1f}", f"{r['load_ratio']:.2f}",
            f"{r['store_gbps']:.1f}", f"{r['copy_store_gbps']:.1f}", f"{r['store_ratio']:.2f}",
            f"{r['link_load_gbps']:.1f}", f"{r['link_store_gbps']:.1f}",
        ])  # fmt: skip
    out.append(format_table(
        ["chunk", "n", "load", "copy_", "ratio", "store", "copy_", "ratio", "link H2D", "link D2H"],
        rows, "bandwidth (GB/s): kvtier vs per-chunk pinned copy_ vs one bulk copy_ (link)",
    ))  # fmt: skip
    rt = report["round_trip"]
    if "sync_during_async_ms" in rt:
        out.append(
            f"sync load {rt['sync_bytes'] // MiB} MiB: alone {rt['sync_alone_ms']:.2f} ms, during "
            f"a {rt['async_bytes'] // MiB} MiB async load {rt['sync_during_async_ms']:.2f} ms "
            f"(async {rt['async_ms']:.2f} ms, still running then: "
            f"{rt['async_still_running_when_sync_done']})"
        )
    lay = report["layered"].get("overlap")
    if lay:
        out.append(
            f"layered: forward {lay['forward_ms']:.1f} ms, whole load + forward "
            f"{lay['whole_then_forward_ms']:.1f} ms, layered {lay['layered_ms']:.1f} ms "
            f"(load hidden {lay['load_hidden_fraction']:.0%})"
        )
    pin = report["pinning"]
    if "startup_s" in pin:
        out.append(
            f"CPU tier {pin['tier_bytes'] / GiB:.1f} GiB: start-up "
            f"{pin['startup_s'] * 1e3:.1f} ms, ready (pinned={pin['pinned']}) after "
            f"{pin['ready_s']:.1f} s"
        )
    done = [(k[:-3], v) for k, v in report["summary"].items() if k.endswith("_ok")]
    out.append("checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in done))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--dry", action="store_true", help="CPU tensors, small sizes (automatic without CUDA)"
    )
    p.add_argument(
        "--tier-gib",
        type=float,
        default=None,
        help="CPU tier size of the pinning check (GPU 16, dry 0.0625)",
    )
    p.add_argument(
        "--json", default=None, help="report path (default benchmarks/results/gpu_check[-dry].json)"
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    dry = args.dry or not torch.cuda.is_available()
    if dry and not args.dry:
        print("no CUDA device: dry run on CPU tensors (no GPU figures)", flush=True)
    tier_gib = args.tier_gib if args.tier_gib is not None else (1 / 16 if dry else 16.0)
    report = run(dry, tier_gib, args.seed)
    print(table(report))
    default = (
        Path(__file__).resolve().parent
        / "results"
        / ("gpu_check-dry.json" if dry else "gpu_check.json")
    )
    write_json(args.json or str(default), report)
    return 0 if report["summary"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
