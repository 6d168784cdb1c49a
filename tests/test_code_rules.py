"""The codebase rules that a reviewer would otherwise check by hand: size limits of the
tier-stack issue, how deep a class inherits from project classes, which package may import
vllm or touch CUDA, and that the copy path reads what a store declares instead of probing
it."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kvtier"
MAX_CLASS_LINES = 250
MAX_MODULE_LINES = 500


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


MAX_PROJECT_BASES = 2
"""Project classes (ABCs and protocols aside) a class may inherit through, along its
longest line of bases: deeper chains share state through ``self`` across many files."""
SHALLOW = ("",)
"""Where the inheritance rule holds (paths below src/kvtier): "" is all of it."""

ABSTRACT = {"ABC", "abc.ABC", "Protocol", "typing.Protocol", "typing_extensions.Protocol"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def dotted(node: ast.expr) -> str | None:
    """``a.b.C`` of a base expression (``C[T]`` counts as ``C``); None for anything else."""
    if isinstance(node, ast.Subscript):
        return dotted(node.value)
    if isinstance(node, ast.Attribute):
        head = dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else None


class ClassGraph:
    """Every class defined in src/kvtier, its bases resolved to qualified names through
    each module's imports (re-exports followed), and whether it is an ABC or a protocol."""

    def __init__(self) -> None:
        self.bases: dict[str, list[str]] = {}
        self.abstract: set[str] = set()
        self.where: dict[str, Path] = {}
        self.names: dict[str, dict[str, str]] = {}  # module -> local name -> qualified
        trees = {module_name(p): (p, ast.parse(p.read_text())) for p in modules()}
        for mod, (path, tree) in trees.items():
            self.names[mod] = self._local_names(mod, path, tree)
        for mod, (path, tree) in trees.items():
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self._add(mod, path, node)

    @staticmethod
    def _local_names(mod: str, path: Path, tree: ast.Module) -> dict[str, str]:
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        out: dict[str, str] = {}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                out[node.name] = f"{mod}.{node.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    out[a.asname or a.name.split(".")[0]] = (
                        a.name if a.asname else a.name.split(".")[0]
                    )
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        package[: len(package) - node.level + 1] + ([base] if base else [])
                    )
                for a in node.names:
                    out[a.asname or a.name] = f"{base}.{a.name}"
        return out

    def _qualify(self, mod: str, name: str) -> str:
        head, _, rest = name.partition(".")
        full = self.names[mod].get(head, head)
        return f"{full}.{rest}" if rest else full

    def resolve(self, name: str) -> str:
        """The class a qualified name stands for, following re-exports."""
        for _ in range(20):
            if name in self.bases or name in self.abstract:
                return name
            mod, _, attr = name.rpartition(".")
            target = self.names.get(mod, {}).get(attr)
            if target is None or target == name:
                return name
            name = target
        return name

    def _add(self, mod: str, path: Path, node: ast.ClassDef) -> None:
        qual = f"{mod}.{node.name}"
        self.where[qual] = path
        raw = [d for b in node.bases if (d := dotted(b)) is not None]
        meta = [dotted(k.value) for k in node.keywords if k.arg == "metaclass"]
        qualified = [self._qualify(mod, b) for b in raw]
        if {*raw, *qualified} & ABSTRACT or any(m and m.endswith("ABCMeta") for m in meta):
            self.abstract.add(qual)
        self.bases[qual] = qualified

    def is_exception(self, qual: str) -> bool:
        """Whether ``qual`` derives from a built-in exception."""
        for base in self.bases.get(qual, []):
            base = self.resolve(base)
            builtin = getattr(builtins, base, None)
            if isinstance(builtin, type) and issubclass(builtin, BaseException):
                return True
            if base in self.bases and self.is_exception(base):
                return True
        return False

    def project_depth(self, qual: str, seen: frozenset[str] = frozenset()) -> int:
        """Project classes, ABCs and protocols aside, on the longest line of bases above
        ``qual`` (cycles, which Python forbids, end a line)."""
        best = 0
        for base in self.bases.get(qual, []):
            base = self.resolve(base)
            if base not in self.bases or base in seen:
                continue  # not a class of the project
            here = 0 if base in self.abstract else 1
            best = max(best, here + self.project_depth(base, seen | {qual}))
        return best


def test_no_class_inherits_through_more_than_two_project_classes():
    """Exceptions aside too: their hierarchy is what ``except`` clauses name (e.g.
    UnsafeDirectory is a TierUnavailable), not state shared through ``self``."""
    graph = ClassGraph()
    deep = [
        f"{graph.where[q].relative_to(SRC)}: {q.rpartition('.')[2]} inherits through {d}"
        for q in sorted(graph.bases)
        if any(graph.where[q].relative_to(SRC).as_posix().startswith(s) for s in SHALLOW)
        and not graph.is_exception(q)
        and (d := graph.project_depth(q)) > MAX_PROJECT_BASES
    ]
    assert not deep, deep


def test_the_inheritance_rule_sees_a_chain_through_imports():
    """The rule's own check: a known three-deep chain (disk slab's old shape, rebuilt in
    the graph from real modules' names) is found, an ABC on top of it is not counted."""
    graph = ClassGraph()
    graph.bases.update(
        {
            "x.A": ["kvtier.contract.store.SlotStore"],  # an ABC of the project: not counted
            "x.B": ["x.A"],
            "x.C": ["x.B"],
            "x.D": ["x.C", "kvtier.contract.store.SlotStore"],
        }
    )
    assert "kvtier.contract.store.SlotStore" in graph.abstract
    assert [graph.project_depth(q) for q in ("x.A", "x.B", "x.C", "x.D")] == [0, 1, 2, 3]
    assert graph.project_depth(graph.resolve("kvtier.tools.slot_tier.DiskTier")) >= 1
    unsafe = "kvtier.tiers.disk.private.UnsafeDirectory"
    assert graph.is_exception(unsafe) and graph.project_depth(unsafe) == 3
    assert not graph.is_exception("kvtier.tiers.disk.slab.DiskSlab")


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
