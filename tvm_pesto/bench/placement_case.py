"""One case of ``tvm-pesto bench placement`` (:mod:`tvm_pesto.bench.placement`): every solver
on its problem against a lower bound (:func:`run_case`), both objectives in the case's own
execution model (:func:`case_objectives`, :func:`run_objective`) and the issue-3 checks
(:func:`case_checks`).
"""
from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from ..errors import PestoError
from ..plan import simulate
from ..plan.expert_split import load_expert_split
from ..plan.objective import evaluate
from ..solve import get_solver, lower_bound, solve

HEURISTICS = ("single", "m-topo", "m-etf", "m-sct", "heft")
ALGORITHMS = HEURISTICS + ("ilp",)
HEURISTIC_SLACK = 0.10  # "the heuristics are within 10 % of the bound"
ILP_GOAL = 0.05  # "the ILP is within 5 % of the bound"


@dataclass
class Case:
    """One benchmark problem.

    Attributes
    ----------
    name : str
        ``"<setting>/<graph>"`` for LayerGraphs, ``"zoo/<model>@<cluster>"`` for zoo models.
    source : {"layergraph", "zoo"}
    problem : Problem
    expert : str or None
        Path of a human-expert split to evaluate.
    meta : dict
        Facts for the report (setting, file, model size, number of ops before fusion).
    """

    name: str
    source: str
    problem: object
    expert: str | None = None
    meta: dict = field(default_factory=dict)


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _ilp_facts(info: dict) -> dict:
    keys = ("source", "status", "timed_out", "mip_gap", "coarse_nodes", "coarse_status", "coarse_timed_out",
            "coarse_mip_gap", "coarse_solver_backend", "solver_backend", "coarsen_s", "ilp_s", "note",
            "num_vars", "coarse_num_vars", "refine")
    return {k: info[k] for k in keys if k in info}


def run_case(case: Case, algorithms: Iterable[str] = ALGORITHMS, ilp_time_limit_s: float = 10.0,
             ilp_target: int | None = None, lp_max_nodes: int = 1000, ilp_options: dict | None = None,
             objectives: bool = True, objective_ilp_s: float = 5.0) -> dict:
    """Run every algorithm (and the expert split, if any) on one case.

    Returns
    -------
    dict
        ``name``, ``source``, ``graph``, ``nodes``, ``edges``, ``cluster``, ``devices``,
        ``capacity_bytes``, ``lower_bound`` (all bounds), ``lower_bound_s``, ``results``
        (per algorithm: ``makespan_s``, ``ratio_to_lower_bound``, ``solve_s``,
        ``peak_memory_bytes`` per device, ``memory_ok``, ``devices_used``; or ``error``),
        ``best_heuristic``, ``best_heuristic_makespan_s`` and ``checks``; with ``objectives``,
        ``objectives``: :func:`run_objective` for each of :func:`case_objectives` (the
        ILP there with ``objective_ilp_s`` seconds).

    Examples
    --------
    >>> row = run_case(case, ilp_time_limit_s=2)  # doctest: +SKIP
    >>> row["checks"]["ilp_not_worse_than_heuristics"]  # doctest: +SKIP
    True
    """
    p = case.problem
    lb, lb_s = _timed(lambda: lower_bound(p, lp_max_nodes=lp_max_nodes))
    lat = lb
    cap = p.capacity
    results: dict[str, dict] = {}
    runs = list(algorithms) + (["expert"] if case.expert else [])
    for name in runs:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                if name == "expert":
                    plan, wall = _timed(lambda: load_expert_split(case.expert, p.graph, p.cluster))
                    sim = simulate(p, plan, check_memory=False)
                else:
                    opts = {}
                    if name == "ilp":
                        opts = dict(ilp_options or {}, time_limit_s=ilp_time_limit_s)
                        if ilp_target is not None:
                            opts["target"] = ilp_target
                    plan, wall = _timed(lambda: get_solver(name)(p, **opts))
                    sim = simulate(p, plan)
        except PestoError as e:
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        peak = np.asarray(sim.peak_memory, dtype=np.float64)
        r = {"makespan_s": float(sim.makespan),
             "ratio_to_lower_bound": float(sim.makespan / lb["best"]) if lb["best"] > 0 else None,
             "solve_s": float(wall), "peak_memory_bytes": peak.tolist(),
             "peak_memory_fraction": float(np.max(peak / cap)) if len(cap) else 0.0,
             "memory_ok": bool((peak <= cap * (1 + 1e-9)).all()), "devices_used": plan.devices_used()}
        if name == "ilp":
            r["ilp"] = _ilp_facts(plan.info)
        if name == "expert":
            r["split"] = os.path.basename(case.expert)
        results[name] = r
    heur = {k: v["makespan_s"] for k, v in results.items() if k in HEURISTICS and "makespan_s" in v}
    best_h = min(heur, key=heur.get) if heur else None
    out = {"name": case.name, "source": case.source, "graph": p.graph.name, "nodes": p.num_nodes,
           "edges": p.graph.num_edges, "cluster": p.cluster.name, "devices": p.num_devices,
           "capacity_bytes": cap.tolist(), "meta": case.meta, "lower_bound": lb, "lower_bound_s": lb["best"],
           "lower_bound_time_s": lb_s, "results": results, "best_heuristic": best_h,
           "best_heuristic_makespan_s": heur.get(best_h)}
    out["checks"] = case_checks(out)
    if objectives:
        out["objectives"] = {}
        for key, model, objective in case_objectives(case):
            out["objectives"][key] = run_objective(case, model, objective, algorithms, objective_ilp_s, lp_max_nodes,
                                                   lat if model == "op" else None)
    return out


def case_objectives(case: Case) -> list[tuple[str, str, str]]:
    """``(key, model, objective)`` of the extra objectives a case is judged on: the
    throughput (time per sample, steady state) in the case's own model (stage for the
    LayerGraphs, whose files define it; op for the zoo) and, for the latency LayerGraphs,
    the latency in the file's stage model.

    Examples
    --------
    >>> case_objectives(Case("zoo/vgg11@2xV100-nvlink", "zoo", None))
    [('throughput', 'op', 'throughput')]
    """
    if case.source != "layergraph":
        return [("throughput", "op", "throughput")]
    out = [("throughput", "stage", "throughput")]
    if case.meta.get("setting") == "latency":
        out.append(("stage_latency", "stage", "latency"))
    return out


def run_objective(case: Case, model: str, objective: str, algorithms: Iterable[str] = ALGORITHMS,
                  ilp_time_limit_s: float = 5.0, lp_max_nodes: int = 1000, latency_bound: dict | None = None) -> dict:
    """Every algorithm (plus ``stage-dp`` and the expert split, if any) for one objective in
    one model (:mod:`tvm_pesto.plan.objective`), against the bound valid for both
    (:func:`tvm_pesto.solve.bounds.objective.objective_lower_bound`).

    Returns
    -------
    dict
        ``model``, ``objective``, ``lower_bound_s``, ``lower_bound`` (its parts), ``results``
        (per algorithm: ``objective_value_s``, ``ratio_to_lower_bound``, ``valid``,
        ``violations`` (kinds), ``solve_s``; or ``error``), ``best`` (our best valid plan's
        algorithm) and, with an expert split, ``expert_value_s``, ``ours_over_expert`` and
        ``beats_expert``.
    """
    # lazy: loads PuLP (the MIP solvers), which importing this module does not
    from ..solve.bounds.objective import objective_lower_bound

    p = case.problem
    lb, lb_s = _timed(lambda: objective_lower_bound(p, model, objective, lp_max_nodes=lp_max_nodes,
                                                    latency_bound=latency_bound))
    results: dict[str, dict] = {}
    names = list(dict.fromkeys(list(algorithms) + ["stage-dp"])) + (["expert"] if case.expert else [])
    for name in names:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                if name == "expert":
                    plan, wall = _timed(lambda: load_expert_split(case.expert, p.graph, p.cluster))
                else:
                    opts = {"time_limit_s": ilp_time_limit_s} if name == "ilp" else {}
                    plan, wall = _timed(lambda: solve(p, name, model=model, objective=objective, **opts))
                ev = evaluate(p, plan, model, objective)
        except PestoError as e:
            results[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        results[name] = {"objective_value_s": ev.objective_value, "latency_s": ev.latency_s,
                         "bottleneck_s": ev.bottleneck_s, "valid": ev.valid,
                         "violations": sorted({v["kind"] for v in ev.violations}),
                         "ratio_to_lower_bound": ev.objective_value / lb["best"] if lb["best"] > 0 else None,
                         "solve_s": float(wall),
                         "source": case.meta.get("expert") if name == "expert" else plan.info.get("source")}
    ours = {k: v["objective_value_s"] for k, v in results.items() if k != "expert" and v.get("valid")}
    best = min(ours, key=ours.get) if ours else None
    out = {"model": model, "objective": objective, "microbatches": None, "lower_bound_s": lb["best"],
           "lower_bound": lb, "lower_bound_time_s": lb_s, "results": results, "best": best,
           "best_value_s": ours.get(best)}
    ex = results.get("expert", {})
    if "objective_value_s" in ex and best is not None:
        out.update(expert_value_s=ex["objective_value_s"], expert_valid=ex["valid"],
                   ours_over_expert=ours[best] / ex["objective_value_s"],
                   beats_expert=bool(ours[best] < ex["objective_value_s"] * (1 - 1e-9)))
    return out


def case_checks(row: dict) -> dict:
    """The issue-3 checks for one case row of :func:`run_case`.

    ``ilp_not_worse_than_heuristics``: ILP makespan <= best heuristic makespan (1e-9 relative
    slack); ``heuristics_within_10pct`` / ``ilp_within_5pct``: best heuristic / ILP over the
    lower bound; ``goal_met``: the 5 % goal holds or does not apply. None where the ILP or
    every heuristic failed.

    Examples
    --------
    >>> case_checks({"lower_bound_s": 1.0, "best_heuristic_makespan_s": 1.08,
    ...              "results": {"ilp": {"makespan_s": 1.04}}})["goal_met"]
    True
    """
    lb = row["lower_bound_s"]
    bh = row.get("best_heuristic_makespan_s")
    ilp = row["results"].get("ilp", {}).get("makespan_s")
    if ilp is None or bh is None or not lb or lb <= 0:
        return {"ilp_not_worse_than_heuristics": None, "heuristics_within_10pct": None, "ilp_within_5pct": None,
                "goal_met": None, "ilp_over_best_heuristic": None}
    h10 = bh <= lb * (1 + HEURISTIC_SLACK)
    i5 = ilp <= lb * (1 + ILP_GOAL)
    return {"ilp_not_worse_than_heuristics": bool(ilp <= bh * (1 + 1e-9)), "heuristics_within_10pct": bool(h10),
            "ilp_within_5pct": bool(i5), "goal_met": bool(i5 or not h10), "ilp_over_best_heuristic": ilp / bh}


__all__ = ["ALGORITHMS", "Case", "HEURISTICS", "HEURISTIC_SLACK", "ILP_GOAL", "case_checks", "case_objectives",
           "run_case", "run_objective"]
