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

For each case and algorithm (:mod:`tvm_pesto.bench.placement_case` runs one case): simulated
makespan, makespan / lower bound (:func:`tvm_pesto.solve.bounds.makespan.lower_bound`, LP relaxation up
to ``lp_max_nodes`` nodes), wall-clock solve time and peak memory per device. Each case also records the checks of
issue 3: the ILP plan is never worse than the best heuristic, and it is within 5 % of the
lower bound wherever the best heuristic is within 10 % of it.

Both objectives (issue 14, :mod:`tvm_pesto.plan.objective`): each case's ``objectives``
also holds the throughput (time per sample, steady state) in the case's own execution model
(stage for the LayerGraphs, op for the zoo) and, for the latency LayerGraphs, the latency in
the files' stage model, per algorithm (``stage-dp`` too) against
:func:`tvm_pesto.solve.bounds.objective.objective_lower_bound`; on the throughput
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
import inspect
import os
import time
from typing import Callable, Iterable

import numpy as np

from ..cluster import parse_cluster
from ..costs.predict.roofline import roofline_costs
from ..errors import GraphError
from ..graph import dnn_partitioning as dp
from ..plan import Problem
from ..plan.problem import layer_graph_problem
from ..solve import get_solver
from .placement_case import ALGORITHMS, HEURISTIC_SLACK, ILP_GOAL, Case, run_case
from .report import fmt, machine_info, markdown_table, pyplot, save_figure

SETTINGS = ("latency", "throughput")
ZOO_CLUSTERS = ("2xV100-nvlink", "4xV100-pcie", "8xA100-nvlink")
#: The quick subset (``--quick``): two small LayerGraphs and one small zoo model.
QUICK = {"layergraphs": ["bert24_inference"], "settings": ["latency", "throughput"], "models": ["mlp_mixer"],
         "size": "small", "clusters": ["2xV100-nvlink"]}


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
            problem, meta = layer_graph_problem(path)
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
    # lazy: loads TVM's compiler and PyTorch, which importing this module does not
    from .. import api, zoo

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
    """Run :func:`~tvm_pesto.bench.placement_case.run_case` on every case; returns ``machine``,
    ``settings``, ``cases`` and ``summary`` (:func:`summarize`).

    Examples
    --------
    >>> res = run_placement(layergraph_cases(names=["bert24_inference"]), ilp_time_limit_s=2)  # doctest: +SKIP
    >>> res["summary"]["cases"]  # doctest: +SKIP
    2
    """
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
        # lazy: loads PuLP (the MIP solvers), which importing this module does not
        from ..solve.placement_ilp.driver import solve as ilp_solve

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
    """The tables of the extra objectives (:func:`~tvm_pesto.bench.placement_case.case_objectives`): ratio to the bound
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
