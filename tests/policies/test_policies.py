from kvtier.policies import ARCPolicy, LRUPolicy, SeenCountAdmission, make_admission_policy


def test_lru_order():
    p = LRUPolicy(3)
    for k in (b"a", b"b", b"c"):
        p.insert(k)
    p.touch(b"a")
    assert list(p.candidates()) == [b"b", b"c", b"a"]
    p.remove(b"c")
    assert list(p.candidates()) == [b"b", b"a"] and len(p) == 2


def test_arc_prefers_recency_list_and_learns_from_ghosts():
    p = ARCPolicy(2)
    p.insert(b"a")
    p.insert(b"b")
    p.touch(b"a")  # recency only: still T1
    assert b"a" in p.t1
    p.observe([b"a"], 1)  # another request uses a -> T2 (frequent)
    assert b"a" in p.t2
    assert list(p.candidates())[0] == b"b"  # T1 first while it exceeds p=0
    p.remove(b"b", evicted=True)  # b becomes a ghost in B1
    assert b"b" in p.b1
    p.insert(b"b")  # ghost hit in B1: grow T1's target, b goes to T2
    assert p.p > 0 and b"b" in p.t2
    assert len(p) == 2


def test_seen_count_admission():
    adm = SeenCountAdmission(2, max_tracked=2)
    assert not adm.admit(b"x")
    adm.observe([b"x"])
    assert not adm.admit(b"x")
    adm.observe([b"x", b"y", b"z"])  # bounded: x is the oldest and drops out
    assert adm.admit(b"z") is False and adm.admit(b"x") is False
    adm.observe([b"z"])
    assert adm.admit(b"z")
    assert make_admission_policy(1).admit(b"anything")


def test_admit_run_follows_a_subclass_that_overrides_admit_alone():
    """A policy that only overrides ``admit`` (the runner's refuse-all, a plugin's) must
    not be bypassed by the run path the store planner uses."""
    from kvtier.policies.admission import AdmissionPolicy

    class EveryOther(AdmissionPolicy):
        def admit(self, key: bytes) -> bool:
            return key[0] % 2 == 0

    keys = [bytes([i]) for i in (0, 2, 4, 5, 6)]
    assert EveryOther().admit_run(keys) == 3
    assert EveryOther().admit_run(keys[:3]) == 3
    assert AdmissionPolicy().admit_run(keys) == 5
