"""kvtier's remote tier (Redis) against the same client doing plain pipelined GET/SET.

What it measures, on a redis-server this script starts on loopback (``--cluster``: a
3-master Redis Cluster), persistence off:

- Bandwidth, per chunk size S in 256 KiB, 1 MiB, 4 MiB: ``--batch-bytes`` (default 128 MiB)
  as ``n = batch // S`` chunks of distinct random bytes in a host tensor, each chunk given
  as two segments (as engine KV regions give it), in batches of 32 MiB (one round trip
  each). ``kvtier store``: ``RemoteStore.write`` of a batch (one pipelined EXISTS to skip
  present keys, then pipelined SETs, each value sent from the source tensor in 256 KiB
  parts, each part checksummed just before it is sent, the envelope last); ``kvtier
  load``: ``RemoteStore.read`` of a batch into a destination tensor (GET, envelope and
  checksum checked, scattered into the segments). Baselines (``raw``), same bytes, same
  client object and connections, same batch split, same run: ``RemoteClient.set_many`` of
  ready-made payload bytes (the library's pipelined SET on the connections kvtier's stores
  use, whose packer sends each value as it is) and ``RemoteClient.get_many`` of them. Each
  round starts on an emptied server; the sides alternate batch by batch, the writes, then
  the loads (kvtier's batch, then raw's, then raw's, then kvtier's, ...; each side's time
  is the sum of its batches), so a slow spell of the machine, or of a filling server,
  falls on both alike: timed whole side after whole side, a single round now and then ran
  a side 30-40 % off its median (store ratios of 0.74-0.76 amid 1.1-1.2), and the first
  128 MiB read after the writes ran ~10 % slower (15-30 % after an idle second)
  whichever side read it. GB/s counts payload bytes (1e9 bytes/s); best and worst of
  ``--repeats`` rounds. Ratio = kvtier / baseline. A store ratio above 1 is kvtier's way
  of sending, not a weak baseline; with ``--sends`` two more write sides (alternated with
  the others, under names of their own; they make each round hold twice the bytes, so the
  headline runs go without them) show it: the raw SET's own bytes sent through kvtier's
  sender in 256 KiB parts (``raw_set_parts``), and each part first read by the checksum
  (``raw_set_read_parts``), each over the raw SET (``raw_set_in_parts_over_raw_set``,
  ``raw_set_read_in_parts_over_raw_set``: medians, keyed by chunk bytes). Here the second ran
  1.02-1.19x the raw SET (1.15-1.19x at 4 MiB): the kernel copies a part just read into
  cache faster than a whole value from memory.
  ``page_faults_per_mib`` counts each side's minor page faults: with glibc's defaults the
  raw GET's 32 MiB list of replies lands on fresh pages every batch (~256 a MiB: one per
  4 KiB), kvtier's reads, one reply at a time, do not. ``--keep-freed`` makes glibc keep
  freed memory (both sides, same process) and so measures against a raw side that never
  faults: the cost of kvtier's checksum and of its copy into the destination alone.
- Sealed values (unless ``--no-auth``): the same store and load through a tier with a
  secret (``store_mac`` / ``load_mac``: keyed names, a keyed-BLAKE3 tag over each value)
  and with ``encrypt: true`` (``store_aead`` / ``load_aead``: AES-256-GCM), alternated
  batch by batch with the other sides, each over the raw client of the same run
  (``load_ratio_{mac,aead}_vs_raw_client`` and the store ones in the summary: worst over
  rounds and sizes, ``_median``: the lowest per-size median). Stores of values of 256 KiB
  and more seal values ahead on the store's sealer thread while the sender sends
  (``kvtier.tiers.remote.ahead``; the sender seals whatever the sealer has not reached),
  and loads of values of 1 MiB and more open them on the store's opener thread.
  ``--inline-sealing`` adds two store sides sealing every part inline on the sending
  thread (``store_ratio_{mac,aead}_inline_...``).
  Each round then holds four times ``--batch-bytes`` on the server (six with
  ``--inline-sealing``).
- Like with like: every side sends the same chunks, through the same client object and
  connections, in batches of the same number of values (``values_per_batch``: kvtier's values are
  128-172 bytes longer, envelope and tag, which leaves the split unchanged at these sizes), and
  the raw side's values are ready-made bytes, so it does no work beyond the send. The
  threads each side runs on are in the JSON (``threads``): the raw client and the plain
  store use the caller's thread only, a sealed store one sealer thread more.
- Lookup: the probe of a 128k-token prompt (4096 chunks of 32 tokens, vLLM's block size
  here): ``RemoteIndex.leading`` from the scheduler's side, asked again until it answers
  (the probe thread), median and worst of ``--probes``, for a chain present whole, one
  whose last quarter was never stored, and one missing a single chunk half-way (the
  slow path: counting EXISTS, then the Lua probe).
- With ``--vllm`` (real engines; minutes): ``kvtier.tools.bench.two_engines`` (the ``two-engines``
  workload of ``kvtier bench``) with 6 conversations of 700-token documents and a 4k-token
  prompt: TTFT of the 4k-token prompt on a fresh engine B whose remote tier holds what engine
  A stored (A and B are separate processes), against an engine without kvtier recomputing it,
  both on the same explicit threads; and B's remote-hit tokens over the shared-prefix tokens
  of the conversations A served (``second_engine_hit_fraction``).

Run: ``.venv/bin/python benchmarks/remote_tier.py [--quick] [--cluster] [--vllm] [--keep-freed]
[--sends] [--no-auth] [--inline-sealing] [--repeats N] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import ctypes
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import xxhash

from common import fmt_bytes, format_table, machine_info, write_json
from kvtier.contract import Pending
from kvtier.keys import Namespace, chunk_keys
from kvtier.tiers.remote import KeySpace, RemoteClient, RemoteIndex, RemoteStore
from kvtier.tiers.remote.auth import ValueAuth
from kvtier.tiers.remote.keyspace import purge_pattern
from kvtier.tiers.remote.store import SEAL_AHEAD_BYTES
from kvtier.tiers.remote.streams import PART_BYTES
from kvtier.tiers.remote.url import parse_remote_url

NS = Namespace("bench", "layout")


def _segments(data: torch.Tensor) -> list[list[tuple[int, torch.Tensor]]]:
    h = data.shape[1] // 2
    return [[(0, row[:h]), (h, row[h:])] for row in data]


OWN_SERVER = [True]
"""False with ``--url``: delete only this benchmark's keys, never flush a deployment."""


def _flush(client: RemoteClient) -> None:
    c = client.client
    if not OWN_SERVER[0]:
        mine = [purge_pattern(NS.extra, NS.model, k) for k in (None, SECRET)]
        for pattern in (*mine, b"raw:*", b"praw:*", b"rraw:*"):
            names = list(c.scan_iter(match=pattern, count=1000))
            for lo in range(0, len(names), 500):
                client.delete(names[lo : lo + 500])
        return
    if client.target.cluster:
        c.flushall(target_nodes=c.PRIMARIES)
    else:
        c.flushall()


SECRET = b"kvtier-benchmark-secret-0123456789abcdef"
"""The MAC and AEAD sides' secret (a benchmark's: a real one comes from secret_env/_file)."""


def _sealed_store(
    client: RemoteClient, size: int, encrypt: bool, ahead: bool = True
) -> RemoteStore:
    """A store as a redis tier with a secret builds one (keyed names, MAC or AES-GCM);
    ``ahead=False`` seals every part inline (the ``--inline-sealing`` sides), under names of
    its own (another secret), so it never skips the other side's values as present."""
    secret = SECRET if ahead else SECRET + b"-inline"
    auth = ValueAuth(secret, encrypt, NS.digest(), size)
    space = KeySpace(NS, secret, encrypt)
    least = SEAL_AHEAD_BYTES if ahead else None
    return RemoteStore(client, space, size, NS.digest(), auth=auth, seal_ahead_bytes=least)


THREADS = {
    "raw_set": 1,
    "raw_get": 1,
    "store": 1,
    "load": 1,
    "store_mac": "1 below 256 KiB values (SEAL_AHEAD_BYTES), else 2",
    "store_aead": "1 below 256 KiB values (SEAL_AHEAD_BYTES), else 2",
    "store_mac_inline": 1,
    "store_aead_inline": 1,
    "load_mac": "1 below 1 MiB values, else 2",
    "load_aead": "1 below 1 MiB values, else 2",
}
"""Threads each side runs on: the caller's; sealed stores of 256 KiB values and more add
their store's sealer thread (values sealed ahead of the send, kvtier.tiers.remote.ahead),
sealed loads of 1 MiB values and more its opener thread. Every side uses the one client's
connections."""


def bandwidth(
    url: str,
    size: int,
    batch_bytes: int,
    repeats: int,
    sends: bool = False,
    auth: bool = True,
    inline_sealing: bool = False,
) -> dict[str, Any]:
    n = max(4, batch_bytes // size)
    client = RemoteClient(parse_remote_url(url), timeout_s=30)
    space = KeySpace(NS)
    store = RemoteStore(client, space, size, NS.digest())
    sealed = {"mac": _sealed_store(client, size, False), "aead": _sealed_store(client, size, True)}
    if inline_sealing:
        for mode in ("mac", "aead"):
            sealed[f"{mode}_inline"] = _sealed_store(client, size, mode == "aead", ahead=False)
    src = torch.randint(0, 256, (n, size), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    keys = chunk_keys(list(range(n * 4)), 4, b"bench")
    raw_names = [b"raw:" + k.hex().encode() for k in keys]
    raw_values = [src[i].numpy().tobytes() for i in range(n)]
    per = store.batch
    samples: dict[str, list[float]] = {
        "store": [],
        "load": [],
        "raw_set": [],
        "raw_get": [],
    }
    if sends:
        samples.update(raw_set_parts=[], raw_set_read_parts=[])
    if auth:
        samples.update(store_mac=[], load_mac=[], store_aead=[], load_aead=[])
        if inline_sealing:
            samples.update(store_mac_inline=[], store_aead_inline=[])
    slots = [-1] * n

    def raw_set(lo: int) -> None:
        client.set_many(list(zip(raw_names[lo : lo + per], raw_values[lo : lo + per], strict=True)))

    def raw_parts(prefix: bytes, read: bool) -> Any:
        """The raw SET's bytes under other names, sent the way kvtier sends a value (in
        PART_BYTES parts), each part read by the checksum first when ``read``: what
        explains a store ratio above 1 (see the module docstring)."""
        names = [prefix + nm for nm in raw_names]

        def run(lo: int) -> None:
            def parts(j: int) -> Any:
                view = memoryview(raw_values[lo + j])
                for a in range(0, size, PART_BYTES):
                    if read:
                        xxhash.xxh3_64_intdigest(view[a : a + PART_BYTES])
                    yield view[a : a + PART_BYTES]

            assert all(client.set_streamed(names[lo : lo + per], size, parts))

        return run

    def raw_get(lo: int) -> bytes:
        # Each batch's values are dropped before the next, as kvtier's read drops them
        # (keeping all 128 MiB ran at ~0.6 of kvtier's speed at 1-4 MiB chunks). With
        # glibc's defaults each batch still lands on fresh pages: see --keep-freed.
        return client.get_many(raw_names[lo : lo + per])[0]

    def kvtier_store(lo: int) -> None:
        hi = min(n, lo + per)
        assert all(store.write(slots[lo:hi], keys[lo:hi], _segments(src[lo:hi])))

    def kvtier_load(lo: int) -> None:
        hi = min(n, lo + per)
        assert all(store.read(slots[lo:hi], keys[lo:hi], _segments(dst[lo:hi])))

    def sealed_sides(mode: str) -> tuple[Any, Any]:
        s = sealed[mode]
        # A few bytes more per value: batches as the tier would split them (the same
        # number of values as the raw side's at the sizes measured: values_per_batch).
        batch = s.batch

        def write(lo: int) -> None:
            for a in range(lo, min(n, lo + per), batch):
                b = min(n, lo + per, a + batch)
                assert all(s.write(slots[a:b], keys[a:b], _segments(src[a:b])))

        def read(lo: int) -> None:
            for a in range(lo, min(n, lo + per), batch):
                b = min(n, lo + per, a + batch)
                assert all(s.read(slots[a:b], keys[a:b], _segments(dst[a:b])))

        return write, read

    faults = dict.fromkeys(samples, 0)  # minor page faults of the timed rounds, per side

    def timed(name: str, fn: Any, *args: Any) -> float:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        fn(*args)
        dt = time.perf_counter() - t0
        faults[name] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        return dt

    writes: tuple[tuple[str, Any], ...] = (("store", kvtier_store), ("raw_set", raw_set))
    if sends:
        writes += (
            ("raw_set_parts", raw_parts(b"p", read=False)),
            ("raw_set_read_parts", raw_parts(b"r", read=True)),
        )
    loads: tuple[tuple[str, Any], ...] = (("load", kvtier_load), ("raw_get", raw_get))
    if auth:
        for mode in ("mac", "aead"):
            w, rd = sealed_sides(mode)
            writes += ((f"store_{mode}", w),)
            loads += ((f"load_{mode}", rd),)
        if inline_sealing:
            for m in ("mac", "aead"):
                writes += ((f"store_{m}_inline", sealed_sides(f"{m}_inline")[0]),)
    for r in range(repeats + 1):
        # Each round starts on an emptied server. The sides alternate batch by batch, the
        # writes and then the loads (kvtier's batch, raw's, raw's, kvtier's, ...; each
        # side's time the sum of its batches), so a slow spell of the machine, or of a
        # server filling up, falls on both sides alike.
        _flush(client)
        t = dict.fromkeys(samples, 0.0)
        for phase in (writes, loads):
            for b, lo in enumerate(range(0, n, per)):
                for name, fn in phase[:: 1 if (b + r) % 2 == 0 else -1]:
                    t[name] += timed(name, fn, lo)
        if r == 0:  # warm-up round; check the bytes once
            assert torch.equal(dst, src) and raw_get(0) == raw_values[0]
            faults.update(dict.fromkeys(faults, 0))
            continue
        nb = n * size
        for name, secs in t.items():
            samples[name].append(nb / secs / 1e9)
    _flush(client)
    store.close()

    def over(name: str, base: str) -> dict[str, float]:
        return _spread([k / r for k, r in zip(samples[name], samples[base], strict=True)])

    ratios_load = [k / r for k, r in zip(samples["load"], samples["raw_get"], strict=True)]
    ratios_store = [k / r for k, r in zip(samples["store"], samples["raw_set"], strict=True)]
    sealed_ratios = {}
    if auth:
        for mode in ("mac", "aead"):
            sealed_ratios[f"load_ratio_{mode}"] = over(f"load_{mode}", "raw_get")
            sealed_ratios[f"store_ratio_{mode}"] = over(f"store_{mode}", "raw_set")
            if inline_sealing:
                ratio = over(f"store_{mode}_inline", "raw_set")
                sealed_ratios[f"store_ratio_{mode}_inline"] = ratio

    def over_raw_set(name: str) -> dict[str, float]:
        return _spread([k / r for k, r in zip(samples[name], samples["raw_set"], strict=True)])

    # The raw SET's bytes sent in kvtier's parts, over the raw SET (same run).
    extra = {f"{k}_ratio": over_raw_set(k) for k in samples if k.startswith("raw_set_")}

    return {
        "chunk_bytes": size,
        "chunks": n,
        "gbps": {k: _spread(v) for k, v in samples.items()},
        "load_ratio": _spread(ratios_load),
        "store_ratio": _spread(ratios_store),
        **sealed_ratios,
        **extra,
        "page_faults_per_mib": {k: v / (repeats * n * size / 2**20) for k, v in faults.items()},
        "values_per_batch": {"raw": per, **{k: v.batch for k, v in sealed.items()}},
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"worst": min(values), "median": statistics.median(values), "best": max(values)}


def lookup(url: str, probes: int, tokens: int = 131072, chunk: int = 32) -> dict[str, Any]:
    """Probe times of a ``tokens``-token prompt: all present (``whole``), the first three
    quarters present and the rest never stored (``tail_absent``), all present but one chunk
    half-way (``hole``, the slow path: the Lua probe finds the miss)."""
    n = tokens // chunk
    space = KeySpace(NS)
    client = RemoteClient(parse_remote_url(url), timeout_s=5)
    keys = chunk_keys(list(range(tokens)), chunk, b"bench-lookup")
    absent = chunk_keys(list(range(tokens)), chunk, b"bench-lookup-absent")
    for lo in range(0, n, 512):
        client.set_many([(nm, b"x") for nm in space.names(keys[lo : lo + 512], 0)])
    index = RemoteIndex(RemoteClient(parse_remote_url(url), timeout_s=5), space, 1, 0.005)
    three_quarters = 3 * n // 4
    cases = {
        "whole": (keys, n),
        "tail_absent": (keys[:three_quarters] + absent[three_quarters:], three_quarters),
        "hole": ([*keys[: n // 2], absent[n // 2], *keys[n // 2 + 1 :]], n // 2),
    }
    out: dict[str, Any] = {"tokens": tokens, "chunk_tokens": chunk, "keys": n}
    for name, (chain, want) in cases.items():
        times = []
        for i in range(probes + 1):
            t0 = time.perf_counter()
            while isinstance(got := index.leading(chain, 0), Pending):
                time.sleep(0.0002)
            dt = time.perf_counter() - t0
            assert got == want, (name, got, want)
            if i:
                times.append(dt * 1e3)
        out[name] = {
            "ms_median": statistics.median(times),
            "ms_worst": max(times),
            "ms_best": min(times),
        }
    index.close()
    _flush(client)
    client.close()
    return out


def two_engines(url: str) -> dict[str, Any]:
    """Engines A, B and the no-kvtier baseline on ``url`` (see the module docstring)."""
    from rich.console import Console

    from kvtier.tools.bench import two_engines as pair
    from kvtier.tools.bench.binding import check_equal, default_threads
    from kvtier.tools.models import smollm2_path

    opts = pair.TwoEngineOptions(
        conversations=6, doc_tokens=700, max_tokens=16, long_tokens=4000, sync_budget="1GiB"
    )
    engine = {"dtype": "float32", "max_num_batched_tokens": 8192, "max_model_len": 8192}
    with tempfile.TemporaryDirectory(prefix="kvtier-remote-") as d:
        r = pair.run_two_engines(
            url,
            model=smollm2_path(),
            engine=engine,
            threads=default_threads(multiprocess=False),
            opts=opts,
            out_dir=Path(d),
        )
    check_equal(r["binding"])

    def ttft_4k(row: str) -> float:
        return float(next(x["ttft"] for x in r["raw"][row]["requests"] if x["id"] == "long"))

    s = r["summary"]
    s["second_engine_hit_fraction"] = s["hit_fraction"]
    s["ttft_recompute_over_remote_hit_4k"] = ttft_4k("baseline") / ttft_4k("B")
    Console(width=140).print(pair.table(r))
    return r


def keep_freed_memory() -> None:
    """Make glibc keep what is freed in its heap: no ``mmap`` per large value (threshold
    64 MiB) and no return of the heap's top to the system (threshold 1 GiB). By default a
    batch of values freed together is handed back and the next batch faults every 4 KiB page
    in again: the raw side's list of 32 MiB of replies does, kvtier's one reply at a time
    does not (``page_faults_per_mib`` in the results)."""
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    if not (libc.mallopt(m_mmap_threshold, 64 << 20) and libc.mallopt(m_trim_threshold, 1 << 30)):
        raise SystemExit("--keep-freed: mallopt refused (not glibc?)")


def _fmt_spread(r: dict[str, float]) -> str:
    return f"{r['worst']:.2f} / {r['median']:.2f} / {r['best']:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small batches, few repeats")
    ap.add_argument("--cluster", action="store_true", help="measure on a 3-master cluster")
    ap.add_argument("--vllm", action="store_true", help="also the two-engine TTFT runs")
    ap.add_argument("--url", help="an existing deployment instead of a local server")
    ap.add_argument("--batch-bytes", type=int, default=128 << 20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--probes", type=int, default=30)
    ap.add_argument(
        "--keep-freed",
        action="store_true",
        help="glibc keeps freed memory (no heap trim, no mmap per value) for both sides",
    )
    ap.add_argument(
        "--sends",
        action="store_true",
        help="also time the raw SET's bytes sent in kvtier's 256 KiB parts (read first or not)",
    )
    ap.add_argument(
        "--no-auth",
        action="store_true",
        help="skip the MAC and AEAD sides (a tier with a secret, and with encrypt: true)",
    )
    ap.add_argument(
        "--inline-sealing",
        action="store_true",
        help="also time MAC and AEAD stores sealing every part inline (no sealer thread)",
    )
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.keep_freed:
        keep_freed_memory()
    if a.quick:
        a.batch_bytes, a.repeats, a.probes = 32 << 20, 2, 10
    from kvtier.tools.redis_server import RedisCluster, RedisServer

    server: Any = None
    url = a.url
    OWN_SERVER[0] = url is None
    if url is None:
        server = RedisCluster(3) if a.cluster else RedisServer()
        url = server.url
    try:
        sizes = [256 << 10, 1 << 20, 4 << 20]
        auth = not a.no_auth
        inline = auth and a.inline_sealing
        bw = [bandwidth(url, s, a.batch_bytes, a.repeats, a.sends, auth, inline) for s in sizes]
        lk = lookup(url, a.probes)
        vllm: dict[str, Any] = {}
        if a.vllm:
            vllm = two_engines(url)
    finally:
        if server is not None:
            server.close()
    rows = []
    for b in bw:
        g = b["gbps"]
        rows.append(
            [
                fmt_bytes(b["chunk_bytes"]),
                f"{g['store']['best']:.2f} / {g['raw_set']['best']:.2f}",
                _fmt_spread(b["store_ratio"]),
                f"{g['load']['best']:.2f} / {g['raw_get']['best']:.2f}",
                _fmt_spread(b["load_ratio"]),
            ]
        )
    where = "3-master cluster" if a.cluster else "standalone"
    print(
        format_table(
            [
                "chunk",
                "store GB/s kvtier/raw",
                "store ratio worst/median/best",
                "load GB/s kvtier/raw",
                "load ratio worst/median/best",
            ],
            rows,
            title=f"remote tier vs raw pipelined SET/GET ({where}, loopback)",
        )
    )
    if auth:
        print(
            format_table(
                [
                    "chunk",
                    *(
                        f"{op} ratio {m}"
                        for m in ("off", "MAC", "AEAD")
                        for op in ("load", "store")
                    ),
                ],
                [
                    [
                        fmt_bytes(b["chunk_bytes"]),
                        *(
                            _fmt_spread(b[f"{op}_ratio{m}"])
                            for m in ("", "_mac", "_aead")
                            for op in ("load", "store")
                        ),
                    ]
                    for b in bw
                ],
                title="over the raw client, worst / median / best: options off, MAC (a secret), "
                "AEAD (encrypt: true)",
            )
        )
    print(
        f"lookup of a {lk['tokens']}-token prompt ({lk['keys']} keys), median / worst: "
        + ", ".join(
            f"{case.replace('_', ' ')} {lk[case]['ms_median']:.2f} / {lk[case]['ms_worst']:.2f} ms"
            for case in ("whole", "tail_absent", "hole")
        )
    )
    summary: dict[str, Any] = {
        "load_ratio_vs_raw_client": min(b["load_ratio"]["worst"] for b in bw),
        "load_ratio_vs_raw_client_best": max(b["load_ratio"]["best"] for b in bw),
        "store_ratio_vs_raw_client": min(b["store_ratio"]["worst"] for b in bw),
        "store_ratio_vs_raw_client_best": max(b["store_ratio"]["best"] for b in bw),
        # The lowest per-size median: the typical round at the chunk size that does worst.
        "load_ratio_vs_raw_client_median": min(b["load_ratio"]["median"] for b in bw),
        "store_ratio_vs_raw_client_median": min(b["store_ratio"]["median"] for b in bw),
        "lookup_ms_128k": lk["whole"]["ms_median"],
        "lookup_ms_128k_worst": lk["whole"]["ms_worst"],
        "lookup_ms_128k_tail_absent": lk["tail_absent"]["ms_median"],
        "lookup_ms_128k_hole": lk["hole"]["ms_median"],
        "cluster": bool(a.cluster),
        "allocator": "glibc, freed memory kept" if a.keep_freed else "glibc default",
    }
    if auth:
        for mode in ("mac", "aead"):
            for op in ("load", "store"):
                ratios = [b[f"{op}_ratio_{mode}"] for b in bw]
                summary[f"{op}_ratio_{mode}_vs_raw_client"] = min(r["worst"] for r in ratios)
                summary[f"{op}_ratio_{mode}_vs_raw_client_median"] = min(
                    r["median"] for r in ratios
                )
        summary["sealing"] = (
            f"values of {SEAL_AHEAD_BYTES} bytes and more sealed ahead on a sealer thread"
            " (kvtier.tiers.remote.ahead), smaller ones inline"
        )
        if inline:
            for mode in ("mac", "aead"):
                ratios = [b[f"store_ratio_{mode}_inline"] for b in bw]
                key = f"store_ratio_{mode}_inline_vs_raw_client"
                summary[key] = min(r["worst"] for r in ratios)
                summary[f"{key}_median"] = min(r["median"] for r in ratios)
            print(
                "sealed stores, every part sealed inline (no sealer thread), over the raw client,"
                " worst / median / best: "
                + "; ".join(
                    f"{fmt_bytes(b['chunk_bytes'])} MAC {_fmt_spread(b['store_ratio_mac_inline'])}"
                    f", AEAD {_fmt_spread(b['store_ratio_aead_inline'])}"
                    for b in bw
                )
            )
    if a.sends:
        # Why a store can beat the raw SET: the raw SET's own bytes sent the way kvtier
        # sends (medians per chunk size, over the raw SET).
        for side in ("parts", "read_parts"):
            name = side.replace("parts", "in_parts")
            summary[f"raw_set_{name}_over_raw_set"] = {
                b["chunk_bytes"]: b[f"raw_set_{side}_ratio"]["median"] for b in bw
            }
        print(
            "the raw SET's bytes sent in 256 KiB parts / read, then sent in parts, over the raw"
            " SET (medians): "
            + ", ".join(
                f"{fmt_bytes(b['chunk_bytes'])} {b['raw_set_parts_ratio']['median']:.2f}"
                f" / {b['raw_set_read_parts_ratio']['median']:.2f}"
                for b in bw
            )
        )
    if vllm:
        summary.update(vllm["summary"])
    print(summary)
    write_json(
        a.json,
        {
            "summary": summary,
            "bandwidth": bw,
            "lookup": lk,
            "vllm": vllm,
            "machine": machine_info(server=where, url=parse_remote_url(url).display),
            "threads": THREADS,
        },
    )


if __name__ == "__main__":
    main()
