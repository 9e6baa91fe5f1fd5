"""The registry's ``"ilp"`` solver: coarsen when the graph is large, solve the placement MIP,
expand, re-optimise windows of the schedule (large-neighbourhood search), and polish the
plan with local search.

This module only orchestrates. The MIP itself (one problem -> one MIP -> a plan) is
:mod:`.model.build` (solved by :mod:`.warm_solve`), coarsening :mod:`.coarsen` (the MIP on
supernodes :mod:`.coarse_ilp`), the window search :mod:`.lns`, the local search
:mod:`.refine`, the stage-model MIP :mod:`tvm_pesto.solve.stage.ilp` and the cheap lower
bounds that stop the searches early :mod:`tvm_pesto.solve.bounds.makespan` /
:mod:`tvm_pesto.solve.bounds.comm`.

Examples
--------
>>> from tvm_pesto.plan import simulate
>>> from tvm_pesto.solve import solve as run
>>> from tvm_pesto.solve.placement_ilp.driver import solve
>>> from tvm_pesto.bench.random_dag import dnn_like_problem
>>> problem = dnn_like_problem(8, cluster="2xV100-nvlink")   # 8 ops, 2 GPUs
>>> plan = solve(problem, target=40, time_limit_s=5, deterministic=True)
>>> plan.info["status"], simulate(problem, plan).makespan <= simulate(problem, run(problem, "heft")).makespan
('optimal', True)
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ...errors import PestoError
from ...plan import Plan, Problem, simulate
from ...plan.objective import check_choice
from ..bounds.comm import path_memory_bound
from ..bounds.makespan import lower_bound
from ..budget import cap_left_s, combine, mode_name, outcome
from ..heuristics.portfolio import HEURISTIC_SOLVERS
from ..stage.ilp import solve as stage_solve
from .coarse_ilp import solve_coarse_ilp
from .lns import LnsSettings
from .lns import lns as run_lns
from .polish import critical_path_splits, polish
from .warm_solve import _scorer, solve_ilp


def solve(problem: Problem, target: int = 40, time_limit_s: float = 3.0, refine_s: float | None = None,
          deterministic: bool | None = None, lns: LnsSettings = LnsSettings(), objective: str = "latency",
          microbatches: int | None = None, model: str = "op", **opts) -> Plan:
    """Registry entry point for ``"ilp"``.

    Op model: solve directly when the graph has at most ``target`` nodes, else coarsen to
    ``target`` supernodes, solve and expand; then, on graphs above ``target`` nodes and for
    the latency objective, a large-neighbourhood search (:func:`tvm_pesto.solve.placement_ilp.lns.lns`)
    for ``lns.seconds`` seconds (default: ``time_limit_s`` on graphs of more than
    ``lns.min_nodes`` nodes, where the coarse MIP sees too little; else 0, which turns it
    off) from the best of the
    expanded plan and the heuristics in ``lns.starts`` (run on the fine graph unless
    ``fine_heuristics`` already did); then polish the plan for up to ``refine_s`` seconds
    (default: ``time_limit_s``; 0 turns it off): :func:`tvm_pesto.solve.placement_ilp.polish.polish` from
    the plan and from :func:`~tvm_pesto.solve.placement_ilp.polish.critical_path_splits`. Stage model: the
    stage MIP of :mod:`tvm_pesto.solve.stage.ilp`.

    ``info["refine"]`` and ``info["lns"]`` say what the searches did; ``info["source"]``
    names where the plan came from (``+lns``, ``+refine`` when they helped);
    ``info["improvement"]`` lists each step's objective value, so a benchmark can say where
    an improvement came from.

    ``info["status"]`` (direct solve) or ``info["coarse_status"]`` (coarsened graph) is the
    MIP's real outcome, see :func:`~tvm_pesto.solve.placement_ilp.warm_solve.solve_ilp`; a coarse
    ``optimal`` is optimal for the supernode graph only, so a coarsened solve carries no
    top-level ``status``.

    ``objective`` / ``microbatches``: what the MIPs minimise and the plans are compared on
    (:mod:`tvm_pesto.plan.objective`). ``deterministic`` replaces every wall-clock budget by
    a work budget (MIP node limits, weighted simulations; :mod:`tvm_pesto.solve.budget`) so
    the plan is the same on any machine; default: the ambient mode. ``info["budget"]`` names
    the mode, ``info["deterministic"]`` says whether no clock decided the plan (else
    ``info["deterministic_reason"]`` says which one did).

    ``opts`` go to :func:`~tvm_pesto.solve.placement_ilp.warm_solve.solve_ilp` (``solver``, ``gap``,
    ``pairs``, ``warm_start``, ``msg``) and, for coarsened graphs, to
    :func:`tvm_pesto.solve.placement_ilp.coarsen.solve_coarse_ilp` (``fine_heuristics``, ``weight_cap``,
    ``mem_frac``, ``max_passes``); ``lns`` (:class:`~tvm_pesto.solve.placement_ilp.lns.LnsSettings`)
    says when the LNS runs and how it searches.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(8, cluster="2xV100-nvlink")   # 8 ops, 2 GPUs
    >>> plan = solve(problem, target=40, time_limit_s=5, deterministic=True)
    >>> plan.info["budget"], len(plan.assignment)
    ('work', 8)
    """
    model, objective, microbatches = check_choice(model, objective, microbatches)
    if model == "stage":
        return stage_solve(problem, objective=objective, microbatches=microbatches, time_limit_s=time_limit_s,
                           deterministic=deterministic, **{k: v for k, v in opts.items() if k in ("msg", "warm_start")})
    t0 = time.perf_counter()
    score = _scorer(problem, objective, microbatches)
    coarse_only = {k: opts.pop(k) for k in ("fine_heuristics", "weight_cap", "mem_frac", "max_passes") if k in opts}
    large = problem.num_nodes > target
    lns_s = lns.seconds
    if lns_s is None:
        lns_s = time_limit_s if problem.num_nodes > max(target, lns.min_nodes) and objective == "latency" else 0.0
    if refine_s is None:
        refine_s = time_limit_s
    # cheap bounds only (no LP, no segment MIPs), where something uses them: the direct MIP
    # is skipped, and the searches stop early, when a plan meets one
    floor = 0.0
    if objective == "latency" and problem.num_nodes and (not large or lns_s > 0 or refine_s > 0):
        floor = max(lower_bound(problem, lp=False, comm=False)["best"], path_memory_bound(problem)["bound_s"])
        floor = floor if np.isfinite(floor) else 0.0
    if not large:
        plan = solve_ilp(problem, time_limit_s=time_limit_s, deterministic=deterministic, objective=objective,
                         microbatches=microbatches, floor_s=floor, **opts)
    else:
        plan = solve_coarse_ilp(problem, target=target, time_limit_s=time_limit_s, deterministic=deterministic,
                                objective=objective, microbatches=microbatches, **opts, **coarse_only)
    steps = [(plan.info.get("source", "ilp"), score(simulate(problem, plan)))]
    if lns_s > 0 and objective == "latency":
        plan = _lns_step(problem, plan, replace(lns, seconds=lns_s), coarse_only.get("fine_heuristics", True),
                         floor, deterministic, steps, score)
    if refine_s > 0 and not cap_left_s():  # an ambient wall_cap ended: no seeds, no search
        plan.info.update(combine(plan.info, outcome(True, "polish", deterministic)))
    elif refine_s > 0:
        seeds = [plan] + critical_path_splits(problem)
        best = polish(problem, seeds, time_budget_s=refine_s, floor_s=floor, deterministic=deterministic,
                      score=None if objective == "latency" else score)
        r = best.info["refine"]
        info = dict(plan.info, refine=r, cheap_lower_bound_s=floor, **combine(plan.info, r))
        if r["makespan_after_s"] < r["makespan_before_s"] * (1 - 1e-9):
            base = plan.info.get("source", "ilp") if r["start"] == 0 else "critical-path split"
            info.update(source=f"{base}+refine", makespan_s=simulate(problem, best).makespan)
            steps.append(("refine", r["makespan_after_s"]))
        else:
            best = plan
        plan = Plan(best.assignment, best.order, solver="ilp", info=info)
    plan.info["improvement"] = [{"step": name, "objective_value_s": float(v)} for name, v in steps]
    plan.info["objective_value_s"] = score(simulate(problem, plan))
    plan.info["budget"] = mode_name(deterministic)
    plan.solve_s = time.perf_counter() - t0
    return plan


def _lns_step(problem: Problem, plan: Plan, settings: LnsSettings, fine_heuristics: bool, floor: float,
              deterministic, steps: list, score) -> Plan:
    """The LNS for ``settings.seconds`` from the best of ``plan`` and the ``settings.starts``
    heuristics' plans."""
    start, start_name, start_value = plan, plan.info.get("source", "ilp"), steps[-1][1]
    if not fine_heuristics:  # else the coarse solve already compared them all
        for name in settings.starts:
            try:
                cand = HEURISTIC_SOLVERS[name](problem)
                value = score(simulate(problem, cand))
            except PestoError:
                continue
            steps.append((name, value))
            if value < start_value * (1 - 1e-12):
                start, start_name, start_value = cand, name, value
    out = run_lns(problem, Plan(start.assignment, start.order, solver="ilp", info=dict(plan.info)),
                  time_budget_s=settings.seconds, deterministic=deterministic, floor_s=floor, settings=settings)
    r = out.info["lns"]
    info = dict(plan.info, lns=r, **combine(plan.info, r))
    source = start_name
    if r["makespan_after_s"] < r["makespan_before_s"] * (1 - 1e-9):
        source = f"{start_name}+lns"
        steps.append(("lns", r["makespan_after_s"]))
    info.update(source=source, makespan_s=r["makespan_after_s"])
    return Plan(out.assignment, out.order, solver="ilp", info=info)


__all__ = ["solve"]
