"""An opt-in event timeline: where a hit's time goes, step by step.

With ``$KVTIER_TIMELINE`` set to a file path, :func:`event` appends one JSON object per
line: ``{"t": <CLOCK_MONOTONIC seconds>, "pid": ..., "thread": ..., "ev": name, ...}``.
The clock is system-wide, so events of an engine's scheduler process, its worker
processes and the copy threads line up. Off (the default), :func:`event` is one global
lookup. Used to diagnose latency, never read back by kvtier itself.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

_PATH = os.environ.get("KVTIER_TIMELINE") or None
_LOCK = threading.Lock()


def enabled() -> bool:
    return _PATH is not None


def event(name: str, **fields: Any) -> None:
    """Record one event (no-op unless ``$KVTIER_TIMELINE`` is set)."""
    if _PATH is None:
        return
    rec = {
        "t": time.monotonic(),
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
        "ev": name,
        **fields,
    }
    line = json.dumps(rec, default=str) + "\n"
    with _LOCK, open(_PATH, "a", encoding="utf-8") as f:
        f.write(line)
