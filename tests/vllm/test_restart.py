"""Restart under load: kill -9 an engine mid-workload, start a new one on the same disk tier.

A real vLLM engine (CPU backend, SmolLM2) with a write-through disk tier serves a
workload; once some requests are done (stores and disk copies in flight), the process is
killed with SIGKILL. While it lived, a second opener of its directory was refused; once it
is dead, the directory's lock is taken over. A new engine on the same directory serves the
whole workload again: chunks the dead one wrote are disk hits, and every greedy output is
token-identical to an engine without kvtier (nothing torn or corrupt is ever served).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kvtier.errors import TierUnavailable
from kvtier.tiers.disk.format import LOCK_NAME, read_superblock
from kvtier.tiers.disk.slab import DiskSlab
from kvtier.tools.soak.run import cpu_binding

pytestmark = pytest.mark.vllm

ENGINE = {
    "dtype": "float32",
    "num_gpu_blocks_override": 40,
    "max_model_len": 1248,
    "max_num_batched_tokens": 512,
}
DISK_BYTES = 256 << 20


def workload() -> list[dict[str, Any]]:
    from kvtier.tools.bench.prompts import chat_turn, document_text
    from kvtier.tools.bench.text import question
    from kvtier.tools.models import smollm2_path

    model = smollm2_path()
    docs = [document_text(model, 300 + d, 200) for d in range(6)]
    return [
        {
            "id": f"d{d}q{q}",
            "prompt": chat_turn(model, f"{docs[d]}\n\n{question(40 + 7 * d + q)}"),
            "max_tokens": 4,
        }
        for q in range(4)
        for d in range(6)
    ]


def spec(connector: dict[str, Any] | None, reqs: list[dict[str, Any]]) -> dict[str, Any]:
    program = [{"op": "serve", "name": "w", "requests": reqs, "max_concurrency": 2}]
    return {"engine": ENGINE, "connector": connector, "program": program}


def start(tmp: Path, name: str, s: dict[str, Any]) -> tuple[subprocess.Popen[bytes], Path, Path]:
    spec_path, out_path, prog = tmp / f"{name}.json", tmp / f"{name}.out.json", tmp / f"{name}.n"
    spec_path.write_text(json.dumps(s))
    env = dict(os.environ, **cpu_binding(), KVTIER_PROGRESS=str(prog))
    log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 (the child holds it)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtier.vllm.harness.runner", str(spec_path), str(out_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    return proc, out_path, prog


def finish(proc: subprocess.Popen[bytes], out_path: Path, tmp: Path, name: str) -> dict[str, Any]:
    assert proc.wait(timeout=900) == 0, (tmp / f"{name}.log").read_text()[-3000:]
    result: dict[str, Any] = json.loads(out_path.read_text())
    return result


def finished(prog: Path) -> int:
    try:
        return int(prog.read_text() or 0)
    except (OSError, ValueError):
        return 0


def open_slab(rank_dir: Path) -> DiskSlab:
    """Open the directory as a second owner would (same geometry, another namespace, so
    nothing in it changes even when the lock is free)."""
    geo = read_superblock(rank_dir)
    assert geo is not None
    return DiskSlab(rank_dir, DISK_BYTES // geo.slot_bytes, geo.slot_bytes, b"x" * 16, 1)


def test_sigkill_mid_workload_then_restart_on_the_same_disk(tmp_path):
    reqs = workload()
    proc, out, _ = start(tmp_path, "oracle", spec(None, reqs))
    oracle = finish(proc, out, tmp_path, "oracle")
    want = {r["id"]: r["output"] for r in oracle["ops"][0]["requests"]}

    disk = tmp_path / "disk"
    cfg = {"cpu_bytes": "64MiB", "disk_path": str(disk), "disk_bytes": DISK_BYTES}
    first, _, prog = start(tmp_path, "first", spec(cfg, reqs))
    deadline = time.monotonic() + 600
    while finished(prog) < 8 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
    rank_dir = disk / "tp1-rank0"
    # A live owner: a second opener is refused, and told who owns the directory.
    with pytest.raises(TierUnavailable, match=f"pid {first.pid}"):
        open_slab(rank_dir)
    os.kill(first.pid, signal.SIGKILL)
    assert first.wait(timeout=60) == -signal.SIGKILL
    done_before_kill = finished(prog)
    assert done_before_kill < len(reqs), "the kill must land mid-workload"

    # The owner is dead: its lock is free, whatever pid its lock file still names.
    assert (rank_dir / LOCK_NAME).read_text().strip() == str(first.pid)
    open_slab(rank_dir).close()

    second, out, _ = start(tmp_path, "second", spec(cfg, reqs))
    result = finish(second, out, tmp_path, "second")
    got = {r["id"]: r for r in result["ops"][0]["requests"]}
    assert {rid: r["output"] for rid, r in got.items()} == want
    disk_hits = {rid: r.get("hit_sources", {}).get("disk", 0) for rid, r in got.items()}
    # What the killed engine stored is served from disk by the new one.
    assert sum(disk_hits.values()) > 0, disk_hits
    served = [rid for rid, n in disk_hits.items() if n > 0]
    assert any(rid in want for rid in served)
