"""``tvm-pesto bench placement``: every solver on every benchmark graph, against a lower bound.

Cases
-----
* **LayerGraphs** of msr-fiddle/dnn-partitioning (``latency-inputs`` and
  ``throughput-inputs``), each on the cluster its file describes
  (:func:`tvm_pesto.graph.dnn_partitioning.cluster_from_graph`), with its profiled costs and
  its forward/backward co-location groups. The human-expert splits apply to the throughput
  inputs; they are evaluated as the ``expert`` algorithm (simulated without the memory
  check, since tvm-pesto's memory model also counts received tensors; ``memory_ok`` says
  whether the split fits).
* **Zoo models** (:mod:`tvm_pesto.zoo`, size ``full``): the fused-group graph of
  :func:`tvm_pesto.api.analyze` with roofline costs on ``2xV100-nvlink``, ``4xV100-pcie`` and
  ``8xA100-nvlink``.

For each case and algorithm: simulated makespan, makespan / lower bound
(:func:`tvm_pesto.solve.bounds.lower_bound`, LP relaxation up to ``lp_max_nodes`` nodes),
wall-clock solve time and peak memory per device. Each case also records the checks of
issue 3: the ILP plan is never worse than the best heuristic, and it is within 5 % of the
lower bound wherever the best heuristic is within 10 % of it.

Both objectives (issue 14, :mod:`tvm_pesto.plan.objective`): each case's ``objectives``
also holds the throughput (time per sample, steady state) in the case's own execution model
(stage for the LayerGraphs, op for the zoo) and, for the latency LayerGraphs, the latency in
the files' stage model, per algorithm (``stage-dp`` too) against
:func:`tvm_pesto.solve.objective_bounds.objective_lower_bound`; on the throughput
LayerGraphs our best plan is compared with the expert split on the expert's own objective
(``ours_over_expert``, ``beats_expert``; counted in ``summary["throughput_vs_expert"]``).

Examples
--------
>>> from tvm_pesto.bench.placement import layergraph_cases, run_placement
>>> cases = layergraph_cases(names=["bert24_inference"], settings=["throughput"])  # doctest: +SKIP
>>> res = run_placement(cases, ilp_time_limit_s=2)  # doctest: +SKIP
>>> res["summary"]["ilp_never_worse"]  # doctest: +SKIP
True
"""
from __future__ import annotations

import glob
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from ..errors import GraphError, PestoError
from .report import fmt, machine_info, markdown_table, pyplot, save_figure

SETTINGS = ("latency", "throughput")
ZOO_CLUSTERS = ("2xV100-nvlink", "4xV100-pcie", "8xA100-nvlink")
HEURISTICS = ("single", "m-topo", "m-etf", "m-sct", "heft")
ALGORITHMS = HEURISTICS + ("ilp",)
#: The quick subset (``--quick``): two small LayerGraphs and one small zoo model.
QUICK = {"layergraphs": ["bert24_inference"], "settings": ["latency", "throughput"], "models": ["mlp_mixer"],
         "size": "small", "clusters": ["2xV100-nvlink"]}
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


def layergraph_cases(root: str | None = None, settings: Iterable[str] = SETTINGS,
                     names: Iterable[str] | None = None) -> list[Case]:
    """The LayerGraph cases under ``root`` (``<setting>-inputs/LayerGraphs/*.json``).

    Parameters
    ----------
    root : str, optional
        The dnn-partitioning folder (default: :func:`tvm_pesto.graph.dnn_partitioning.benchmark_dir`,
        the shipped graphs or ``$TVM_PESTO_DNN_PARTITIONING``).
    settings : iterable of {"latency", "throughput"}
    names : iterable of str, optional
        File stems to keep (e.g. ``["bert24_inference"]``); default all.

    Raises
    ------
    GraphError
        If ``root`` holds no LayerGraph for the requested settings and names.

    Examples
    --------
    >>> cases = layergraph_cases(names=["bert24_inference"])  # doctest: +SKIP
    >>> [c.name for c in cases]  # doctest: +SKIP
    ['latency/bert24_inference', 'throughput/bert24_inference']
    """
    from ..graph import dnn_partitioning as dp
    from ..plan import Problem

    root = str(root) if root is not None else str(dp.benchmark_dir())
    keep = set(names) if names is not None else None
    cases = []
    for setting in settings:
        if setting not in SETTINGS:
            raise GraphError(f"unknown LayerGraph setting {setting!r}; use {' or '.join(SETTINGS)}")
        for path in sorted(glob.glob(os.path.join(root, f"{setting}-inputs", "LayerGraphs", "*.json"))):
            stem = os.path.splitext(os.path.basename(path))[0]
            if keep is not None and stem not in keep:
                continue
            graph, meta = dp.load_layer_graph(path)
            cluster = dp.cluster_from_graph(meta)
            problem = Problem(graph, cluster, dp.costs_from_graph(graph, cluster),
                              colocate=dp.colocation_groups(graph), cost_source="file")
            expert = dp.find_expert_split(path) if setting == "throughput" else None
            cases.append(Case(f"{setting}/{stem}", "layergraph", problem, expert,
                              {"setting": setting, "file": os.path.relpath(path, root),
                               "expert": os.path.relpath(expert, root) if expert else None,
                               "accelerators": meta["max_accelerators"], "cpus": meta["max_cpus"]}))
    if not cases:
        raise GraphError(f"no LayerGraph files under {root!r} for settings {list(settings)}"
                         + (f" and names {sorted(keep)}" if keep else "")
                         + "; point $TVM_PESTO_DNN_PARTITIONING (or --root) at the dnn-partitioning folder")
    return cases


def zoo_cases(models: Iterable[str] | None = None, size: str = "full",
              clusters: Iterable[str] = ZOO_CLUSTERS, progress: Callable[[str], None] | None = None) -> list[Case]:
    """Zoo models (fused-group graphs from :func:`tvm_pesto.api.analyze`) with roofline costs.

    Examples
    --------
    >>> cases = zoo_cases(["vgg11"], size="small", clusters=["2xV100-nvlink"])  # doctest: +SKIP
    >>> cases[0].name  # doctest: +SKIP
    'zoo/vgg11@2xV100-nvlink'
    """
    from .. import api, zoo
    from ..cluster import parse_cluster
    from ..costs.roofline import roofline_costs
    from ..plan import Problem

    say = progress or (lambda _m: None)
    clusters = [parse_cluster(c) if isinstance(c, str) else c for c in clusters]
    specs = [c if isinstance(c, str) else c.name for c in clusters]
    cases = []
    for name in (models or zoo.list_models()):
        t = time.perf_counter()
        analysis = api.analyze(zoo.load(name, size).mod)
        say(f"{name} ({size}): {analysis.op_graph.num_nodes} ops in {analysis.graph.num_nodes} fused groups, "
            f"imported in {time.perf_counter() - t:.1f} s")
        for spec, cluster in zip(specs, clusters):
            problem = Problem(analysis.graph, cluster, roofline_costs(analysis.graph, cluster), cost_source="roofline")
            cases.append(Case(f"zoo/{name}@{spec}", "zoo", problem, None,
                              {"model": name, "size": size, "cluster_spec": spec,
                               "ops": analysis.op_graph.num_nodes}))
    return cases


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
    from ..plan import simulate
    from ..solve import get_solver, lower_bound

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
                    from ..graph.dnn_partitioning import load_expert_split

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
    (:func:`tvm_pesto.solve.objective_bounds.objective_lower_bound`).

    Returns
    -------
    dict
        ``model``, ``objective``, ``lower_bound_s``, ``lower_bound`` (its parts), ``results``
        (per algorithm: ``objective_value_s``, ``ratio_to_lower_bound``, ``valid``,
        ``violations`` (kinds), ``solve_s``; or ``error``), ``best`` (our best valid plan's
        algorithm) and, with an expert split, ``expert_value_s``, ``ours_over_expert`` and
        ``beats_expert``.
    """
    from ..plan.objective import evaluate
    from ..solve import solve
    from ..solve.objective_bounds import objective_lower_bound

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
                    from ..graph.dnn_partitioning import load_expert_split

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


def summarize(rows: list[dict]) -> dict:
    """Counts over the case rows: how often each check held, and which cases miss the goal.

    Examples
    --------
    >>> summarize([])["cases"]
    0
    """
    checked = [r for r in rows if r["checks"]["ilp_not_worse_than_heuristics"] is not None]
    applies = [r for r in checked if r["checks"]["heuristics_within_10pct"]]
    missed = [r["name"] for r in applies if not r["checks"]["ilp_within_5pct"]]
    improved = [r["name"] for r in checked if r["checks"]["ilp_over_best_heuristic"] < 1 - 1e-6]
    errors = {f"{r['name']}:{k}": v["error"] for r in rows for k, v in r["results"].items() if "error" in v}
    experts = {r["name"]: r["objectives"]["throughput"] for r in rows
               if "ours_over_expert" in r.get("objectives", {}).get("throughput", {})}
    return {"cases": len(rows), "checked": len(checked),
            "throughput_vs_expert": {"cases": len(experts), "beaten": sum(v["beats_expert"] for v in experts.values()),
                                     "ours_over_expert": {k: v["ours_over_expert"] for k, v in experts.items()}},
            "ilp_never_worse": all(r["checks"]["ilp_not_worse_than_heuristics"] for r in checked),
            "ilp_worse_cases": [r["name"] for r in checked if not r["checks"]["ilp_not_worse_than_heuristics"]],
            "heuristics_within_10pct": len(applies), "ilp_within_5pct_where_applicable": len(applies) - len(missed),
            "goal_missed": missed, "ilp_better_than_best_heuristic": improved, "errors": errors}


def run_placement(cases: list[Case], algorithms: Iterable[str] = ALGORITHMS, ilp_time_limit_s: float = 10.0,
                  ilp_target: int | None = None, lp_max_nodes: int = 1000, ilp_options: dict | None = None,
                  progress: Callable[[str], None] | None = None, objectives: bool = True,
                  objective_ilp_s: float | None = None) -> dict:
    """Run :func:`run_case` on every case; returns ``machine``, ``settings``, ``cases`` and
    ``summary`` (:func:`summarize`).

    Examples
    --------
    >>> res = run_placement(layergraph_cases(names=["bert24_inference"]), ilp_time_limit_s=2)  # doctest: +SKIP
    >>> res["summary"]["cases"]  # doctest: +SKIP
    2
    """
    from ..solve import get_solver

    algorithms = list(algorithms)
    for name in algorithms:
        get_solver(name)  # unknown names fail before any work
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    load_start = machine_info()["load_average"]
    rows = []
    for k, case in enumerate(cases):
        t = time.perf_counter()
        row = run_case(case, algorithms, ilp_time_limit_s=ilp_time_limit_s, ilp_target=ilp_target,
                       lp_max_nodes=lp_max_nodes, ilp_options=ilp_options, objectives=objectives,
                       objective_ilp_s=objective_ilp_s if objective_ilp_s is not None else min(ilp_time_limit_s, 5.0))
        rows.append(row)
        ilp = row["results"].get("ilp", {})
        thr = row.get("objectives", {}).get("throughput", {})
        say(f"[{k + 1}/{len(cases)}] {case.name}: {row['nodes']} nodes, {row['devices']} devices, "
            f"best heuristic {row['best_heuristic']} x{fmt(_ratio(row, row['best_heuristic']))}, "
            f"ilp x{fmt(ilp.get('ratio_to_lower_bound'))} of the bound"
            + (f"; throughput: {thr.get('best')} x{fmt((thr.get('best_value_s') or 0) / thr['lower_bound_s'])}"
               if thr.get("lower_bound_s") else "")
            + (f", ours / expert {fmt(thr['ours_over_expert'])}" if "ours_over_expert" in thr else "")
            + f" ({time.perf_counter() - t:.1f} s)")
    try:
        import inspect

        from ..solve.ilp import solve as ilp_solve

        default_target = inspect.signature(ilp_solve).parameters["target"].default
    except (ImportError, KeyError, TypeError, ValueError):
        default_target = None
    return {"benchmark": "placement", "machine": dict(machine_info(), load_average_start=load_start),
            "settings": {"algorithms": algorithms, "ilp_time_limit_s": ilp_time_limit_s, "objectives": objectives,
                         "objective_ilp_s": objective_ilp_s if objective_ilp_s is not None else min(ilp_time_limit_s, 5.0),
                         "ilp_target": ilp_target if ilp_target is not None else default_target,
                         "ilp_options": dict(ilp_options or {}), "lp_max_nodes": lp_max_nodes,
                         "heuristic_slack": HEURISTIC_SLACK, "ilp_goal": ILP_GOAL},
            "cases": rows, "summary": summarize(rows), "total_s": time.perf_counter() - t0}


def _ratio(row: dict, alg: str | None):
    if alg is None:
        return None
    return row["results"].get(alg, {}).get("ratio_to_lower_bound")


def _columns(res: dict) -> list[str]:
    cols = list(res["settings"]["algorithms"])
    if any("expert" in r["results"] for r in res["cases"]):
        cols.insert(len(cols) - 1 if "ilp" in cols else len(cols), "expert")
    return cols


_BOUND_NAMES = {"critical_path_s": "path", "work_s": "work", "lp_s": "LP", "segment_s": "segments",
                "path_memory_s": "path+memory"}


def bound_kind(lb: dict) -> str:
    """Which bound of :func:`tvm_pesto.solve.lower_bound` is the largest (ties: the simplest).

    Examples
    --------
    >>> bound_kind({"critical_path_s": 1.0, "work_s": 0.5, "lp_s": 1.0, "segment_s": 1.2, "best": 1.2})
    'segments'
    """
    best = lb.get("best")
    for key, name in _BOUND_NAMES.items():
        v = lb.get(key)
        if v is not None and best is not None and v >= best * (1 - 1e-9):
            return name
    return "?"


def _ratio_cell(v: dict | None, best: bool, note: str = "") -> str:
    """A table cell for one solver's result: empty, ``fail``, or its ratio to the bound
    (bold when best), followed by ``note``."""
    if v is None:
        return ""
    if "error" in v:
        return "fail"
    txt = fmt(v["ratio_to_lower_bound"])
    return (f"**{txt}**" if best else txt) + note


def placement_markdown(res: dict, command: str | None = None) -> str:
    """The benchmark as markdown: summary, then ratio, solve-time and memory tables.

    Examples
    --------
    >>> text = placement_markdown(res, "tvm-pesto bench placement")  # doctest: +SKIP
    """
    cols = _columns(res)
    m, s, summ = res["machine"], res["settings"], res["summary"]
    lines = []
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += [f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), load average (1, 5, 15 min) "
              f"{m.get('load_average_start')} at the start and {m['load_average']} at the end of the run, "
              f"Python {m['python']}. Solvers and bounds took {res['total_s']:.0f} s in all.",
              f"ILP: time limit {s['ilp_time_limit_s']:g} s per MIP, graphs above {s['ilp_target']} nodes "
              f"coarsened to {s['ilp_target']} supernodes, then up to "
              f"{s.get('ilp_options', {}).get('refine_s', s['ilp_time_limit_s']):g} s of critical-path local search "
              "(from the ILP's plan and a critical-path split). Lower bound: "
              f"max(critical path, work / devices, LP relaxation up to {s['lp_max_nodes']} nodes, segment "
              "bound, path-memory bound); the last two charge transfers (`bound by` names the largest).", "",
              f"- ILP never worse than the best heuristic: **{summ['ilp_never_worse']}** "
              f"({summ['checked']} of {summ['cases']} cases checked"
              + (f"; worse on {', '.join(summ['ilp_worse_cases'])}" if summ["ilp_worse_cases"] else "") + ")",
              f"- ILP strictly better than every heuristic on {len(summ['ilp_better_than_best_heuristic'])} cases"
              + (f": {', '.join(summ['ilp_better_than_best_heuristic'])}" if summ["ilp_better_than_best_heuristic"]
                 else ""),
              f"- Best heuristic within {HEURISTIC_SLACK:.0%} of the bound on {summ['heuristics_within_10pct']} "
              f"cases; ILP within {ILP_GOAL:.0%} of the bound on {summ['ilp_within_5pct_where_applicable']} of them"
              + (f"; missed on {', '.join(summ['goal_missed'])}" if summ["goal_missed"] else ""), ""]
    if summ["errors"]:
        lines += ["Failures:", ""] + [f"- {k}: {v}" for k, v in summ["errors"].items()] + [""]
    heads = ["case", "nodes", "dev", "bound (ms)", "bound by"] + cols + ["ILP ≤ best heur.", "5% goal"]
    rows = []
    for r in res["cases"]:
        best = r["best_heuristic"]
        cells = [_ratio_cell(r["results"].get(a), a == best,
                             " (mem)" if a == "expert" and not r["results"].get(a, {}).get("memory_ok", True) else "")
                 for a in cols]
        c = r["checks"]
        goal = {None: "–", False: "n/a"}.get(c["heuristics_within_10pct"], "yes" if c["goal_met"] else "**no**")
        rows.append([r["name"], r["nodes"], r["devices"], fmt(r["lower_bound_s"] * 1e3, ".3f"),
                     bound_kind(r["lower_bound"])] + cells
                    + ["yes" if c["ilp_not_worse_than_heuristics"] else ("–" if c["ilp_not_worse_than_heuristics"]
                                                                         is None else "**no**"), goal])
    lines += ["### Makespan / lower bound", "",
              "Bold: the best heuristic. `(mem)`: the expert split exceeds a device's memory in tvm-pesto's model "
              "(received tensors count).", "", markdown_table(heads, rows, "lrrrl" + "r" * len(cols) + "ll"), ""]
    trows = [[r["name"]] + [fmt(r["results"].get(a, {}).get("solve_s"), ".3f") for a in cols if a != "expert"]
             + [fmt(r["lower_bound_time_s"], ".2f")] for r in res["cases"]]
    lines += ["### Solve time (s)", "", markdown_table(["case"] + [a for a in cols if a != "expert"] + ["bound"],
                                                       trows), ""]
    mrows = [[r["name"], fmt(max(r["capacity_bytes"]) / 2**30, ".1f")]
             + [fmt(100 * r["results"][a]["peak_memory_fraction"], ".1f") if "peak_memory_fraction" in
                r["results"].get(a, {}) else "" for a in cols] for r in res["cases"]]
    lines += ["### Peak memory (largest device, % of its capacity)", "",
              "Per-device peaks are in the JSON (`peak_memory_bytes`).", "",
              markdown_table(["case", "max capacity (GiB)"] + cols, mrows), ""]
    lines += objectives_markdown(res)
    irows = []
    for r in res["cases"]:
        ilp = r["results"].get("ilp", {})
        f = ilp.get("ilp", {})
        if f:
            irows.append([r["name"], f.get("coarse_nodes", r["nodes"]), f.get("source"),
                          f.get("coarse_timed_out", f.get("timed_out")),
                          fmt(f.get("coarse_mip_gap", f.get("mip_gap")), ".3f"),
                          f.get("coarse_solver_backend", f.get("solver_backend")),
                          fmt(ilp.get("solve_s"), ".1f")])
    if irows:
        lines += ["### ILP details", "", "`source`: which candidate the ILP returned (`ilp` = its own solution; "
                  "a heuristic's name = the warm start or fine-graph heuristic was better after expansion; "
                  "`+refine` = the critical-path local search then improved it).", "",
                  markdown_table(["case", "ILP nodes", "source", "timed out", "MIP gap", "backend", "solve (s)"],
                                 irows), ""]
    return "\n".join(lines)


_OBJECTIVE_TITLES = {
    "throughput": ("Throughput: time per sample (steady state) / lower bound",
                   "The LayerGraphs in their files' stage model (contiguous blocks, the files' memory; the "
                   "dnn-partitioning paper's max-load, the objective of the human-expert splits), the zoo in the op "
                   "model. Heuristics: their schedule order split into stages by the prefix DP (stage model). "
                   "`inv`: the plan breaks the model's rules."),
    "stage_latency": ("Latency in the files' stage model / lower bound (latency LayerGraphs)",
                      "One sample's time with each device's subgraph run as a contiguous block (all inputs in, "
                      "its ops, all outputs out)."),
}


def objectives_markdown(res: dict) -> list[str]:
    """The tables of the extra objectives (:func:`case_objectives`): ratio to the bound
    per algorithm, and for the throughput LayerGraphs our best plan against the expert's."""
    lines = []
    for key, (title, note) in _OBJECTIVE_TITLES.items():
        rows = [r for r in res["cases"] if key in r.get("objectives", {})]
        if not rows:
            continue
        algs = list(dict.fromkeys(a for r in rows for a in r["objectives"][key]["results"]))
        heads = ["case", "model", "bound (ms)"] + algs + (["ours / expert"] if key == "throughput" else [])
        trows = []
        for r in rows:
            o = r["objectives"][key]
            cells = [_ratio_cell(v, a == o["best"], "" if a == o["best"] or v is None or v.get("valid", True)
                                 else " (inv)")
                     for a, v in ((a, o["results"].get(a)) for a in algs)]
            extra = [fmt(o.get("ours_over_expert"))] if key == "throughput" else []
            trows.append([r["name"], o["model"], fmt(o["lower_bound_s"] * 1e3, ".3f")] + cells + extra)
        lines += [f"### {title}", "", note + " Bold: our best valid plan.", "",
                  markdown_table(heads, trows, "llr" + "r" * (len(heads) - 3)), ""]
        if key == "throughput":
            t = res["summary"].get("throughput_vs_expert", {})
            if t.get("cases"):
                lines += [f"Against the human-expert splits on their own objective (time per sample, steady state, "
                          f"stage model): our best plan beats the expert on **{t['beaten']} of {t['cases']}** "
                          "graphs; `ours / expert` per graph above.", ""]
    return lines


def placement_plots(res: dict, out_dir: str) -> list[str]:
    """``placement_ratio.png`` (makespan / bound per case and algorithm) and
    ``placement_solve_time.png`` (solve seconds), both dot plots with one row per case.

    Examples
    --------
    >>> placement_plots(res, "plots")  # doctest: +SKIP
    """
    plt = pyplot()
    cols = _columns(res)
    names = [r["name"] for r in res["cases"]]
    y = np.arange(len(names))
    markers = dict(zip(["single", "m-topo", "m-etf", "m-sct", "heft", "expert", "ilp"], "osD^vPX"))
    out = []
    for key, fname, xlabel, logx in (("ratio_to_lower_bound", "placement_ratio.png", "makespan / lower bound", True),
                                      ("solve_s", "placement_solve_time.png", "solve time (s)", True)):
        fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(names) + 1.6))
        for j, a in enumerate(cols):
            if key == "solve_s" and a == "expert":
                continue
            xs = [r["results"].get(a, {}).get(key) for r in res["cases"]]
            pts = [(x, yy) for x, yy in zip(xs, y) if x is not None and x > 0]
            if pts:
                px, py = zip(*pts)
                ax.scatter(px, np.asarray(py) + (j - len(cols) / 2) * 0.06, marker=markers.get(a, "o"), s=26,
                           label=a, zorder=3 if a == "ilp" else 2)
        if key == "ratio_to_lower_bound":
            ax.axvline(1.0, color="k", lw=0.8)
            ax.axvline(1.0 + ILP_GOAL, color="g", lw=0.8, ls="--", label=f"+{ILP_GOAL:.0%}")
            ax.axvline(1.0 + HEURISTIC_SLACK, color="r", lw=0.8, ls=":", label=f"+{HEURISTIC_SLACK:.0%}")
        if logx:
            ax.set_xscale("log")
        ax.set_yticks(y)
        ax.set_yticklabels(names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.grid(True, axis="x", which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        out.append(save_figure(fig, os.path.join(out_dir, fname)))
    return out
