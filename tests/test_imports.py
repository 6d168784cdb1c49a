"""The runtime (what a vLLM engine imports) imports no tooling, and no import cycle runs
among any of kvtier's modules, the tooling's included.

Every ``import`` counts, wherever it stands: module level, inside a function, under
``if TYPE_CHECKING``. Importing ``a.b.c`` also runs the packages ``a.b`` and ``a`` (their
``__init__``), so those are edges too, except from a module inside that package (Python
has run the package before it).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
TOOLING = ("kvtier.tools", "kvtier.vllm.harness", "kvtier.conformance")
"""Packages that sit on top of the runtime (they may import it, not the other way)."""

CONTRACT = "kvtier.contract"
"""The bottom layer: the tier contract (docs/architecture.md draws the layers)."""
CONTRACT_IMPORTS = (
    CONTRACT,
    "kvtier.keys",
    "kvtier.sources",
    "kvtier.options",
    "kvtier.errors",
    "kvtier.units",
)
"""All the contract may import: itself and the lowest modules."""
STORAGE = "kvtier.tiers"
"""The tier implementations: above the contract, below orchestration."""
ORCHESTRATION = ("kvtier.stack", "kvtier.transfer", "kvtier.manager", "kvtier.config")
"""What neither the contract nor the tier implementations may import."""
ALLOWED_UPWARD = {
    # The CPU slab moves bytes with the transfer package's primitives (streaming row
    # copies, pinned host memory), which the rule "only transfer/ touches CUDA"
    # (tests/test_code_rules.py) keeps there. Moving them below the tiers needs that rule
    # and the _rowcopy extension's module name changed: a decision left open.
    ("kvtier.tiers.cpu", "kvtier.transfer"),
    ("kvtier.tiers.cpu", "kvtier.transfer.copy"),
    ("kvtier.tiers.cpu", "kvtier.transfer.host_memory"),
}
"""Upward edges from the tier implementations that are known and tolerated, each with why."""


def module_paths() -> dict[str, Path]:
    out = {}
    for path in (SRC / "kvtier").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The kvtier modules ``name`` makes Python run when it is imported."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    out: set[str] = set()
    for target in found:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            ancestor = ".".join(parts[:i])
            inside = name == ancestor or name.startswith(ancestor + ".")
            if ancestor in modules and not inside:
                out.add(ancestor)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def is_tooling(name: str) -> bool:
    return any(name == t or name.startswith(t + ".") for t in TOOLING)


def runtime_graph(*, keep_tooling: bool = False) -> dict[str, set[str]]:
    """Each runtime module's kvtier imports (runtime ones only unless ``keep_tooling``)."""
    modules = module_paths()
    runtime = {m for m in modules if not is_tooling(m)}
    targets = set(modules) if keep_tooling else runtime
    return {m: imports_of(m, modules[m], modules) & targets for m in runtime}


def test_the_runtime_imports_no_tooling():
    wrong = sorted(
        f"{a} imports {b}"
        for a, deps in runtime_graph(keep_tooling=True).items()
        for b in deps
        if is_tooling(b)
    )
    assert not wrong, wrong
    for path in module_paths().values():
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            assert not any(n == "tests" or n.startswith("tests.") for n in names), path


def test_the_graph_sees_function_level_and_type_checking_imports():
    graph = runtime_graph()
    assert "kvtier.contract.spec" in graph["kvtier.config"]  # module level
    assert "kvtier.tiers.faulty" in graph["kvtier.stack.build"]  # inside a function
    assert "kvtier.config" in graph["kvtier.stack.build"]  # under TYPE_CHECKING
    assert "kvtier.contract" in graph["kvtier.config"]  # a package's __init__ runs
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_runtime_modules():
    found = cycles(runtime_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_import_cycle_anywhere_in_src():
    """The tooling too (a lazy import hid ``tools.sim.bounds`` <-> ``tools.sim.simulator``)."""
    found = cycles(full_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def within(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def full_graph() -> dict[str, set[str]]:
    modules = module_paths()
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def test_the_contract_imports_only_the_lowest_modules():
    graph = full_graph()
    wrong = sorted(
        f"{a} imports {b}"
        for a, deps in graph.items()
        if within(a, CONTRACT)
        for b in deps
        if not within(b, *CONTRACT_IMPORTS)
    )
    assert not wrong, wrong
    # Nor does anything it imports reach up (the lowest modules stay low).
    seen, todo = set(), [m for m in graph if within(m, CONTRACT)]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    assert not [m for m in seen if within(m, STORAGE, *ORCHESTRATION)], sorted(seen)


def upward_edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Edges from the contract or a tier implementation up to orchestration."""
    return {
        (a, b)
        for a, deps in graph.items()
        if within(a, STORAGE, CONTRACT)
        for b in deps
        if within(b, *ORCHESTRATION)
    }


def test_no_arrow_from_the_tiers_up_to_orchestration():
    upward = upward_edges(full_graph())
    assert not sorted(upward - ALLOWED_UPWARD), sorted(upward - ALLOWED_UPWARD)
    assert not sorted(ALLOWED_UPWARD - upward), "stale allow-list entries"


def test_no_path_from_the_tiers_up_to_orchestration():
    """Nor through a module outside both (a tier imports a helper that imports the
    config), but for the allowed edges."""
    graph = full_graph()
    wrong = []
    for root in graph:
        if not within(root, STORAGE, CONTRACT):
            continue
        seen, todo = {root}, [root]
        while todo:
            m = todo.pop()
            for d in graph[m]:
                if (m, d) in ALLOWED_UPWARD or d in seen:
                    continue
                if within(d, *ORCHESTRATION):
                    wrong.append(f"{root} reaches {d} through {m}")
                    continue
                seen.add(d)
                todo.append(d)
    assert not wrong, sorted(wrong)


def test_the_layer_rule_sees_an_upward_arrow():
    """The rule would catch a tier importing the config (the check is not vacuous)."""
    graph = full_graph()
    graph["kvtier.tiers.memory"] = graph["kvtier.tiers.memory"] | {"kvtier.config"}
    assert ("kvtier.tiers.memory", "kvtier.config") in upward_edges(graph) - ALLOWED_UPWARD


def test_policies_and_the_budget_take_their_fields_not_the_config():
    """Issue 44: the config hands each part the typed slice it needs; the policies and the
    sync budget sit below ``kvtier.config`` and never import it (not even for a type)."""
    modules = module_paths()
    wrong = sorted(
        m
        for m in modules
        if (m == "kvtier.budget" or m.startswith("kvtier.policies"))
        and "kvtier.config" in imports_of(m, modules[m], modules)
    )
    assert not wrong, wrong
