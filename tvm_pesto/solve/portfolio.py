"""The placement heuristics as a portfolio: run them all, keep the best simulated plan.

The ILP takes the best heuristic plan as its warm start (and upper bound), the coarse ILP
compares against it on the fine graph. The heuristics are imported directly (not through
the registry in :mod:`tvm_pesto.solve`, which is built from :data:`HEURISTIC_SOLVERS`).

Examples
--------
>>> from tvm_pesto.solve.portfolio import HEURISTIC_SOLVERS
>>> list(HEURISTIC_SOLVERS)
['single', 'heft', 'm-topo', 'm-etf', 'm-sct']
"""
from __future__ import annotations

from typing import Callable

from ..errors import PestoError
from ..plan.plan import Plan
from ..plan.problem import Problem
from ..plan.simulate import simulate
from . import heft, metf, msct, mtopo, single

HEURISTIC_SOLVERS: dict[str, Callable[..., Plan]] = {
    "single": single.solve,
    "heft": heft.solve,
    "m-topo": mtopo.solve,
    "m-etf": metf.solve,
    "m-sct": msct.solve,
}


def best_heuristic_plan(problem: Problem, exclude: tuple[str, ...] = ()) -> tuple[Plan | None, dict]:
    """The best memory-feasible plan among the heuristics (smallest simulated makespan; the
    first in :data:`HEURISTIC_SOLVERS` order on a tie).

    A heuristic that fails (no memory-feasible plan, a missing LP solver for m-sct) is
    skipped. Returns ``(plan, makespans)``: ``plan`` is None when every heuristic failed,
    ``makespans`` maps each heuristic that succeeded to its simulated makespan.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> plan, spans = best_heuristic_plan(problem)
    >>> spans[plan.solver] == min(spans.values())
    True
    """
    best, spans = None, {}
    for name, fn in HEURISTIC_SOLVERS.items():
        if name in exclude:
            continue
        try:
            plan = fn(problem)
        except Exception:  # noqa: BLE001 - one failing heuristic must not stop the others
            continue
        try:
            span = simulate(problem, plan).makespan
        except PestoError:
            continue
        spans[name] = span
        if best is None or span < spans[best[0]]:
            best = (name, plan)
    return (best[1] if best else None), spans


__all__ = ["HEURISTIC_SOLVERS", "best_heuristic_plan"]
