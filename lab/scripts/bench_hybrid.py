"""Plans from ``hybrid`` costs against plans from full measurement, end to end.

Run it before relying on ``--costs hybrid`` on a new machine (are its plans as fast as fully
measured ones here?), and after a change to :mod:`tvm_pesto.costs.predict.hybrid` or the cost model.

For each model: place it on ``--cluster`` with every backend twice through the one flow
(``tvm_pesto.place``, deterministic budgets, so only the costs differ):

* ``measured``: every distinct candidate is compiled and timed (fresh measurement log, so
  the count and the profiling time are real);
* ``hybrid``: every candidate predicted by the bundled cost model, the close calls and
  then the plan's own predicted units measured, re-planning after each round, within a
  budget of 1 in 25 distinct candidates (a fresh log too; :func:`tvm_pesto.place`,
  :mod:`tvm_pesto.costs.predict.hybrid`).

* ``measured-again`` (``--noise-floor``): a second fully measured placement from another
  fresh log: how far two plans from the same source, measured minutes apart, land apart
  (the floor under any hybrid / measured figure).

It reports the measurements each made (and the ratio), each plan's makespan simulated under
the *measured* costs (so the comparison is on one scale), then builds the plans and runs
them interleaved (round-robin blocks, so slow drifts of the machine hit all alike): the
median latency of each, hybrid / measured and measured-again / measured. The load average
goes with every timing.

``--replay DIR`` takes the timer out: each model is measured in full once (``DIR/<model>-<size>-<cluster>.jsonl``,
kept and reused), and ``hybrid`` places from a copy of that log, so every measurement it
chooses is served by the same timing the full plan saw. It reports which measurements the
hybrid made and its plan simulated under the measured costs against the measured plan's, and
builds and runs nothing: the hybrid's choices alone, a few seconds a model after the first
pass, for trying a change to :mod:`tvm_pesto.costs.predict.hybrid` on every model before timing one.

Usage::

    python lab/scripts/bench_hybrid.py --json cost_models/bench_hybrid.json
    python lab/scripts/bench_hybrid.py --models bert,vit --rounds 4
    python lab/scripts/bench_hybrid.py --noise-floor --json out.json
    python lab/scripts/bench_hybrid.py --replay hybrid-logs --models bert,mlp_mixer
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np


def _module(name: str, size: str):
    from tvm_pesto import zoo
    from tvm_pesto.zoo import outside

    if name in outside.MODELS:
        mod = outside.relax_module(name, size)
        _, inputs = outside.build(name, size)
        return mod, inputs, "outside"
    zm = zoo.load(name, size)
    return zm.mod, zm.example_inputs, "zoo"


def bench_model(name: str, size: str, cluster_spec: str, rounds: int, per_round: int, solver: str,
                noise_floor: bool = False) -> dict:
    import tvm_pesto
    from tvm_pesto.costs.store.cache import MeasureCache
    from tvm_pesto.plan import JointProblem, simulate

    mod, inputs, origin = _module(name, size)
    cluster = tvm_pesto.parse_cluster(cluster_spec)
    analysis = tvm_pesto.analyze(mod)
    cs = tvm_pesto.make_candidates(analysis, cluster, "all")
    res: dict = {"model": name, "origin": origin, "size": size, "cluster": cluster.name, "candidates": len(cs),
                 "load_before": list(os.getloadavg())}
    tables, placements = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        # hybrid first: placed after a full measurement, its few measurements ran on a machine
        # that had just built and timed hundreds of candidates (mobilenet_v2: 1.21-1.22x twice
        # in that order, 1.000 placed first or alone)
        for source in ("hybrid", "measured") + (("measured-again",) if noise_floor else ()):
            cache = MeasureCache(os.path.join(tmp, f"{source}.jsonl"))
            t = time.perf_counter()
            pl = tvm_pesto.place(analysis, cluster, backends="all", solver=solver,
                                 costs=source.replace("-again", ""), cache=cache, deterministic=True)
            ct = pl.costs
            res[f"{source}_place_s"] = time.perf_counter() - t
            res[f"{source}_measure_s"] = float(ct.seconds)
            res[f"{source}_measurements"] = int(ct.measured)  # distinct timings made
            res[f"{source}_predicted"] = int(ct.predicted)
            res[f"{source}_saved_s"] = float(ct.saved_s)
            if source == "hybrid":
                res["hybrid_budget"] = ct.hybrid.get("budget")
                res["hybrid_rounds"] = ct.hybrid.get("rounds")
            tables[source], placements[source] = ct, pl
    res["measurement_ratio"] = res["measured_measurements"] / max(res["hybrid_measurements"], 1)
    jp = JointProblem(analysis.op_graph, cluster, list(cs), tables["measured"].table)
    index = {(c.backend, tuple(c.nodes)): i for i, c in enumerate(cs)}
    for source, pl in placements.items():
        cover = [index[(u.backend, tuple(u.nodes))] for u in pl.plan.units]
        under = simulate(jp.contract(cover), pl.plan).run_s
        res[source] = {"backend_mix": pl.backend_mix, "devices_used": pl.plan.devices_used(),
                       "simulated_s": float(pl.sim.run_s), "simulated_under_measured_s": float(under)}
    res["sim_ratio_under_measured"] = (res["hybrid"]["simulated_under_measured_s"]
                                       / res["measured"]["simulated_under_measured_s"])
    order = ["measured"] + [k for k in placements if k != "measured"]  # the reference output first
    built = {k: tvm_pesto.build(mod, cluster, plan=placements[k].plan) for k in order}
    ref = None
    for k, pm in built.items():
        out = pm(*inputs)
        out = out[0] if isinstance(out, (list, tuple)) else out
        out = out.numpy() if hasattr(out, "numpy") else np.asarray(out)
        ref = out if ref is None else ref
        res[k]["max_abs_err_vs_measured_plan"] = float(np.max(np.abs(out - ref)))
    runs: dict = {k: [] for k in built}
    loads = [os.getloadavg()[0]]
    for _ in range(rounds):
        for k, pm in built.items():
            b = pm.benchmark(*inputs, repeat=per_round, warmup=1, min_seconds=0, warmup_seconds=0)  # exact rounds
            runs[k].append(b["median_s"])
        loads.append(os.getloadavg()[0])
    for k, v in runs.items():
        res[k]["run_median_s"] = float(np.median(v))
        res[k]["run_rounds_s"] = [float(x) for x in v]
    res["run_ratio"] = res["hybrid"]["run_median_s"] / res["measured"]["run_median_s"]
    if noise_floor:
        again = placements["measured-again"].plan.units
        res["noise_floor_run_ratio"] = res["measured-again"]["run_median_s"] / res["measured"]["run_median_s"]
        res["noise_floor_same_plan"] = [(u.backend, tuple(u.nodes)) for u in again] == \
            [(u.backend, tuple(u.nodes)) for u in placements["measured"].plan.units]
    res["load_while_running"] = [float(min(loads)), float(max(loads))]
    for pm in built.values():
        pm.close()
    return res


def replay_model(name: str, size: str, cluster_spec: str, solver: str, log_dir: str) -> tuple[dict, dict]:
    """``--replay``: the hybrid's plan against the fully measured one, both from one log; and
    the per-backend lists of measured / predicted (:func:`_prediction_ratios`)."""
    import tvm_pesto
    from tvm_pesto.costs.store.cache import MeasureCache
    from tvm_pesto.plan import JointProblem, simulate

    mod, _, origin = _module(name, size)
    cluster = tvm_pesto.parse_cluster(cluster_spec)
    analysis = tvm_pesto.analyze(mod)
    os.makedirs(log_dir, exist_ok=True)
    full = os.path.join(log_dir, f"{name}-{size}-{cluster.name}.jsonl".replace("/", "_").replace(":", "_"))
    res: dict = {"model": name, "origin": origin, "size": size, "cluster": cluster.name, "log": full,
                 "load_before": list(os.getloadavg())}
    pm = tvm_pesto.place(analysis, cluster, backends="all", solver=solver, costs="measured", cache=MeasureCache(full),
                         deterministic=True)
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "hybrid.jsonl")
        shutil.copy(full, copy)
        ph = tvm_pesto.place(analysis, cluster, backends="all", solver=solver, costs="hybrid",
                             cache=MeasureCache(copy), deterministic=True)
    cs = pm.candidates
    jp = JointProblem(analysis.op_graph, cluster, list(cs), pm.costs.table)
    index = {(c.backend, tuple(c.nodes)): i for i, c in enumerate(cs)}

    def under(pl):
        return float(simulate(jp.contract([index[(u.backend, tuple(u.nodes))] for u in pl.plan.units]), pl.plan).run_s)

    with open(full) as f:  # the distinct timings of the full pass: its records, less the VM probe and the failures
        recs = [json.loads(line) for line in f if line.strip()]
    n_full = sum(1 for r in recs if not str(r.get("key", "")).startswith("__") and float(r.get("median_s", -1)) >= 0)
    rounds = ph.costs.hybrid.get("rounds") or []
    res.update(candidates=len(cs), measured_measurements=n_full,
               hybrid_measurements=sum(int(x["keys"]) for x in rounds),
               hybrid_budget=ph.costs.hybrid.get("budget"), hybrid_rounds=rounds,
               measured={"backend_mix": pm.backend_mix, "simulated_s": under(pm)},
               hybrid={"backend_mix": ph.backend_mix, "simulated_s": float(ph.sim.run_s),
                       "simulated_under_measured_s": under(ph)})
    res["measurement_ratio"] = res["measured_measurements"] / max(res["hybrid_measurements"], 1)
    res["sim_ratio_under_measured"] = res["hybrid"]["simulated_under_measured_s"] / res["measured"]["simulated_s"]
    ratios = _prediction_ratios(cs, cluster, pm.costs.table)
    res["measured_over_predicted"] = _medians(ratios)
    return res, ratios


def _medians(ratios: dict) -> dict:
    return {b: {"n": len(v["raw"]), "applied": float(np.median(v["applied"])), "raw": float(np.median(v["raw"]))}
            for b, v in sorted(ratios.items())}


def _prediction_ratios(cs, cluster, measured) -> dict:
    """Per backend, over every candidate the full pass timed (first device): measured / the
    ``xgb`` source's prediction, as applied (this machine's calibration) and raw; lists."""
    from tvm_pesto.costs.predict.xgb import predict_candidate_costs

    applied, _ = predict_candidate_costs(cs, cluster)
    raw, _ = predict_candidate_costs(cs, cluster, calibration=False)
    out: dict = {}
    for i, c in enumerate(cs):
        m = measured[i, 0]
        if np.isfinite(m) and m > 0 and np.isfinite(applied[i, 0]) and np.isfinite(raw[i, 0]):
            o = out.setdefault(c.backend, {"applied": [], "raw": []})
            o["applied"].append(float(m / applied[i, 0]))
            o["raw"].append(float(m / raw[i, 0]))
    return out


def _replay(names, args) -> dict:
    out = {"mode": "replay", "cluster": args.cluster, "size": args.size, "solver": args.solver, "logs": args.replay,
           "load_start": list(os.getloadavg()), "models": {}}
    print(f"{'model':14s} {'cands':>6s} {'meas full':>9s} {'meas hyb':>8s} {'ratio':>6s} {'sim h/m':>8s}  rounds")
    pooled: dict = {}
    for n in names:
        r, ratios = replay_model(n, args.size, args.cluster, args.solver, args.replay)
        out["models"][n] = r
        for b, v in ratios.items():
            for k in ("applied", "raw"):
                pooled.setdefault(b, {"applied": [], "raw": []})[k].extend(v[k])
        print(f"{n:14s} {r['candidates']:6d} {r['measured_measurements']:9d} {r['hybrid_measurements']:8d} "
              f"{r['measurement_ratio']:6.1f} {r['sim_ratio_under_measured']:8.3f}  "
              + " ".join(f"{x['why']}:{x['keys']}" for x in r["hybrid_rounds"] or []), flush=True)
    ms = list(out["models"].values())
    out["summary"] = {"worst_sim_ratio": max(r["sim_ratio_under_measured"] for r in ms),
                      "min_model_ratio": min(r["measurement_ratio"] for r in ms),
                      "median_measured_over_predicted": _medians(pooled)}
    out["load_end"] = list(os.getloadavg())
    print(f"worst hybrid/measured plan, simulated under the measured costs: {out['summary']['worst_sim_ratio']:.3f}")
    for b, v in out["summary"]["median_measured_over_predicted"].items():
        print(f"  {b:12s} {v['n']:5d} candidates: measured / predicted (median) {v['applied']:.3f} as applied, "
              f"{v['raw']:.3f} raw")
    return out


def main(argv=None) -> int:
    from tvm_pesto import zoo
    from tvm_pesto.costs.predict.hybrid import DEFAULT_FRACTION
    from tvm_pesto.jsonio import write_json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="", help="comma-separated zoo / outside-zoo models [default: the zoo]")
    ap.add_argument("--size", default="small", choices=["small", "full"])
    ap.add_argument("--cluster", default="cpu:2")
    ap.add_argument("--solver", default="heft")
    # a round of a 0.2-ms model takes milliseconds, and single rounds here swing by +-25 %: many
    # short rounds make the medians of two identical plans agree within ~1 %
    ap.add_argument("--rounds", type=int, default=40, help="interleaved rounds of runs per plan")
    ap.add_argument("--per-round", type=int, default=20, help="runs per round (the round's median is kept)")
    ap.add_argument("--noise-floor", action="store_true",
                    help="also place with measured costs a second time (another fresh log) and run that plan too")
    ap.add_argument("--replay", default=None, metavar="DIR",
                    help="place from full-measurement logs kept in DIR (made on first use); simulate, run nothing")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m] or zoo.list_models()
    if args.replay:
        out = _replay(names, args)
        if args.json:
            write_json(args.json, out)
        return 0
    out = {"cluster": args.cluster, "size": args.size, "solver": args.solver, "fraction": DEFAULT_FRACTION,
           "cores": os.cpu_count(), "load_start": list(os.getloadavg()), "models": {}}
    print(f"{'model':14s} {'cands':>6s} {'meas full':>9s} {'meas hyb':>8s} {'ratio':>6s} {'sim h/m':>8s} "
          f"{'run h/m':>8s}" + (f" {'m2/m':>6s}" if args.noise_floor else "") + "  load")
    for n in names:
        r = bench_model(n, args.size, args.cluster, args.rounds, args.per_round, args.solver, args.noise_floor)
        out["models"][n] = r
        print(f"{n:14s} {r['candidates']:6d} {r['measured_measurements']:9d} {r['hybrid_measurements']:8d} "
              f"{r['measurement_ratio']:6.1f} {r['sim_ratio_under_measured']:8.3f} {r['run_ratio']:8.3f}"
              + (f" {r['noise_floor_run_ratio']:6.3f}" if args.noise_floor else "") + "  "
              f"{r['load_while_running'][0]:.2f}-{r['load_while_running'][1]:.2f}", flush=True)
    ms = list(out["models"].values())
    tot_m = sum(r["measured_measurements"] for r in ms)
    tot_h = sum(r["hybrid_measurements"] for r in ms)
    out["summary"] = {
        "measurements_full": tot_m, "measurements_hybrid": tot_h, "ratio": tot_m / max(tot_h, 1),
        "min_model_ratio": min(r["measurement_ratio"] for r in ms),
        "worst_sim_ratio": max(r["sim_ratio_under_measured"] for r in ms),
        "worst_run_ratio": max(r["run_ratio"] for r in ms),
        "geomean_run_ratio": float(np.exp(np.mean([np.log(r["run_ratio"]) for r in ms]))),
    }
    if args.noise_floor:
        floors = [r["noise_floor_run_ratio"] for r in ms]
        out["summary"]["worst_noise_floor_run_ratio"] = max(max(f, 1 / f) for f in floors)
    out["load_end"] = list(os.getloadavg())
    s = out["summary"]
    print(f"measurements {tot_m} full vs {tot_h} hybrid ({s['ratio']:.1f}x fewer; least per model "
          f"{s['min_model_ratio']:.1f}x); worst plan hybrid/measured: simulated {s['worst_sim_ratio']:.3f}, "
          f"run {s['worst_run_ratio']:.3f} (geomean run {s['geomean_run_ratio']:.3f})")
    if args.json:
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
