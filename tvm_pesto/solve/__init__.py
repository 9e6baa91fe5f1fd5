"""Stage 4: placement solvers. Each is ``solve(problem, **options) -> Plan``.

``SOLVERS`` maps a name to its solve function. ``ilp`` is looked up lazily in
:mod:`tvm_pesto.solve.ilp`, so the heuristics work without it.

Examples
--------
>>> from tvm_pesto.solve import SOLVERS, get_solver
>>> sorted(SOLVERS)
['heft', 'ilp', 'm-etf', 'm-sct', 'm-topo', 'single']
"""
from __future__ import annotations

import importlib
from typing import Callable

from ..errors import SolverError
from ..plan.plan import Plan
from ..plan.problem import Problem
from . import heft, metf, msct, mtopo, single
from .bounds import lower_bound


def _ilp(problem: Problem, **options) -> Plan:
    """The ILP solver of :mod:`tvm_pesto.solve.ilp`, imported on first use."""
    try:
        mod = importlib.import_module(f"{__name__}.ilp")
    except ImportError as err:
        raise SolverError(f"ilp solver not available ({err}); use one of the heuristics: "
                          f"{', '.join(n for n in SOLVERS if n != 'ilp')}") from None
    fn = getattr(mod, "solve", None)
    if fn is None:
        raise SolverError("ilp solver not available (tvm_pesto.solve.ilp has no solve function)")
    return fn(problem, **options)


SOLVERS: dict[str, Callable[..., Plan]] = {
    "single": single.solve,
    "heft": heft.solve,
    "m-topo": mtopo.solve,
    "m-etf": metf.solve,
    "m-sct": msct.solve,
    "ilp": _ilp,
}
HEURISTICS = ("single", "heft", "m-topo", "m-etf", "m-sct")


def get_solver(name: str) -> Callable[..., Plan]:
    """The solve function called ``name``.

    Raises
    ------
    SolverError
        If no solver has that name; the message lists the known names.

    Examples
    --------
    >>> get_solver("heft").__module__
    'tvm_pesto.solve.heft'
    """
    key = name.strip().lower() if isinstance(name, str) else name
    key = {"mtopo": "m-topo", "metf": "m-etf", "msct": "m-sct"}.get(key, key)
    try:
        return SOLVERS[key]
    except (KeyError, TypeError):
        raise SolverError(f"unknown solver {name!r}; known solvers: {', '.join(SOLVERS)}") from None


def solve(problem: Problem, name: str = "heft", **options) -> Plan:
    """Run the solver called ``name`` on ``problem``.

    Examples
    --------
    >>> # plan = solve(problem, "m-etf")
    """
    return get_solver(name)(problem, **options)


__all__ = ["SOLVERS", "HEURISTICS", "get_solver", "solve", "lower_bound"]
