"""A redis tier's secrets and privileges, on real redis-server processes: passwords never
reach kvtier's errors, logs or reprs, whatever the URL looks like; the env and file forms
authenticate; a password in the config text gets one loud warning naming the safe forms;
a least-privilege ACL user (docs/security.md) stores, probes and loads, and is refused
everything outside its grant."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvtier.config import KVTierConfig
from kvtier.contract.spec import TierSpec
from kvtier.errors import ConfigError
from kvtier.keysecret import read_key_secret
from kvtier.stack.parse import accepted_keys
from kvtier.tiers.memory import MemoryOptions
from kvtier.tiers.remote import keyspace, parse_remote_url
from kvtier.tiers.remote.kind import client_for
from kvtier.tools.redis_server import RedisCluster, RedisServer
from tests.support.redis_fixtures import tier_roundtrip
from tests.support.remote_stores import ACL_PASSWORD, SECRET, acl_line

MISS = ([False, False, False], 0)
ALL = ([True, True, True], 3)


def config(*entries: object) -> KVTierConfig:
    return KVTierConfig.from_dict({"tiers": [{"kind": "cpu"}, *entries]})


def private_file(path: Path, text: str) -> Path:
    """``path`` holding ``text``, mode 0600 (as secret files must be)."""
    path.write_text(text)
    path.chmod(0o600)
    return path


# -- redaction -----------------------------------------------------------------------------

# Marked ends: no fixed message text holds "Zx" or "9Q", so a leak of either end (a
# password cut in two at a comma, a slash, a question mark) is caught, not just the whole.
passwords = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789-_.~!$&'()*+,;=:%?/[]#@"),
    min_size=2,
    max_size=24,
).map(lambda s: f"Zx{s}9Q")


@settings(max_examples=300, deadline=None)
@given(
    pw=passwords,
    scheme=st.sampled_from(["redis", "rediss", "redis+cluster", "http", "redis:", "REDIS"]),
    user=st.sampled_from(["", "alice"]),
    encode=st.booleans(),
    host=st.sampled_from(["h", "", "[::1]", "h:99999", "h:x", "a:1,b:2", "h:1,redis://c:3"]),
    tail=st.sampled_from(["", "/0", "/x", "/3", "?ssl=1", ",h2:bad", ",redis://u:p@z:1/9"]),
)
def test_no_url_puts_its_password_into_an_error_or_repr(pw, scheme, user, encode, host, tail):
    shown = quote(pw, safe="") if encode else pw
    url = f"{scheme}://{user}:{shown}@{host}{tail}"
    assume(pw not in url.replace(shown, "", 1) and shown not in url.replace(shown, "", 1))
    try:
        t = parse_remote_url(url, environ={})
    except ConfigError as e:
        text = str(e)
    else:
        text = f"{t.display} {t!r}"
    try:
        config({"kind": "redis", "url": url})
    except ConfigError as e:
        text += str(e)
    for form in {pw, shown, quote(pw, safe="")}:
        assert form[:4] not in text and form[-4:] not in text, (url, text)


@pytest.mark.parametrize(
    "url", [f"redis://alice:{SECRET}@h:1", f"redis://:{SECRET}@a:1,redis://:{SECRET}@b:2"]
)
def test_a_config_repr_masks_the_url(url):
    cfg = config({"kind": "redis", "url": url, "ttl_s": 5})
    shown = repr(cfg)
    assert SECRET not in shown and "ttl_s=5" in shown and ":***@" in shown
    assert cfg.tiers[1].to_dict()["url"] == url and cfg.to_dict()["tiers"][1]["url"] == url
    odd = TierSpec("memory", options=MemoryOptions(url=f"memory://{SECRET}@x"))
    assert SECRET not in repr(odd) and "***@x" in repr(odd)


def test_config_errors_never_echo_a_tier_entry(caplog):
    url = f"redis://:{SECRET}@h:1"
    for bad in (
        {"tiers": [{"kind": "cpu"}, url]},  # a URL where a mapping belongs
        {"tiers": url},
        {"tiers": [{"kind": "cpu"}, {"kind": "redis", "url": url, "bogus": 1}]},
        {"tiers": [{"kind": "cpu"}, {"kind": "redis", "url": url, "timeout_ms": -1}]},
        {"tiers": [{"kind": "cpu"}, {"kind": "redis", "url": url, "path": "/x"}]},
    ):
        with pytest.raises(ConfigError) as e:
            KVTierConfig.from_dict(bad)
        assert SECRET not in str(e.value)
    assert SECRET not in caplog.text


def test_a_misspelt_key_lists_exactly_the_redis_tiers_keys():
    with pytest.raises(ConfigError) as e:
        config({"kind": "redis", "url": "redis://h", "ssl_cafile": "x"})
    msg = str(e.value)
    assert msg.startswith("tiers[1]: unknown key(s) 'ssl_cafile'; accepted keys for a redis tier")
    listed = set(msg.rsplit(": ", 1)[1].split(", "))
    for key in ("url", "timeout_ms", "ttl_s", "password_env", "password_file", "ssl_ca"):
        assert key in listed
    assert not listed & {"path", "threads", "lookup_delay_ms", "shared"}
    assert listed == set(accepted_keys("redis"))
    with pytest.raises(
        ConfigError, match=r"tiers\[1\]: unknown key\(s\) 'path'; accepted keys for a redis"
    ):
        config({"kind": "redis", "url": "redis://h", "path": "/tmp/x"})


def test_a_password_in_the_url_warns_once_naming_the_safe_forms(caplog):
    caplog.set_level(logging.WARNING, logger="kvtier")
    url = f"redis://:{SECRET}@warn-host:1"
    config({"kind": "redis", "url": url})
    config({"kind": "redis", "url": url})
    warnings = [r for r in caplog.records if "carries a password" in r.getMessage()]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert text.startswith("kvtier: tiers[1].url")
    assert "password_env" in text and "password_file" in text and SECRET not in caplog.text
    caplog.clear()
    config({"kind": "redis", "url": "redis://other-host:1", "password_env": "X"})
    assert "carries a password" not in caplog.text


# -- the safe forms authenticate -----------------------------------------------------------


@pytest.fixture(scope="module")
def locked() -> RedisServer:
    with RedisServer(password=SECRET) as s:
        yield s


def test_password_from_env_or_file_authenticates(locked, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    base = {"kind": "redis", "url": locked.url, "timeout_ms": 3000}
    monkeypatch.delenv("KVTIER_REDIS_PASSWORD", raising=False)
    assert tier_roundtrip(base) == MISS  # NOAUTH: misses, nothing raised
    monkeypatch.setenv("KVTIER_REDIS_PASSWORD", SECRET)
    assert tier_roundtrip(base, seed=1) == ALL
    monkeypatch.setenv("TEAM_PW", SECRET)
    monkeypatch.setenv("KVTIER_REDIS_PASSWORD", "wrong")
    assert tier_roundtrip({**base, "password_env": "TEAM_PW"}, seed=2) == ALL
    pw = private_file(tmp_path / "pw", SECRET + "\n")
    assert tier_roundtrip({**base, "password_file": str(pw)}, seed=3) == ALL  # file wins
    pw.write_text("not-it\n")
    assert tier_roundtrip({**base, "password_file": str(pw)}, seed=4) == MISS
    monkeypatch.setenv("KVTIER_REDIS_PASSWORD", SECRET)
    spec = config(base).tiers[1]
    client = client_for(spec)
    assert client.target.password == SECRET  # it is there, and no repr shows it:
    shown = [
        repr(spec),
        repr(client.target),
        repr(client.client),
        repr(client.client.connection_pool),
    ]
    assert not [r for r in shown if SECRET in r], shown  # the library's own from redis 7.4
    client.close()
    text = caplog.text + "".join(str(r.args) for r in caplog.records)
    assert "remote tier" in text and SECRET not in text and "not-it" not in text


def test_bad_password_files_are_one_line_naming_the_option(tmp_path):
    base = {"kind": "redis", "url": "redis://h:1"}
    with pytest.raises(ConfigError, match=r"^tiers\[1\]\.password_file: cannot read .*nope"):
        config({**base, "password_file": str(tmp_path / "nope")})
    empty = private_file(tmp_path / "empty", "\n")
    with pytest.raises(ConfigError, match=r"^tiers\[1\]\.password_file: .* holds no password"):
        config({**base, "password_file": str(empty)})
    private_file(tmp_path / "pw", "x\n")
    both = {"kind": "redis", "url": f"redis://:{SECRET}@h:1", "password_file": str(tmp_path / "pw")}
    with pytest.raises(ConfigError, match=r"^tiers\[1\]\.password_file: the url carries") as e:
        config(both)
    assert SECRET not in str(e.value)


# -- secret files are private ---------------------------------------------------------------

NOBODY = 65534
SECRET_TEXT = "0123456789abcdef" * 4  # long enough for every option's minimum


def _read_option(option: str, path: Path) -> object:
    """What kvtier makes of ``path`` given as ``option`` (raises ConfigError if refused)."""
    if option == "key_secret_file":
        return read_key_secret(KVTierConfig.from_dict({"key_secret_file": str(path)}))
    return config({"kind": "redis", "url": "redis://h:1", option: str(path)})


def _make_unsafe(path: Path, how: str) -> str:
    """Make ``path`` unsafe as ``how`` says; the words the refusal must contain."""
    if how.startswith("mode "):
        path.write_text(SECRET_TEXT + "\n")
        path.chmod(int(how[5:], 8))
        return how
    if how == "owner":
        private_file(path, SECRET_TEXT + "\n")
        os.chown(path, NOBODY, NOBODY)  # the tests run as root (see test_disk_security)
        return f"owned by uid {NOBODY}"
    if how == "fifo":
        os.mkfifo(path, 0o600)  # opening it must not hang the start either
        return "not a regular file"
    path.mkdir(mode=0o700)
    return "not a regular file"


@pytest.mark.parametrize("option", ["password_file", "secret_file", "key_secret_file"])
@pytest.mark.parametrize(
    "how", ["mode 0644", "mode 0640", "mode 0604", "mode 0620", "owner", "fifo", "directory"]
)
def test_a_secret_file_others_can_read_or_change_is_refused(tmp_path, option, how):
    """Like ssh with a private key: group/other permission bits, another owner, or not a
    regular file is one ConfigError line naming the option, the path and the fix; the same
    content in a private file (0600, or 0400) is accepted."""
    path = tmp_path / "secret"
    want = _make_unsafe(path, how)
    with pytest.raises(ConfigError) as e:
        _read_option(option, path)
    msg = str(e.value)
    where = option if option == "key_secret_file" else f"tiers[1].{option}"
    assert msg.startswith(f"{where}: {str(path)!r} ") and want in msg and "\n" not in msg, msg
    assert SECRET_TEXT[:8] not in msg
    if how.startswith("mode "):
        assert f"chmod 600 {path}" in msg
    for mode in (0o600, 0o400):
        ok = tmp_path / f"ok-{mode:o}"
        private_file(ok, SECRET_TEXT + "\n").chmod(mode)
        _read_option(option, ok)


# -- least privilege -----------------------------------------------------------------------


def _acl_url(url: str) -> str:
    return url.replace("://", "://kvtier:@", 1)  # user in the URL, password from the env


def test_an_acl_user_stores_and_loads_and_nothing_more(monkeypatch):
    monkeypatch.setenv("KVTIER_REDIS_PASSWORD", ACL_PASSWORD)
    with RedisServer(acl=[acl_line()]) as s:
        entry = {"kind": "redis", "url": _acl_url(s.url), "timeout_ms": 3000}
        assert tier_roundtrip(entry) == ALL
        admin = redis.Redis(port=s.port)
        admin.set("other:secret", b"tenant B")
        assert any(k.startswith(keyspace.PREFIX) for k in admin.keys("*"))
        user = redis.Redis(port=s.port, username="kvtier", password=ACL_PASSWORD)
        for refused in (
            lambda: user.get("other:secret"),
            lambda: user.set("other:x", b"1"),
            lambda: user.flushall(),
            lambda: user.keys("*"),
            lambda: user.config_get("*"),
            lambda: user.execute_command("MONITOR"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                refused()
        user.close()
        admin.close()


def test_an_acl_user_on_a_cluster(monkeypatch):
    monkeypatch.setenv("KVTIER_REDIS_PASSWORD", ACL_PASSWORD)
    with RedisCluster(1, acl=[acl_line()]) as c:
        assert tier_roundtrip({"kind": "redis", "url": _acl_url(c.url), "timeout_ms": 3000}) == ALL


@pytest.mark.parametrize("where", ["key_secret_env", "secret_env"])
def test_a_secret_pasted_into_an_env_option_is_not_echoed(where, monkeypatch):
    """Issue 45, finding 5: a secret put into ``secret_env`` / ``key_secret_env`` itself
    (instead of the variable's name) was echoed as "environment variable '...' is unset"."""
    pasted = "Zq7" + "x" * 40
    monkeypatch.delenv(pasted, raising=False)
    if where == "key_secret_env":
        cfg = KVTierConfig.from_dict({"key_secret_env": pasted})
        with pytest.raises(ConfigError) as e:
            read_key_secret(cfg)
    else:
        with pytest.raises(ConfigError) as e:
            KVTierConfig.from_dict(
                {"tiers": [{"kind": "cpu"}, {"kind": "redis", "url": "redis://h", where: pasted}]}
            )
    msg = str(e.value)
    assert where in msg and "is unset" in msg and "Zq7" not in msg and "xxxx" not in msg
