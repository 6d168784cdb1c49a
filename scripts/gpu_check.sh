#!/usr/bin/env bash
# kvtier's worker-side CUDA path on a GPU: benchmarks/gpu_check.py (what it checks: its
# docstring and docs/benchmarks.md). Needs PyTorch with CUDA, NumPy and xxhash; not vLLM,
# not blake3; kvtier is taken from src/ (no install). Without CUDA it runs dry on CPU.
# Arguments go to the script (--dry, --tier-gib N, --json PATH, --seed N).
# Exit status: 0 when every check passed, 1 when one failed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
"$PY" -c "import torch, numpy, xxhash; print('gpu_check: torch', torch.__version__, 'CUDA', torch.version.cuda, 'available', torch.cuda.is_available())"
exec "$PY" benchmarks/gpu_check.py "$@"
