"""``tvm-pesto bench scale``: solver wall time on random DNN-like DAGs of 1k-100k ops.

For each size, a random layered DAG (:mod:`tvm_pesto.bench.random_dag`) on a
``4xV100-pcie`` cluster is placed by every heuristic and by the ILP path of
:func:`tvm_pesto.solve.placement_ilp.driver.solve`: coarsen + coarse MIP + expand, HEFT on the fine graph,
``lns_s`` of large-neighbourhood search (:mod:`tvm_pesto.solve.placement_ilp.lns`) from the better of the
two and ``refine_s`` of local search (the other heuristics are not re-run on the fine
graph), all within ``ilp_max_s`` wall-clock seconds (:func:`tvm_pesto.solve.budget.wall_cap`:
the searches' work budgets hold the plan fixed across machines, and the cap holds the wall
time on a slower one, where the row then says which search it stopped). Each row has the
wall time, the simulated makespan and its ratio to the lower bound
of :func:`tvm_pesto.solve.lower_bound` without the LP (critical path, total work and, up to
5,000 ops, the transfer-aware segment and path-memory bounds); the ILP row also has the ratio
after each step of its path (``ratio_by_step``), so the report says where an improvement
came from.

Examples
--------
>>> from tvm_pesto.bench.scale import IlpPath, run_scale
>>> res = run_scale([20], algorithms=["heft", "ilp"], ilp=IlpPath(time_limit_s=1, lns_s=1, refine_s=0.5, target=10))
>>> [r["algorithm"] for r in res["rows"]], sorted(res["rows"][0])
(['heft', 'ilp'], ['algorithm', 'makespan_s', 'n', 'ratio_to_lower_bound', 'wall_s'])
"""
from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass
from typing import Callable

from ..errors import PestoError
from ..plan import simulate
from ..solve import get_solver, lower_bound
from ..solve.budget import wall_cap
from ..solve.placement_ilp.coarsen import coarsen
from .random_dag import dnn_like_problem
from .report import fmt, machine_info, markdown_table, pyplot, save_figure

DEFAULT_SIZES = (1000, 10000, 100000)
QUICK_SIZES = (300, 1000)
ALGORITHMS = ("single", "m-topo", "m-etf", "m-sct", "heft", "ilp")
#: The ILP path's wall-clock cap per size (#31 asks for under 60 s at every size on any machine).
ILP_MAX_S = 55.0


@dataclass(frozen=True)
class IlpPath:
    """The ILP path's settings in ``bench scale``.

    Attributes
    ----------
    time_limit_s : float
        MIP solver time limit on the coarse graph.
    target : int
        Supernodes after coarsening.
    solver : {"cbc", "highs"}
        MIP backend.
    lns_s, refine_s : float
        Seconds (nominal seconds of work in deterministic mode) of the large-neighbourhood
        search (:mod:`tvm_pesto.solve.placement_ilp.lns`) and of the local search.
    max_s : float or None
        Wall-clock seconds the path may take per size, coarsening included: its MIPs and
        searches stop there whatever their budgets (None: no cap). A row the cap stopped
        says where (``clock_stopped``) and is not ``deterministic``.
    """

    time_limit_s: float = 2.0
    target: int = 40
    solver: str = "cbc"
    lns_s: float = 25.0
    refine_s: float = 5.0
    max_s: float | None = ILP_MAX_S


def _ilp_row(problem, ilp: IlpPath, lower_bound_s: float) -> dict:
    """The ILP path on one graph: coarsen + MIP + expand, HEFT on the fine graph, the LNS from
    the better of the two, the local search; with each step's ratio to the bound."""
    # lazy: loads PuLP (the MIP solvers), which importing this module does not
    from ..solve.placement_ilp.driver import solve
    from ..solve.placement_ilp.lns import LnsSettings

    t = time.perf_counter()
    coarse, _ = coarsen(problem, ilp.target)
    t_coarsen = time.perf_counter() - t
    t = time.perf_counter()
    with wall_cap(math.inf if ilp.max_s is None else ilp.max_s):
        plan = solve(problem, target=ilp.target, time_limit_s=ilp.time_limit_s, solver=ilp.solver,
                     fine_heuristics=False, lns=LnsSettings(seconds=ilp.lns_s), refine_s=ilp.refine_s)
    wall = time.perf_counter() - t
    span = simulate(problem, plan).makespan
    info = plan.info
    lns = info.get("lns", {})
    steps = {s["step"]: s["objective_value_s"] / lower_bound_s for s in info.get("improvement", [])}
    return {"wall_s": wall, "makespan_s": span, "coarsen_s": t_coarsen, "coarse_nodes": coarse.num_nodes,
            "ilp_s": info.get("ilp_s"), "ilp_timed_out": info.get("coarse_timed_out"),
            "source": info.get("source", "ilp"), "coarse_mip_gap": info.get("coarse_mip_gap"),
            "coarse_vars": info.get("coarse_num_vars"), "coarse_constraints": info.get("coarse_num_constraints"),
            "coarse_backend": info.get("coarse_solver_backend"),
            "lns_s": lns.get("seconds"), "lns_windows": lns.get("windows"), "lns_accepted": lns.get("accepted"),
            "refine_s": info.get("refine", {}).get("seconds"), "refine_moves": info.get("refine", {}).get("moves"),
            "ratio_by_step": steps, "deterministic": info.get("deterministic"),
            "clock_stopped": info.get("deterministic_reason"),
            "coarse_ratio": (info["improvement"][0]["objective_value_s"] / lower_bound_s
                             if info.get("improvement") else None)}


def run_scale(sizes=DEFAULT_SIZES, algorithms=ALGORITHMS, ilp: IlpPath = IlpPath(), seed: int = 0,
              cluster: str = "4xV100-pcie", progress: Callable[[str], None] | None = None) -> dict:
    """Time every algorithm on random DNN-like DAGs of each size.

    Parameters
    ----------
    sizes : sequence of int
        Numbers of ops.
    algorithms : sequence of str
        Registered solver names; ``"ilp"`` means coarsen + ILP + expand.
    ilp : IlpPath
        The ILP path's settings.
    seed, cluster
        Passed to :func:`tvm_pesto.bench.random_dag.dnn_like_problem`.
    progress : callable, optional
        Called with one line of text per finished row.

    Returns
    -------
    dict
        ``machine``, ``settings``, ``graphs`` (per size: nodes, edges, build seconds, lower
        bound) and ``rows``: one per (size, algorithm) with ``n``, ``algorithm``, ``wall_s``,
        ``makespan_s``, ``ratio_to_lower_bound`` and, for ``ilp``, ``coarsen_s``,
        ``coarse_nodes``, ``ilp_timed_out`` and the coarse model's size; a failed algorithm
        has ``error`` instead.

    Examples
    --------
    >>> res = run_scale([20], algorithms=["heft"])
    >>> res["rows"][0]["algorithm"]
    'heft'
    """
    say = progress or (lambda _m: None)
    for name in algorithms:
        get_solver(name)  # unknown names fail before any work
    t_all = time.perf_counter()
    graphs, rows = [], []
    for n in sizes:
        t = time.perf_counter()
        problem = dnn_like_problem(int(n), seed=seed, cluster=cluster)
        problem.graph.topo_order()  # cached, as any caller of the solvers would have it
        build_s = time.perf_counter() - t
        lb = lower_bound(problem, lp=False)["best"]
        graphs.append({"n": int(n), "edges": problem.graph.num_edges, "build_s": build_s, "lower_bound_s": lb,
                       "devices": problem.num_devices, "cluster": problem.cluster.name})
        say(f"n={n}: {problem.graph.num_edges} edges, built in {build_s:.1f} s")
        for name in algorithms:
            row = {"n": int(n), "algorithm": name}
            t = time.perf_counter()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    if name == "ilp":
                        row.update(_ilp_row(problem, ilp, lb))
                    else:
                        plan = get_solver(name)(problem)
                        row["wall_s"] = time.perf_counter() - t
                        row["makespan_s"] = simulate(problem, plan).makespan
            except PestoError as e:
                row.update(wall_s=time.perf_counter() - t, error=str(e))
            if "makespan_s" in row:
                row["ratio_to_lower_bound"] = row["makespan_s"] / lb if lb > 0 else None
            rows.append(row)
            say(f"  {name}: {row['wall_s']:.2f} s" + (f", makespan {row['makespan_s'] * 1e3:.3f} ms"
                                                       if "makespan_s" in row else f", failed: {row['error']}"))
    return {"benchmark": "scale", "machine": machine_info(),
            "settings": {"sizes": [int(n) for n in sizes], "algorithms": list(algorithms),
                         "ilp_time_limit_s": ilp.time_limit_s, "ilp_target": ilp.target, "ilp_solver": ilp.solver,
                         "lns_s": ilp.lns_s, "refine_s": ilp.refine_s, "ilp_max_s": ilp.max_s, "seed": seed,
                         "cluster": cluster},
            "graphs": graphs, "rows": rows, "total_s": time.perf_counter() - t_all}


def scale_markdown(res: dict) -> str:
    """Markdown: one row per size, wall seconds of each algorithm (makespan / bound below).

    Examples
    --------
    >>> res = run_scale([20], algorithms=["heft"])
    >>> print(scale_markdown(res))
    Wall time per algorithm (4xV100-pcie; ...
    | ops | edges | heft (s) |
    |:--|--:|--:|
    | 20 | 30 | ... |
    ...
    """
    algs = res["settings"]["algorithms"]
    by = {(r["n"], r["algorithm"]): r for r in res["rows"]}
    heads = ["ops", "edges"] + [f"{a} (s)" for a in algs]
    rows, rrows = [], []
    for g in res["graphs"]:
        n = g["n"]
        cells = []
        rcells = []
        for a in algs:
            r = by.get((n, a), {})
            cells.append("failed" if "error" in r else fmt(r.get("wall_s"), ".2f"))
            rcells.append("failed" if "error" in r else fmt(r.get("ratio_to_lower_bound"), ".3f"))
        rows.append([n, g["edges"]] + cells)
        rrows.append([n] + rcells)
    m = res["machine"]
    st = res["settings"]
    cap = f", all within {st['ilp_max_s']:g} s" if st.get("ilp_max_s") is not None else ""
    out = [f"Wall time per algorithm ({st['cluster']}; ILP = coarsen to "
           f"{st['ilp_target']} supernodes + {st['ilp_solver']} with a "
           f"{st['ilp_time_limit_s']:g} s limit + expand, HEFT, {st.get('lns_s', 0):g} s of LNS (MIP windows), "
           f"{st.get('refine_s', 0):g} s of local search{cap}). Machine: {m['nproc']} CPUs, "
           f"{m['cpu_model']}, load average {m['load_average']}.", "",
           markdown_table(heads, rows), "", "Simulated makespan / lower bound (`lower_bound` without the LP):", "",
           markdown_table(["ops"] + algs, rrows)]
    ilp = [r for r in res["rows"] if r["algorithm"] == "ilp" and "error" not in r]
    if ilp:
        out += ["", "ILP breakdown:", "",
                markdown_table(["ops", "coarsen (s)", "supernodes", "coarse vars", "coarse constraints",
                                "MIP timed out", "LNS (s)", "windows", "kept", "local search (s)", "moves",
                                "total (s)"],
                               [[r["n"], fmt(r.get("coarsen_s"), ".2f"), r.get("coarse_nodes"), r.get("coarse_vars"),
                                 r.get("coarse_constraints"), r.get("ilp_timed_out"), fmt(r.get("lns_s"), ".2f"),
                                 r.get("lns_windows"), r.get("lns_accepted"), fmt(r.get("refine_s"), ".2f"),
                                 r.get("refine_moves"), fmt(r["wall_s"], ".2f")]
                                for r in ilp]),
                "", "Where the ILP path's plan came from (makespan / bound after each step; `heft` is its start on "
                    "the fine graph, `ilp` the expanded coarse MIP):", "",
                markdown_table(["ops", "coarse ILP", "heft (start)", "after LNS", "after local search", "final",
                                "source"],
                               [[r["n"], fmt(r.get("coarse_ratio"), ".3f"),
                                 fmt(r["ratio_by_step"].get("heft"), ".3f"), fmt(r["ratio_by_step"].get("lns"), ".3f"),
                                 fmt(r["ratio_by_step"].get("refine"), ".3f"), fmt(r.get("ratio_to_lower_bound"), ".3f"),
                                 r.get("source")] for r in ilp])]
        stopped = [f"- {r['n']} ops: {r['clock_stopped']}" for r in ilp if r.get("clock_stopped")]
        if stopped:
            out += ["", "Where a clock stopped the ILP path (that row's plan may differ on another machine):", ""]
            out += stopped
    return "\n".join(out) + "\n"


def scale_plots(res: dict, out_dir: str) -> list[str]:
    """``scale_wall_time.png``: wall seconds against ops, one line per algorithm (log-log).

    Examples
    --------
    >>> res = run_scale([20], algorithms=["heft"])
    >>> import tempfile
    >>> scale_plots(res, tempfile.mkdtemp())
    ['.../scale_wall_time.png']
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for a in res["settings"]["algorithms"]:
        pts = [(r["n"], r["wall_s"]) for r in res["rows"] if r["algorithm"] == a and "error" not in r]
        if pts:
            xs, ys = zip(*sorted(pts))
            ax.plot(xs, ys, marker="o", label="coarsen+ILP" if a == "ilp" else a)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ops in the graph")
    ax.set_ylabel("wall time (s)")
    ax.set_title(f"Placement wall time, {res['settings']['cluster']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return [save_figure(fig, os.path.join(out_dir, "scale_wall_time.png"))]
