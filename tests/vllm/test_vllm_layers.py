"""Layer-wise loading (config ``layer_loads``) on a real vLLM engine (CPU backend).

Sync loads copied layer by layer while the forward runs must give the same greedy tokens
as no connector at all; a deliberately slow copy of one layer (its rows hold garbage until
the copy ends) shows that no attention reads a layer before its copy is whole.
"""

from __future__ import annotations

import pytest

from tests.support.vllm_runs import (  # the same engine, prompts and runner as test_vllm
    assert_clean,
    metric,
    num_cached,
    outputs,
    run,
)

pytestmark = pytest.mark.vllm

CPU = {"cpu_bytes": "512MiB", "sync_budget": "1GiB"}


@pytest.mark.xdist_group("vllm-hits")
def test_layer_wise_sync_hits_are_exact(tmp_path, baseline):
    whole = run(tmp_path, {**CPU, "layer_loads": "off"})
    r = run(tmp_path, {**CPU, "layer_loads": "on"})
    assert outputs(r) == outputs(baseline) == outputs(whole)
    assert r["kvtier"]["layered_steps"] >= 1 and whole["kvtier"]["layered_steps"] == 0
    assert metric(r, "loads", "cpu", "sync") >= 3
    assert num_cached(r, 1) == num_cached(whole, 1)
    assert metric(r, "failures", "cpu", "load") == 0
    assert_clean(r)


@pytest.mark.xdist_group("vllm-hits")
def test_a_slow_layer_is_never_read_early(tmp_path, baseline):
    # Region 0 is layer 0's K. Each of its row loads first fills the destination rows with
    # garbage, sleeps, then copies: an attention that did not wait for layer 0 would read
    # the garbage, and the outputs would differ from the baseline.
    slow = {"rows": True, "slow_region": 0, "slow_seconds": 0.2}
    r = run(tmp_path, {**CPU, "layer_loads": "on", "fault_injection": slow})
    assert r["kvtier"]["layered_steps"] >= 1 and r["kvtier"]["slow_ops"] >= 2
    assert outputs(r) == outputs(baseline)
    assert metric(r, "failures", "cpu", "load") == 0
    assert_clean(r)


@pytest.mark.xdist_group("vllm-hits")
def test_layer_wise_loads_that_fail_recompute(tmp_path, baseline):
    faults = {"rows": True, "fail_all_reads": True}
    r = run(tmp_path, {**CPU, "layer_loads": "on", "fault_injection": faults})
    assert outputs(r) == outputs(baseline)
    assert r["kvtier"]["layered_steps"] >= 1
    assert metric(r, "failures", "cpu", "load") > 0 and r["kvtier"]["failed_reads"] > 0
    assert_clean(r)
