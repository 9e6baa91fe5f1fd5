"""Size limits of the ``tvm_pesto`` sources and the cost-model lab's (``tvm_pesto_lab``): no module over 500 lines, no function or method
over 100 lines (``end_lineno - lineno + 1``, docstring included), except what
:data:`ALLOWED` names, each with the reason it stays whole.

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
