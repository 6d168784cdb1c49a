from hypothesis import given
from hypothesis import strategies as st

from kvtier.sources import HitRun, HitSource, chunk_runs, hit_sources

H, D, P, U = HitSource.HOST, HitSource.DISK, HitSource.P2P, HitSource.EXTERNAL_UNSPECIFIED


def oracle(group_runs, start, end):
    """Naive per-token reference: each token takes the outermost source covering it."""
    out = {}
    for t in range(start, end):
        covering = [r.source for runs in group_runs for r in runs if r.start <= t < r.end]
        src = max(covering) if covering else U
        out[src] = out.get(src, 0) + 1
    return out


def test_vllm_range_boundaries_example():
    # vLLM's test case: (10,20,p2p),(6,10,disk),(0,8,host),(4,12,host), start 4, 12 tokens.
    runs = [HitRun(10, 20, P), HitRun(6, 10, D), HitRun(0, 8, H), HitRun(4, 12, H)]
    assert hit_sources([runs], 4, 16) == {H: 2, D: 4, P: 6}


def test_edges():
    assert hit_sources([[HitRun(0, 10, H)]], 5, 5) == {}
    assert hit_sources([[]], 0, 12) == {U: 12}
    assert hit_sources([], 0, 3) == {U: 3}
    assert hit_sources([[HitRun(0, 4, H)], [HitRun(2, 8, D)]], 0, 10) == {H: 2, D: 6, U: 2}


def test_recurrent_group_covers_whole_prefix():
    attn = [HitRun(0, 64, H), HitRun(64, 128, D)]
    mamba = [HitRun(0, 128, H)]
    assert hit_sources([attn, mamba], 0, 128) == {H: 64, D: 64}


def test_chunk_runs_merges():
    assert chunk_runs([H, H, D, D, H], 16) == [
        HitRun(0, 32, H),
        HitRun(32, 64, D),
        HitRun(64, 80, H),
    ]
    assert chunk_runs([H, H], 16, start_chunk=1, limit=40) == [HitRun(16, 40, H)]


run_st = st.builds(
    lambda a, n, s: HitRun(a, a + n, s),
    st.integers(0, 200),
    st.integers(0, 60),
    st.sampled_from(list(HitSource)),
)


@given(st.lists(st.lists(run_st, max_size=8), max_size=4), st.integers(0, 150), st.integers(0, 150))
def test_matches_per_token_oracle(group_runs, a, n):
    start, end = a, a + n
    got = hit_sources(group_runs, start, end)
    assert got == oracle(group_runs, start, end)
    assert sum(got.values()) == max(0, end - start)
    assert all(v > 0 for v in got.values())


@given(
    st.lists(
        st.tuples(st.integers(1, 64), st.lists(st.sampled_from([H, D, P]), max_size=12)), max_size=3
    ),
    st.integers(0, 100),
    st.integers(0, 400),
)
def test_groups_with_different_chunk_sizes(groups, a, n):
    group_runs = [chunk_runs(srcs, chunk) for chunk, srcs in groups]
    assert hit_sources(group_runs, a, a + n) == oracle(group_runs, a, a + n)
