"""A real vLLM engine on a password-protected redis-server: what its whole log shows.

One engine per form of giving the password, each a subprocess whose stdout and stderr are
captured together (vLLM's own start-up lines, which echo ``kv_connector_extra_config``,
included). The env form (``$KVTIER_REDIS_PASSWORD``) must authenticate (chunks reach the
server) and leave the password nowhere in the log; the URL form authenticates too, and the
log carries kvtier's warning naming the safe forms (the password itself is in vLLM's echo
of the config, which runs before kvtier and which kvtier cannot change).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from kvtier.tiers.remote import keyspace
from kvtier.tools.redis_server import RedisServer
from tests.support.vllm_runs import ENGINE, PROMPTS

pytestmark = pytest.mark.vllm

SECRET = "Pr0mpt-Vault-7d1e9c2b"


def run_logged(tmp_path: Path, connector: dict[str, Any], env: dict[str, str]) -> tuple[Any, str]:
    """One short program on a fresh engine; its result and its whole combined log."""
    spec = {
        "connector": connector,
        "engine": ENGINE,
        # One 6-chunk prompt: enough to store chunks; the engine's start is most of the time.
        "program": [{"op": "serve", "name": "p", "requests": [{"id": "a", "prompt": PROMPTS[2]}]}],
        "inspect": True,
    }
    spec_path = tmp_path / f"spec-{len(list(tmp_path.iterdir()))}.json"
    out_path = spec_path.with_suffix(".out.json")
    spec_path.write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier.vllm.harness.runner", str(spec_path), str(out_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
        env={**os.environ, **env},
    )
    spec_path.with_suffix(".log").write_text(proc.stdout)  # kept for a failing test's reader
    assert proc.returncode == 0, proc.stdout[-4000:]
    return json.loads(out_path.read_text()), proc.stdout


def stored_on_server(server: RedisServer) -> int:
    with redis.Redis(port=server.port, password=SECRET) as admin:
        n = sum(1 for _ in admin.scan_iter(match=keyspace.PREFIX + b"*"))
        admin.flushall()
    return n


@pytest.fixture(scope="module")
def locked():
    with RedisServer(password=SECRET) as s:
        yield s


def test_env_form_authenticates_and_the_log_never_shows_the_password(tmp_path, locked):
    cfg = {"tiers": [{"kind": "cpu", "capacity": "256MiB"}, redis_tier(locked.url)]}
    env = {"KVTIER_REDIS_PASSWORD": SECRET, "VLLM_LOGGING_LEVEL": "DEBUG"}
    _, log = run_logged(tmp_path, cfg, env)
    assert stored_on_server(locked) > 0  # the password reached the server
    assert "kv_connector_extra_config" in log or "kvtier" in log  # the log is the engine's
    assert SECRET not in log
    assert "carries a password" not in log


def test_url_form_warns_naming_the_safe_forms(tmp_path, locked):
    url = locked.url.replace("://", f"://:{SECRET}@", 1)
    cfg = {"tiers": [{"kind": "cpu", "capacity": "256MiB"}, redis_tier(url)]}
    _, log = run_logged(tmp_path, cfg, {"KVTIER_REDIS_PASSWORD": ""})
    assert stored_on_server(locked) > 0
    warning = [line for line in log.splitlines() if "carries a password" in line]
    assert warning, log[-4000:]
    assert "kvtier: tiers[1].url" in warning[0]
    assert "password_env" in warning[0] and "password_file" in warning[0]
    assert SECRET not in warning[0] and "redis://:***@127.0.0.1" in warning[0]
    # kvtier's own lines never show it (vLLM's echo of the config does: the warning's point)
    echo = "kv_connector_extra_config="  # in vLLM's start-up line echoing its config
    ours = [line for line in log.splitlines() if "kvtier: " in line and echo not in line]
    assert ours and not [line for line in ours if SECRET in line]


def redis_tier(url: str) -> dict[str, Any]:
    return {"kind": "redis", "url": url, "timeout_ms": 3000}
