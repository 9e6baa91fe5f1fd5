"""The stage model's chain bound (tvm_pesto.solve.stage.bounds): below the brute-force optimum
on small random graphs (branches, training passes, CPUs, tight memory), below the experts'
splits on the LayerGraphs, and above the critical path where the stage budget binds."""
from __future__ import annotations

import itertools
import json
import os
import warnings

import numpy as np
import pytest
from test_objectives import random_problem

from tvm_pesto.cluster import parse_cluster
from tvm_pesto.graph import dnn_partitioning as dp
from tvm_pesto.graph.opgraph import OpGraph, OpNode
from tvm_pesto.plan import Plan, Problem
from tvm_pesto.plan.expert_split import load_expert_split
from tvm_pesto.plan.objective import evaluate
from tvm_pesto.solve.bounds.objective import objective_lower_bound
from tvm_pesto.solve.bounds.paths import critical_path
from tvm_pesto.solve.stage.bounds import stage_latency_bound

warnings.filterwarnings("ignore", category=RuntimeWarning)
ROOT = str(dp.benchmark_dir())


def best_stage_latency(p: Problem) -> float:
    """The smallest stage-model latency over every valid plan (every assignment)."""
    n, d = p.num_nodes, p.num_devices
    best = np.inf
    for a in itertools.product(range(d), repeat=n):
        a = np.array(a)
        if np.isfinite(p.costs[np.arange(n), a]).all():
            ev = evaluate(p, Plan.from_assignment(a, np.arange(n), d), "stage", "latency")
            if ev.valid:
                best = min(best, ev.latency_s)
    return best


def layer_problem(tmp_path, seed: int, n: int, fpgas: int, cpus: int, training: bool) -> Problem:
    """A random LayerGraph: each node takes 1-2 earlier ones as inputs (branches that meet
    again), accelerators 2-10x faster than the CPU, memory from tight to ample; with
    ``training`` a co-located backward copy (edges along or against the forward ones)."""
    rng = np.random.default_rng(seed)
    f = n // 2 if training else n
    fwd = sorted({(int(u), v) for v in range(1, f) for u in rng.choice(v, size=min(int(rng.integers(1, 3)), v),
                                                                       replace=False)})
    nodes, edges = [], []
    for k in range(2 if training else 1):
        for i in range(f):
            t = float(rng.uniform(0.5, 3.0))
            nodes.append({"id": k * f + i, "name": f"n{i}" + ("grad" if k else ""),
                          "cpuLatency": t * rng.uniform(2, 10), "fpgaLatency": t, "supportedOnFpga": True,
                          "size": int(rng.integers(1, 6)) << 20, "colorClass": i, "isBackwardNode": bool(k)})
    against = rng.random() < 0.5
    cost = {}
    for k in range(2 if training else 1):
        for u, v in fwd:
            s, t = (k * f + v, k * f + u) if k and against else (k * f + u, k * f + v)
            c = cost.setdefault(s, float(rng.uniform(0.05, 1.0)))  # one cost per source, as the files have
            edges.append({"sourceId": s, "destId": t, "cost": c, "size": int(c * 2**31)})
    total = sum(nd["size"] for nd in nodes)
    data = {"maxFPGAs": fpgas, "maxSizePerFPGA": int(total * rng.choice([0.4, 0.7, 2.0])), "maxCPUs": cpus,
            "nodes": nodes, "edges": edges}
    path = tmp_path / f"g{seed}.json"
    path.write_text(json.dumps(data))
    g, meta = dp.load_layer_graph(str(path))
    cl = dp.cluster_from_graph(meta)
    return Problem(g, cl, dp.costs_from_graph(g, cl), colocate=dp.colocation_groups(g))


CASES = [dict(seed=s, n=n, fpgas=f, cpus=c, training=t) for s, (n, f, c, t) in enumerate(
    [(6, 2, 1, False), (7, 1, 1, False), (6, 2, 0, False), (7, 2, 0, False), (5, 2, 1, False), (8, 1, 1, True),
     (6, 2, 1, True), (6, 2, 1, True), (8, 1, 1, True), (6, 1, 1, False)])]


@pytest.mark.parametrize("case", CASES, ids=[f"layer{c['seed']}" for c in CASES])
def test_chain_bound_holds_against_brute_force_on_layergraphs(tmp_path, case):
    p = layer_problem(tmp_path, **case)
    best = best_stage_latency(p)
    assert np.isfinite(best), "every generated graph has a valid plan (ample CPU memory)"
    lb = stage_latency_bound(p)["bound_s"]
    assert 0 < lb <= best * (1 + 1e-9), (lb, best)


@pytest.mark.parametrize("seed, n, d, training", [(40, 5, 3, False), (41, 6, 2, False), (42, 6, 2, True),
                                                  (43, 5, 2, False)])
def test_chain_bound_holds_against_brute_force_on_unlike_gpus(seed, n, d, training):
    p = random_problem(seed, n=n, d=d, tight=True, training=training)
    best = best_stage_latency(p)
    if not np.isfinite(best):
        pytest.fail(f"seed {seed}: no valid plan; pick a seed with one")
    assert stage_latency_bound(p)["bound_s"] <= best * (1 + 1e-9)


def test_a_diamond_on_two_devices_runs_its_branches_one_after_the_other():
    # branches side by side need 4 stages (ends, two branches) on 2 devices: the bound is the work
    g = OpGraph([OpNode(c, "op") for c in "abcd"], [(0, 1, 0), (0, 2, 0), (1, 3, 0), (2, 3, 0)])
    p = Problem(g, parse_cluster("cpu:2"), np.ones((4, 2)))
    lb = stage_latency_bound(p)["bound_s"]
    assert critical_path(p) == pytest.approx(3.0)
    assert lb == pytest.approx(4.0, rel=1e-5) and lb <= best_stage_latency(p) * (1 + 1e-9)
    assert objective_lower_bound(p, "stage", "latency")["latency"]["stage_chain_s"] == lb


def test_on_the_layergraphs_it_is_below_the_experts_and_above_the_critical_path():
    tighter = 0
    for name in ("bert24_inference", "bert24_training", "gnmt_inference", "gnmt_training", "inceptionv3_inference",
                 "resnet50_inference"):
        g, meta = dp.load_layer_graph(os.path.join(ROOT, "throughput-inputs", "LayerGraphs", f"{name}.json"))
        cl = dp.cluster_from_graph(meta)
        p = Problem(g, cl, dp.costs_from_graph(g, cl), colocate=dp.colocation_groups(g))
        expert = load_expert_split(dp.find_expert_split(os.path.join(ROOT, "throughput-inputs", "LayerGraphs",
                                                                        f"{name}.json")), g, cl)
        ev = evaluate(p, expert, "stage", "latency")
        lb = stage_latency_bound(p)["bound_s"]
        assert ev.valid and lb <= ev.latency_s, name
        tighter += lb > 1.3 * critical_path(p)
    assert tighter >= 1  # Inception's modules cannot all run their branches side by side on 7 devices
