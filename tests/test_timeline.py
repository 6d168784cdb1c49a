"""The opt-in event timeline: off by default, JSON lines on one clock when enabled."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CODE = """
import threading
from kvtier import timeline
timeline.event("a", req="r1", n=1)
t = threading.Thread(target=timeline.event, args=("b",), kwargs={"req": "r1"}, name="copy")
t.start(); t.join()
print(timeline.enabled())
"""


def run(env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_timeline_is_off_by_default(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_TIMELINE"}
    assert run(env) == "False"


def test_timeline_writes_ordered_events(tmp_path):
    path = tmp_path / "events.jsonl"
    assert run({**os.environ, "KVTIER_TIMELINE": str(path)}) == "True"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["ev"] for e in events] == ["a", "b"]
    assert events[0]["req"] == "r1" and events[0]["n"] == 1 and events[1]["thread"] == "copy"
    assert events[0]["t"] <= events[1]["t"] and events[0]["pid"] == events[1]["pid"]
