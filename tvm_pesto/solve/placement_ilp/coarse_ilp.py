"""The placement ILP on a coarsened graph: coarsen (:mod:`tvm_pesto.solve.placement_ilp.coarsen`), solve the MIP
on the supernodes (:func:`tvm_pesto.solve.placement_ilp.warm_solve.solve_ilp`), expand, and keep the best plan
on the fine graph.
"""
from __future__ import annotations

import time
from dataclasses import asdict

from ...errors import PestoError, PlanError
from ...plan import Plan, Problem, simulate
from ..budget import combine
from ..heuristics.portfolio import best_heuristic_plan
from ..settings import MipSettings
from .coarsen import coarsen, expand_plan
from .warm_solve import _scorer, solve_ilp


def solve_coarse_ilp(problem: Problem, target: int = 40, warm_start: Plan | None = None, pairs: int | None = None,
                     fine_heuristics: bool = True, objective: str = "latency", microbatches: int | None = None,
                     **options) -> Plan:
    """Coarsen, solve the ILP on the supernodes, expand, and re-simulate on the fine graph.

    The returned plan is the best (simulated on the fine graph) of: the expanded ILP plan,
    the expanded coarse warm start, ``warm_start`` and, when ``fine_heuristics``, the
    heuristics run on the fine graph, so it is never worse than any of them.

    ``info`` holds the coarse solve's info with a ``coarse_`` prefix: ``coarse_status`` is
    the coarse MIP's real outcome (``optimal``, ``time_limit``, ``infeasible``, ...; see
    :func:`~tvm_pesto.solve.placement_ilp.warm_solve.solve_ilp`), ``coarse_timed_out``, ``coarse_mip_gap``;
    ``budget`` and ``deterministic`` (with ``deterministic_reason`` when False) are the
    coarse MIP's, unprefixed.

    Parameters
    ----------
    problem : Problem
    target : int
        Supernodes for the ILP.
    pairs, objective, microbatches
        Passed to :func:`tvm_pesto.solve.placement_ilp.warm_solve.solve_ilp`; the candidates
        are compared on ``objective`` (op model).
    warm_start : Plan, optional
        A plan of the fine problem to compare against.
    fine_heuristics : bool
        Also run the heuristics (:mod:`tvm_pesto.solve.heuristics.portfolio`) on the fine graph (their
        time grows with it; ``tvm-pesto bench scale`` times them).
    **options
        The coarse MIP's :class:`~tvm_pesto.solve.settings.MipSettings` fields (``time_limit_s``,
        default 3 s, ``solver``, ``gap``, ``msg``, ``threads``, ``deterministic``: a node limit
        instead of the time limit, see :mod:`tvm_pesto.solve.budget`); the others
        (``weight_cap``, ``mem_frac``, ``max_passes``) go to :func:`~tvm_pesto.solve.placement_ilp.coarsen.coarsen`.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(100, cluster="2xV100-nvlink")   # 100 ops, 2 GPUs
    >>> plan = solve_coarse_ilp(problem, target=10, time_limit_s=5, deterministic=True)
    >>> plan.info["coarse_nodes"] <= 10, len(plan.assignment)
    (True, 100)
    """
    mip = MipSettings.take(options, time_limit_s=3.0)
    t0 = time.perf_counter()
    coarse, groups = coarsen(problem, target, **options)
    t_coarsen = time.perf_counter() - t0
    cwarm, _ = best_heuristic_plan(coarse)
    cplan = solve_ilp(coarse, warm_start=cwarm, pairs=pairs, objective=objective, microbatches=microbatches,
                      **asdict(mip))
    score = _scorer(problem, objective, microbatches)
    t_ilp = time.perf_counter() - t0 - t_coarsen
    info = {f"coarse_{k}": v for k, v in cplan.info.items()}
    info.update(budget=cplan.info.get("budget"), **combine(cplan.info))
    info.update(coarse_nodes=coarse.num_nodes, fine_nodes=problem.num_nodes, coarsen_s=t_coarsen, ilp_s=t_ilp)

    candidates: list[tuple[str, Plan]] = [("ilp", expand_plan(cplan, groups, problem))]
    if cwarm is not None:
        candidates.append((f"coarse_{cwarm.solver}", expand_plan(cwarm, groups, problem)))
    if warm_start is not None:
        candidates.append(("warm_start", warm_start))
    if fine_heuristics:
        t1 = time.perf_counter()
        hplan, spans = best_heuristic_plan(problem)
        info["fine_heuristic_s"] = time.perf_counter() - t1
        info["fine_heuristic_makespans_s"] = spans
        if hplan is not None:
            candidates.append((hplan.solver, hplan))
    name, chosen, spans = _best_on_fine_graph(problem, candidates, score, info)
    info.update(candidate_makespans_s=spans, source=name, objective_value_s=spans[name],
                makespan_s=simulate(problem, chosen).makespan if objective != "latency" else spans[name])
    if name != "ilp":
        info["note"] = f"the expanded ILP plan was not the best on the fine graph; returning {name}'s plan"
    return Plan(chosen.assignment, chosen.order, solver="ilp", solve_s=time.perf_counter() - t0, info=info)


def _best_on_fine_graph(problem: Problem, candidates: list[tuple[str, Plan]], score, info: dict):
    """The candidate with the best ``score`` on the fine graph: ``(name, plan, scores)``; a
    candidate that does not simulate is left out with ``info["rejected_<name>"]`` saying why.

    Raises
    ------
    PlanError
        If no candidate simulates.
    """
    best = None
    spans: dict[str, float] = {}
    for name, cand in candidates:
        try:
            span = score(simulate(problem, cand))
        except PestoError as e:
            info[f"rejected_{name}"] = str(e)
            continue
        spans[name] = span
        if best is None or span < spans[best[0]]:
            best = (name, cand)
    if best is None:
        raise PlanError(f"{problem.graph.name}: neither the expanded ILP plan nor any heuristic plan is feasible "
                        "on the fine graph; the coarse memory model undercounts received tensors; "
                        "use a larger target or devices with more memory")
    return best[0], best[1], spans


__all__ = ["solve_coarse_ilp"]
