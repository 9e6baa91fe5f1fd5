"""The import structure of ``tvm_pesto``: no import circle anywhere, ``solve`` imports no later
stage, no two packages import each other, nothing imports another package's private names, the runtime side (``run``) never
reaches TVM's compiler, every package imports only its own layer and below
(docs/architecture.md, "Layers"), the product never imports the cost-model lab (``lab/``, the
package ``tvm_pesto_lab``), and every import inside a function says why it waits (in the lab
too, which imports no private name of the product either).

Every import counts, including the ones inside functions (a lazy import hides a circle
from Python, not from the design) and ``importlib.import_module`` with a constant name.
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

import tvm_pesto
import tvm_pesto_lab

ROOT = Path(tvm_pesto.__file__).parent
LAB = Path(tvm_pesto_lab.__file__).parent
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
    return import_graph(SOLVE.rglob("*.py"))


#: The most modules one folder of the package (or of the lab) holds at one level: one concept
#: per sub-package, not a heap of files.
MAX_MODULES_PER_FOLDER = 15


def test_the_resolver_sees_lazy_and_relative_imports(tmp_path):
    tree = imports_of(SOLVE / "registry.py")  # the registry imports the ILP driver lazily, by importlib
    assert "tvm_pesto.solve.placement_ilp.driver" in tree and "tvm_pesto.solve.heuristics.portfolio" in tree
    assert "tvm_pesto.solve.mip" in imports_of(SOLVE / "heuristics" / "msct.py")  # inside favorite_lp
    assert "tvm_pesto._core" in imports_of(SOLVE / "placement_ilp" / "refine.py")  # `from ... import _core`
    assert _resolve("tvm_pesto.solve.placement_ilp.driver", False, "plan", 3) == "tvm_pesto.plan"


def test_no_folder_is_a_heap():
    lab = ROOT.parent / "lab" / "tvm_pesto_lab"
    folders = [d for top in (ROOT, lab) if top.is_dir()
               for d in [top, *top.rglob("*")] if d.is_dir() and (d / "__init__.py").is_file()]
    assert ROOT in folders and (ROOT / "solve" / "joint") in folders
    big = {str(d.relative_to(ROOT.parent)): n for d in folders
           if (n := len([f for f in d.glob("*.py") if f.name != "__init__.py"])) > MAX_MODULES_PER_FOLDER}
    assert not big, f"folders with more than {MAX_MODULES_PER_FOLDER} modules: {big}; split them by concept"


def test_solve_has_no_import_circle():
    g = solve_graph()
    inside = g.subgraph(n for n in g if n.startswith("tvm_pesto.solve"))
    assert len(inside) >= 15
    cycles = list(nx.simple_cycles(inside))
    assert not cycles, f"import circles in tvm_pesto.solve: {cycles}"


def test_nothing_in_solve_imports_the_registry():
    g = solve_graph()
    assert {"tvm_pesto.solve.heuristics.heft", "tvm_pesto.solve.stage.dp"} <= set(g)  # sub-packages count
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
    driver = "tvm_pesto.solve.placement_ilp.driver"
    # the MIP models and the modules they serve never reach back into the orchestration
    models = ["mip", "heuristics.portfolio", "placement_ilp.coarsen", "placement_ilp.warm_solve",
              "placement_ilp.refine", "bounds.comm", "bounds.makespan", "joint.ilp", "stage.model"]
    models += [f"placement_ilp.model.{p.stem}" for p in (SOLVE / "placement_ilp" / "model").glob("*.py")
               if p.stem != "__init__"]
    for mod in models:
        reach = nx.descendants(g, f"tvm_pesto.solve.{mod}")
        assert driver not in reach, mod
        assert "tvm_pesto.solve.stage.ilp" not in reach, mod
    assert {"tvm_pesto.solve.mip"} <= set(g.successors("tvm_pesto.solve.joint.ilp"))
    assert {"tvm_pesto.solve.mip"} <= set(g.successors("tvm_pesto.solve.placement_ilp.model.build"))
    assert {"tvm_pesto.solve.mip"} <= set(g.successors("tvm_pesto.solve.stage.model"))


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
    reach = nx.descendants(g, "tvm_pesto.run.bundle.load") | {"tvm_pesto.run.bundle.load"}
    compiler_side = ("tvm_pesto.builder", "tvm_pesto.graph", "tvm_pesto.candidates", "tvm_pesto.costs",
                     "tvm_pesto.solve", "tvm_pesto.backends", "tvm_pesto.api", "tvm_pesto.frontend")
    assert not [m for m in reach if m.startswith(compiler_side)], sorted(reach)
    for m in reach:
        path = ROOT.parent.joinpath(*m.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        relax = [i for i in imports_of(path) if i == "tvm.relax" or i.startswith("tvm.relax.")]
        assert not relax, f"{m} imports {relax}"


# -- layers (docs/architecture.md, "Layers") ----------------------------------------------------------
#: Package -> layer: a package imports only packages of its own layer or below. ``tvm_pesto``
#: is the root package (``__version__``, names imported lazily on first use).
LAYERS = {
    "tvm_pesto": 0, "errors": 0, "jsonio": 0, "package_data": 0, "_core": 0,  # utilities
    "frontend": 0, "models": 0, "zoo": 0,  # where a model comes from: a Relax module, nothing of the flow
    "graph": 1, "cluster": 1,
    "candidates": 2, "backends": 2, "constraints": 2,
    "run": 2,  # the runtime needs only errors and cluster: the compiler side imports it, as TVM's does its runtime
    "costs": 3,
    "plan": 4,
    "solve": 5,
    "builder": 6, "report": 6,  # report: what a built model shows of itself (builder.placed.PlacedModule.report)
    "placing": 8, "choose": 8, "api": 8, "train": 8,  # api -> choose -> placing; train builds a step and places it with api
    "cli": 9, "bench": 9,
}
#: (importing package, imported module): why it may point up a layer. The list only shrinks
#: (:func:`test_every_allowed_upward_import_is_still_there`); none is left.
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}


def package_of(module: str) -> str:
    """``tvm_pesto.X`` for a module of package ``X`` (or top-level module ``X``); ``tvm_pesto``
    for the root package."""
    return ".".join(module.split(".")[:2])


def layer_of(module: str) -> int:
    return LAYERS[package_of(module).removeprefix("tvm_pesto.") if module != "tvm_pesto" else "tvm_pesto"]


def upward_imports(g: nx.DiGraph) -> list[tuple[str, str]]:
    """Edges of ``g`` from a package to a package of a higher layer."""
    return sorted((u, v) for u, v in g.edges if layer_of(v) > layer_of(u))


def test_every_package_has_a_layer():
    packages = {package_of(m) for m in package_graph()}
    missing = sorted(p for p in packages if p.removeprefix("tvm_pesto.") not in LAYERS and p != "tvm_pesto")
    assert not missing, f"{missing} have no layer; add them to LAYERS (and to docs/architecture.md, 'Layers')"


def test_packages_import_only_their_layer_and_below():
    bad = [(u, v) for u, v in upward_imports(package_graph()) if (package_of(u), v) not in ALLOWED_UPWARD]
    assert not bad, (f"imports that point up a layer: {bad}; move the code to the layer of its users (or, if it "
                     "must stay, add the pair to ALLOWED_UPWARD with the reason)")


def test_every_allowed_upward_import_is_still_there():
    used = {(package_of(u), v) for u, v in upward_imports(package_graph())}
    stale = sorted(set(ALLOWED_UPWARD) - used)
    assert not stale, f"{stale} no longer import upward: remove them from ALLOWED_UPWARD"


def test_the_layer_check_catches_an_upward_import():
    g = nx.DiGraph([("tvm_pesto.costs.x", "tvm_pesto.api"), ("tvm_pesto.api", "tvm_pesto.costs.x"),
                    ("tvm_pesto.run.runtime", "tvm_pesto.builder.placed"),
                    ("tvm_pesto.builder.placed", "tvm_pesto.run.runtime")])
    assert upward_imports(g) == [("tvm_pesto.costs.x", "tvm_pesto.api"),
                                 ("tvm_pesto.run.runtime", "tvm_pesto.builder.placed")]


def mutual_imports(g: nx.DiGraph) -> list[tuple[str, str]]:
    """Pairs of packages (:func:`package_of`) of ``g`` that import each other, each pair once."""
    packages = nx.DiGraph((package_of(u), package_of(v)) for u, v in g.edges if package_of(u) != package_of(v))
    return sorted((a, b) for a, b in packages.edges if a < b and packages.has_edge(b, a))


def test_no_two_packages_import_each_other():
    """Between two packages imports go one way (lazy ones included): a concept both need lives
    in the lower one."""
    pairs = mutual_imports(package_graph())
    assert not pairs, (f"packages that import each other: {pairs}; move what one takes from the other to where "
                       "both may import it")


def test_the_pair_check_catches_two_packages_importing_each_other():
    g = nx.DiGraph([("tvm_pesto.models", "tvm_pesto.zoo"), ("tvm_pesto.zoo.outside", "tvm_pesto.models"),
                    ("tvm_pesto.candidates.generate", "tvm_pesto.backends.base"),
                    ("tvm_pesto.backends.gpu.patterns", "tvm_pesto.graph.regions")])
    assert mutual_imports(g) == [("tvm_pesto.models", "tvm_pesto.zoo")]


def test_the_product_never_imports_the_lab():
    """The lab (``tvm_pesto_lab``) makes and judges the cost model and imports the product; the
    product never needs it: its verbs reach the CLI through an entry point
    (``tvm_pesto.cli.main.add_plugins``), not an import."""
    assert not (ROOT / "lab").exists(), "tvm_pesto/lab is back: the lab is the package lab/tvm_pesto_lab"
    importers = sorted(module_name(p) for p in ROOT.rglob("*.py")
                       if any(i.split(".")[0] == "tvm_pesto_lab" for i in imports_of(p)))
    assert not importers, f"{importers} import the lab; the product must install and run without it"


def test_the_lab_imports_no_private_name_of_the_product():
    bad = []
    for path in sorted(LAB.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "tvm_pesto":
                bad += [f"{path.name}: from {node.module} import {a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, bad


# -- imports inside functions ------------------------------------------------------------------------
#: Third-party modules slow to import or needed by one feature only: a function may import them
#: where it needs them without saying why.
HEAVY = {"tvm", "tvm_ffi", "torch", "onnx", "onnxruntime", "onnxscript", "ray", "openvino", "xgboost", "pulp",
         "highspy", "matplotlib", "scipy", "tensorrt", "cudnn", "cuda", "nvidia", "triton"}
LAZY_MARK = "# lazy:"


def function_imports(source: str) -> list[ast.stmt]:
    """The import statements inside the functions of ``source``."""
    out = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.extend(n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return sorted(set(out), key=lambda n: n.lineno)


def imports_heavy_only(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and node.module.split(".")[0] in HEAVY
    return all(alias.name.split(".")[0] in HEAVY for alias in node.names)


def unexplained_function_imports(source: str) -> list[int]:
    """Lines of the function-level imports of ``source`` that are neither of a :data:`HEAVY`
    module nor explained by a ``# lazy: <reason>`` comment. A comment explains the import on
    its line and the imports that follow it without a line between: it stands in the comment
    lines right above a run of imports, or on one of the run's lines up to this import's."""
    lines = source.splitlines()
    nodes = function_imports(source)
    ends = {n.end_lineno: n for n in nodes}

    def marked(first: int, last: int) -> bool:
        return any(LAZY_MARK in lines[i - 1] and lines[i - 1].split(LAZY_MARK, 1)[1].strip()
                   for i in range(max(first, 1), last + 1))

    bad = []
    for node in nodes:
        if imports_heavy_only(node):
            continue
        start = node
        while start.lineno - 1 in ends:  # back to the first import of the run
            start = ends[start.lineno - 1]
        above = start.lineno - 1
        while above > 1 and lines[above - 2].lstrip().startswith("#"):  # the comment block above the run
            above -= 1
        if not marked(above, node.end_lineno):
            bad.append(node.lineno)
    return bad


def test_every_import_inside_a_function_says_why():
    """An import belongs at the top of its module unless it must wait: a heavy optional library,
    or a module the importer should not load at import time (say which and why)."""
    bad = {}
    for path in sorted(ROOT.rglob("*.py")) + sorted(LAB.rglob("*.py")):
        lines = unexplained_function_imports(path.read_text())
        if lines:
            bad[str(path.relative_to((ROOT if path.is_relative_to(ROOT) else LAB).parent))] = lines
    assert not bad, (f"imports inside functions without a reason: {bad}; move each to the top of its module, or "
                     f"say why it waits with a '{LAZY_MARK} <reason>' comment on its line or the line above")


def test_the_lazy_import_check_reads_comments_and_blocks():
    source = '''
def f():
    import torch
    import os
    from . import a  # lazy: a loads torch
    from .b import c
    x = 1
    from .d import e


def g():
    # lazy: the registry imports backends on first use
    from .backends import get_backend
    from .candidates import x
    # lazy:
    from .plan import y


def h():
    # lazy: two lines of reason,
    # this one and the one above
    from .solve import z
'''
    assert unexplained_function_imports(source) == [4, 8, 16]
