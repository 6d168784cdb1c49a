"""The doorkeeper: a full tier stores a chain's new chunks once a second request asked for
them, refusing from the chain's first first-sighted chunk; history bounded in generations;
sampled keys for large tiers. And the reuse bound it is measured against."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.keys import chunk_keys
from kvtier.policies import make_eviction_policy
from kvtier.policies.doorkeeper import Doorkeeper, DoorkeeperLRUPolicy
from kvtier.policies.shadow import ShadowCache
from kvtier.tools.bench.workloads import DEFAULT_TRACE
from kvtier.tools.sim.bounds import next_uses, replay_lru_oracle, replay_lru_reuse
from kvtier.tools.sim.simulator import replay_index
from kvtier.tools.sim.trace import load_trace


def chain(*parts: int) -> list[bytes]:
    """One key per token of ``parts`` (chunks of one token), chained: equal prefixes, equal
    keys."""
    return chunk_keys(list(parts), 1, b"door")


def test_first_sightings_are_refused_until_another_request_asks():
    door = Doorkeeper(100)
    a = chain(1, 2, 3, 4)
    door.observe(a, 0)
    assert door.admitted(a) == 0  # only this request asked
    b = chain(1, 2, 9)  # another request walks over a's first two chunks
    door.observe(b, 0)
    assert door.admitted(a) == 2  # a's tail 3, 4 still seen once
    assert door.admitted(a[2:]) == 0
    assert door.admitted(b) == 2  # b's own 9 is a first sighting
    door.observe(a, 1)  # a again, holding its first chunk: the rest seen twice now
    assert door.admitted(a) == 4 and door.admitted(a[1:]) == 3


def test_a_request_asking_again_gets_the_same_answer():
    door = Doorkeeper(100)
    a = chain(5, 6, 7)
    door.observe(a, 0)
    assert [door.admitted(a[1:]) for _ in range(3)] == [0, 0, 0]


def test_history_is_bounded_by_generations():
    door = Doorkeeper(4, history=2)  # generations of 4 keys
    assert door.limit == 4
    for i in range(50):
        door.observe(chain(100 + i, 1, 2), 0)
    # A generation overflows by one request before it becomes the older one.
    assert all(n <= door.limit + 3 for n in door.remembered())
    # Forgotten long ago: a first sighting again.
    old = chain(100, 1, 2)
    door.observe(old, 0)
    assert door.admitted(old) == 0


def test_sampled_doorkeeper_remembers_a_share_of_the_keys():
    door = Doorkeeper(1000, stride=8)
    keys = chain(*range(4000))
    door.observe(keys, 0)
    seen, seen_old, _, _ = door.remembered()
    remembered = seen + seen_old
    assert 300 < remembered < 700  # about one in 8
    assert door.admitted(keys) < 40  # refused from (about) its first sampled key
    door.observe(keys, 0)
    assert door.admitted(keys) == len(keys)


def test_lru_doorkeeper_stores_everything_while_there_is_room():
    pol = DoorkeeperLRUPolicy(10)
    shadow = ShadowCache(pol, admission=True)
    shadow.request(chain(1, 2, 3))
    assert len(shadow) == 3  # room: stored at the first sighting
    shadow.request(chain(4, 5, 6, 7, 8, 9, 10, 11))
    assert len(shadow) == 3  # full: a first sighting is refused, nothing evicted
    shadow.request(chain(4, 5, 6, 7, 8, 9, 10, 11))
    assert len(shadow) == 10 and shadow.request(chain(4, 5, 6, 7, 8, 9, 10, 11)) == 8


# Random walks over a small tree: the doorkeeper's answers match a brute-force count of
# which requests saw each key (unbounded history).
walks = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=8), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(walks)
def test_doorkeeper_matches_a_count_of_sightings(paths):
    door = Doorkeeper(10_000)
    seen_by: dict[bytes, int] = {}
    for path in paths:
        keys = chain(*path)
        door.observe(keys, 0)
        for k in keys:
            seen_by[k] = seen_by.get(k, 0) + 1
        want = next((i for i, k in enumerate(keys) if seen_by[k] == 1), len(keys))
        assert door.admitted(keys) == want


def test_reuse_bound_sits_between_lru_and_the_oracle():
    trace = load_trace(DEFAULT_TRACE, limit=600)
    future = next_uses(trace)
    for slots in (150, 900):
        lru = replay_index(trace, [slots], "lru").hit_tokens[0]
        reuse = replay_lru_reuse(trace, slots, future).hit_tokens[0]
        oracle = replay_lru_oracle(trace, slots, future).hit_tokens[0]
        assert lru <= reuse <= oracle


def test_lru_doorkeeper_is_a_registered_policy():
    assert isinstance(make_eviction_policy("lru-doorkeeper", 8), DoorkeeperLRUPolicy)


def test_large_tiers_get_a_sampled_doorkeeper():
    from kvtier.policies.doorkeeper import EXACT_SLOTS

    strides = []
    for slots in (EXACT_SLOTS, 10 * EXACT_SLOTS):
        pol = DoorkeeperLRUPolicy(slots)
        assert pol.door is None  # no history until a single tier asks what to store
        pol.admit_chain(chain(1, 2))
        assert pol.door is not None
        strides.append(pol.door.stride)
    assert strides == [1, 10]
