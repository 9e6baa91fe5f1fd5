"""The placement heuristics as a portfolio: run them all, keep the best simulated plan.

The ILP takes the best heuristic plan as its warm start (and upper bound), the coarse ILP
compares against it on the fine graph. The heuristics are imported directly (not through
the registry in :mod:`tvm_pesto.solve`, which is built from :data:`HEURISTIC_SOLVERS`).

Examples
--------
>>> from tvm_pesto.solve.heuristics.portfolio import HEURISTIC_SOLVERS
>>> list(HEURISTIC_SOLVERS)
['single', 'heft', 'm-topo', 'm-etf', 'm-sct']
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Callable

from ...errors import PestoError, error_line
from ...plan.plan import Plan
from ...plan.problem import Problem
from ...plan.simulate import simulate
from . import heft, metf, msct, mtopo, single

HEURISTIC_SOLVERS: dict[str, Callable[..., Plan]] = {
    "single": single.solve,
    "heft": heft.solve,
    "m-topo": mtopo.solve,
    "m-etf": metf.solve,
    "m-sct": msct.solve,
}

log = logging.getLogger(__name__)


@dataclass
class HeuristicRuns:
    """What every heuristic gave on one problem.

    Attributes
    ----------
    plans : dict
        Heuristic name -> ``(plan, simulation)`` for each memory-feasible plan, in
        :data:`HEURISTIC_SOLVERS` order.
    errors : dict
        Heuristic name -> ``"Type: message"`` for each heuristic that raised or whose plan
        did not simulate (``plan.info["heuristic_errors"]`` of the ILP).
    """

    plans: dict = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def makespans(self) -> dict[str, float]:
        """Heuristic name -> simulated makespan (seconds)."""
        return {k: sim.makespan for k, (_, sim) in self.plans.items()}

    def best(self, score: Callable | None = None) -> Plan | None:
        """The plan with the smallest ``score(simulation)`` (default: the makespan; the first
        on a tie), or None when no heuristic gave one."""
        score = score or (lambda sim: sim.makespan)
        best, best_v = None, None
        for plan, sim in self.plans.values():
            v = score(sim)
            if best_v is None or v < best_v:
                best, best_v = plan, v
        return best


def run_heuristics(problem: Problem, exclude: tuple[str, ...] = ()) -> HeuristicRuns:
    """Run every heuristic of :data:`HEURISTIC_SOLVERS` (but ``exclude``) and simulate its plan.

    A heuristic that fails does not stop the others; it is named in ``errors``. An expected
    failure (a :class:`~tvm_pesto.errors.PestoError`: no memory-feasible plan, a missing LP
    solver for m-sct) is logged at INFO; any other exception is a bug: a ``RuntimeWarning``
    names the heuristic and the exception (its traceback is logged at DEBUG).

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> runs = run_heuristics(dnn_like_problem(12, cluster="2xV100-nvlink"))   # 12 ops, 2 GPUs
    >>> list(runs.plans), runs.errors
    (['single', 'heft', 'm-topo', 'm-etf', 'm-sct'], {})
    """
    runs = HeuristicRuns()
    for name, fn in HEURISTIC_SOLVERS.items():
        if name in exclude:
            continue
        try:
            plan = fn(problem)
            sim = simulate(problem, plan)
        except PestoError as e:
            runs.errors[name] = error_line(e)
            log.info("heuristic %s gave no plan for %s: %s", name, problem.graph.name, runs.errors[name])
            continue
        except Exception as e:  # noqa: BLE001 - one failing heuristic must not stop the others; said below
            runs.errors[name] = error_line(e)
            log.debug("heuristic %s failed on %s", name, problem.graph.name, exc_info=True)
            warnings.warn(f"heuristic {name!r} failed on {problem.graph.name} ({runs.errors[name]}); the other "
                          "heuristics' plans are used", RuntimeWarning, stacklevel=2)
            continue
        runs.plans[name] = (plan, sim)
    return runs


def best_heuristic_plan(problem: Problem, exclude: tuple[str, ...] = ()) -> tuple[Plan | None, dict]:
    """The best memory-feasible plan among the heuristics (smallest simulated makespan; the
    first in :data:`HEURISTIC_SOLVERS` order on a tie).

    A heuristic that fails is skipped and said (:func:`run_heuristics`). Returns
    ``(plan, makespans)``: ``plan`` is None when every heuristic failed, ``makespans`` maps
    each heuristic that succeeded to its simulated makespan.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> plan, spans = best_heuristic_plan(problem)
    >>> spans[plan.solver] == min(spans.values())
    True
    """
    runs = run_heuristics(problem, exclude)
    return runs.best(), runs.makespans


__all__ = ["HEURISTIC_SOLVERS", "HeuristicRuns", "best_heuristic_plan", "run_heuristics"]
