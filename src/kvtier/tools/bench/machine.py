"""Facts about this machine that choose defaults and go into results.json."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def preferred_dtype() -> str:
    """bf16 where the CPU has bf16 matrix instructions, else fp32.

    Without AVX-512 BF16 / AMX, vLLM's CPU backend runs bf16 linear layers on a slow
    fallback (measured here: a 1k-token SmolLM2 prefill takes ~3x longer than in fp32).
    """
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & cpu_flags() else "float32"


def machine_info() -> dict[str, Any]:
    import torch

    from kvtier.transfer import cuda_available

    flags = cpu_flags()
    return {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_bf16": bool({"avx512_bf16", "amx_bf16"} & flags),
        "avx512": "avx512f" in flags,
        "cuda": cuda_available(),
    }
