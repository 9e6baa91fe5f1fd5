"""tvm-pesto: place Relax graphs across devices and backends, jointly, by cost.

The data path is the package layout: ``graph`` -> ``candidates`` -> ``costs`` -> ``solve``
(with ``plan``) -> ``builder`` -> ``run``. :func:`build` walks all of it in one call,
:class:`PlacementPass` inside a TVM compile flow; :func:`load` runs an exported bundle
with TVM's runtime only.

Names are imported on first use, so ``import tvm_pesto; tvm_pesto.load(path)`` never
loads TVM's compiler (a deployed bundle runs with ``TVM_USE_RUNTIME_LIB=1``).
"""
from __future__ import annotations

import importlib

from .errors import PestoError

__version__ = "0.1.0"

#: public name -> (module, attribute), imported lazily
_LAZY = {
    "Analysis": ("api", "Analysis"),
    "Placement": ("api", "Placement"),
    "PlacementPass": ("api", "PlacementPass"),
    "analyze": ("api", "analyze"),
    "build": ("api", "build"),
    "calibrate_machine": ("api", "calibrate_machine"),
    "make_candidates": ("api", "make_candidates"),
    "estimate_costs": ("api", "estimate_costs"),
    "place": ("api", "place"),
    "from_torch": ("frontend", "from_torch"),
    "from_onnx": ("frontend", "from_onnx"),
    "Constraints": ("constraints", "Constraints"),
    "Cluster": ("cluster", "Cluster"),
    "Device": ("cluster", "Device"),
    "parse_cluster": ("cluster", "parse_cluster"),
    "JointProblem": ("plan", "JointProblem"),
    "Plan": ("plan", "Plan"),
    "Problem": ("plan", "Problem"),
    "simulate": ("plan", "simulate"),
    "load": ("run.bundle.load", "load"),
}


def __getattr__(name: str):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'tvm_pesto' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{module}", __name__), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


__all__ = ["PestoError", *_LAZY]
