"""``kvtier purge`` on a real redis-server and real disk tier directories: two tenants of one
model (two ranks each) are written to both tiers, one is purged, exactly its chunks go and
the other's still load; a dry run removes nothing and reports the count; keys that are not
kvtier's are never touched."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import pytest
import redis
import torch

from kvtier.keys import Namespace, chunk_keys
from kvtier.stack.states import state_key
from kvtier.tiers.disk.format import LOCK_NAME, SUPER_NAME
from kvtier.tiers.disk.slab import DiskSlab
from kvtier.tiers.remote import KeySpace, RemoteClient, RemoteStore, parse_remote_url
from kvtier.tiers.remote.keyspace import PREFIX
from kvtier.tools.cli import main
from kvtier.tools.purge import target_of
from kvtier.tools.purge.remote import purge_remote
from kvtier.tools.redis_server import RedisServer
from tests.support.redis_fixtures import flush, server  # noqa: F401  (fixture)

SLOT = 8192
N = 6  # chunks per tenant and rank; SCAN_COUNT is forced small below, so several batches
WORLD = 2
A = Namespace("org/model-a@", "layout-1", "tp2pp1", "tenant-1")
B = Namespace("org/model-a@", "layout-1", "tp2pp1", "tenant-2")
A_ARGS = ["--model", "org/model-a", "--layout", "layout-1", "--parallel", "tp2pp1"]
FOREIGN = [b"other:key", PREFIX + b"not-a-chunk", KeySpace(A).prefix + b"junk}:0"]


def _labels(ns: Namespace) -> str:
    """The ``<tenant>:<model>`` labels of ``ns``'s remote names (what ``--list`` shows)."""
    return KeySpace(ns).prefix[len(PREFIX) : -2].decode()


def _keys(ns: Namespace) -> list[bytes]:
    return chunk_keys(list(range(4 * N)), 4, ns.seed())


def _data(ns: Namespace, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash((ns.extra, rank)) % 1000)
    return torch.randint(0, 256, (N, SLOT), dtype=torch.uint8, generator=g)


def _segs(t: torch.Tensor) -> list[list[tuple[int, torch.Tensor]]]:
    return [[(0, row)] for row in t]


def _store(url: str, ns: Namespace, rank: int) -> RemoteStore:
    client = RemoteClient(parse_remote_url(url), timeout_s=5)
    return RemoteStore(client, KeySpace(ns), SLOT, ns.for_rank(rank).digest(), rank)


def _remote_reads(url: str, ns: Namespace) -> list[bool]:
    got: list[bool] = []
    for r in range(WORLD):
        store = _store(url, ns, r)
        try:
            out = torch.zeros(N, SLOT, dtype=torch.uint8)
            ok = store.read([-1] * N, _keys(ns), _segs(out))
            got += [o and torch.equal(out[i], _data(ns, r)[i]) for i, o in enumerate(ok)]
        finally:
            store.close()
    return got


def _slots(ns: Namespace) -> list[int]:
    return list(range(N)) if ns is A else list(range(N, 2 * N))


def _disk_reads(root: Path, ns: Namespace) -> list[bool]:
    """Each rank's chunks of ``ns`` as a fresh engine finds them: restored, then read."""
    got: list[bool] = []
    for r in range(WORLD):
        with DiskSlab(root / f"tp2-rank{r}", 2 * N, SLOT, ns.for_rank(r).digest(), 1) as slab:
            found = {rec.key for rec in slab.records}
            out = torch.zeros(N, SLOT, dtype=torch.uint8)
            ok = slab.read(_slots(ns), _keys(ns), _segs(out))
            got += [
                k in found and o and torch.equal(out[i], _data(ns, r)[i])
                for i, (k, o) in enumerate(zip(_keys(ns), ok, strict=True))
            ]
    return got


def _fill(url: str, root: Path) -> redis.Redis:
    flush(url)
    raw = redis.Redis.from_url(url)
    for ns in (A, B):
        keys = _keys(ns)
        for r in range(WORLD):
            store = _store(url, ns, r)
            try:
                assert (
                    store.write([-1] * N, keys, _segs(_data(ns, r)), [None, *keys[:-1]])
                    == [True] * N
                )
            finally:
                store.close()
            d = root / f"tp2-rank{r}"
            with DiskSlab(d, 2 * N, SLOT, ns.for_rank(r).digest(), 1) as slab:
                assert all(slab.write(_slots(ns), keys, _segs(_data(ns, r)), [None, *keys[:-1]]))
    for k in FOREIGN:
        raw.set(k, b"keep me")
    assert raw.dbsize() == 2 * N * WORLD + len(FOREIGN)
    return raw


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME
    }


@pytest.fixture
def small_scans(monkeypatch):
    from kvtier.tools.purge import remote as purge

    monkeypatch.setattr(purge, "SCAN_COUNT", 5)  # several SCAN batches per purge


def test_purge_one_tenant_removes_exactly_its_chunks(server, tmp_path, capsys, small_scans):  # noqa: F811
    root = tmp_path / "disk"
    raw = _fill(server.url, root)
    before, files = raw.dbsize(), _files(root)
    tenant = [*A_ARGS, "--namespace", "tenant-1"]
    where = ["--remote", server.url, "--disk", str(root)]

    assert main(["purge", *where, *tenant, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count(f"would remove {N * WORLD} chunks") == 2, out
    assert raw.dbsize() == before and _files(root) == files
    assert all(_remote_reads(server.url, A)) and all(_disk_reads(root, A))

    assert main(["purge", *where, *tenant]) == 0
    out = capsys.readouterr().out
    assert out.count(f"removed {N * WORLD} chunks") == 2, out
    assert "1 other keys under the prefix left alone" in out
    assert _remote_reads(server.url, A) == [False] * (N * WORLD)
    assert _disk_reads(root, A) == [False] * (N * WORLD)
    assert all(_remote_reads(server.url, B)) and all(_disk_reads(root, B))
    assert raw.dbsize() == before - N * WORLD
    assert all(raw.get(k) == b"keep me" for k in FOREIGN)
    # The purged chunks' bytes are gone from the files, not just unlisted.
    for r in range(WORLD):
        blob = (root / f"tp2-rank{r}" / "slab-00000.kvt").read_bytes()
        assert _data(A, r)[0].numpy().tobytes() not in blob
        assert _data(B, r)[0].numpy().tobytes() in blob

    # Again: nothing left to remove.
    assert main(["purge", *where, *tenant]) == 0
    assert capsys.readouterr().out.count("removed 0 chunks") == 2

    # --all: every kvtier chunk goes, everything else stays.
    assert main(["purge", *where, "--all", "--dry-run"]) == 0
    assert capsys.readouterr().out.count(f"would remove {N * WORLD} chunks") == 2
    assert main(["purge", *where, "--all"]) == 0
    assert sorted(raw.keys()) == sorted(FOREIGN)
    assert sorted(os.listdir(root)) == []  # rank directories emptied of kvtier's files, removed
    raw.close()


def test_list_and_digest(server, tmp_path, capsys):  # noqa: F811
    root = tmp_path / "disk"
    raw = _fill(server.url, root)
    assert main(["purge", "--remote", server.url, "--disk", str(root), "--list"]) == 0
    out = capsys.readouterr().out
    assert f"--digest {_labels(A)}  {N * WORLD} chunks" in out
    assert f"--digest {A.for_rank(1).digest().hex()}  {N} chunks" in out
    # Remote labels purge that tenant's model; a rank digest that rank's disk chunks.
    assert main(["purge", "--remote", server.url, "--digest", _labels(B)]) == 0
    assert _remote_reads(server.url, B) == [False] * (N * WORLD)
    assert all(_remote_reads(server.url, A))
    disk = ["--disk", str(root), "--digest", B.for_rank(1).digest().hex()]
    assert main(["purge", *disk]) == 0
    assert _disk_reads(root, B) == [True] * N + [False] * N
    assert all(_disk_reads(root, A))
    raw.close()


def test_a_directory_in_use_is_refused_and_bad_selections_are_one_line(tmp_path, capsys):
    root = tmp_path / "disk"
    with DiskSlab(root, 4, SLOT, A.digest(), 1):
        assert main(["purge", "--disk", str(root), "--all"]) == 2
        err = capsys.readouterr().err
        assert str(root) in err and "stop the engine using it first" in err
    assert (root / SUPER_NAME).exists()
    for args, needle in [
        (["--disk", str(root), "--model", "m"], "--model and --layout together"),
        (["--disk", str(root), "--namespace", "t"], "a disk tier is selected by"),
        (["--disk", str(root)], "exactly one of"),
        (["--disk", str(root), "--all", "--digest", "00"], "exactly one of"),
        (["--disk", str(root), "--digest", "zz"], "not hex"),
        (["--disk", str(root), "--digest", "00"], "32 hex digits"),
        (["--disk", str(root), *A_ARGS[:4], "--parallel", "two"], "tpNppM"),
        (["--all"], "--remote URL and/or --disk PATH"),
        (["--disk", str(tmp_path / "nope"), "--all"], "not a directory"),
    ]:
        assert main(["purge", *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, (args, err)


@pytest.mark.parametrize("ns", [A, Namespace("m@rev 1", "l", "tp1pp1", ""), B])
def test_the_logged_selector_names_the_namespace(ns):
    """What the engine logs at start (``Namespace.purge_selector``) selects its namespace."""
    args = shlex.split(ns.purge_selector())
    opts = dict(zip(args[::2], args[1::2], strict=True))
    target = target_of(
        False,
        opts["--model"],
        opts.get("--revision", ""),
        opts["--layout"],
        opts["--parallel"],
        opts.get("--namespace", ""),
        None,
    )
    assert target.namespace is not None
    assert target.namespace.chain_digest() == ns.chain_digest()


def test_purge_remote_scans_in_batches(server):  # noqa: F811
    """SCAN batches of COUNT names, each one UNLINK; the count is exact across batches."""
    flush(server.url)
    raw = redis.Redis.from_url(server.url)
    store = _store(server.url, A, 0)
    try:
        keys = chunk_keys(list(range(4 * 40)), 4, A.seed())
        data = torch.zeros(40, SLOT, dtype=torch.uint8)
        assert all(store.write([-1] * 40, keys, _segs(data)))
    finally:
        store.close()
    target = target_of(True, None, "", None, "tp1pp1", "", None)
    seen: list[int] = []
    assert purge_remote(raw, target, dry_run=True, scan_count=7).chunks == 40
    got = purge_remote(raw, target, scan_count=7, progress=seen.append)
    assert got.chunks == 40 and raw.dbsize() == 0
    assert len(seen) >= 40 // 7 and seen[-1] == 40
    raw.close()


def test_a_tenant_alone_is_purged_from_a_remote_store(server, tmp_path):  # noqa: F811
    """``--namespace`` without ``--model``: every model of that tenant, on the remote store."""
    raw = _fill(server.url, tmp_path / "disk")
    assert main(["purge", "--remote", server.url, "--namespace", B.extra]) == 0
    assert _remote_reads(server.url, B) == [False] * (N * WORLD)
    assert all(_remote_reads(server.url, A))
    raw.close()


def test_purge_disk_covers_hybrid_states(tmp_path, capsys):
    """A hybrid model's disk tier keeps its recurrent states in ``states/`` (own slab
    files, same namespaces): a purge of one tenant removes its states there too."""
    root = tmp_path / "disk"
    for sub in (root, root / "states"):
        for ns in (A, B):
            keys = _keys(ns)
            for r in range(WORLD):
                with DiskSlab(sub / f"tp2-rank{r}", 2 * N, SLOT, ns.for_rank(r).digest(), 1) as s:
                    assert all(s.write(_slots(ns), keys, _segs(_data(ns, r)), [None] * N))
    assert main(["purge", "--disk", str(root), *A_ARGS, "--namespace", "tenant-1"]) == 0
    for sub in (root, root / "states"):
        assert not any(_disk_reads(sub, A)), sub
        assert all(_disk_reads(sub, B)), sub


STATE = 3 * SLOT + 40
"""Bytes of one recurrent state: its own slot size, unlike the attention chunks'."""


def _state_stores(url: str, root: Path, ns: Namespace, rank: int) -> dict[str, Any]:
    """The state tiers' stores of one rank, as a hybrid engine's worker builds them
    (:func:`kvtier.stack.states.split_specs`): ``root/states`` on disk, the Redis server."""
    from kvtier.config import KVTierConfig
    from kvtier.contract.kind import TierContext
    from kvtier.stack.build import build_stores
    from kvtier.stack.states import split_specs

    config = KVTierConfig.from_dict(
        {
            "tiers": [
                {"kind": "disk", "path": str(root), "capacity": 8 * N * STATE},
                {"kind": "redis", "url": url, "timeout_ms": 5000},
            ],
            "state_share": 0.5,
        }
    )
    _, specs = split_specs(config)
    return build_stores(config, TierContext(STATE, ns.for_rank(rank), world=WORLD), specs)


def _state_keys(ns: Namespace) -> list[bytes]:
    return [state_key(k) for k in _keys(ns)]


def _state_data(ns: Namespace, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash((ns.extra, rank, "state")) % 1000)
    return torch.randint(0, 256, (N, STATE), dtype=torch.uint8, generator=g)


def _state_io(url: str, root: Path, write: bool) -> dict[tuple[str, str], list[bool]]:
    """Write (or read back) every rank's states of both tenants in both tiers; per
    (tenant, tier), which states came back intact."""
    got: dict[tuple[str, str], list[bool]] = {}
    for ns in (A, B):
        slots = _slots(ns)
        for r in range(WORLD):
            stores = _state_stores(url, root, ns, r)
            try:
                for name, store in stores.items():
                    addr = slots if name == "disk" else [-1] * N
                    want = _state_data(ns, r)
                    if write:
                        out = want
                        ok = store.write(addr, _state_keys(ns), _segs(out), [None] * N)
                    else:
                        out = torch.zeros(N, STATE, dtype=torch.uint8)
                        ok = store.read(addr, _state_keys(ns), _segs(out))
                    got.setdefault((ns.extra, name), []).extend(
                        bool(o) and torch.equal(out[i], want[i]) for i, o in enumerate(ok)
                    )
            finally:
                for store in stores.values():
                    store.close()
    return got


@pytest.mark.parametrize("selection", ["namespace", "all"])
def test_purge_removes_hybrid_states_from_disk_and_redis(server, tmp_path, selection):  # noqa: F811
    """A hybrid model's recurrent states, written by the state tiers' own stores (a slot
    size of their own, the ``states`` subdirectory, the same namespaces and Redis names as
    the attention chunks): ``--namespace`` removes exactly one tenant's from both tiers,
    ``--all`` every one."""
    flush(server.url)
    root = tmp_path / "disk"
    written = _state_io(server.url, root, write=True)
    assert all(all(v) for v in written.values()) and len(written) == 4, written
    assert (root / "states" / f"tp{WORLD}-rank0").is_dir()
    sel = [*A_ARGS, "--namespace", A.extra] if selection == "namespace" else ["--all"]
    assert main(["purge", "--disk", str(root), *sel]) == 0
    assert main(["purge", "--remote", server.url, *sel]) == 0
    got = _state_io(server.url, root, write=False)
    for (tenant, tier), ok in got.items():
        gone = selection == "all" or tenant == A.extra
        assert ok == [not gone] * (N * WORLD), (tenant, tier, ok)


def test_purge_reaches_a_mutual_tls_server_with_an_acl_user_and_a_password_file(tmp_path):
    """Issue 45, finding 4: the recommended deployment (docs/security.md section 3: TLS with
    a private CA and client certificates, the kvtier ACL user, the password in a 0600 file)
    is purged by ``kvtier purge`` run as its own process with the tier's own options; on
    main it had no such options and failed with a certificate error. A tenant given
    without the secret that keys its names matched nothing: said on stderr, with why."""
    import subprocess
    import sys

    from kvtier.config import KVTierConfig
    from kvtier.tiers.remote.kind import client_for, secret_for
    from kvtier.tools.tls_certs import make_certs
    from tests.support.remote_stores import ACL_PASSWORD, acl_line

    certs = make_certs(tmp_path / "tls")
    pw = tmp_path / "kvtier-redis"
    pw.write_text(ACL_PASSWORD + "\n")
    pw.chmod(0o600)
    secret = tmp_path / "values"
    secret.write_text("v" * 64 + "\n")
    secret.chmod(0o600)
    with RedisServer(tls=certs, acl=[acl_line()]) as s:
        url = s.url.replace("://", "://kvtier:@", 1)
        tls = {"ssl_ca": str(certs.ca), "ssl_cert": str(certs.client_cert)}
        tls["ssl_key"] = str(certs.client_key)
        entry = {"kind": "redis", "url": url, "password_file": str(pw), **tls}
        spec = KVTierConfig.from_dict(
            {"tiers": [{"kind": "cpu"}, {**entry, "secret_file": str(secret)}]}
        ).tiers[1]
        ns = Namespace("org/model-a@", "layout-1", "tp1pp1", "tenant-x")
        store = RemoteStore(client_for(spec), KeySpace(ns, secret_for(spec)), SLOT, ns.digest())
        try:
            keys = chunk_keys(list(range(4 * 3)), 4, ns.seed())
            assert store.write([-1] * 3, keys, _segs(torch.zeros(3, SLOT, dtype=torch.uint8)))
        finally:
            store.close()
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in tls.items()]
        flags += ["--password-file", str(pw)]

        def purge(*args: str) -> subprocess.CompletedProcess[str]:
            cmd = [sys.executable, "-m", "kvtier.tools.cli", "purge", "--remote", url, *args]
            env = {k: v for k, v in os.environ.items() if not k.startswith("KVTIER_REDIS")}
            return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)

        # The tenant's names are keyed by the tier's secret: without it, nothing matches.
        got = purge(*flags, "--namespace", "tenant-x")
        assert got.returncode == 0, got.stderr
        assert "removed 0 chunks" in got.stdout
        assert "no chunk matched" in got.stderr and "--secret-file" in got.stderr
        got = purge(*flags, "--namespace", "tenant-x", "--secret-file", str(secret))
        assert got.returncode == 0 and "removed 3 chunks" in got.stdout, got.stderr
        assert "no chunk matched" not in got.stderr
        # Without the client certificate the server refuses: one line, no password shown.
        got = purge("--ssl-ca", str(certs.ca), "--password-file", str(pw), "--all")
        assert got.returncode == 2 and ACL_PASSWORD not in got.stderr + got.stdout
        # A bad option is one config error line naming the flag.
        got = purge(*flags[:1], "--all")
        assert got.returncode == 2 and "ssl_cert" not in got.stdout
        assert ACL_PASSWORD not in got.stderr + got.stdout
