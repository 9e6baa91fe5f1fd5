"""The registry's ``"ilp"`` solver: coarsen when the graph is large, solve the placement MIP,
expand, and polish the plan with local search.

This module only orchestrates. The MIP itself (one problem -> one MIP -> a plan) is
:mod:`tvm_pesto.solve.ilp_model`, coarsening :mod:`tvm_pesto.solve.coarsen`, the local search
:mod:`tvm_pesto.solve.refine` and the cheap lower bounds that stop it early
:mod:`tvm_pesto.solve.bounds` / :mod:`tvm_pesto.solve.comm_bounds`.

Examples
--------
>>> from tvm_pesto.solve.ilp import solve  # doctest: +SKIP
>>> plan = solve(problem, target=40, time_limit_s=5)  # doctest: +SKIP
>>> plan.info["status"], plan.info["source"]  # doctest: +SKIP
('optimal', 'ilp+refine')
"""
from __future__ import annotations

import time

import numpy as np

from ..plan import Plan, Problem
from .bounds import lower_bound
from .budget import combine, mode_name
from .coarsen import solve_coarse_ilp
from .comm_bounds import path_memory_bound
from .ilp_model import solve_ilp
from .refine import critical_path_splits, polish


def solve(problem: Problem, target: int = 40, time_limit_s: float = 3.0, refine_s: float | None = None,
          deterministic: bool | None = None, **opts) -> Plan:
    """Registry entry point for ``"ilp"``: solve directly when the graph has at most
    ``target`` nodes, else coarsen to ``target`` supernodes, solve and expand; then polish the
    plan on the full graph for up to ``refine_s`` seconds (default: ``time_limit_s``; 0 turns
    it off): :func:`tvm_pesto.solve.refine.polish` from the ILP's plan and from
    :func:`~tvm_pesto.solve.refine.critical_path_splits`. ``info["refine"]`` says what it
    did; ``info["source"]`` ends in ``+refine`` when it helped.

    ``info["status"]`` (direct solve) or ``info["coarse_status"]`` (coarsened graph) is the
    MIP's real outcome, see :func:`~tvm_pesto.solve.ilp_model.solve_ilp`; a coarse
    ``optimal`` is optimal for the supernode graph only, so a coarsened solve carries no
    top-level ``status``.

    ``deterministic`` replaces both wall-clock budgets by work budgets (the MIP's node limit,
    the local search's weighted simulations; :mod:`tvm_pesto.solve.budget`) so the plan is
    the same on any machine; default: the ambient mode. ``info["budget"]`` names the mode,
    ``info["deterministic"]`` says whether no clock decided the plan (else
    ``info["deterministic_reason"]`` says which one did).

    ``opts`` go to :func:`~tvm_pesto.solve.ilp_model.solve_ilp` (``solver``, ``gap``,
    ``pairs``, ``warm_start``, ``msg``) and, for coarsened graphs, to
    :func:`tvm_pesto.solve.coarsen.solve_coarse_ilp` (``fine_heuristics``, ``weight_cap``,
    ``mem_frac``, ``max_passes``).

    Examples
    --------
    >>> from tvm_pesto.solve.ilp import solve  # doctest: +SKIP
    >>> plan = solve(problem, target=40, time_limit_s=5)  # doctest: +SKIP
    """
    t0 = time.perf_counter()
    coarse_only = {k: opts.pop(k) for k in ("fine_heuristics", "weight_cap", "mem_frac", "max_passes") if k in opts}
    if problem.num_nodes <= target:
        plan = solve_ilp(problem, time_limit_s=time_limit_s, deterministic=deterministic, **opts)
    else:
        plan = solve_coarse_ilp(problem, target=target, time_limit_s=time_limit_s, deterministic=deterministic,
                                **opts, **coarse_only)
    if refine_s is None:
        refine_s = time_limit_s
    if refine_s > 0:
        # cheap bounds only (no LP, no segment MIPs): the search stops early when it meets one
        floor = max(lower_bound(problem, lp=False, comm=False)["best"], path_memory_bound(problem)["bound_s"])
        seeds = [plan] + critical_path_splits(problem)
        best = polish(problem, seeds, time_budget_s=refine_s, floor_s=floor if np.isfinite(floor) else 0.0,
                      deterministic=deterministic)
        r = best.info["refine"]
        info = dict(plan.info, refine=r, cheap_lower_bound_s=floor, **combine(plan.info, r))
        if r["makespan_after_s"] < r["makespan_before_s"] * (1 - 1e-9):
            base = plan.info.get("source", "ilp") if r["start"] == 0 else "critical-path split"
            info.update(source=f"{base}+refine", makespan_s=r["makespan_after_s"])
        else:
            best = plan
        plan = Plan(best.assignment, best.order, solver="ilp", info=info)
    plan.info["budget"] = mode_name(deterministic)
    plan.solve_s = time.perf_counter() - t0
    return plan


__all__ = ["solve"]
