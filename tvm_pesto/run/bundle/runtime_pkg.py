"""TVM's Python package without its compiler: what a machine without TVM needs to run modules.

An exported module (``export_library``) runs with TVM's runtime alone: ``TVM_USE_RUNTIME_LIB=1``,
``tvm.runtime.load_module`` and ``tvm.runtime.vm.VirtualMachine``. The installed ``tvm`` package
is 305 MB, almost all of it ``lib/libtvm_compiler.so`` and ``3rdparty/``; without them, without
``__pycache__`` and without the top-level folders that only building needs (C++ sources and
headers, the WebAssembly runtime's sources, CMake files) it is about 13 MB and keeps
``libtvm_runtime.so`` and ``libtvm_runtime_cuda.so``. :func:`copy_runtime_package` makes that
copy. It locates TVM without
importing it and imports nothing of TVM's compiler, so it runs anywhere.

Used by ``tests/gpu/device_check.py --prepare`` (the folder carried to the lent GPU machine)
and by the runtime-only fixture of ``tests/test_deploy.py``.

Examples
--------
>>> from tvm_pesto.run.bundle.runtime_pkg import copy_runtime_package
>>> import os, tempfile
>>> rt = os.path.join(tempfile.mkdtemp(), "rt")
>>> pkg = copy_runtime_package(rt)
>>> pkg.name, (pkg / "lib" / "libtvm_compiler.so").exists()
('tvm', False)
>>> # TVM_USE_RUNTIME_LIB=1 PYTHONPATH=$rt python -c "import tvm.runtime.vm"
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from ...errors import BuildError

#: What the copy leaves out (``shutil.ignore_patterns`` globs, matched on every level).
EXCLUDED = ("libtvm_compiler*", "3rdparty", "__pycache__")
#: Top-level folders of the package the copy leaves out: only building reads them (C++ sources,
#: headers, the WebAssembly runtime's sources, CMake package files); nothing imports them.
EXCLUDED_TOP = ("src", "include", "web", "cmake", "lib64")

#: Libraries the copy must hold for loading and running CPU and CUDA modules.
RUNTIME_LIBS = ("libtvm_runtime.so", "libtvm_runtime_cuda.so")


def installed_tvm_dir() -> Path:
    """The folder of the installed ``tvm`` package, found without importing it.

    Raises
    ------
    BuildError
        When no ``tvm`` package is importable.

    Examples
    --------
    >>> installed_tvm_dir().name
    'tvm'
    """
    spec = importlib.util.find_spec("tvm")
    if spec is None or not spec.origin:
        raise BuildError("the tvm package is not installed here; install apache-tvm==0.27.0.post1 to copy its runtime")
    return Path(spec.origin).resolve().parent


def copy_runtime_package(dest, src=None) -> Path:
    """Copy TVM's Python package without its compiler into ``dest/tvm``.

    Parameters
    ----------
    dest : str or os.PathLike
        The folder to put on ``PYTHONPATH`` (created; ``dest/tvm`` must not exist yet).
    src : str or os.PathLike, optional
        A ``tvm`` package folder (default: the installed one).

    Returns
    -------
    pathlib.Path
        ``dest/tvm``.

    Raises
    ------
    BuildError
        When the source has no runtime library, the target exists, or the copy fails.

    Examples
    --------
    >>> import tempfile
    >>> pkg = copy_runtime_package(tempfile.mkdtemp())
    >>> sorted(p.name for p in (pkg / "lib").glob("libtvm_runtime*"))
    ['libtvm_runtime.so', 'libtvm_runtime_cuda.so', 'libtvm_runtime_extra.so']
    """
    src = Path(src) if src is not None else installed_tvm_dir()
    missing = [n for n in RUNTIME_LIBS if not (src / "lib" / n).is_file()]
    if missing:
        raise BuildError(f"{src} has no lib/{', lib/'.join(missing)}: it is not a complete TVM 0.27 package "
                         "(reinstall apache-tvm==0.27.0.post1)")
    target = Path(dest) / "tvm"
    if target.exists():
        raise BuildError(f"{target} already exists; give an empty folder or remove it first")
    os.makedirs(dest, exist_ok=True)
    try:
        shutil.copytree(src, target, ignore=_ignore(src))
    except OSError as e:
        raise BuildError(f"copying TVM's runtime package from {src} to {target} failed: {e}") from e
    return target


def _ignore(src: Path):
    """``copytree``'s ignore function: :data:`EXCLUDED` everywhere, :data:`EXCLUDED_TOP` in ``src``."""
    everywhere = shutil.ignore_patterns(*EXCLUDED)
    top = os.path.realpath(src)

    def ignore(folder, names):
        out = set(everywhere(folder, names))
        if os.path.realpath(folder) == top:
            out |= set(EXCLUDED_TOP) & set(names)
        return out

    return ignore


def tree_bytes(path) -> int:
    """Total size in bytes of the files under ``path`` (links not followed).

    Examples
    --------
    >>> tree_bytes(installed_tvm_dir()) > 10_000_000
    True
    """
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


__all__ = ["EXCLUDED", "EXCLUDED_TOP", "RUNTIME_LIBS", "copy_runtime_package", "installed_tvm_dir", "tree_bytes"]
