"""Run kvtier.vllm.harness.runner programs in subprocesses, one engine configuration each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvtier.errors import KVTierError


class EngineRunError(KVTierError):
    """An engine subprocess failed; the message carries the tail of its log."""


def run_engine(
    spec: dict[str, Any], *, timeout: float = 3600, log_path: Path | None = None, quiet: bool = True
) -> dict[str, Any]:
    """Execute one runner spec in a fresh Python process and return its results."""
    with tempfile.TemporaryDirectory(prefix="kvtier-run-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        out_path = Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        log = open(log_path, "w") if log_path else None  # noqa: SIM115 (closed below)
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "kvtier.vllm.harness.runner", str(spec_path), str(out_path)],
                stdout=log or (subprocess.PIPE if quiet else None),
                stderr=subprocess.STDOUT if (log or quiet) else None,
                text=True,
                timeout=timeout,
            )
        finally:
            if log:
                log.close()
        if proc.returncode != 0:
            tail = (proc.stdout or "")[-3000:] if not log_path else log_path.read_text()[-3000:]
            raise EngineRunError(f"engine run failed (exit {proc.returncode}):\n{tail}")
        result: dict[str, Any] = json.loads(out_path.read_text())
        return result


def run_module(
    module: str,
    spec: dict[str, Any],
    log_path: Path,
    bar: Any,
    env: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any] | None]:
    """``python -m MODULE SPEC.json OUT.json`` in a fresh process, its output in
    ``log_path``; (exit status, OUT or None). The module reports finished requests through
    ``$KVTIER_PROGRESS``, which moves ``bar`` (a tqdm bar, or None)."""
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-") as tmp:
        spec_path, out_path, prog = (Path(tmp) / n for n in ("spec.json", "out.json", "progress"))
        spec_path.write_text(json.dumps(spec))
        seen = 0
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, str(spec_path), str(out_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, **(env or {}), KVTIER_PROGRESS=str(prog)),
            )
            while proc.poll() is None:
                time.sleep(0.5)
                seen = _advance(bar, prog, seen)
        _advance(bar, prog, seen)
        if proc.returncode != 0 or not out_path.exists():
            return proc.returncode or 1, None
        return 0, json.loads(out_path.read_text())


def run_with_progress(spec: dict[str, Any], bar: Any, log_path: Path) -> dict[str, Any]:
    """One :mod:`kvtier.vllm.harness.runner` engine (see :func:`run_module`); raises EngineRunError
    with the log's tail if it fails. The ``warmup`` op, if any, is left out of the ops."""
    status, result = run_module("kvtier.vllm.harness.runner", spec, log_path, bar)
    if status or result is None:
        tail = log_path.read_text()[-2500:]
        raise EngineRunError(f"the engine failed (see {log_path}):\n{tail}")
    result["ops"] = [op for op in result["ops"] if op["name"] != "warmup"]
    return result


def _advance(bar: Any, prog: Path, seen: int) -> int:
    """Move the bar by the requests finished since the last look."""
    try:
        n = int(prog.read_text() or 0)
    except (OSError, ValueError):
        return seen
    if bar is not None and n > seen:
        bar.update(n - seen)
    return max(n, seen)
