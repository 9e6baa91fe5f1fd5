"""Size limits of the ``tvm_pesto`` sources and the cost-model lab's (``tvm_pesto_lab``): no module over 500 lines, no function or method
over 100 lines (``end_lineno - lineno + 1``, docstring included), except what
:data:`ALLOWED` names, each with the reason it stays whole; and at most
:data:`MAX_WIDE_FUNCTIONS` functions that take :data:`MAX_PARAMETERS` or more parameters
(every parameter but ``self``/``cls``, keyword-only ones included; ``*args``/``**kwargs``
not), each named in :data:`WIDE` with why (parameters that travel together are one record:
a frozen dataclass of the stage they configure).

A module that holds two concepts is split into two modules; a long function into steps with
names. An entry that no longer exceeds its limit fails the test too, so the list only shrinks.
"""
from __future__ import annotations

import ast
from pathlib import Path

import tvm_pesto
import tvm_pesto_lab

ROOT = Path(tvm_pesto.__file__).parent
LAB = Path(tvm_pesto_lab.__file__).parent
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100

#: ``path`` (a module) or ``path::qualified.name`` (a function), relative to the package
#: (``tvm_pesto_lab/...`` for the lab's), and why it may exceed its limit.
ALLOWED = {
}


MAX_PARAMETERS = 10
MAX_WIDE_FUNCTIONS = 5

#: ``path::qualified.name`` of the functions that may take :data:`MAX_PARAMETERS` or more
#: parameters, and why: the public Python API, whose keywords are what users call.
WIDE = {
    "placing.py::place": "tvm_pesto.place: the public entry point; each keyword is documented API",
    "api.py::build": "tvm_pesto.build: the public entry point; each keyword is documented API",
    "train/trainer.py::build_trainer": "tvm_pesto.train.build_trainer: the public training entry point",
    "costs/tune/tune.py::tune_model": "MetaSchedule tuning's public entry point (keyword-only options)",
}


def oversized(source: str, path: str) -> dict[str, int]:
    """What in ``source`` exceeds the limits: ``path`` for the module itself and
    ``path::qualified.name`` for each function or method, with its length in lines."""
    out = {}
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        out[path] = lines

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                length = child.end_lineno - child.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    out[f"{path}::{name}"] = length
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(source, path), "")
    return out


def package_sizes() -> dict[str, int]:
    """:func:`oversized` over every module of the imported package and of the lab."""
    out = {}
    for file in sorted(ROOT.rglob("*.py")):
        out.update(oversized(file.read_text(encoding="utf-8"), file.relative_to(ROOT).as_posix()))
    for file in sorted(LAB.rglob("*.py")):
        out.update(oversized(file.read_text(encoding="utf-8"), file.relative_to(LAB.parent).as_posix()))
    return out


def wide(source: str, path: str) -> dict[str, int]:
    """``path::qualified.name`` -> parameters of every function in ``source`` that takes
    :data:`MAX_PARAMETERS` or more (``self``/``cls`` not counted)."""
    out = {}

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                k = len(names) - (1 if names and names[0] in ("self", "cls") else 0)
                if k >= MAX_PARAMETERS:
                    out[f"{path}::{prefix}{child.name}"] = k
                walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(source, path), "")
    return out


def package_wide() -> dict[str, int]:
    """:func:`wide` over every module of the imported package and of the lab."""
    out = {}
    for file in sorted(ROOT.rglob("*.py")):
        out.update(wide(file.read_text(encoding="utf-8"), file.relative_to(ROOT).as_posix()))
    for file in sorted(LAB.rglob("*.py")):
        out.update(wide(file.read_text(encoding="utf-8"), file.relative_to(LAB.parent).as_posix()))
    return out


def test_at_most_five_functions_take_ten_or_more_parameters():
    found = package_wide()
    assert len(WIDE) <= MAX_WIDE_FUNCTIONS
    extra = {k: v for k, v in found.items() if k not in WIDE}
    assert not extra, (f"functions with {MAX_PARAMETERS} or more parameters: {extra}; group the parameters that "
                       "travel together into a frozen dataclass of the stage they configure (or pass the object "
                       "they come from)")


def test_every_wide_entry_still_takes_that_many():
    stale = sorted(set(WIDE) - set(package_wide()))
    assert not stale, f"{stale} take fewer than {MAX_PARAMETERS} parameters now (or are gone): remove them from WIDE"


def test_a_wide_function_is_found_and_self_and_star_args_are_not_counted():
    ten = ", ".join(f"a{i}" for i in range(MAX_PARAMETERS))
    nine = ", ".join(f"a{i}" for i in range(MAX_PARAMETERS - 1))
    source = (f"def f({ten}):\n    pass\n\n\nclass C:\n    def m(self, {nine}, *args, **kwargs):\n        pass\n"
              f"\n    def k(self, {nine}, *, b=1):\n        pass\n")
    assert wide(source, "pkg/w.py") == {"pkg/w.py::f": MAX_PARAMETERS, "pkg/w.py::C.k": MAX_PARAMETERS}


def test_nothing_exceeds_the_limits_unless_allowed():
    found = package_sizes()
    over = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not over, (f"over {MAX_MODULE_LINES} lines per module or {MAX_FUNCTION_LINES} per function: {over}; "
                      "split the module by concept or the function into named steps (or, if it must stay "
                      "whole, add it to ALLOWED in tests/test_code_size.py with the reason)")


def test_every_allowed_entry_still_exceeds_its_limit():
    found = package_sizes()
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"{stale} are within the limits now (or gone): remove them from ALLOWED"


def test_every_allowed_entry_says_why():
    assert all(isinstance(why, str) and why.strip() for why in ALLOWED.values())


def test_a_long_module_and_a_long_method_are_reported():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    source = (f"class Long:\n    def method(self):\n{'    ' + body.replace(chr(10), chr(10) + '    ')}\n"
              f"        return 0\n\n\ndef short():\n    return 1\n")
    source += "\n" * (MAX_MODULE_LINES - len(source.splitlines()) + 1)
    found = oversized(source, "pkg/long.py")
    assert found == {"pkg/long.py": MAX_MODULE_LINES + 1, "pkg/long.py::Long.method": MAX_FUNCTION_LINES + 2}


def test_a_function_at_the_limit_passes():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    assert oversized(f"def f():\n{body}\n", "pkg/ok.py") == {}
