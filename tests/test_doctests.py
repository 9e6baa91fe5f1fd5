"""Every docstring example in the ``tvm_pesto`` package and the cost-model lab
(``tvm_pesto_lab``) runs and prints what it shows.

The modules are those of the *imported* package (the installed one, or the source tree when
``PYTHONPATH`` points there), so the examples see the C++ core library that only an install
(or ``TVM_PESTO_CORE_LIB``) provides; ``pytest --doctest-modules tvm_pesto`` would import the
source-tree copy instead. One test per module that has examples, run in a fresh temporary
folder, which is also where the examples' ``tempfile.mkdtemp()`` folders go.

A module that imports an optional dependency (the ``gpu`` or ``distributed`` extra) at import
time is skipped with the missing module named, when that dependency is not installed; any other
import error fails. Examples marked ``# doctest: +SKIP`` need a GPU, a server or minutes.
"""
import doctest
import importlib
import os
import pkgutil
import tempfile

import pytest

import tvm_pesto
import tvm_pesto_lab

OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

# Top-level modules of the optional extras in pyproject.toml (gpu, distributed): a tvm_pesto
# module that cannot be imported because one of these is missing is skipped, not failed.
# (openvino: the optional peer of tvm_pesto.bench.peers.)
OPTIONAL_DEPENDENCIES = {"cuda", "tensorrt", "cudnn", "nvidia", "ray", "tornado", "openvino"}


def package_modules(package=tvm_pesto):
    """Names of every module of the imported ``package`` whose source holds ``>>>``.

    Walks the package folders without importing the modules (an import error then fails the
    module's own test, not the collection of this file).
    """
    names = []

    def walk(path, prefix):
        for info in pkgutil.iter_modules(path, prefix):
            spec = info.module_finder.find_spec(info.name.rsplit(".", 1)[-1])
            if spec is None or spec.origin is None:
                continue
            if info.ispkg:
                walk(spec.submodule_search_locations, info.name + ".")
            if spec.origin.endswith(".py"):
                with open(spec.origin, encoding="utf-8") as f:
                    if ">>>" in f.read():
                        names.append(info.name)

    with open(package.__file__, encoding="utf-8") as f:
        if ">>>" in f.read():
            names.append(package.__name__)
    walk(package.__path__, package.__name__ + ".")
    return sorted(names)


MODULES = package_modules() + package_modules(tvm_pesto_lab)


def missing_optional(err: ModuleNotFoundError):
    """The optional dependency whose absence ``err`` reports, else None."""
    missing = (err.name or "").split(".")[0]
    return missing if missing in OPTIONAL_DEPENDENCIES else None


def import_module(name):
    """Import ``name``; skip the test when an optional dependency is missing."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if missing_optional(err):
            pytest.skip(f"{name} needs the optional dependency {missing_optional(err)!r}, which is not installed")
        raise


def module_doctests(module):
    """The doctests of ``module`` that hold at least one example."""
    return [t for t in doctest.DocTestFinder(exclude_empty=True).find(module) if t.examples]


def runnable(example):
    """Whether ``example`` runs (it is not marked ``+SKIP``)."""
    return not example.options.get(doctest.SKIP, False)


def test_the_package_has_doctests():
    assert MODULES, f"found no module with a '>>>' example under {tvm_pesto.__path__}"
    total = 0
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if missing_optional(err):
                continue  # its own test is skipped with the reason
            raise
        total += sum(runnable(e) for t in module_doctests(module) for e in t.examples)
    assert total > 0, "the package's docstrings hold no example that runs"


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name, tmp_path, monkeypatch):
    module = import_module(name)
    tests = module_doctests(module)
    examples = sum(len(t.examples) for t in tests)
    assert examples, (f"{name} has '>>>' in its source but doctest finds no example in it: "
                      "an example in a comment or in a string that is not a docstring never runs")
    if not any(runnable(e) for t in tests for e in t.examples):
        # a benchmark's examples take minutes (all marked +SKIP): each must still be valid Python
        for t in tests:
            for e in t.examples:
                compile(e.source, f"{t.name} (line {t.lineno + e.lineno + 1})", "exec")
        return
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the examples' tempfile.mkdtemp() folders
    environ = dict(os.environ)  # an example that sets a variable must not leak it to later tests
    report = []
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    try:
        for test in tests:
            runner.run(test, out=report.append)
    finally:
        os.environ.clear()
        os.environ.update(environ)
    failed, attempted = runner.summarize(verbose=False)
    assert attempted > 0
    assert failed == 0, f"{failed} of {attempted} examples of {name} failed:\n" + "".join(report)
