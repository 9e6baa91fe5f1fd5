"""The stage ILP against the heuristics and the bound on the dnn-partitioning LayerGraphs, in
``tvm-pesto bench placement --stage-ilp``: per file and objective (one sample's latency, and
the steady state's time per sample), the best heuristic, the ILP, its status and whose plan it
returns, the lower bound and the gap.

Each row is what ``tvm-pesto place <file> --cluster from-graph --solver all --objective
<objective>`` finds in the stage model: :mod:`tvm_pesto.solve.stage.ilp` (the ``ilp``
solver), whose starts are the stage DP and every heuristic made a stage plan, each judged by
the objective (``start_values_s``: the best of them is the best heuristic); the bound is the
larger of :func:`tvm_pesto.solve.bounds.objective.objective_lower_bound` and the ILP's own
(its MIP's dual bound where valid). Where a file's problem carries the benchmark's host pool
(:class:`tvm_pesto.plan.problem.HostPool`, its one-pass files' latency), the row says so
(``rules``).

Examples
--------
>>> row = StageIlpRow("throughput", "g", "latency", {"heft": 2.0, "single": 3.0, "stage-dp": 2.0}, 1.9, True,
...                   "optimal", "ilp", None, None, 1.9, 0.0, 0.5, "stage")
>>> stage_ilp_markdown([row.to_json()])[2]
'| throughput | g | latency | 2.000 (heft, stage-dp) | 1.900 | optimal (ilp) | 1.900 | 0.0 % | 0.5 |'
"""
from __future__ import annotations

import glob
import os
import time
from dataclasses import asdict, dataclass

from ..graph import dnn_partitioning as dp
from ..plan.objective import evaluate
from ..plan.problem import layer_graph_problem
from ..solve import solve
from ..solve.bounds.objective import objective_lower_bound

OBJECTIVES = ("latency", "throughput")
SETTINGS = ("latency", "throughput")
_TIE = 1e-9


@dataclass(frozen=True)
class StageIlpRow:
    """One file and objective (times in ms): ``starts``, the value of every heuristic's (and
    the stage DP's) valid stage plan (the best one, and every one within 1e-9 of it, is the
    best heuristic), the ILP's value, whether its plan is a valid
    stage plan, its ``status`` and ``source`` (whose plan), the MIP it ran (``mip``,
    ``mip_status``), the ``bound``, ``gap`` (ILP / bound - 1) and ``solve_s`` (the ILP,
    starts included); ``rules``: ``host-pool`` or ``stage``."""

    inputs: str
    graph: str
    objective: str
    starts: dict
    ilp: float
    valid: bool
    status: str
    source: str
    mip: str | None
    mip_status: str | None
    bound: float
    gap: float | None
    solve_s: float
    rules: str

    def to_json(self) -> dict:
        return asdict(self)


def layergraph_files(root: str | None = None, settings=SETTINGS) -> list[tuple[str, str]]:
    """``(setting, path)`` of every LayerGraph under ``root`` (default: the shipped folder)."""
    root = str(root) if root is not None else str(dp.benchmark_dir())
    return [(s, p) for s in settings
            for p in sorted(glob.glob(os.path.join(root, f"{s}-inputs", "LayerGraphs", "*.json")))]


def stage_ilp_row(setting: str, path: str, objective: str, time_limit_s: float,
                  deterministic: bool = True) -> StageIlpRow:
    """One row (module docstring) of the file at ``path`` for ``objective``."""
    problem, meta = layer_graph_problem(path)
    t0 = time.perf_counter()
    plan = solve(problem, "ilp", model="stage", objective=objective, time_limit_s=time_limit_s,
                 deterministic=deterministic)
    solve_s = time.perf_counter() - t0
    info = plan.info
    ev = evaluate(problem, plan, "stage", objective)
    starts = {k: v for k, v in info["start_values_s"].items() if k != "warm_start"}
    lb = objective_lower_bound(problem, "stage", objective, None, deterministic=deterministic)["best"]
    bound = max(lb, info.get("lower_bound_s") or 0.0)
    return StageIlpRow(setting, meta["name"], objective, {k: v * 1e3 for k, v in starts.items()},
                       ev.objective_value * 1e3, ev.valid,
                       info.get("status", "heuristic"), info.get("source", "?"), info.get("mip"),
                       info.get("mip_status"), bound * 1e3,
                       ev.objective_value / bound - 1.0 if bound > 0 else None, solve_s,
                       problem.host_pool.to_json()["rule"] if problem.pooled("stage", objective) else "stage")


def stage_ilp_rows(root: str | None = None, time_limit_s: float = 1.0, deterministic: bool = True,
                   objectives=OBJECTIVES, progress=None) -> list[dict]:
    """:func:`stage_ilp_row` of every LayerGraph and objective, as JSON records."""
    rows = []
    for setting, path in layergraph_files(root):
        for objective in objectives:
            if progress:
                progress(f"stage ILP {setting}/{dp.graph_stem(path)} {objective}")
            rows.append(stage_ilp_row(setting, path, objective, time_limit_s, deterministic).to_json())
    return rows


def stage_ilp_markdown(rows: list[dict]) -> list[str]:
    """The table: values in ms (throughput: the steady state's time per sample); "all" where
    every start ties."""
    head = "| inputs | graph | objective | best heuristic | ilp | status (source) | bound | gap | solve s |"
    out = [head, "|:--|:--|:--|--:|--:|:--|--:|--:|--:|"]
    for r in rows:
        low = min(r["starts"].values())
        tie = [k for k, v in r["starts"].items() if v <= low * (1 + _TIE)]
        best = "all" if len(tie) == len(r["starts"]) else ", ".join(tie)
        gap = f"{100 * r['gap']:.1f} %" if r["gap"] is not None else "-"
        out.append(f"| {r['inputs']} | {r['graph']} | {r['objective']} | {low:.3f} ({best}) | "
                   f"{r['ilp']:.3f}{'' if r['valid'] else ' (invalid)'} | {r['status']} ({r['source']}) | "
                   f"{r['bound']:.3f} | {gap} | {r['solve_s']:.1f} |")
    return out


__all__ = ["OBJECTIVES", "StageIlpRow", "layergraph_files", "stage_ilp_markdown", "stage_ilp_row", "stage_ilp_rows"]
