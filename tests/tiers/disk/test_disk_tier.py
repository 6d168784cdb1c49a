"""Disk tier: conformance, restarts, faults (bit flips, truncation, kill -9, full disk,
removed directory), one owner per directory, header-scan speed, random operation sequences.

A chunk's payload here is a deterministic function of its key (as real KV is of its token
prefix), so any chunk that reads back successfully can be checked, even one written by
another process or before a restart.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvtier.tiers.disk.slab as disk_module
from kvtier.errors import TierUnavailable
from kvtier.keys import Namespace, chunk_keys
from kvtier.policies.registry import make_eviction_policy
from kvtier.tiers.disk import native as slabio
from kvtier.tiers.disk.format import (
    SlabGeometry,
    SlotRecord,
    pack_header,
    read_superblock,
    slab_file_name,
)
from kvtier.tiers.disk.native import native_io
from kvtier.tiers.disk.restore import restorable, restore_index
from kvtier.tiers.disk.slab import DiskSlab
from kvtier.tiers.index import SlotIndex
from kvtier.tools.inspect import format_inspect, inspect_dir
from kvtier.tools.slot_tier import DiskTier

NS = Namespace("test-model", "layout-x", "tp1").digest()
OTHER_NS = Namespace("other-model", "layout-x", "tp1").digest()
CH = 4096

# Timing limits are benchmarks: only the ``slow`` variant of a test asserts them.
TIMED = [pytest.param(False, id="exact"), pytest.param(True, id="timed", marks=pytest.mark.slow)]


def payload(keys, nbytes=CH):
    """uint8 [len(keys), nbytes]: each row a function of its key."""
    rows = [
        torch.frombuffer(bytearray(hashlib.shake_128(k).digest(nbytes)), dtype=torch.uint8)
        for k in keys
    ]
    return torch.stack(rows) if rows else torch.empty(0, nbytes, dtype=torch.uint8)


def chain(n, salt=0, prefix=()):
    tokens = list(prefix) + list(range(salt * 100_000, salt * 100_000 + n * 4 - len(prefix)))
    return chunk_keys(tokens, 4, b"disk-test")


def check_reads(tier, keys, nbytes=CH):
    """get() of a chain: returns the count, asserting the bytes read are the right ones."""
    out = torch.zeros(len(keys), nbytes, dtype=torch.uint8)
    n = tier.get(keys, out)
    assert torch.equal(out[:n], payload(keys[:n], nbytes)), "wrong bytes read back"
    return n


def slab_path(tier_or_slab, slot):
    slab = getattr(tier_or_slab, "slab", tier_or_slab)
    return slab.path / slab_file_name(slot // slab.geometry.slots_per_file)


def flip_bit(path, offset, rng):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))


@pytest.fixture(autouse=True, params=["native", "python"])
def data_path(request, monkeypatch):
    """Every test here runs on both data paths of DiskSlab: the native one (built by
    ``pip install``; its absence is a failure, not a skip) and the Python one."""
    if request.param == "native":
        assert native_io() is not None, "native disk I/O is not built: pip install -e ."
    else:
        monkeypatch.setattr(disk_module, "native_io", lambda: None)
    return request.param


@pytest.fixture
def tmpdir_path():
    d = tempfile.mkdtemp(prefix="kvtier-disk-")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


# Conformance: the disk kind runs through kvtier.conformance in test_conformance.py.


# -- restarts ---------------------------------------------------------------------------------


def test_restart_finds_chains_again(tmpdir_path):
    a = chain(6, salt=1)
    b = chain(6, salt=1, prefix=list(range(100_000, 100_008)) + [7] * 8)  # shares 2 chunks
    c = chain(5, salt=2)
    assert a[:2] == b[:2] and a[2] != b[2]
    tier = DiskTier(tmpdir_path, 32 * CH, CH, NS)
    assert tier.put(a, payload(a)) == 6
    assert tier.put(b[2:], payload(b[2:]), parent=b[1]) == 4
    assert tier.put(c, payload(c)) == 5
    tier.close()

    again = DiskTier(tmpdir_path, 32 * CH, CH, NS)
    assert again.restored == len(again) == 15
    again.index.check()
    for keys in (a, b, c):
        assert again.prefix_len(keys) == len(keys)
        assert check_reads(again, keys) == len(keys)
    again.close()

    # Another namespace shares nothing; the first one's chunks survive its visit.
    other = DiskTier(tmpdir_path, 32 * CH, CH, OTHER_NS)
    assert other.restored == 0 and other.prefix_len(a) == 0
    other.close()
    third = DiskTier(tmpdir_path, 32 * CH, CH, NS)
    assert third.restored == 15
    third.close()


def test_restart_keeps_write_order_for_eviction(tmpdir_path):
    old, new, newest = chain(4, salt=1), chain(4, salt=2), chain(4, salt=3)
    tier = DiskTier(tmpdir_path, 8 * CH, CH, NS)
    tier.put(old, payload(old))
    tier.put(new, payload(new))
    tier.close()
    tier = DiskTier(tmpdir_path, 8 * CH, CH, NS)
    assert tier.put(newest, payload(newest)) == 4
    assert tier.prefix_len(old) == 0, "the oldest chain goes first after a restart too"
    assert tier.prefix_len(new) == 4
    assert check_reads(tier, newest) == 4
    tier.close()


def test_restore_index_places_every_key_in_its_own_slot():
    k = [bytes([i]) * 16 for i in range(10)]
    records = [
        SlotRecord(7, k[0], None, 1),  # root at a high slot
        SlotRecord(2, k[1], k[0], 2),  # child below its parent: waits for it
        SlotRecord(0, k[2], k[1], 3),
        SlotRecord(5, k[3], k[0], 4),  # a branch
        SlotRecord(9, k[1], k[0], 1),  # an older copy of k[1]: the newer one wins
        SlotRecord(3, k[4], k[9], 5),  # orphan (parent never stored)
        SlotRecord(4, k[5], k[4], 6),  # child of an orphan
        SlotRecord(12, k[6], None, 7),  # past num_slots
    ]
    index = SlotIndex(10, make_eviction_policy("lru", 10))
    assert restore_index(index, records) == 4
    index.check()
    assert {key: index.slot_of(key) for key in index.ready_keys()} == {
        k[0]: 7,
        k[1]: 2,
        k[2]: 0,
        k[3]: 5,
    }
    assert index.free_slots == 6
    # New stores get the lowest free slots first, as on a fresh index.
    assert index.reserve([b"x" * 16], None) == [1]
    # Eviction takes leaves, oldest write first: k[2] (seq 3) before k[3] (seq 4).
    index.reserve([bytes([50 + i]) * 16 for i in range(6)], None)
    evicted = [key for key in (k[2], k[3]) if not index.has(key)]
    assert evicted == [k[2]]


@pytest.mark.parametrize("timed", TIMED)
def test_restore_index_is_linear_in_scattered_long_chains(timed):
    # A 4096-deep chain plus a 500-deep branch off its middle, in shuffled slots: one
    # reservation per path (a reservation walks the parent's ancestors).
    n = 4600
    rng = random.Random(5)
    slots = rng.sample(range(n + 50), n)
    keys = [i.to_bytes(16, "little") for i in range(n)]
    parents = [None, *keys[: 4096 - 1], keys[2000], *keys[4096 : n - 1]]
    records = [SlotRecord(slots[i], keys[i], parents[i], i + 1) for i in range(n)]
    index = SlotIndex(n + 50, make_eviction_policy("arc", n + 50))
    t0 = time.perf_counter()
    assert restore_index(index, records) == n
    elapsed = time.perf_counter() - t0
    index.check()
    assert all(index.slot_of(keys[i]) == slots[i] for i in range(n))
    assert index.free_slots == 50
    assert not timed or elapsed < 2.0, f"restore took {elapsed:.2f} s"


def test_restorable_is_a_fixpoint_over_chains():
    k = [bytes([i]) * 16 for i in range(6)]
    recs = [SlotRecord(i, k[i], k[i - 1] if i else None, 10 - i) for i in range(6)]
    assert [r.key for r in restorable(recs)] == k
    assert [r.key for r in restorable(recs[:2] + recs[3:])] == k[:2]


def test_capacity_change_and_geometry_change(tmpdir_path, caplog):
    keys = chain(12)
    tier = DiskTier(tmpdir_path, 16 * CH, CH, NS, file_bytes=4 * CH)  # 4 slots per file
    assert tier.put(keys, payload(keys)) == 12
    tier.close()
    # Smaller: chunks past the new capacity are dropped, the prefix before them survives.
    small = DiskTier(tmpdir_path, 6 * CH, CH, NS)
    assert small.slab.geometry.slots_per_file == 4, "an existing directory keeps its layout"
    assert small.prefix_len(keys) == 6 and check_reads(small, keys) == 6
    assert sorted(p.name for p in tmpdir_path.glob("slab-*")) == [
        slab_file_name(0),
        slab_file_name(1),
    ]
    small.close()
    big = DiskTier(tmpdir_path, 16 * CH, CH, NS)
    assert big.prefix_len(keys) == 6, "trimmed slots must not come back"
    big.close()
    # Another chunk size: the directory is reformatted.
    other = DiskTier(tmpdir_path, 16 * 2 * CH, 2 * CH, NS)
    assert other.restored == 0
    assert read_superblock(tmpdir_path).slot_bytes == 2 * CH
    assert "reformatting" in caplog.text
    other.close()


def test_writes_without_parents_are_readable_but_not_restored(tmpdir_path):
    keys = chain(3)
    data = payload(keys)
    with DiskSlab(tmpdir_path, 8, CH, NS) as slab:
        assert slab.write([0, 1, 2], keys, [[(0, data[i])] for i in range(3)]) == [True] * 3
        out = torch.zeros_like(data)
        assert slab.read([0, 1, 2], keys, [[(0, out[i])] for i in range(3)]) == [True] * 3
        assert torch.equal(out, data)
    assert DiskSlab.scan(tmpdir_path, NS, CH) == []
    info = inspect_dir(tmpdir_path)
    assert info["namespaces"][0]["parent_unknown"] == 3


# -- the data path ----------------------------------------------------------------------------


def _open_slab(path, native, nbytes):
    with mock.patch.object(disk_module, "native_io", slabio.native_io if native else lambda: None):
        slab = DiskSlab(path, 8, nbytes, NS, threads=2)
    assert slab.accepts_buffers() == native
    return slab


def _split(rng, t):
    """``t`` as (offset, view) segments cut at random points (some of them empty)."""
    cuts = sorted(rng.randrange(t.numel() + 1) for _ in range(rng.randrange(4)))
    bounds = [0, *cuts, t.numel()]
    return [(a, t[a:b]) for a, b in itertools.pairwise(bounds)]


@settings(max_examples=20, deadline=None)
@given(
    nbytes=st.sampled_from([1000, 4096, 5000, 300_000]),
    slots=st.lists(st.integers(0, 7), min_size=1, max_size=6, unique=True),
    seed=st.integers(0, 1 << 16),
)
def test_native_and_python_paths_are_interchangeable(nbytes, slots, seed):
    """Both paths write byte-identical slab files (payloads, padding, headers), and each
    reads, with random segment splits and skipped ranges, what the other wrote."""
    rng = random.Random(seed)
    keys = chain(len(slots), salt=seed % 7)
    data = payload(keys, nbytes)
    parents = [None, *keys[:-1]]
    root = Path(tempfile.mkdtemp(prefix="kvtier-paths-"))
    try:
        for native in (True, False):
            with _open_slab(root / str(native), native, nbytes) as slab:
                segs = [_split(rng, d) for d in data]
                assert slab.write(slots, keys, segs, parents=parents) == [True] * len(slots)
        files = [sorted((root / str(n)).glob("slab-*.kvt")) for n in (True, False)]
        assert [f.read_bytes() for f in files[0]] == [f.read_bytes() for f in files[1]]
        for native in (True, False):
            with _open_slab(root / str(not native), native, nbytes) as slab:
                out = torch.zeros_like(data)
                kept = [[s for s in _split(rng, o) if rng.random() < 0.7] for o in out]
                assert slab.read(slots, keys, kept) == [True] * len(slots)
                for i, segs in enumerate(kept):
                    for off, view in segs:
                        assert torch.equal(view, data[i, off : off + view.numel()])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_partial_reads_still_verify_the_skipped_bytes(tmpdir_path):
    keys = chain(2)
    data = payload(keys)
    with DiskSlab(tmpdir_path, 4, CH, NS) as slab:
        slab.write([0, 1], keys, [[(0, data[i])] for i in range(2)], parents=[None, keys[0]])
        dst = torch.zeros(CH, dtype=torch.uint8)
        segs = [(1000, dst[1000:2000]), (3000, dst[3000:])]  # [0,1000) and [2000,3000) skipped
        assert slab.read([1], [keys[1]], [segs]) == [True]
        assert torch.equal(dst[1000:2000], data[1, 1000:2000])
        assert torch.equal(dst[3000:], data[1, 3000:])
        # A flipped bit in a skipped range still fails the read.
        flip_bit(slab_path(slab, 1), slab.geometry.payload_offset(1) + 2500, random.Random(1))
        assert slab.read([1], [keys[1]], [segs]) == [False]
        assert slab.corrupt_reads == 1
        # ... and erases the slot, so it is not re-admitted later.
        assert slab.holds(1) is None
    assert [r.key for r in DiskSlab.scan(tmpdir_path, NS, CH)] == [keys[0]]


def test_staged_segments_and_wrong_keys(tmpdir_path):
    keys = chain(2)
    data = payload(keys)
    with DiskSlab(tmpdir_path, 4, CH, NS, threads=1) as slab:
        # Non-contiguous views go through the thread's scratch buffer.
        src = torch.zeros(2 * CH, dtype=torch.uint8)[::2]
        src.copy_(data[0])
        assert not src.is_contiguous()
        assert slab.write([3], [keys[0]], [[(0, src)]], parents=[None]) == [True]
        back = torch.zeros(2 * CH, dtype=torch.uint8)[::2]
        assert slab.read([3], [keys[0]], [[(0, back)]]) == [True]
        assert torch.equal(back, src)
        # The slot holds keys[0]: asking for keys[1] there is a miss, not keys[0]'s bytes.
        out = torch.zeros(CH, dtype=torch.uint8)
        assert slab.read([3], [keys[1]], [[(0, out)]]) == [False]
        assert slab.read([2], [keys[0]], [[(0, out)]]) == [False]
        assert slab.stale_reads == 2
        with pytest.raises(ValueError, match="whole payload"):
            slab.write([0], [keys[0]], [[(0, data[0][:100])]])
        with pytest.raises(ValueError, match="out of range"):
            slab.read([4], [keys[0]], [[(0, out)]])
        with pytest.raises(ValueError, match="overlaps"):
            slab.read([3], [keys[0]], [[(0, out[:200]), (100, out[100:300])]])


def test_large_batches_use_the_thread_pool(tmpdir_path):
    nbytes = 256 << 10
    keys = chain(12)
    data = payload(keys, nbytes)
    with DiskSlab(tmpdir_path, 16, nbytes, NS, threads=4) as slab:
        slots = list(range(12))
        parents = [None, *keys[:-1]]
        assert slab.write(slots, keys, [[(0, d)] for d in data], parents=parents) == [True] * 12
        out = torch.zeros_like(data)
        assert slab.read(slots, keys, [[(0, o)] for o in out]) == [True] * 12
        assert torch.equal(out, data)


def test_runs_of_consecutive_slots_keep_per_chunk_outcomes(tmpdir_path):
    nbytes = 1000  # not a page multiple: payloads are padded apart in the file
    keys = chain(6)
    data = payload(keys, nbytes)
    with DiskSlab(tmpdir_path, 8, nbytes, NS, threads=1) as slab:
        parents = [None, *keys[:-1]]
        assert slab.write(range(6), keys, [[(0, d)] for d in data], parents=parents) == [True] * 6
        out = torch.zeros_like(data)
        asked = [*keys[:2], OTHER_NS, *keys[3:]]  # chunk 2: a key its slot does not hold
        partial = [(0, out[4][:300]), (700, out[4][700:])]  # chunk 4 skips [300, 700)
        segs = [[(0, o)] for o in out]
        segs[4] = partial
        assert slab.read(range(6), asked, segs) == [True, True, False, True, True, True]
        for i in (0, 1, 3, 5):
            assert torch.equal(out[i], data[i])
        assert torch.equal(out[4][:300], data[4][:300]) and not out[4][300:700].any()
        # A flipped bit fails its own chunk only.
        flip_bit(slab_path(slab, 3), slab.geometry.payload_offset(3) + 999, random.Random(2))
        out.zero_()
        assert (
            slab.read(range(6), keys, [[(0, o)] for o in out]) == [True] * 3 + [False] + [True] * 2
        )
        assert torch.equal(out[5], data[5])


# -- faults -----------------------------------------------------------------------------------


def _filled_tier(path, n_chains=4, length=6, capacity=32):
    tier = DiskTier(path, capacity * CH, CH, NS, file_bytes=16 * CH)
    chains = [chain(length, salt=s) for s in range(n_chains)]
    for keys in chains:
        assert tier.put(keys, payload(keys)) == length
    return tier, chains


def test_payload_bit_flips_become_misses(tmpdir_path):
    tier, chains = _filled_tier(tmpdir_path)
    rng = random.Random(7)
    victims = rng.sample(tier.index.ready_keys(), 6)
    for key in victims:
        slot = tier.index.slot_of(key)
        flip_bit(
            slab_path(tier, slot), tier.slab.geometry.payload_offset(slot) + rng.randrange(CH), rng
        )
    total = sum(check_reads(tier, keys) for keys in chains)
    assert total < 24
    assert tier.slab.corrupt_reads >= 1
    tier.index.check()
    tier.close()
    # After a restart the damaged slots stay gone (their headers were erased on read).
    again = DiskTier(tmpdir_path, 32 * CH, CH, NS)
    assert sum(check_reads(again, keys) for keys in chains) == total
    again.close()


def test_header_bit_flips_become_misses_after_restart(tmpdir_path):
    tier, chains = _filled_tier(tmpdir_path)
    rng = random.Random(3)
    victims = rng.sample(tier.index.ready_keys(), 8)
    slots = [tier.index.slot_of(k) for k in victims]
    geo = tier.slab.geometry
    tier.close()
    for slot in slots:
        flip_bit(slab_path(tier, slot), geo.header_offset(slot) + rng.randrange(128), rng)
    again = DiskTier(tmpdir_path, 32 * CH, CH, NS)
    again.index.check()
    assert len(again) <= 24 - 8
    assert sum(check_reads(again, keys) for keys in chains) == len(again)
    again.close()


def test_truncated_slab_files_are_misses(tmpdir_path):
    tier, chains = _filled_tier(tmpdir_path)
    geo = tier.slab.geometry
    for p in tmpdir_path.glob("slab-*.kvt"):
        os.truncate(p, geo.header_area + 3 * geo.stride + 100)  # mid-payload of slot 3
    got = sum(check_reads(tier, keys) for keys in chains)
    assert got < 24 and tier.slab.io_errors >= 1
    # The tier keeps working: new stores extend the files again.
    fresh = chain(4, salt=9)
    assert tier.put(fresh, payload(fresh)) == 4
    assert check_reads(tier, fresh) == 4
    tier.close()
    again = DiskTier(tmpdir_path, 32 * CH, CH, NS)
    again.index.check()
    assert check_reads(again, fresh) == 4
    for keys in chains:
        check_reads(again, keys)
    again.close()


def test_directory_removed_under_a_running_tier(tmpdir_path, caplog):
    tier, chains = _filled_tier(tmpdir_path)
    shutil.rmtree(tmpdir_path)
    assert check_reads(tier, chains[0]) == 0
    fresh = chain(3, salt=8)
    assert tier.put(fresh, payload(fresh)) == 0
    assert tier.slab.unavailable and "removed while in use" in caplog.text
    tier.index.check()
    tier.close()
    # A new tier starts afresh in a recreated directory.
    again = DiskTier(tmpdir_path, 32 * CH, CH, NS)
    assert again.restored == 0 and again.put(fresh, payload(fresh)) == 3
    again.close()


def test_second_owner_is_refused(tmpdir_path):
    tier = DiskTier(tmpdir_path, 8 * CH, CH, NS)
    with pytest.raises(TierUnavailable, match=str(tmpdir_path)):
        DiskTier(tmpdir_path, 8 * CH, CH, NS)
    with pytest.raises(TierUnavailable, match="already open in this process"):
        DiskSlab(tmpdir_path, 8, CH, OTHER_NS)
    # Header readers need no lock.
    assert DiskSlab.scan(tmpdir_path, NS, CH) == []
    tier.close()
    DiskTier(tmpdir_path, 8 * CH, CH, NS).close()


WRITER = r"""
import hashlib, sys, torch
from kvtier.keys import chunk_keys
from kvtier.tools.slot_tier import DiskTier
path, ns, ch = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3])
tier = DiskTier(path, 48 * ch, ch, ns, threads=2, file_bytes=16 * ch)
def payload(keys):
    return torch.stack([torch.frombuffer(bytearray(hashlib.shake_128(k).digest(ch)),
                                         dtype=torch.uint8) for k in keys])
chains = [chunk_keys(list(range(i * 1000, i * 1000 + 32)), 4, b"writer") for i in range(40)]
datas = [payload(keys) for keys in chains]
tier.put(chains[0], datas[0])
print("ready", flush=True)
i = 0
while True:
    i = (i + 1) % 40
    tier.put(chains[i], datas[i])
"""


def test_killed_writer_leaves_no_wrong_bytes(tmpdir_path):
    ch = 16384
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmpdir_path), NS.hex(), str(ch)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = proc.stdout.readline()
        assert line.strip() == b"ready", proc.stderr.read().decode()
        # While it runs, the directory is its own: a second process is refused.
        with pytest.raises(TierUnavailable, match=f"pid {proc.pid}"):
            DiskTier(tmpdir_path, 48 * ch, ch, NS)
        time.sleep(0.4)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # Every slot whose header validates, restorable or not, reads back exactly what the
    # writer meant for its key, or fails.
    records = DiskSlab.scan(tmpdir_path, NS, ch)
    assert records
    tier = DiskTier(tmpdir_path, 48 * ch, ch, NS)  # the dead writer's lock is gone
    good = 0
    for r in records:
        out = torch.zeros(ch, dtype=torch.uint8)
        if tier.slab.read([r.slot], [r.key], [[(0, out)]]) == [True]:
            assert torch.equal(out, payload([r.key], ch)[0]), "a slot validated with wrong bytes"
            good += 1
    print(
        f"\nkilled writer: {len(records)} valid headers, {good} verified, restored {tier.restored}"
    )
    assert good >= len(records) - 2 * 8  # at most the chunks of two puts were in flight
    tier.index.check()
    chains = [chunk_keys(list(range(i * 1000, i * 1000 + 32)), 4, b"writer") for i in range(40)]
    assert sum(check_reads(tier, keys, ch) for keys in chains) > 0
    tier.close()


FULL_DISK = r"""
import hashlib, json, resource, signal, sys, torch
from kvtier.keys import chunk_keys
from kvtier.tools.slot_tier import DiskTier
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a signal
path, ns, ch = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3])
# Files: one 4 KiB header area, then 32 slots. Writes past slot 16 (+ a bit) fail.
resource.setrlimit(resource.RLIMIT_FSIZE, (4096 + 16 * ch + 5000, resource.RLIM_INFINITY))
tier = DiskTier(path, 32 * ch, ch, ns, file_bytes=32 * ch)
def payload(keys):
    return torch.stack([torch.frombuffer(bytearray(hashlib.shake_128(k).digest(ch)),
                                         dtype=torch.uint8) for k in keys])
def read(keys):
    out = torch.zeros(len(keys), ch, dtype=torch.uint8)
    n = tier.get(keys, out)
    assert torch.equal(out[:n], payload(keys[:n]))
    return n
a = chunk_keys(list(range(64)), 4, b"a")
b = chunk_keys(list(range(1000, 1032)), 4, b"b")
res = {"put_a": tier.put(a, payload(a)), "put_b": tier.put(b, payload(b))}
res["errors_b"] = tier.slab.io_errors
res["read_a"] = read(a)
tier.delete([a[8]])
res["put_b_again"] = tier.put(b, payload(b))
res["read_b"] = read(b)
tier.close()
tier = DiskTier(path, 32 * ch, ch, ns, file_bytes=32 * ch)
res["restored"] = tier.restored
res["read_b_restart"] = read(b)
print(json.dumps(res))
"""


def test_full_disk_fails_stores_per_chunk(tmpdir_path):
    ch = 16384
    out = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmpdir_path), NS.hex(), str(ch)],
        capture_output=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    res = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert res["put_a"] == 16  # slots 0..15 fit under the limit
    assert res["put_b"] == 0 and res["errors_b"] == 8  # every chunk of b failed, no exception
    assert res["read_a"] == 16
    assert res["put_b_again"] == 8  # in the slots the delete freed
    assert res["read_b"] == 8
    assert res["restored"] == 16 and res["read_b_restart"] == 8


# -- scans ------------------------------------------------------------------------------------


@pytest.mark.parametrize("timed", TIMED)
def test_scan_speed_few_thousand_slots(tmpdir_path, timed):
    n_slots, ch = 4096, 4096
    tier = DiskTier(tmpdir_path, n_slots * ch, ch, NS)
    zeros = torch.zeros(16, ch, dtype=torch.uint8)
    for s in range(n_slots // 16):
        assert tier.put(chain(16, salt=s), zeros) == 16
    tier.close()
    t0 = time.perf_counter()
    records = DiskSlab.scan(tmpdir_path, NS, ch)
    t_scan = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = DiskTier(tmpdir_path, n_slots * ch, ch, NS)
    t_open = time.perf_counter() - t0
    assert len(records) == again.restored == n_slots
    assert gc.isenabled(), "bulk loads pause the GC, then restore it"
    again.close()
    print(
        f"\nscan of {n_slots} slots: {t_scan * 1e3:.1f} ms; open + restore: {t_open * 1e3:.1f} ms"
    )
    assert not timed or (t_scan < 2.0 and t_open < 5.0)


def write_sparse_tier(path, slot_bytes, num_slots, chain_len=16):
    """A full tier of valid headers over sparse (never written) payloads."""
    geo = SlabGeometry.for_slot_bytes(slot_bytes)
    path.mkdir(parents=True, exist_ok=True)
    (path / "kvtier.super").write_bytes(geo.encode())
    seq = 0
    for fi in range(geo.num_files(num_slots)):
        count = geo.file_slots(fi, num_slots)
        area = bytearray()
        for j in range(count):
            slot = fi * geo.slots_per_file + j
            key = slot.to_bytes(16, "little")
            parent = (slot - 1).to_bytes(16, "little") if slot % chain_len else None
            seq += 1
            area += pack_header(key, parent, NS, seq, slot_bytes, 0)
        with open(path / slab_file_name(fi), "wb") as f:
            f.write(area)
            f.truncate(geo.file_size(count))
    return geo


@pytest.mark.parametrize("timed", TIMED)
def test_scan_speed_sparse_10gib_tier(tmpdir_path, timed):
    slot_bytes, num_slots = 1 << 20, 10 * 1024  # 10 GiB of 1 MiB slots
    write_sparse_tier(tmpdir_path, slot_bytes, num_slots)
    t0 = time.perf_counter()
    records = DiskSlab.scan(tmpdir_path, NS, slot_bytes)
    t_scan = time.perf_counter() - t0
    t0 = time.perf_counter()
    tier = DiskTier(tmpdir_path, num_slots * slot_bytes, slot_bytes, NS)
    t_open = time.perf_counter() - t0
    assert len(records) == tier.restored == num_slots
    tier.index.check()
    tier.close()
    print(
        f"\n10 GiB sparse tier ({num_slots} x 1 MiB): scan {t_scan * 1e3:.1f} ms, "
        f"open + restore {t_open * 1e3:.1f} ms"
    )
    assert not timed or (t_scan < 2.0 and t_open < 10.0)


def test_inspect_dir_reports_namespaces(tmpdir_path):
    keys = chain(5)
    tier = DiskTier(tmpdir_path, 16 * CH, CH, NS)
    tier.put(keys, payload(keys))
    tier.close()
    with DiskSlab(tmpdir_path, 16, CH, OTHER_NS) as slab:
        slab.write(
            [10, 11], keys[:2], [[(0, d)] for d in payload(keys[:2])], parents=[None, keys[0]]
        )
    info = inspect_dir(tmpdir_path)
    json.dumps(info)  # JSON-friendly
    assert info["error"] is None and info["valid_chunks"] == 7
    rows = {row["namespace"]: row for row in info["namespaces"]}
    assert rows[NS.hex()]["chunks"] == rows[NS.hex()]["restorable"] == 5
    assert rows[OTHER_NS.hex()]["chunks"] == 2
    assert rows[NS.hex()]["oldest_seq"] == 1 and rows[OTHER_NS.hex()]["newest_seq"] == 7
    assert rows[NS.hex()]["payload_bytes"] == 5 * CH
    text = format_inspect(info)
    assert NS.hex() in text and OTHER_NS.hex() in text
    assert "not a directory" in format_inspect(inspect_dir(tmpdir_path / "nope"))


# -- random operation sequences ---------------------------------------------------------------

BASE = chain(6, salt=5)
CHAINS = [BASE, chain(6, salt=5, prefix=list(range(500_000, 500_008)) + [1] * 4), chain(5, salt=6)]
SMALL = 512

_op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, 2), st.integers(0, 4), st.integers(1, 6)),
    st.tuples(st.just("get"), st.integers(0, 2)),
    st.tuples(st.just("delete"), st.integers(0, 2), st.integers(0, 4)),
    st.tuples(st.just("reopen")),
)


@settings(max_examples=100, deadline=None)
@given(ops=st.lists(_op, min_size=1, max_size=20))
def test_random_operations_never_return_wrong_bytes(ops):
    assert CHAINS[0][:2] == CHAINS[1][:2]
    d = Path(tempfile.mkdtemp(prefix="kvtier-prop-"))

    def open_tier():
        return DiskTier(d, 8 * SMALL, SMALL, NS, threads=2, file_bytes=3 * 4096)

    tier = open_tier()
    try:
        for op in ops:
            if op[0] == "put":
                keys = CHAINS[op[1]][op[2] : op[2] + op[3]]
                parent = CHAINS[op[1]][op[2] - 1] if op[2] else None
                stored = tier.put(keys, payload(keys, SMALL), parent=parent)
                assert 0 <= stored <= len(keys)
            elif op[0] == "get":
                keys = CHAINS[op[1]]
                present = tier.prefix_len(keys)
                assert check_reads(tier, keys, SMALL) == present
            elif op[0] == "delete":
                keys = CHAINS[op[1]]
                tier.delete([keys[op[2]]])
                assert tier.prefix_len(keys) <= op[2]
            else:
                before = set(tier.index.ready_keys())
                tier.close()
                tier = open_tier()
                assert before <= set(tier.index.ready_keys()), "a stored chunk was lost"
            tier.index.check()
        for keys in CHAINS:
            assert check_reads(tier, keys, SMALL) == tier.prefix_len(keys)
    finally:
        tier.close()
        shutil.rmtree(d, ignore_errors=True)


def test_previous_format_directories_are_never_misread(tmpdir_path, caplog):
    """Slots of the previous format (version 1 envelopes: 16-byte keys at other offsets)
    never validate, even with their checksums right; a version-1 superblock makes the tier
    reformat the directory."""
    import struct

    import xxhash

    from kvtier.tiers.disk.format import SUPER_NAME
    from kvtier.tiers.envelope import HEADER_BYTES, SUMMED_BYTES

    keys = chain(6)
    tier = DiskTier(tmpdir_path, 8 * CH, CH, NS)
    assert tier.put(keys, payload(keys)) == 6
    tier.close()
    path = tmpdir_path / slab_file_name(0)
    with open(path, "r+b") as f:  # every written header says version 1, checksum right
        for slot in range(6):
            f.seek(slot * HEADER_BYTES)
            head = bytearray(f.read(HEADER_BYTES))
            head[4:6] = struct.pack("<H", 1)
            head[SUMMED_BYTES:] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(head[:-8])))
            f.seek(slot * HEADER_BYTES)
            f.write(head)
    again = DiskTier(tmpdir_path, 8 * CH, CH, NS)
    assert again.restored == 0 and again.prefix_len(keys) == 0
    again.close()
    sb = bytearray((tmpdir_path / SUPER_NAME).read_bytes())
    sb[8:12] = struct.pack("<I", 1)
    sb[-8:] = struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(sb[:-8])))
    (tmpdir_path / SUPER_NAME).write_bytes(bytes(sb))
    assert read_superblock(tmpdir_path) is None
    fresh = DiskTier(tmpdir_path, 8 * CH, CH, NS)
    assert fresh.restored == 0 and "reformatting" in caplog.text
    assert read_superblock(tmpdir_path) is not None
    fresh.close()
