"""The data folders shipped with tvm-pesto, found in the installed package or the source checkout,
and the user's cache folder (:func:`cache_root`).

The repository's top-level data folders (``cost_models/``, ``benchmarks/``) travel in the wheel
as package data: the CMake install rules (``CMakeLists.txt``) put them into ``tvm_pesto/`` (see
``pyproject.toml``, ``[tool.scikit-build]``). So a folder ``NAME`` is looked for in the
installed package first (``<package>/NAME``), then in the source checkout (``<package>/../NAME``,
where a checkout or an editable install sees the live folder rather than a copy made at install
time), then in the other folders of the package's ``__path__`` (an editable install's
site-packages copy).

Examples
--------
>>> from tvm_pesto.package_data import data_dirs
>>> dirs = data_dirs("cost_models")
>>> dirs[0].parent.name, dirs[1] == dirs[0].parent.parent / "cost_models"
('tvm_pesto', True)
"""
from __future__ import annotations

import os
from pathlib import Path

import tvm_pesto


def data_dirs(name: str) -> list[Path]:
    """The places a shipped data folder ``name`` may be, in search order, without duplicates
    (they need not exist).

    Parameters
    ----------
    name : str
        A top-level data folder of the repository, e.g. ``"cost_models"`` or ``"benchmarks"``.
    """
    pkg = Path(tvm_pesto.__file__).resolve().parent
    dirs = [pkg / name, pkg.parent / name]
    dirs += [Path(extra) / name for extra in getattr(tvm_pesto, "__path__", [])]
    out: list[Path] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


def cache_root() -> Path:
    """The folder of what tvm-pesto keeps between runs on this machine (measurements, machine
    figures, TensorRT engines, large exports): ``$TVM_PESTO_CACHE``, else ``tvm-pesto`` in
    ``$XDG_CACHE_HOME`` (default ``~/.cache``). It need not exist.

    Examples
    --------
    >>> import os
    >>> from tvm_pesto.package_data import cache_root
    >>> os.environ["TVM_PESTO_CACHE"] = "/var/tmp/pesto-cache"
    >>> str(cache_root())
    '/var/tmp/pesto-cache'
    >>> del os.environ["TVM_PESTO_CACHE"]
    """
    root = os.environ.get("TVM_PESTO_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "tvm-pesto"


__all__ = ["cache_root", "data_dirs"]
