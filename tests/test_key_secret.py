import pytest

from kvtier.config import KVTierConfig
from kvtier.errors import ConfigError
from kvtier.keys import Namespace, chunk_keys
from kvtier.keysecret import read_key_secret


def test_no_secret_by_default():
    assert read_key_secret(KVTierConfig()) == b""


def test_secret_from_env_and_file_are_the_same_key(tmp_path, monkeypatch):
    secret = b"0123456789abcdef-tenant-deployment"
    monkeypatch.setenv("KVT_TEST_SECRET", secret.decode())
    path = tmp_path / "secret"
    path.write_bytes(secret + b"\n")
    path.chmod(0o600)  # a secret file must be private (tests/tiers/remote/test_secrets.py)
    from_env = read_key_secret(KVTierConfig.from_dict({"key_secret_env": "KVT_TEST_SECRET"}))
    from_file = read_key_secret(KVTierConfig.from_dict({"key_secret_file": str(path)}))
    assert from_env == from_file == secret
    keyed = Namespace("m", "g", secret=from_env)
    assert chunk_keys(list(range(64)), 16, keyed.seed(), hash_key=keyed.hash_key) != chunk_keys(
        list(range(64)), 16, Namespace("m", "g").seed()
    )


@pytest.mark.parametrize(
    ("config", "env", "content", "match"),
    [
        (
            {"key_secret_env": "KVT_UNSET_SECRET"},
            None,
            None,
            "key_secret_env: the environment variable it names is unset",
        ),
        ({"key_secret_env": "KVT_TEST_SECRET"}, "", None, "key_secret_env: .* is empty"),
        ({"key_secret_env": "KVT_TEST_SECRET"}, "short", None, "holds 5 bytes"),
        ({"key_secret_file": "{tmp}/missing"}, None, None, "key_secret_file: cannot read"),
        ({"key_secret_file": "{tmp}/secret"}, None, b"\n", "key_secret_file: .* is empty"),
        ({"key_secret_file": "{tmp}/secret"}, None, b"x" * 5000, "holds 4096|holds 4097|holds"),
        ({"key_secret_env": ""}, None, None, "key_secret_env: expected a non-empty string"),
        ({"key_secret_file": 3}, None, None, "key_secret_file: expected a non-empty string"),
        (
            {"key_secret_env": "A", "key_secret_file": "/x"},
            None,
            None,
            "give one of them, not both",
        ),
    ],
)
def test_bad_secrets_are_one_clear_error(tmp_path, monkeypatch, config, env, content, match):
    monkeypatch.delenv("KVT_UNSET_SECRET", raising=False)
    if env is not None:
        monkeypatch.setenv("KVT_TEST_SECRET", env)
    if content is not None:
        (tmp_path / "secret").write_bytes(content)
        (tmp_path / "secret").chmod(0o600)
    config = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in config.items()}
    with pytest.raises(ConfigError, match=match) as info:
        read_key_secret(KVTierConfig.from_dict(config))
    assert "\n" not in str(info.value)
    if env:
        assert env not in str(info.value), "the secret is never echoed"
