"""The test side of :mod:`kvtier.vllm.harness.engine_host`: one long-lived process per test
worker that runs engine specs one after another, each on a fresh in-process engine."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import IO, Any


class EngineHost:
    """Sends specs to an engine host subprocess and returns their results. The process
    starts on first use; after a failed run it is stopped, so the next spec starts on a
    fresh interpreter and never on state a failed engine left behind. Its stderr goes to
    ``workdir/host.log``, whose tail a failed run's assertion message carries."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[str] | None = None
        self.log: IO[str] | None = None
        self.runs = 0

    def _start(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            self.close()
            self.log = open(self.workdir / "host.log", "a")  # noqa: SIM115 (closed in close())
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kvtier.vllm.harness.engine_host"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.log,
                text=True,
            )
        return self.proc

    def log_tail(self, chars: int = 4000) -> str:
        path = self.workdir / "host.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def run(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The spec's result; an AssertionError naming the error if the engine failed."""
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        self.runs += 1
        spec_path = self.workdir / f"spec-{self.runs}.json"
        out_path = spec_path.with_suffix(".out.json")
        spec_path.write_text(json.dumps(spec))
        proc.stdin.write(f"{spec_path} {out_path}\n")
        proc.stdin.flush()
        reply = proc.stdout.readline()
        if reply.strip() != f"done {out_path}":
            self.close()
            raise AssertionError(f"engine host died: {self.log_tail()}")
        result: dict[str, Any] = json.loads(out_path.read_text())
        if "error" in result:
            self.close()
            raise AssertionError(f"{result}\n{self.log_tail()}")
        return result

    def close(self) -> None:
        """Stop the host process (it exits at the end of its input) and close its log."""
        if self.proc is not None:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            with contextlib.suppress(BrokenPipeError):  # a host that died has no reader
                self.proc.stdin.close()
            self.proc.stdout.close()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None
