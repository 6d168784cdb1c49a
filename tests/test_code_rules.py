"""The codebase rules that a reviewer would otherwise check by hand: size limits of the
tier-stack issue, which package may import vllm or touch CUDA, and that the copy path reads
what a store declares instead of probing it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kvtier"
MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 600


def modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_class_or_module_is_too_long():
    too_long = []
    for path in modules():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(SRC)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > MAX_CLASS_LINES:
                    too_long.append(f"{path.relative_to(SRC)}: class {node.name} {n} lines")
    assert not too_long, too_long


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_the_vllm_package_imports_vllm():
    outside = [
        str(p.relative_to(SRC))
        for p in modules()
        if "vllm" not in p.relative_to(SRC).parts[:-1]
        and any(n == "vllm" or n.startswith("vllm.") for n in imported(p))
    ]
    assert not outside, outside


def test_only_the_transfer_package_touches_cuda():
    outside = [
        str(p.relative_to(SRC))
        for p in modules()
        if p.relative_to(SRC).parts[0] != "transfer" and "torch.cuda" in p.read_text()
    ]
    assert not outside, outside


COPY_PATH = (
    "transfer/plans.py",
    "transfer/engine.py",
    "transfer/layered.py",
    "worker.py",
    "tiers/faulty.py",
)
"""Where the copy path picks a store's copy paths (and the fault wrapper forwards them)."""


def test_the_copy_path_does_not_probe_stores():
    """A store's optional copy paths are declared members of ``SlotStore``
    (docs/tiers.md): the copy path reads them, never ``getattr``/``hasattr``."""
    probes = [
        f"{name}:{node.lineno}"
        for name in COPY_PATH
        for node in ast.walk(ast.parse((SRC / name).read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
    ]
    assert not probes, probes
