"""The import structure of ``tvm_pesto``: no import circle anywhere, ``solve`` imports no later
stage, nothing imports another package's private names, and the runtime side (``run``)
never reaches TVM's compiler.

Every import counts, including the ones inside functions (a lazy import hides a circle
from Python, not from the design) and ``importlib.import_module`` with a constant name.
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

import tvm_pesto

ROOT = Path(tvm_pesto.__file__).parent
SOLVE = ROOT / "solve"
FORBIDDEN = ("builder", "run", "cli", "search", "api", "bench", "frontend")  # stages after solve, and entry points


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, name: str | None, level: int) -> str:
    """The absolute module a (possibly relative) import names."""
    if level == 0:
        return name or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[:-(level - 1)]
    return ".".join(base + ([name] if name else []))


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (``from X import y`` gives ``X.y``
    when that is a module, else ``X``)."""
    module, is_package = module_name(path), path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node.module, node.level)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if _is_module(sub) else target)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              == "import_module" and node.args and isinstance(node.args[0], ast.Constant)):
            name = node.args[0].value
            level = len(name) - len(name.lstrip("."))
            out.add(_resolve(module, is_package, name.lstrip(".") or None, level))
    return out


def _is_module(name: str) -> bool:
    if not name.startswith("tvm_pesto"):
        return False
    rel = ROOT.parent.joinpath(*name.split("."))
    return rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()


def import_graph(paths) -> nx.DiGraph:
    """Module -> the tvm_pesto modules it imports, for the given source files."""
    g = nx.DiGraph()
    for path in sorted(paths):
        src = module_name(path)
        g.add_node(src)
        for dst in imports_of(path):
            if dst.startswith("tvm_pesto"):
                g.add_edge(src, dst)
    return g


def solve_graph() -> nx.DiGraph:
    return import_graph(SOLVE.glob("*.py"))


def test_the_resolver_sees_lazy_and_relative_imports(tmp_path):
    tree = imports_of(SOLVE / "registry.py")  # the registry imports ilp lazily, by importlib
    assert "tvm_pesto.solve.ilp" in tree and "tvm_pesto.solve.portfolio" in tree
    assert "tvm_pesto.solve.mip" in imports_of(SOLVE / "msct.py")  # inside favorite_lp
    assert "tvm_pesto._core" in imports_of(SOLVE / "refine.py")  # `from .. import _core`
    assert _resolve("tvm_pesto.solve.ilp", False, "plan", 2) == "tvm_pesto.plan"


def test_solve_has_no_import_circle():
    g = solve_graph()
    inside = g.subgraph(n for n in g if n.startswith("tvm_pesto.solve"))
    assert len(inside) >= 15
    cycles = list(nx.simple_cycles(inside))
    assert not cycles, f"import circles in tvm_pesto.solve: {cycles}"


def test_nothing_in_solve_imports_the_registry():
    g = solve_graph()
    importers = sorted(u for u, _ in g.in_edges("tvm_pesto.solve")) if "tvm_pesto.solve" in g else []
    assert not importers, f"{importers} import the registry tvm_pesto.solve; import the modules directly"


@pytest.mark.parametrize("stage", FORBIDDEN)
def test_solve_does_not_import_later_stages(stage):
    g = solve_graph()
    bad = sorted((u, v) for u, v in g.edges
                 if v == f"tvm_pesto.{stage}" or v.startswith(f"tvm_pesto.{stage}."))
    assert not bad, f"tvm_pesto.solve imports tvm_pesto.{stage}: {bad}"


def test_model_and_orchestration_are_separate():
    g = solve_graph()
    # the MIP model and the modules it serves never reach back into the orchestration
    for mod in ("mip", "ilp_model", "portfolio", "coarsen", "comm_bounds", "bounds", "refine", "joint_ilp"):
        reach = nx.descendants(g, f"tvm_pesto.solve.{mod}")
        assert "tvm_pesto.solve.ilp" not in reach, mod
    assert "tvm_pesto.solve.ilp" not in nx.descendants(g, "tvm_pesto.solve.joint_ilp")
    assert {"tvm_pesto.solve.mip"} <= set(g.successors("tvm_pesto.solve.joint_ilp"))
    assert {"tvm_pesto.solve.mip"} <= set(g.successors("tvm_pesto.solve.ilp_model"))


def package_graph() -> nx.DiGraph:
    return import_graph(ROOT.rglob("*.py"))


def test_no_import_circle_anywhere_in_the_package():
    cycles = list(nx.simple_cycles(package_graph()))
    assert not cycles, f"import circles: {cycles[:5]}"


def test_no_private_import_across_packages():
    """``from tvm_pesto.x.y import _name`` from another package reaches into its internals."""
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        module, is_package = module_name(path), path.name == "__init__.py"
        here = module if is_package else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _resolve(module, is_package, node.module, node.level)
            for alias in node.names:
                name = alias.name
                if name.startswith("_") and not name.startswith("__") and name != "_core" \
                        and not (target == here or target.startswith(here + ".")):
                    bad.append(f"{module}: from {target} import {name}")
    assert not bad, bad


def test_the_runtime_side_never_imports_the_compiler():
    """What a deployed bundle loads (``tvm_pesto.run`` and what it imports) must not import
    ``tvm.relax`` or the compiler-side packages, even lazily."""
    g = package_graph()
    reach = nx.descendants(g, "tvm_pesto.run.load") | {"tvm_pesto.run.load"}
    compiler_side = ("tvm_pesto.builder", "tvm_pesto.graph", "tvm_pesto.candidates", "tvm_pesto.costs",
                     "tvm_pesto.solve", "tvm_pesto.backends", "tvm_pesto.api", "tvm_pesto.frontend")
    assert not [m for m in reach if m.startswith(compiler_side)], sorted(reach)
    for m in reach:
        path = ROOT.parent.joinpath(*m.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        relax = [i for i in imports_of(path) if i == "tvm.relax" or i.startswith("tvm.relax.")]
        assert not relax, f"{m} imports {relax}"
