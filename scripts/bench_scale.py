"""Scale benchmark: coarsen + ILP + expand (and each registered heuristic) on DNN-like DAGs.

Random layered graphs (layers of width 1-8, each node fed by 1-3 nodes of the previous
layer, plus skip connections from up to 8 layers back) with roofline-style random costs on
a 4xV100-pcie cluster; tensor and weight sizes shrink on big graphs so that the static
memory model (every output kept) uses at most a quarter of the cluster's memory.
Prints one line per (size, solver): wall seconds and simulated makespan; ``--json`` writes
the rows. The ILP row uses ``fine_heuristics=False`` (coarsen + ILP + expand only); the
heuristic rows are timed on their own.

Usage::

    python scripts/bench_scale.py --sizes 1000 10000 100000 --time-limit 2
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

import numpy as np

from tvm_pesto.cluster import parse_cluster
from tvm_pesto.graph import OpGraph, OpNode
from tvm_pesto.plan import Problem, simulate


def dnn_like_problem(n: int, seed: int = 0, cluster: str = "4xV100-pcie") -> Problem:
    """A random layered DNN-like DAG with ``n`` ops and roofline-ish costs on ``cluster``.

    Examples
    --------
    >>> dnn_like_problem(100).num_nodes
    100
    """
    rng = np.random.default_rng(seed)
    layers: list[list[int]] = []
    v = 0
    while v < n:
        w = int(min(rng.integers(1, 9), n - v))
        layers.append(list(range(v, v + w)))
        v += w
    flops = np.exp(rng.uniform(np.log(1e6), np.log(2e10), n))
    out_b = np.exp(rng.uniform(np.log(1e4), np.log(8e6), n)).astype(np.int64)
    params = np.where(rng.random(n) < 0.4, np.exp(rng.uniform(np.log(1e4), np.log(2e7), n)), 0).astype(np.int64)
    cl = parse_cluster(cluster)
    # keep weights + activations at most a quarter of the cluster's memory (static memory model)
    scale = min(1.0, 0.25 * float(cl.capacities().sum()) / float(out_b.sum() + params.sum()))
    out_b = np.maximum((out_b * scale).astype(np.int64), 1)
    params = (params * scale).astype(np.int64)
    edges = []
    for li in range(1, len(layers)):
        prev = layers[li - 1]
        for t in layers[li]:
            k = int(min(len(prev), rng.integers(1, 4)))
            for s in rng.choice(prev, size=k, replace=False).tolist():
                edges.append((s, t, int(out_b[s])))
            if li >= 2 and rng.random() < 0.15:
                back = int(rng.integers(2, min(8, li) + 1))
                s = int(rng.choice(layers[li - back]))
                edges.append((s, t, int(out_b[s])))
    nodes = [OpNode(f"op{i}", "dense", flops=float(flops[i]), bytes_read=int(out_b[i] + params[i]),
                    bytes_written=int(out_b[i]), param_bytes=int(params[i])) for i in range(n)]
    g = OpGraph(nodes, edges, name=f"dnn{n}")
    costs = np.empty((n, cl.num_devices))
    for d, dev in enumerate(cl.devices):
        base = np.maximum(flops / dev.peak_flops, (out_b + params) * 2 / dev.mem_bandwidth)
        costs[:, d] = 5e-6 + base * rng.uniform(1.0, 1.3, n)
    return Problem(g, cl, costs, cost_source="roofline")


def _registry():
    try:
        import tvm_pesto.solve as reg
    except ImportError:
        return []
    names = getattr(reg, "HEURISTICS", None) or [k for k in getattr(reg, "SOLVERS", {}) if k != "ilp"]
    return [(nm, reg.get_solver(nm)) for nm in names]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--time-limit", type=float, default=2.0, help="MIP solver seconds")
    ap.add_argument("--target", type=int, default=40)
    ap.add_argument("--solver", default="cbc")
    ap.add_argument("--no-heuristics", action="store_true", help="time only coarsen + ILP + expand")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore", RuntimeWarning)
    from tvm_pesto.solve.coarsen import coarsen
    from tvm_pesto.solve.ilp import solve

    rows = []
    for n in args.sizes:
        t = time.perf_counter()
        problem = dnn_like_problem(n)
        print(f"n={n}: graph with {problem.graph.num_edges} edges built in {time.perf_counter() - t:.1f} s",
              flush=True)
        problem.graph.topo_order()  # cached, as any caller of the solvers would have it
        t = time.perf_counter()
        coarse, groups = coarsen(problem, args.target)
        t_coarsen = time.perf_counter() - t
        t = time.perf_counter()
        plan = solve(problem, target=args.target, time_limit_s=args.time_limit, solver=args.solver,
                     fine_heuristics=False)
        t_ilp = time.perf_counter() - t
        t = time.perf_counter()
        span = simulate(problem, plan).makespan
        t_sim = time.perf_counter() - t
        info = plan.info
        row = {"n": n, "solver": "ilp(coarse)", "wall_s": t_ilp, "makespan_s": span, "coarsen_only_s": t_coarsen,
               "coarse_nodes": coarse.num_nodes, "simulate_s": t_sim,
               "ilp_timed_out": info.get("coarse_timed_out"), "source": info.get("source"),
               "coarse_mip_gap": info.get("coarse_mip_gap"), "coarse_vars": info.get("coarse_num_vars"),
               "coarse_constraints": info.get("coarse_num_constraints")}
        rows.append(row)
        print(f"  ilp(coarse): {t_ilp:.2f} s (coarsen {t_coarsen:.2f} s -> {coarse.num_nodes} supernodes, "
              f"{row['coarse_vars']} vars, {row['coarse_constraints']} constraints, timed_out="
              f"{row['ilp_timed_out']}, chosen={row['source']}), makespan {span * 1e3:.3f} ms, "
              f"simulate {t_sim:.2f} s", flush=True)
        if args.no_heuristics:
            continue
        for name, fn in _registry():
            t = time.perf_counter()
            try:
                hp = fn(problem)
                wall = time.perf_counter() - t
                hspan = simulate(problem, hp).makespan
                rows.append({"n": n, "solver": name, "wall_s": wall, "makespan_s": hspan})
                print(f"  {name}: {wall:.2f} s, makespan {hspan * 1e3:.3f} ms", flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"  {name}: failed after {time.perf_counter() - t:.2f} s: {e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
