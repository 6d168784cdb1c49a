"""``benchmarks/gpu_check.py``: its dry run here (the logic of the GPU run, on CPU tensors,
so the GPU run is not its first), and the same checks on CUDA (``gpu`` marker), skipped
where no CUDA device is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_check
from kvtier.worker import WorkerSide

CPU = torch.device("cpu")
NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False on this machine"


def test_the_dry_run_passes_every_check_and_writes_its_report(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert gpu_check.main(["--dry", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["dry"] and report["summary"]["ok"]
    for check in ("round_trip", "grouped", "bandwidth", "disk", "pinning", "layered"):
        assert report[check]["ok"], (check, report[check])
    assert report["round_trip"]["bit_exact"] and report["round_trip"]["plan"] == "segments"
    assert report["disk"]["bit_exact"] and report["grouped"]["bit_exact"]
    assert all(s["bit_exact"] for s in report["bandwidth"]["sizes"])
    fault = report["layered"]["fault"]
    assert fault["layered"] and fault["faults_injected"] > 0
    assert fault["bit_exact_as_read_by_each_layer"]
    assert report["machine"]["torch"] == torch.__version__
    assert "dry_min_load_ratio_ge_256k" in report["summary"]  # never named cuda_ on CPU
    printed = capsys.readouterr().out
    assert "bandwidth (GB/s)" in printed and "checks:" in printed


def test_a_layer_read_before_its_copy_finished_fails_the_check(monkeypatch):
    """The layered check can fail: with ``wait_layer`` waiting for nothing, the forward
    reads the faulty layer while it holds garbage."""
    monkeypatch.setattr(WorkerSide, "wait_layer", lambda self, name: None)
    result = gpu_check.check_layered(gpu_check.DRY, CPU, True, seed=3, overlap=False)
    assert not result["ok"]
    assert not result["fault"]["bit_exact_as_read_by_each_layer"]


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_round_trips_of_random_block_sets_are_bit_exact(seed):
    result = gpu_check.check_round_trip(gpu_check.DRY, CPU, True, seed)
    assert result["ok"] and result["bit_exact"], result


# -- on CUDA: the same checks at the GPU run's sizes ----------------------------------------

CUDA = torch.device("cuda")


@pytest.mark.parametrize(
    "check",
    [
        lambda: gpu_check.check_round_trip(gpu_check.GPU, CUDA, False, 0),
        lambda: gpu_check.check_grouped(gpu_check.GPU, CUDA, False, 0),
        lambda: gpu_check.check_disk(gpu_check.GPU, CUDA, 0),
        lambda: gpu_check.check_pinning(gpu_check.GPU, CUDA, 1 << 30),
        lambda: gpu_check.check_layered(gpu_check.GPU, CUDA, False, 0),
        lambda: gpu_check.check_bandwidth(gpu_check.GPU, CUDA, False, 0),
    ],
    ids=["round_trip", "grouped", "disk", "pinning", "layered", "bandwidth"],
)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_check(check):
    result = check()
    assert result["ok"], result


def test_the_check_runs_without_blake3_redis_cryptography_or_vllm():
    """The GPU machine has PyTorch, NumPy and xxhash, none of these: the check's imports
    and one check run with them made unimportable."""
    code = (
        "import sys\n"
        "for m in ('blake3', 'redis', 'hiredis', 'cryptography', 'vllm'):\n"
        "    sys.modules[m] = None\n"
        f"sys.path.insert(0, {str(Path(gpu_check.__file__).parent)!r})\n"
        "import torch, gpu_check\n"
        "r = gpu_check.check_disk(gpu_check.DRY, torch.device('cpu'), 0)\n"
        "assert r['ok'], r\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
