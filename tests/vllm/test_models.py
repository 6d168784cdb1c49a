"""Model coverage: tiny random models of each attention layout, with and without kvtier.

Each architecture is a checkpoint written by :mod:`kvtier.tools.tiny_models` from its
transformers config class (real random weights at a scale where outputs depend on the
whole prompt; see that module for why not ``load_format="dummy"``). Every engine runs the
same program: round 1 serves four prompts (kvtier stores them), the engine's prefix cache
is reset (eviction alone would keep sliding-window prompts resident), round 2 serves them
again, so with kvtier its KV must come back from kvtier. Greedy outputs must equal the
no-connector run token for token, and the baseline itself must show that the outputs
depend on more than the last tokens (prompts 0 and 1 share their last 16 tokens), or the
comparison would pass with wrong KV.

Hybrid recurrent-state models (Mamba / linear attention next to attention): Qwen3-Next
(prefix caching on, vLLM's Mamba "align" mode) gets its recurrent states stored and its
round 2 served from kvtier like the rest (tests/vllm/test_hybrid.py checks the exact
boundaries); the Mamba2 hybrids, which run on this backend only with prefix caching off
(Mamba cache mode "none": no boundary states), start with offload off: kvtier must
neither claim a hit nor store a chunk for them, every request counts as unkeyable
("recurrent-state"), and the outputs must still equal the no-connector run.

All engines of a test run in one subprocess (:mod:`kvtier.vllm.harness.model_matrix`), one
after another: one torch/vLLM import for all. The default run covers Gemma 3 (sliding and
full groups with vLLM's hybrid KV-cache manager on), gpt-oss (sliding window with
attention sinks), Qwen3-Next (gated delta net, prefix caching on: vLLM's Mamba "align"
mode) and the refusals on this backend of MLA and of gpt-oss with HMA off (for which vLLM
alone gives wrong, run-to-run different tokens). Dense attention is covered by
tests/vllm/test_vllm.py with SmolLM2; the rest of the matrix (dense layouts, Granite 4.0-H and
Falcon-H1 with prefix caching off) is ``slow``. Tensor parallel 2 has its own pair of
engines (two worker processes each).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.support.model_runs import (
    BUILD,
    CONNECTOR,
    ENGINE,
    ENGINE_FOR,
    PROGRAM,
    outputs,
    phase,
    run_specs,
)

pytestmark = pytest.mark.vllm

DEFAULT = ("gemma3", "gpt_oss")
SLOW = ("llama", "qwen3", "mqa", "mistral_swa")
HYBRID = ("qwen3_next",)
"""Hybrid recurrent-state models of the default run: Qwen3-Next runs with prefix caching
on (vLLM's Mamba "align" mode): its recurrent states are offloaded and round 2 hits. The
Mamba2 hybrids can run on this backend only with prefix caching off, where kvtier runs
with offload off (no boundary states to store), so they are ``slow``."""
SLOW_HYBRID = ("granite_hybrid", "falcon_h1")


class Refusal(NamedTuple):
    model: str
    """The checkpoint (an architecture of :mod:`kvtier.tools.tiny_models`)."""
    engine: dict[str, Any]
    """Engine settings on top of ENGINE and the architecture's own."""
    needle: str
    """What the ``kvtier:`` line must name."""


REFUSED = {
    # gpt-oss with HMA off gives wrong, run-to-run different tokens on vLLM's CPU backend
    # with or without kvtier; the same checkpoint with HMA on is served (DEFAULT).
    "gpt_oss_hma_off": Refusal(
        "gpt_oss",
        {"disable_hybrid_kv_cache_manager": True},
        "sliding window with attention sinks and HMA off",
    ),
    # vLLM's CPU MLA cannot prefill over cached KV (vLLM itself turns prefix caching off
    # for it there): with kvtier's hits it gave wrong tokens, so kvtier refuses it on CPU.
    # Last: it runs in bf16 (ENGINE_FOR), and an fp32 MoE engine started after a bf16 one
    # in the same process was seen to take vLLM's bf16-only AMX kernels on CPUs with AMX.
    "deepseek_v2_mla": Refusal("deepseek_v2_mla", {}, "MLA on vLLM's CPU backend"),
}
"""Runs kvtier must refuse at engine start, by run name."""
MULTI_GROUP = {"gemma3", "gpt_oss", *HYBRID, *SLOW_HYBRID}
"""Architectures that must run with several KV-cache groups (HMA on)."""


HYBRID_PROGRAM = [*PROGRAM, phase("r3")]
"""Hybrids: round 3 (no reset) is served from vLLM's own prefix cache where it is on."""


def run_matrix(tmp: Path, archs: tuple[str, ...], refused: tuple[str, ...] = ()) -> dict[str, Any]:
    """Build the checkpoints, run baseline + kvtier per arch (and kvtier alone for the
    REFUSED runs named, last) in one subprocess; results keyed "arch/base", "arch/kvtier"
    and "name/kvtier"."""
    models = dict.fromkeys([*archs, *(REFUSED[name].model for name in refused)])
    build = [sys.executable, "-c", BUILD, str(tmp), *models]
    subprocess.run(build, check=True, capture_output=True, timeout=600)
    runs, keys = [], []
    for arch in archs:
        for conn in (None, CONNECTOR):
            runs.append(
                {
                    "model": str(tmp / arch),
                    "engine": ENGINE | ENGINE_FOR.get(arch, {}),
                    "connector": conn,
                    "inspect": conn is not None,
                    "program": HYBRID_PROGRAM if arch in HYBRID + SLOW_HYBRID else PROGRAM,
                }
            )
            keys.append(f"{arch}/{'kvtier' if conn else 'base'}")
    for name in refused:
        r = REFUSED[name]
        engine = ENGINE | ENGINE_FOR.get(r.model, {}) | r.engine
        runs.append(
            {
                "model": str(tmp / r.model),
                "engine": engine,
                "connector": CONNECTOR,
                "program": PROGRAM,
            }
        )
        keys.append(f"{name}/kvtier")
    return run_specs(tmp, dict(zip(keys, runs, strict=True)))


def check_served(results: dict[str, Any], arch: str) -> None:
    base, kv = results[f"{arch}/base"], results[f"{arch}/kvtier"]
    b, k = outputs(base), outputs(kv)
    assert b[0] == b[1], f"{arch}: the baseline itself is not deterministic"
    assert b[0][0] != b[0][1], f"{arch}: outputs do not depend on the prompt beyond its tail"
    assert k == b, f"{arch}: kvtier's outputs differ from no connector"
    groups = kv["kvtier"]["kv_groups"]
    assert (groups > 1) == (arch in MULTI_GROUP), (arch, groups)
    if arch in SLOW_HYBRID:
        check_offload_off(results, arch)
        return
    if arch in HYBRID:
        # Round 2 resumes every prompt at its one state boundary below its end (96 tokens,
        # the block size), from kvtier or, for prompt 2 (prompt 0's first 96 tokens),
        # from what kvtier loaded for prompt 0 into the engine's own cache.
        round2 = kv["ops"][1]["requests"]
        assert all(r["num_cached"] == 96 for r in round2), [r["num_cached"] for r in round2]
        hits = [sum(r["hit_sources"].values()) for r in round2]
        assert hits[0] == hits[1] == hits[3] == 96, hits
        return
    for r in kv["ops"][1]["requests"]:  # round 2: every prompt came back from kvtier
        assert sum(r["hit_sources"].values()) >= 64, (arch, r["id"], r["hit_sources"])
    assert kv["kvtier"]["failed_reads"] == 0


def check_offload_off(results: dict[str, Any], arch: str) -> None:
    """A hybrid recurrent-state model with prefix caching off (Mamba cache mode "none"):
    kvtier started, claimed no hit and stored nothing (there is no boundary state to
    store, and a hit would lack it), counted every request as unkeyable, and said so in
    one ``kvtier:`` line."""
    kv = results[f"{arch}/kvtier"]["kvtier"]
    assert kv["layout"].count("mamba") == 1 and "full" in kv["layout"], kv["layout"]
    for op in results[f"{arch}/kvtier"]["ops"]:
        for r in op["requests"]:
            assert sum(r["hit_sources"].values()) == 0, (arch, r["id"], r["hit_sources"])
    assert set(kv["tier_chunks"].values()) == {0}, kv["tier_chunks"]
    values = kv["metrics"]["values"]
    served = 4 * sum(op["op"] == "serve" for op in HYBRID_PROGRAM)
    assert values["unkeyable_requests"] == [[["recurrent-state"], served]], values
    # vLLM's own prefix cache (Mamba "align" mode) serves round 3 as without kvtier.
    cached = [
        [r["num_cached"] for r in results[f"{arch}/{w}"]["ops"][2]["requests"]]
        for w in ("base", "kvtier")
    ]
    assert cached[0] == cached[1], cached
    prefix_caching = ENGINE_FOR.get(arch, {}).get("enable_prefix_caching", True)
    assert (min(cached[0]) > 0) == prefix_caching, cached
    assert kv["recurrent"].startswith("kvtier: hybrid recurrent-state model")
    assert kv["recurrent"] in results["_stderr"]


@pytest.fixture(scope="module")
def default_matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_matrix(tmp_path_factory.mktemp("models"), DEFAULT + HYBRID, tuple(REFUSED))


@pytest.mark.parametrize("arch", DEFAULT)
def test_token_identical_with_hits(default_matrix, arch):
    check_served(default_matrix, arch)


@pytest.mark.parametrize("arch", HYBRID)
def test_hybrid_recurrent_states_hit_token_identical(default_matrix, arch):
    check_served(default_matrix, arch)


def check_refused(results: dict[str, Any], name: str, needle: str) -> None:
    r = results[f"{name}/kvtier"]
    assert r.get("error_type") == "UnsupportedLayout", r
    assert r["error"].startswith("kvtier: ") and needle in r["error"]
    assert "\n" not in r["error"]
    # The same line is logged (an operator reads logs, not the exception object).
    assert r["error"] in results["_stderr"]


@pytest.mark.parametrize("name", list(REFUSED))
def test_refused_with_one_kvtier_line(default_matrix, name):
    check_refused(default_matrix, name, REFUSED[name].needle)


def test_gpt_oss_refused_with_hma_off_only(default_matrix):
    """gpt-oss is refused only with HMA off: the line says what to do (drop the flag), and
    the same checkpoint with HMA on (the default run's engine, whose tokens
    test_token_identical_with_hits checks) started with its sliding and full groups."""
    off = default_matrix["gpt_oss_hma_off/kvtier"]
    assert "error" in off and "--disable-hybrid-kv-cache-manager" in off["error"]
    on = default_matrix["gpt_oss/kvtier"]
    assert "error" not in on, on.get("error")
    assert on["kvtier"]["kv_groups"] == 2 and "sliding" in on["kvtier"]["layout"], on["kvtier"]


@pytest.mark.slow
def test_slow_matrix_token_identical(tmp_path):
    results = run_matrix(tmp_path, SLOW + SLOW_HYBRID)
    for arch in SLOW + SLOW_HYBRID:
        check_served(results, arch)


def test_tensor_parallel_2_per_rank_tiers_token_identical(tmp_path, all_cores):
    """TP=2 on vLLM's CPU backend (two worker processes, one core each): each rank stores
    its own shard (one KV head of two) in its own disk directory, under its own namespace
    digest; round 2 loads every rank's shard back from its own directory, and the outputs
    equal the TP=2 engine without a connector."""
    from kvtier.tiers.disk.format import read_superblock, scan_headers, slab_file_name
    from kvtier.tools.bench.binding import allowed_cpus

    cpus = allowed_cpus()
    assert len(cpus) >= 2, f"TP=2 needs two cores, this machine allows {cpus}"
    subprocess.run(
        [sys.executable, "-c", BUILD, str(tmp_path), "llama"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    disk = tmp_path / "disk"
    engine = ENGINE | {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
    conn = {
        "tiers": [{"kind": "disk", "path": str(disk), "capacity": "64MiB"}],
        "sync_budget": "1GiB",
    }
    run = {"model": str(tmp_path / "llama"), "engine": engine, "program": PROGRAM}
    runs = {
        "base": run | {"connector": None},
        "kvtier": run | {"connector": conn, "inspect": "scheduler"},
    }
    # vLLM binds each CPU worker's threads; with one NUMA node it needs the list.
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"{cpus[0]}|{cpus[1]}"}
    results = run_specs(tmp_path, runs, env)
    b, k = outputs(results["base"]), outputs(results["kvtier"])
    assert b[0] == b[1] and b[0][0] != b[0][1], "baseline not deterministic or not sensitive"
    assert k == b, "TP=2 with kvtier differs from TP=2 without a connector"
    for r in results["kvtier"]["ops"][1]["requests"]:
        assert r["hit_sources"].get("disk", 0) >= 64, (r["id"], r["hit_sources"])
    digests = results["kvtier"]["kvtier"]["rank_digests"]
    assert len(set(digests)) == 2, digests
    shards = []
    for rank, digest in enumerate(digests):
        d = disk / f"tp2-rank{rank}"
        geo = read_superblock(d)
        assert geo is not None, f"rank {rank} wrote no disk tier"
        headers = scan_headers(d, geo)
        assert {h.namespace.hex() for h in headers} == {digest}, rank
        payloads = {}
        for h in headers:
            with open(d / slab_file_name(h.slot // geo.slots_per_file), "rb") as fh:
                fh.seek(geo.payload_offset(h.slot))
                payloads[h.key] = fh.read(h.length)
        shards.append(payloads)
    # The scheduler keys a chunk once for all ranks; the bytes behind a key are each
    # rank's own shard (different KV heads), so no key holds the same bytes twice.
    assert shards[0].keys() == shards[1].keys() and len(shards[0]) >= 4
    assert all(shards[0][key] != shards[1][key] for key in shards[0])
