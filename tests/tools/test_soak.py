"""The CI soak: about 100 requests of mixed traffic on a real vLLM engine with the CPU and
disk tiers while faults are injected at random (failed and slow copies, disk read/write
errors, corrupted and truncated slab files, a full filesystem) and a shared redis tier
whose server is killed, restarted empty and hung, against an oracle engine without
kvtier. Runs in the default suite (marker ``soak``, not ``slow``) for a model with one
KV-cache group and for one with two; the full soak is ``kvtier soak`` (1,000+ requests).
"""

from __future__ import annotations

import json

import pytest

from kvtier.tools.soak.run import SoakOptions, run_soak

pytestmark = [pytest.mark.vllm, pytest.mark.soak]


CPU_BYTES = {"smollm2": 32 << 20, "gemma3": 1 << 20}
DISK_FAULT_INTERVAL = {"smollm2": 1.5, "gemma3": 0.1}
REQUESTS = {"smollm2": 100, "gemma3": 800}
"""The tiny Gemma 3 serves 100 requests in well under a second on a quiet machine: it gets more of
them, and faults on the disk tier's files come faster, so that several land during its
rounds."""
"""A CPU tier of a few dozen chunks at most (SmolLM2's ~1.4 MiB, the tiny Gemma 3's ~85
KiB), so that recurring prefixes fall out of it."""


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_short_soak_runs_clean(tmp_path, model):
    """``smollm2``: one KV-cache group (failed loads reported per block); ``gemma3``: a
    tiny Gemma 3 with sliding-window and global groups (failed loads reported per
    request, every hit async)."""
    opts = SoakOptions(
        requests=REQUESTS[model],
        model=model,
        seed=1,
        out=str(tmp_path),
        progress=False,
        # A small CPU tier, so that recurring prefixes fall out of it and come back from
        # disk; disk faults at a pace that lands a few during the rounds (faster ones
        # destroy most of what the disk tier holds in a run this short, and with it the
        # disk hits).
        cpu_bytes=CPU_BYTES[model],
        disk_fault_interval=DISK_FAULT_INTERVAL[model],
        remote_fault_interval=2.0,
        # Nothing here checks memory growth: the step-size warm-up would only add ~70 s.
        step_warmup=False,
    )
    report = run_soak(opts)
    s = report["summary"]
    assert s["requests"] >= 100
    assert s["faults_injected_total"] >= 10, s["faults_injected"]
    # Faults of every kind the soak promises were injected.
    for kind in ("cpu_read_error", "cpu_write_error", "disk_read_error", "disk_write_error"):
        assert kind in s["faults_injected"]
    assert (
        s["faults_injected"].get("disk_corrupt", 0) + s["faults_injected"].get("disk_truncate", 0)
        > 0
    )
    assert sum(v for k, v in s["faults_injected"].items() if k.startswith("remote_")) >= 3
    assert s["wrong_outputs"] == 0, report["problems"]
    assert s["failed_requests"] == 0 and s["crashes"] == 0
    assert s["leaked_slots"] == 0 and s["leaked_pins"] == 0 and s["leaked_jobs"] == 0
    assert not s["index_errors"]
    assert s["hit_tokens"].get("host", 0) > 0 and s["hit_tokens"].get("disk", 0) > 0
    assert report["aborted"] > 0
    if model == "smollm2":  # the tiny Gemma 3's engine preempts only now and then
        assert report["preemptions"] > 0
    assert json.loads((tmp_path / "soak.json").read_text())["summary"] == s
