"""Multi-start local search: :func:`polish` runs :func:`tvm_pesto.solve.placement_ilp.refine.refine` from several
plans (the ILP's and the starts of :func:`critical_path_splits`) and keeps the best; the ILP
calls it after every solve.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ...errors import InfeasibleError, PestoError, PlanError
from ...plan.plan import Plan
from ...plan.problem import Problem
from ...plan.simulate import simulate
from ..bounds.paths import critical_path_nodes
from ..budget import Meter
from ..heuristics.heft import solve as heft
from .refine import _AT_BOUND, _REL, RefineSettings, _makespan, refine


def critical_path_splits(problem: Problem, parts=(3,), max_nodes: int = 5000) -> list[Plan]:
    """Start points for :func:`polish`: HEFT with a critical path cut into ``k`` runs of equal
    work, run ``i`` pinned to the ``i``-th fastest device for that path, which other nodes
    avoid when they can (CPOP, which keeps the whole path on one device, generalised to ``k``
    devices; ``k`` is capped at the number of devices). Skipped above ``max_nodes``.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> seeds = critical_path_splits(problem)
    >>> [len(p.assignment) for p in seeds]
    [12]
    """
    if problem.num_nodes > max_nodes or problem.num_devices < 2:
        return []
    path = critical_path_nodes(problem)
    if not path:
        return []
    c = problem.costs[path]
    w = np.where(np.isfinite(c), c, 0.0).min(axis=1)
    total = float(w.sum())
    if total <= 0:
        return []
    span = np.where(np.isfinite(c), c, 1e3 * c[np.isfinite(c)].max()).sum(axis=0)
    fastest = np.argsort(span, kind="stable")
    frac = (np.cumsum(w) - w / 2) / total
    seeds = []
    for k in sorted({min(k, problem.num_devices) for k in parts}):
        runs = np.minimum((frac * k).astype(int), k - 1)
        pins = {v: int(fastest[r]) for v, r in zip(path, runs) if np.isfinite(problem.costs[v, fastest[r]])}
        try:
            plan = heft(problem, pins=pins)
        except PestoError:
            continue
        plan.info["seed"] = f"critical path in {k} runs"
        seeds.append(plan)
    return seeds


def polish(problem: Problem, plans: list[Plan], time_budget_s: float = 2.0, floor_s: float = 0.0,
           deterministic: bool | None = None, score=None, settings: RefineSettings = RefineSettings()) -> Plan:
    """Multi-start :func:`refine`. Each plan in turn descends to a local optimum (no kicks)
    with half of the budget left; then the best result gets the rest for the iterated search.
    Stops early at a plan within 1e-5 of ``floor_s`` (a lower bound). Returns that plan, with
    ``info["refine"]["start"]`` the index of the plan it came from; never worse than the best
    input. ``deterministic`` counts the budget in work units instead of seconds (see
    :func:`refine`); ``info["refine"]`` then has the report of the whole budget. ``settings``
    are :func:`refine`'s (the first descents without kicks).

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> from tvm_pesto.solve import solve
    >>> plan = polish(problem, [solve(problem, "heft")] + critical_path_splits(problem), time_budget_s=0.3,
    ...               deterministic=True)
    >>> plan.info["refine"]["start"] in (0, 1)
    True
    """
    plans = [p for p in plans if p is not None]
    if not plans:
        raise PlanError("polish needs at least one plan")
    t0 = time.perf_counter()
    meter = Meter(time_budget_s, deterministic, "polish")
    stop = floor_s * (1 + _AT_BOUND)
    best, best_span, best_i = None, np.inf, -1
    first_before = None
    for i, plan in enumerate(plans):
        if best is not None and (best_span <= stop or meter.spent()):
            break
        try:
            out = refine(problem, plan, meter=meter.share(0.5), score=score, settings=replace(settings, kicks=False))
        except (InfeasibleError, PlanError):
            continue
        span = out.info["refine"]["makespan_after_s"]
        if i == 0:
            first_before = out.info["refine"]["makespan_before_s"]
        if best is None or span < best_span * (1 - _REL):
            best, best_span, best_i = out, span, i
    if best is None:
        raise PlanError("none of the plans given to polish simulates")
    info = dict(best.info["refine"])
    if best_span > stop and not meter.spent():
        again = refine(problem, Plan(best.assignment, best.order, solver=best.solver), floor_s=floor_s,
                       meter=meter.share(1.0), score=score, settings=settings)
        r = again.info["refine"]
        for key in ("rounds", "moves", "kicks", "kicks_kept", "simulations"):
            info[key] += r[key]
        if r["makespan_after_s"] < best_span * (1 - _REL):
            best = again
            info["makespan_after_s"] = r["makespan_after_s"]
    info.update(meter.report(), start=best_i, starts=len(plans), seconds=time.perf_counter() - t0,
                makespan_before_s=first_before if first_before is not None else (score or _makespan)(
                    simulate(problem, plans[0])))
    best.info["refine"] = info
    return best


__all__ = ["critical_path_splits", "polish"]
