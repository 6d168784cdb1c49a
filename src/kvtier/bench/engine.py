"""Run kvtier.vllm.runner programs in subprocesses, one engine configuration each."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
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
                [sys.executable, "-m", "kvtier.vllm.runner", str(spec_path), str(out_path)],
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
