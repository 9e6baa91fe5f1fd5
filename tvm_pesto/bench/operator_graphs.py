"""The operator-level latency graphs of msr-fiddle/dnn-partitioning in ``tvm-pesto bench
placement --operator-graphs``: our stage plans, lower bounds and gaps beside the best figures
known from outside.

Each graph (``latency-inputs/OperatorGraphs/*.json.gz``, shipped with tvm-pesto) is placed as
``tvm-pesto place <graph> --cluster from-graph --solver auto`` places it: the stage model's
``ilp`` solver (:mod:`tvm_pesto.solve.stage.ilp`; on these graphs the piece MIP of
:mod:`tvm_pesto.solve.stage.piece_mip`), judged by the stage evaluator, whose latency is the
authors' evaluator's (``latency-greedy/greedy.cpp -computeLatency``): the files' problems
carry the benchmark's rule for the host CPUs (:class:`tvm_pesto.plan.problem.HostPool`,
``rules`` in each row). The lower bound is the larger of
:func:`tvm_pesto.solve.bounds.objective.objective_lower_bound` and the MIP's dual bound.

Outside figures (:data:`OUTSIDE`), each scored by the authors' evaluator:

* ``greedy``: the authors' latency greedy (``latency-greedy/greedy.cpp`` built from their
  repository and run on the file; reproduced here);
* ``dp``: the authors' max-load DP (``throughput-dp/dp.cpp``) scored for latency, and
  ``lip``: the paper's latency IP (``latency-ip/lip.py``) written for PuLP and solved by
  HiGHS on one thread for 10 minutes, as reported in tvm-pesto issue 57 (lip found nothing
  better than everything on the CPU on bert_l-12, 14016.8).

Examples
--------
>>> sorted(OUTSIDE)
['bert_l-12_inference', 'bert_l-3_inference', 'bert_l-6_inference', 'resnet50_inference']
>>> min(OUTSIDE["bert_l-3_inference"].values())
408.474
"""
from __future__ import annotations

import glob
import os
import time

from ..graph import dnn_partitioning as dp
from ..plan.problem import layer_graph_problem
from ..plan.objective import evaluate
from ..solve import solve
from ..solve.bounds.objective import objective_lower_bound
from .report import fmt

#: Latency (ms, the files' unit) of the outside plans by graph (module docstring).
OUTSIDE = {
    "bert_l-3_inference": {"greedy": 416.204, "dp": 414.441, "lip": 408.474},
    "bert_l-6_inference": {"greedy": 494.135, "dp": 444.020, "lip": 438.062},
    "bert_l-12_inference": {"greedy": 867.839, "dp": 1327.031, "lip": 14016.8},
    "resnet50_inference": {"greedy": 839.536, "dp": 1123.653, "lip": 785.703},
}
SOURCES = {"greedy": "authors' latency greedy (latency-greedy/greedy.cpp)",
           "dp": "authors' max-load DP (throughput-dp/dp.cpp), scored for latency (issue 57)",
           "lip": "paper's latency IP (latency-ip/lip.py), PuLP + HiGHS, 1 thread, 10 min (issue 57)"}


def operator_graph_paths(root: str | None = None, names=None) -> list[str]:
    """The latency operator graphs under ``root`` (default: the shipped folder)."""
    root = str(root) if root is not None else str(dp.benchmark_dir())
    paths = sorted(glob.glob(os.path.join(root, "latency-inputs", "OperatorGraphs", "*.json*")))
    return [p for p in paths if dp.is_graph_file(p) and (names is None or dp.graph_stem(p) in names)]


def operator_graph_row(path: str, time_limit_s: float, deterministic: bool = True) -> dict:
    """One graph's row: stage-DP and ILP latencies, the ILP's status, bound and gap (times
    in ms, the files' unit), beside :data:`OUTSIDE`."""
    problem, meta = layer_graph_problem(path)
    graph = problem.graph
    ms = 1.0 / meta["time_unit_s"]  # seconds -> the files' unit (ms)
    row = {"graph": meta["name"], "nodes": graph.num_nodes, "accelerators": meta["max_accelerators"],
           "cpus": meta["max_cpus"], "outside": OUTSIDE.get(meta["name"], {}),
           "rules": problem.host_pool.to_json()["rule"] if problem.pooled("stage", "latency") else "stage"}
    for name in ("stage-dp", "ilp"):
        t0 = time.perf_counter()
        plan = solve(problem, name, model="stage", objective="latency", time_limit_s=time_limit_s,
                     deterministic=deterministic)
        ev = evaluate(problem, plan, "stage", "latency")
        row[name] = {"latency": ev.objective_value * ms, "valid": ev.valid, "solve_s": time.perf_counter() - t0,
                     "status": plan.info.get("status", "heuristic"), "mip": plan.info.get("mip"),
                     "mip_status": plan.info.get("mip_status")}
        if name == "ilp":
            row["mip_bound"] = plan.info.get("mip_bound_s", 0.0) * ms
    lb = objective_lower_bound(problem, "stage", "latency", None, deterministic=deterministic)["best"] * ms
    row["bound"] = max(lb, row["mip_bound"])
    row["gap"] = row["ilp"]["latency"] / row["bound"] - 1.0 if row["bound"] > 0 else None
    best_out = min(row["outside"].values()) if row["outside"] else None
    row["best_outside"] = best_out
    row["ours_over_best_outside"] = row["ilp"]["latency"] / best_out if best_out else None
    return row


def operator_graph_rows(root: str | None = None, names=None, time_limit_s: float = 30.0, deterministic: bool = True,
                        progress=None) -> list[dict]:
    """:func:`operator_graph_row` of every operator graph under ``root``."""
    rows = []
    for path in operator_graph_paths(root, names):
        if progress:
            progress(f"operator graph {dp.graph_stem(path)}")
        rows.append(operator_graph_row(path, time_limit_s, deterministic))
    return rows


def operator_graphs_markdown(rows: list[dict]) -> list[str]:
    """The operator graphs' table (latency in the files' ms) and the outside figures' sources."""
    head = ("| graph | ops | acc. | authors' greedy | authors' DP | paper's IP (HiGHS) | stage-dp | ours (ilp) | "
            "status | lower bound | gap | ours / best outside | solve s |")
    out = ["### Latency operator graphs (dnn-partitioning)", "", head, "|" + "---|" * 13]
    for r in rows:
        o = r["outside"]
        out.append(f"| {r['graph']} | {r['nodes']} | {r['accelerators']} | {fmt(o.get('greedy'))} | "
                   f"{fmt(o.get('dp'))} | {fmt(o.get('lip'))} | {fmt(r['stage-dp']['latency'])} | "
                   f"{fmt(r['ilp']['latency'])} | {r['ilp']['status']} | {fmt(r['bound'])} | "
                   f"{fmt(100 * r['gap'], '.1f') + ' %' if r['gap'] is not None else '-'} | "
                   f"{fmt(r['ours_over_best_outside'])} | {fmt(r['ilp']['solve_s'], '.1f')} |")
    rules = sorted({r.get("rules", "stage") for r in rows})
    out += ["", "Outside figures: " + "; ".join(f"{k}: {v}" for k, v in SOURCES.items()) + ".",
            f"Rules: {', '.join(rules)} (host-pool: the benchmark's rule for the host CPUs, CPU nodes side by side "
            "and a colour class all on the CPUs or on one accelerator; tvm_pesto.plan.problem.HostPool).", ""]
    return out


__all__ = ["OUTSIDE", "SOURCES", "operator_graph_paths", "operator_graph_row", "operator_graph_rows",
           "operator_graphs_markdown"]
