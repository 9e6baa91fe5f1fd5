"""Plans from predicted costs vs plans from measured costs, measured end to end.

Run it before relying on ``--costs xgb`` on a new machine (are plans from predicted costs as
fast as plans from measured ones here?), and after retraining the cost model.

For each zoo model: place its fused groups on ``cpu:2`` with

* ``measured`` costs: every group is compiled and timed (fresh measurement log, so the
  profiling time is real),
* ``xgb`` costs: the bundled cost model predicts every group (no measurement),
* ``roofline`` costs: the analytical estimate (reference),

build each plan, run the placed modules interleaved (round-robin blocks of runs, so slow
drifts of the machine hit all variants alike) and report the median latency of each, the
latency of the xgb plan relative to the measured plan, how many measurements each needed
and the profiling time saved.

Usage::

    python lab/scripts/bench_cost_model_plans.py --models inception_v3,resnet50,bert --rounds 8 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np


def bench_model(name: str, size: str, cluster_spec: str, rounds: int, per_round: int, solver: str) -> dict:
    from tvm_pesto import api, zoo
    from tvm_pesto.builder.placed import PlacedModule
    from tvm_pesto.builder.rewrite import apply_plan
    from tvm_pesto.cluster import parse_cluster
    from tvm_pesto.costs.predict.xgb import load_model, predict_costs
    from tvm_pesto.costs.store.cache import MeasureCache

    zm = zoo.load(name, size)
    cluster = parse_cluster(cluster_spec)
    analysis = api.analyze(zm.mod)
    res: dict = {"model": name, "size": size, "cluster": cluster.name, "groups": len(analysis.groups),
                 "load_before": list(os.getloadavg())}
    tables = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache = MeasureCache(os.path.join(tmp, "m.jsonl"))
        t = time.perf_counter()
        tables["measured"], _ = api.estimate_costs(analysis, cluster, "measured", cache=cache)
        res["measured_cost_s"] = time.perf_counter() - t
        res["measured_measurements"] = len(cache)  # distinct group structures + the VM call overhead
    model = load_model()
    t = time.perf_counter()
    tables["xgb"] = predict_costs(analysis, cluster, model=model)
    res["xgb_cost_s"] = time.perf_counter() - t
    res["xgb_measurements"] = 0
    t = time.perf_counter()
    tables["roofline"], _ = api.estimate_costs(analysis, cluster, "roofline")
    res["roofline_cost_s"] = time.perf_counter() - t
    col = tables["measured"][:, 0]
    ape = np.abs(tables["xgb"][:, 0] - col) / col
    res["xgb_group_mape"] = float(100 * ape.mean())
    res["xgb_total_over_measured_total"] = float(tables["xgb"][:, 0].sum() / col.sum())
    placed = {}
    for k, table in tables.items():
        pl = api.place(analysis, cluster, backends="tvm", solver=solver, costs=table)
        pm = PlacedModule(apply_plan(analysis.rg, pl.plan, cluster), cluster, pl.plan, pl)
        placed[k] = pm
        # the plan's makespan evaluated under the measured costs (same simulator)
        from tvm_pesto.plan import Problem, simulate

        under_measured = simulate(Problem(analysis.graph, cluster, tables["measured"]), pl.plan).makespan
        res[k] = {"assignment": [int(x) for x in pl.plan.assignment], "simulated_s": float(pl.sim.makespan),
                  "simulated_under_measured_costs_s": float(under_measured), "devices_used": pm.devices_used}
    res["xgb_same_plan_as_measured"] = res["xgb"]["assignment"] == res["measured"]["assignment"]
    for pm in placed.values():
        pm(*zm.example_inputs)  # warm-up and a numerics smoke run
    runs: dict = {k: [] for k in placed}
    for _ in range(rounds):
        for k, pm in placed.items():
            b = pm.benchmark(*zm.example_inputs, repeat=per_round, warmup=1, min_seconds=0, warmup_seconds=0)
            runs[k].append(b["median_s"])
    for k, pm in placed.items():
        res[k]["latency_median_s"] = float(np.median(runs[k]))
        res[k]["latency_rounds_s"] = runs[k]
        pm.close()
    m = res["measured"]["latency_median_s"]
    res["xgb_latency_over_measured"] = res["xgb"]["latency_median_s"] / m
    res["roofline_latency_over_measured"] = res["roofline"]["latency_median_s"] / m
    res["profiling_time_saved_s"] = res["measured_cost_s"] - res["xgb_cost_s"]
    res["load_after"] = list(os.getloadavg())
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="inception_v3,resnet50,bert,mobilenet_v2")
    ap.add_argument("--size", default="small")
    ap.add_argument("--cluster", default="cpu:2")
    ap.add_argument("--solver", default="heft")
    ap.add_argument("--rounds", type=int, default=8, help="interleaved rounds")
    ap.add_argument("--per-round", type=int, default=5, help="runs per variant per round")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    out = {"models": []}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        r = bench_model(name, args.size, args.cluster, args.rounds, args.per_round, args.solver)
        out["models"].append(r)
        print(f"{name:13s} groups {r['groups']:4d} | measured plan {r['measured']['latency_median_s'] * 1e3:8.3f} ms "
              f"({r['measured_measurements']} measurements, {r['measured_cost_s']:.1f} s) | xgb plan "
              f"{r['xgb']['latency_median_s'] * 1e3:8.3f} ms (x{r['xgb_latency_over_measured']:.3f}; 0 measurements, "
              f"{r['xgb_cost_s']:.2f} s; same assignment: {r['xgb_same_plan_as_measured']}) | roofline plan "
              f"x{r['roofline_latency_over_measured']:.3f} | group MAPE {r['xgb_group_mape']:.1f}%", flush=True)
    ratios = [r["xgb_latency_over_measured"] for r in out["models"]]
    out["summary"] = {
        "xgb_latency_over_measured_geomean": float(np.exp(np.mean(np.log(ratios)))) if ratios else None,
        "xgb_latency_over_measured_max": float(max(ratios)) if ratios else None,
        "measurements_measured": int(sum(r["measured_measurements"] for r in out["models"])),
        "measurements_xgb": 0,
        "profiling_time_saved_s": float(sum(r["profiling_time_saved_s"] for r in out["models"])),
    }
    print(json.dumps(out["summary"], indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
