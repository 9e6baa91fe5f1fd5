"""The placement solvers by name: ``SOLVERS``, :func:`get_solver`, :func:`solve`.

The heuristics of :mod:`tvm_pesto.solve.portfolio` and ``ilp``, which is imported from
:mod:`tvm_pesto.solve.ilp` on first use, so the heuristics work without PuLP.

Examples
--------
>>> from tvm_pesto.solve.registry import SOLVERS
>>> sorted(SOLVERS)
['heft', 'ilp', 'm-etf', 'm-sct', 'm-topo', 'single']
"""
from __future__ import annotations

import importlib
from typing import Callable

from ..errors import SolverError
from ..plan.plan import Plan
from ..plan.problem import Problem
from .portfolio import HEURISTIC_SOLVERS


def _ilp(problem: Problem, **options) -> Plan:
    """The ILP solver of :mod:`tvm_pesto.solve.ilp`, imported on first use."""
    try:
        mod = importlib.import_module(".ilp", __package__)
    except ImportError as err:
        raise SolverError(f"ilp solver not available ({err}); use one of the heuristics: "
                          f"{', '.join(n for n in SOLVERS if n != 'ilp')}") from None
    fn = getattr(mod, "solve", None)
    if fn is None:
        raise SolverError("ilp solver not available (tvm_pesto.solve.ilp has no solve function)")
    return fn(problem, **options)


SOLVERS: dict[str, Callable[..., Plan]] = {**HEURISTIC_SOLVERS, "ilp": _ilp}
HEURISTICS = tuple(HEURISTIC_SOLVERS)


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


def solve(problem: Problem, name: str = "heft", deterministic: bool | None = None, **options) -> Plan:
    """Run the solver called ``name`` on ``problem``.

    ``deterministic`` goes to the solvers with budgets (``ilp``: work budgets instead of
    wall-clock ones, see :mod:`tvm_pesto.solve.budget`); the heuristics are deterministic
    anyway. Default: the ambient mode.

    Examples
    --------
    >>> # plan = solve(problem, "ilp", deterministic=True)
    """
    fn = get_solver(name)
    if deterministic is not None and fn is _ilp:
        options["deterministic"] = deterministic
    return fn(problem, **options)


__all__ = ["HEURISTICS", "SOLVERS", "get_solver", "solve"]
