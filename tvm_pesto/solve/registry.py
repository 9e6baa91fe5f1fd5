"""The placement solvers by name: ``SOLVERS``, :func:`get_solver`, :func:`solve`.

The heuristics of :mod:`tvm_pesto.solve.heuristics.portfolio`, ``ilp``, which is imported from
:mod:`tvm_pesto.solve.placement_ilp.driver` on first use, so the heuristics work without PuLP, and
``stage-dp``, the contiguous-split DP of :mod:`tvm_pesto.solve.stage.dp`.

:func:`solve` takes the execution model and objective (:mod:`tvm_pesto.plan.objective`):
``ilp`` and ``stage-dp`` optimise for them; a heuristic's plan is turned into a stage plan
in the stage model (:func:`tvm_pesto.solve.stage.dp.as_stage_plan`).

Examples
--------
>>> from tvm_pesto.solve.registry import SOLVERS
>>> sorted(SOLVERS)
['auto', 'heft', 'ilp', 'm-etf', 'm-sct', 'm-topo', 'single', 'stage-dp']
"""
from __future__ import annotations

import importlib
from typing import Callable

from ..errors import SolverError
from ..plan.objective import check_choice
from ..plan.plan import Plan
from ..plan.problem import Problem
from .heuristics.portfolio import HEURISTIC_SOLVERS


def _ilp(problem: Problem, **options) -> Plan:
    """The ILP solver of :mod:`tvm_pesto.solve.placement_ilp.driver`, imported on first use."""
    try:
        mod = importlib.import_module(".placement_ilp.driver", __package__)
    except ImportError as err:
        raise SolverError(f"ilp solver not available ({err}); use one of the heuristics: "
                          f"{', '.join(n for n in SOLVERS if n != 'ilp')}") from None
    fn = getattr(mod, "solve", None)
    if fn is None:
        raise SolverError("ilp solver not available (tvm_pesto.solve.placement_ilp.driver has no solve function)")
    return fn(problem, **options)


def _auto(problem: Problem, **options) -> Plan:
    """``auto`` on a placement problem: the ILP, started from the best heuristic (so never
    worse than one); ``info["decided_by"]`` names where its plan came from."""
    plan = _ilp(problem, **options)
    plan.solver = "auto"
    plan.info["decided_by"] = str(plan.info.get("source") or "ilp")
    return plan


def _stage_dp(problem: Problem, **options) -> Plan:
    """The contiguous-split DP of :mod:`tvm_pesto.solve.stage.dp`."""
    # lazy: the registry imports a solver's module when that solver is asked for
    from .stage.dp import solve as dp_solve

    return dp_solve(problem, **options)


#: ``auto`` on a placement problem (a fixed cover, a graph file) is the ILP, which starts from
#: the best heuristic; on a joint problem :func:`tvm_pesto.solve.joint.solver.solve_joint` runs its own
#: ``auto`` (every heuristic, the joint ILPs).
SOLVERS: dict[str, Callable[..., Plan]] = {**HEURISTIC_SOLVERS, "ilp": _ilp, "stage-dp": _stage_dp, "auto": _auto}
HEURISTICS = tuple(HEURISTIC_SOLVERS)
#: Solvers that optimise for the model and objective they are given (the others place for
#: latency in the op model; their plans are then judged, or made stage plans, as asked).
MODEL_AWARE = ("ilp", "stage-dp", "auto")


def get_solver(name: str) -> Callable[..., Plan]:
    """The solve function called ``name``.

    Raises
    ------
    SolverError
        If no solver has that name; the message lists the known names.

    Examples
    --------
    >>> get_solver("heft").__module__
    'tvm_pesto.solve.heuristics.heft'
    """
    key = name.strip().lower() if isinstance(name, str) else name
    key = {"mtopo": "m-topo", "metf": "m-etf", "msct": "m-sct", "dp": "stage-dp"}.get(key, key)
    try:
        return SOLVERS[key]
    except (KeyError, TypeError):
        raise SolverError(f"unknown solver {name!r}; known solvers: {', '.join(SOLVERS)}") from None


def solve(problem: Problem, name: str = "heft", deterministic: bool | None = None, model: str = "op",
          objective: str = "latency", microbatches: int | None = None, **options) -> Plan:
    """Run the solver called ``name`` on ``problem`` for ``objective`` in ``model``
    (:mod:`tvm_pesto.plan.objective`; ``microbatches=None``: steady state).

    ``deterministic`` goes to the solvers with budgets (``ilp``: work budgets instead of
    wall-clock ones, see :mod:`tvm_pesto.solve.budget`); the heuristics and the DP are
    deterministic anyway. Default: the ambient mode. The plan's ``info`` gets ``model``,
    ``objective`` and ``microbatches``.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(8, cluster="2xV100-nvlink")   # 8 ops, 2 GPUs
    >>> plan = solve(problem, "ilp", deterministic=True)
    >>> plan.info["deterministic"], plan.info["objective"]
    (True, 'latency')
    >>> plan = solve(problem, "stage-dp", model="stage", objective="throughput")
    >>> plan.info["model"], plan.info["objective"]
    ('stage', 'throughput')
    """
    fn = get_solver(name)
    model, objective, microbatches = check_choice(model, objective, microbatches)
    key = next(k for k, v in SOLVERS.items() if v is fn)
    if deterministic is not None and key in MODEL_AWARE:
        options["deterministic"] = deterministic
    if key in ("ilp", "auto") and (model, objective) != ("op", "latency"):
        options.update(model=model, objective=objective, microbatches=microbatches)
    elif key == "stage-dp":
        options.update(objective=objective, microbatches=microbatches)
    if model == "stage" and key not in MODEL_AWARE:
        # lazy: the registry imports a solver's module when that solver is asked for
        from .stage.dp import heuristic_stage_plan

        plan = heuristic_stage_plan(problem, fn, objective, microbatches, **options)
    else:
        plan = fn(problem, **options)
    plan.info.update(model=model, objective=objective, microbatches=microbatches)
    return plan


__all__ = ["HEURISTICS", "MODEL_AWARE", "SOLVERS", "get_solver", "solve"]
