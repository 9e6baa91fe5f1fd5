"""``tvm-pesto bench search``: how long the joint search takes, with the costs in hand.

For each model (zoo names at ``size``, or model files): import, analyze, generate every
backend's candidates, predict their costs (``xgb`` by default: measuring is separate and
cached), and time the joint solve (cover, placement, joint local search). Reported per
model: ops, candidates, units, the time of each stage, how the cover was found (exact or
not, pieces, states), and the plan (backend mix, devices, simulated makespan).

Examples
--------
Not run as a doctest: the full-size BERT takes minutes.

>>> from tvm_pesto.bench.search import bench_search     # doctest: +SKIP
>>> res = bench_search(["bert"], size="full")            # doctest: +SKIP
>>> res["models"]["bert"]["solve_s"]                     # doctest: +SKIP
"""
from __future__ import annotations

import time

from ..costs import candidate_costs
from .report import machine_info


def bench_model(target: str, size: str = "full", cluster: str = "cpu:2", costs: str = "xgb",
                backends: str = "all", solver: str = "auto", search_s: float = 5.0, progress=None) -> dict:
    """Time every stage of the flow up to the plan for one model (no build, no run)."""
    # lazy: loads TVM's compiler, which importing this module does not
    from .. import api
    from ..models import load_model

    t0 = time.perf_counter()
    lm = load_model(target, size)
    t1 = time.perf_counter()
    cl = api.as_cluster(cluster)
    an = api.analyze(lm.mod)
    cs = api.make_candidates(an, cl, backends)
    t2 = time.perf_counter()
    ct = candidate_costs(cs, cl, costs)
    t3 = time.perf_counter()
    # the flow's solve (split decision off: the joint search's time alone)
    pl = api.place_from_costs(api.CostedCandidates(an, cl, cs, ct), solver, search_s=search_s, split_margin=0.0)
    plan, placed = pl.plan, pl.problem
    t4 = time.perf_counter()
    info = plan.info
    if progress:
        progress(f"{lm.name}: {an.op_graph.num_nodes} ops, {len(cs)} candidates, solve {t4 - t3:.1f} s")
    return {
        "model": lm.name, "source": lm.source, "num_ops": an.op_graph.num_nodes, "num_candidates": len(cs),
        "candidates_by_backend": cs.by_backend(), "num_units": placed.num_nodes,
        "import_s": t1 - t0, "candidates_s": t2 - t1, "costs_s": t3 - t2, "solve_s": t4 - t3,
        "search_total_s": t4 - t1,  # candidates + costs (predicted) + solve: what a user waits for
        "cover": {k: info.get(k) for k in ("cover", "cover_exact", "cover_states", "cover_s", "cover_cap",
                                            "covers_tried")},
        "joint_search": info.get("search"), "cost_columns": ct.columns,
        "backend_mix": plan.backend_mix(), "devices_used": plan.devices_used(),
        "simulated_s": float(pl.sim.makespan),
    }


def bench_search(targets, size: str = "full", cluster: str = "cpu:2", costs: str = "xgb", backends: str = "all",
                 solver: str = "auto", search_s: float = 5.0, progress=None) -> dict:
    """:func:`bench_model` for every target; ``max_search_total_s`` over them."""
    out = {"size": size, "cluster": cluster, "costs": costs, "backends": backends, "solver": solver,
           "search_s": search_s, "machine": machine_info(), "models": {}}
    for t in targets:
        r = bench_model(t, size, cluster, costs, backends, solver, search_s, progress)
        key = r["model"] if r["model"] not in out["models"] else f"{r['model']} ({r['source']})"
        out["models"][key] = r
    out["max_search_total_s"] = max((m["search_total_s"] for m in out["models"].values()), default=None)
    out["machine_after"] = machine_info()
    return out


__all__ = ["bench_model", "bench_search"]
