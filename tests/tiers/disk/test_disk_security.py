"""The disk tier's directory against another local user (real files, as root here): links
planted at kvtier's names are never followed, a directory or file others could write (or
another user owns) is refused with a message naming it and the fix, and what kvtier creates
is private (0700 directories, 0600 files)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvtier.errors import TierUnavailable
from kvtier.keys import KEY_BYTES, Namespace, chunk_keys
from kvtier.tiers.disk.format import LOCK_NAME, SUPER_NAME, slab_file_name
from kvtier.tiers.disk.private import UnsafeDirectory
from kvtier.tiers.disk.slab import DiskSlab

SLOT = 8192
NS = Namespace("security-test", "layout").digest()
NOBODY = 65534
VICTIM = b"the victim's own bytes\n" * 100


def _keys(n: int) -> list[bytes]:
    return chunk_keys(list(range(4 * n)), 4, Namespace("security-test", "layout").seed())


def _write_and_read(slab: DiskSlab, n: int = 2) -> bool:
    keys = _keys(n)
    data = torch.arange(n * SLOT, dtype=torch.int64).to(torch.uint8).reshape(n, SLOT)
    ok = slab.write(list(range(n)), keys, [[(0, data[i])] for i in range(n)], [None, *keys[:-1]])
    out = torch.zeros_like(data)
    back = slab.read(list(range(n)), keys, [[(0, out[i])] for i in range(n)])
    return all(ok) and all(back) and torch.equal(out, data)


def _formatted(path: Path) -> None:
    with DiskSlab(path, 4, SLOT, NS, 1) as slab:
        assert _write_and_read(slab)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim.txt"
    v.write_bytes(VICTIM)
    return v


def test_created_directories_are_0700_and_files_0600(tmp_path):
    root = tmp_path / "a" / "b" / "disk"
    _formatted(root)
    for d in (tmp_path / "a", tmp_path / "a" / "b", root):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    names = sorted(os.listdir(root))
    assert names == sorted([LOCK_NAME, SUPER_NAME, slab_file_name(0)])
    for n in names:
        assert stat.S_IMODE((root / n).stat().st_mode) == 0o600, n
    # A restart finds the chunks again: the hardening changed no format.
    with DiskSlab(root, 4, SLOT, NS, 1) as slab:
        assert len(slab.records) == 2


@pytest.mark.parametrize("name", [slab_file_name(0), LOCK_NAME, SUPER_NAME])
def test_a_link_planted_at_a_file_name_is_refused_and_its_target_untouched(tmp_path, victim, name):
    root = tmp_path / "disk"
    _formatted(root)
    os.unlink(root / name)
    os.symlink(victim, root / name)
    with pytest.raises(UnsafeDirectory, match="symbolic link") as err:
        DiskSlab(root, 4, SLOT, NS, 1)
    assert str(root / name) in str(err.value) and "remove" in str(err.value)
    assert victim.read_bytes() == VICTIM
    # The scheduler's read-only scan refuses it too (nothing restored, nothing followed).
    if name != LOCK_NAME:
        assert DiskSlab.scan(root, NS, SLOT, 4) == []
    assert victim.read_bytes() == VICTIM


def test_a_link_at_the_superblocks_temporary_name_is_removed_not_followed(tmp_path, victim):
    root = tmp_path / "disk"
    root.mkdir(mode=0o700)
    os.symlink(victim, root / (SUPER_NAME + ".tmp"))
    os.symlink(tmp_path / "dangling", root / slab_file_name(0))  # stale, unformatted dir
    _formatted(root)
    assert victim.read_bytes() == VICTIM
    assert not (tmp_path / "dangling").exists()
    assert not (root / slab_file_name(0)).is_symlink()


def test_a_directory_that_is_a_link_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "disk").symlink_to(real)
    with pytest.raises(UnsafeDirectory, match="symbolic link"):
        DiskSlab(tmp_path / "disk", 4, SLOT, NS, 1)
    assert os.listdir(real) == []


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_directory_others_can_write_is_refused(tmp_path, mode):
    root = tmp_path / "disk"
    root.mkdir()
    os.chmod(root, mode)
    with pytest.raises(UnsafeDirectory, match=f"mode {mode:04o}") as err:
        DiskSlab(root, 4, SLOT, NS, 1)
    assert f"chmod 700 {root}" in str(err.value)
    assert os.listdir(root) == []  # nothing created in it
    assert DiskSlab.scan(root, NS, SLOT, 4) == []


def test_a_directory_of_ours_others_can_only_read_is_tightened(tmp_path, caplog):
    root = tmp_path / "disk"
    _formatted(root)
    os.chmod(root, 0o755)  # as kvtier before this check left its directories
    # The scheduler's read-only scan uses it as it is (nobody else could write into it).
    assert len(DiskSlab.scan(root, NS, SLOT, 4)) == 2
    assert stat.S_IMODE(root.stat().st_mode) == 0o755
    with DiskSlab(root, 4, SLOT, NS, 1) as slab:
        assert len(slab.records) == 2  # its chunks are kept
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert "now 0700" in caplog.text
    assert len(DiskSlab.scan(root, NS, SLOT, 4)) == 2


def test_a_directory_owned_by_another_user_is_refused(tmp_path):
    root = tmp_path / "disk"
    root.mkdir(mode=0o700)
    os.chown(root, NOBODY, NOBODY)
    with pytest.raises(UnsafeDirectory, match=f"owned by uid {NOBODY}") as err:
        DiskSlab(root, 4, SLOT, NS, 1)
    assert str(root) in str(err.value)
    assert os.listdir(root) == []


@pytest.mark.parametrize("name", [slab_file_name(0), SUPER_NAME, LOCK_NAME])
@pytest.mark.parametrize("how", ["chown", "chmod"])
def test_a_file_another_user_owns_or_can_write_is_refused(tmp_path, name, how):
    root = tmp_path / "disk"
    _formatted(root)
    before = (root / name).read_bytes()
    if how == "chown":
        os.chown(root / name, NOBODY, NOBODY)
        want = f"owned by uid {NOBODY}"
    else:
        os.chmod(root / name, 0o666)
        want = "mode 0666"
    with pytest.raises(UnsafeDirectory, match=want) as err:
        DiskSlab(root, 4, SLOT, NS, 1)
    assert str(root / name) in str(err.value)
    assert (root / name).read_bytes() == before  # refused before any write
    # Removed, as the message says, the directory is usable again.
    os.unlink(root / name)
    with DiskSlab(root, 4, SLOT, NS, 1) as slab:
        assert _write_and_read(slab)


def test_unsafe_directories_are_tier_unavailable(tmp_path):
    """An engine treats a refused directory like any unusable one (TierUnavailable)."""
    assert issubclass(UnsafeDirectory, TierUnavailable)
    assert len(_keys(1)[0]) == KEY_BYTES


# -- issue 45: hard links, FIFOs, the tools, a mistyped disk_path ----------------------------


@pytest.mark.parametrize("name", [slab_file_name(0), SUPER_NAME, LOCK_NAME])
def test_a_hard_link_at_a_file_name_is_refused_and_the_other_name_untouched(tmp_path, name):
    """Finding 6: a file with a second name elsewhere (``st_nlink > 1``) shares its bytes
    with that name: writing a slab would change the other file. Refused, nothing written."""
    root = tmp_path / "disk"
    _formatted(root)
    other = tmp_path / "elsewhere"
    os.link(root / name, other)
    before = other.read_bytes()
    with pytest.raises(UnsafeDirectory, match="2 hard links") as err:
        DiskSlab(root, 4, SLOT, NS, 1)
    assert str(root / name) in str(err.value)
    assert other.read_bytes() == before
    if name != LOCK_NAME:
        assert DiskSlab.scan(root, NS, SLOT, 4) == []


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "kvtier.tools.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from kvtier.tools.cli import main

    rc = main(args)
    got = capsys.readouterr()
    return rc, got.out + got.err


TOOLS = {
    "inspect": lambda root: ["inspect", str(root)],
    "purge": lambda root: ["purge", "--disk", str(root), "--all"],
    "purge-dry": lambda root: ["purge", "--disk", str(root), "--all", "--dry-run"],
}


def test_a_fifo_at_a_file_name_hangs_no_tool(tmp_path):
    """Finding 6: a FIFO named kvtier.lock hung ``kvtier inspect`` forever on main (it
    opened the FIFO, waiting for a writer). Real processes, each under a timeout: a FIFO at
    the lock or superblock name is refused (or, for a dry run, never opened)."""
    for name in (LOCK_NAME, SUPER_NAME):
        root = tmp_path / name / "disk"
        _formatted(root)
        os.unlink(root / name)
        os.mkfifo(root / name, 0o600)
        for tool in ("inspect", "purge"):
            got = _cli(*TOOLS[tool](root))  # a hang raises TimeoutExpired
            out = got.stdout + got.stderr
            assert got.returncode == (0 if tool == "inspect" else 2), out
            assert "not a regular file" in out and str(root / name) in out
            assert stat.S_ISFIFO(os.lstat(root / name).st_mode)


@pytest.mark.parametrize("tool", list(TOOLS))
@pytest.mark.parametrize("plant", ["symlink", "hardlink", "chown"])
def test_the_tools_open_files_as_the_tier_does(tmp_path, victim, capsys, tool, plant):
    """Finding 6: ``kvtier inspect`` and ``kvtier purge --disk`` follow no link and refuse a
    file of another user or with a second name, as the tier does (on main they followed
    links and checked no owner); the planted target is never changed."""
    root = tmp_path / "disk"
    _formatted(root)
    if plant == "symlink":
        os.unlink(root / slab_file_name(0))
        os.symlink(victim, root / slab_file_name(0))
        want = "symbolic link"
    elif plant == "hardlink":
        os.link(root / slab_file_name(0), tmp_path / "second-name")
        want = "hard links"
    else:
        os.chown(root / SUPER_NAME, NOBODY, NOBODY)
        want = f"owned by uid {NOBODY}"
    rc, out = _run(TOOLS[tool](root), capsys)
    assert rc == (0 if tool == "inspect" else 2), out
    assert want in out and str(root) in out and "valid chunks" not in out
    assert victim.read_bytes() == VICTIM


def test_the_tools_refuse_a_linked_or_foreign_directory(tmp_path, capsys):
    """The directory itself: a link to a tier directory, or one another user owns."""
    root = tmp_path / "disk"
    _formatted(root)
    link = tmp_path / "link"
    os.symlink(root, link)
    for tool in TOOLS:
        _, out = _run(TOOLS[tool](link), capsys)
        assert "symbolic link" in out, (tool, out)
    os.chown(root, NOBODY, NOBODY)
    for tool in TOOLS:
        _rc, out = _run(TOOLS[tool](root), capsys)
        assert f"owned by uid {NOBODY}" in out, (tool, out)
    assert sorted(os.listdir(root)) == sorted([LOCK_NAME, SUPER_NAME, slab_file_name(0)])


@pytest.mark.parametrize("mode", [0o755, 0o700])
def test_a_directory_holding_someone_elses_files_is_neither_tightened_nor_used(tmp_path, mode):
    """Finding 9: a mistyped disk_path (a 0755 directory holding another program's
    notes.txt) was chmod-ed to 0700 and got slab files beside notes.txt. Now: one line
    naming the path and the foreign entry; mode, entries and bytes unchanged."""
    root = tmp_path / "srv"
    root.mkdir()
    (root / "notes.txt").write_bytes(VICTIM)
    (root / "sub").mkdir()
    os.chmod(root, mode)
    with pytest.raises(UnsafeDirectory) as err:
        DiskSlab(root, 4, SLOT, NS, 1)
    msg = str(err.value)
    assert "\n" not in msg and str(root) in msg and "'notes.txt'" in msg and "1 more" in msg
    assert stat.S_IMODE(root.stat().st_mode) == mode
    assert sorted(os.listdir(root)) == ["notes.txt", "sub"]
    assert (root / "notes.txt").read_bytes() == VICTIM


def test_a_directory_of_kvtiers_own_files_or_empty_is_used(tmp_path):
    """Empty, or nothing but kvtier's names (slabs, superblock, its temporary, the lock,
    per-rank subdirectories): used as before, tightened when others could list it."""
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    os.chmod(empty, 0o755)
    with DiskSlab(empty, 4, SLOT, NS, 1) as slab:
        assert _write_and_read(slab)
    assert stat.S_IMODE(empty.stat().st_mode) == 0o700
    root = tmp_path / "disk"
    _formatted(root)
    (root / "tp2-rank0").mkdir(mode=0o700)
    (root / (SUPER_NAME + ".tmp")).write_bytes(b"")
    with DiskSlab(root, 4, SLOT, NS, 1) as slab:
        assert len(slab.records) == 2
