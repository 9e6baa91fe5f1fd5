"""Makespan lower bounds: exact on small cases, and never above any simulated plan."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_pesto.cluster import Cluster, Device
from tvm_pesto.errors import InfeasibleError
from tvm_pesto.graph.opgraph import OpGraph, OpNode
from tvm_pesto.plan import Problem, simulate
from tvm_pesto.solve import lower_bound, solve
from tvm_pesto.solve.bounds.paths import critical_path

warnings.filterwarnings("ignore", message=".*_core is not built.*")


def make_problem(n, edges, costs, d=2, mem=None, memory=1e12, colocate=(), bandwidth=1e8):
    mem = [0] * n if mem is None else mem
    nodes = [OpNode(f"v{i}", "op", param_bytes=int(mem[i])) for i in range(n)]
    devs = [Device(name=f"g{i}", kind="gpu", target={"kind": "cuda"}, memory_bytes=memory, peak_flops=1e12,
                   mem_bandwidth=1e11, index=i) for i in range(d)]
    cluster = Cluster("test", devs, np.full((d, d), 1e-5), np.full((d, d), bandwidth))
    costs = np.asarray(costs, dtype=float)
    if costs.ndim == 1:
        costs = np.repeat(costs[:, None], d, axis=1)
    return Problem(OpGraph(nodes, edges, name="t"), cluster, costs, colocate=[list(c) for c in colocate])


def test_chain_bound_is_the_sum_of_fastest_costs():
    costs = np.array([[1e-3, 2e-3], [3e-3, 1e-3], [2e-3, 2e-3]])
    p = make_problem(3, [(0, 1, 1), (1, 2, 1)], costs)
    lb = lower_bound(p)
    assert lb["critical_path_s"] == pytest.approx(4e-3)
    assert lb["work_s"] == pytest.approx(2e-3)
    assert lb["lp_s"] == pytest.approx(4e-3, rel=1e-5)
    # the fastest devices differ for nodes 0 and 1: the path bound charges that transfer
    # (10 us latency + 1 byte at 1e8 B/s), which makes the bound the optimum
    assert lb["path_memory_s"] == pytest.approx(4e-3 + 1e-5 + 1e-8, rel=1e-5)
    assert lb["best"] == lb["path_memory_s"]


def test_independent_nodes_bound_is_the_work_share():
    p = make_problem(6, [], [1e-3] * 6, d=3)
    lb = lower_bound(p)
    assert lb["critical_path_s"] == pytest.approx(1e-3)
    assert lb["work_s"] == pytest.approx(2e-3)
    assert lb["best"] == pytest.approx(2e-3, rel=1e-5)
    assert simulate(p, solve(p, "heft")).makespan == pytest.approx(lb["best"], rel=1e-5)


def test_lp_sees_unlike_devices():
    # four independent nodes, device 0 takes 1 ms, device 1 takes 3 ms: the best split is 3
    # on device 0 and 1 on device 1 (3 ms); fractionally 4 / (1 + 1/3) = 3 ms of load.
    costs = np.array([[1e-3, 3e-3]] * 4)
    p = make_problem(4, [], costs)
    lb = lower_bound(p)
    assert lb["work_s"] == pytest.approx(2e-3)
    assert lb["lp_s"] == pytest.approx(3e-3, rel=1e-5)
    assert lb["best"] == pytest.approx(lb["lp_s"], rel=1e-5)


def test_lp_sees_colocation():
    # node 0 only runs on device 0 and must share it with node 1, so both run there
    costs = np.array([[1e-3, np.inf], [1e-3, 1e-3]])
    p = make_problem(2, [], costs, colocate=[[0, 1]])
    lb = lower_bound(p)
    assert lb["work_s"] == pytest.approx(1e-3)
    assert lb["lp_s"] == pytest.approx(2e-3, rel=1e-5)


def test_lp_sees_memory():
    # device 0 is 10x faster but holds only two of the four nodes: the other two take 10 ms
    # each on device 1 (fractionally: 2 nodes' worth of load there = 20 ms)
    costs = np.array([[1e-3, 1e-2]] * 4)
    p = make_problem(4, [], costs, mem=[100] * 4, memory=200)
    lb = lower_bound(p)
    assert lb["work_s"] == pytest.approx(2e-3)
    assert lb["lp_s"] == pytest.approx(2e-2, rel=1e-5)
    assert simulate(p, solve(p, "heft")).makespan == pytest.approx(2e-2)


def test_colocation_restricts_the_fastest_device():
    costs = np.array([[1e-3, np.inf], [5e-3, 1e-3]])
    p = make_problem(2, [(0, 1, 1)], costs, colocate=[[0, 1]])
    assert critical_path(p) == pytest.approx(6e-3)


def test_lp_is_skipped_on_large_graphs_and_can_be_forced():
    p = make_problem(5, [(i, i + 1, 1) for i in range(4)], [1e-3] * 5)
    assert lower_bound(p, lp_max_nodes=3)["lp_s"] is None
    assert lower_bound(p, lp=True, lp_max_nodes=3)["lp_s"] == pytest.approx(5e-3, rel=1e-5)
    assert lower_bound(p, lp=False)["lp_status"] == "skipped"


def test_lp_reports_memory_infeasibility():
    p = make_problem(3, [], [1e-3] * 3, mem=[100] * 3, memory=140)
    lb = lower_bound(p)
    assert lb["lp_status"] == "Infeasible" and lb["best"] == float("inf")


random_case = st.tuples(st.integers(0, 2**31 - 1), st.integers(1, 14), st.integers(1, 4),
                        st.booleans(), st.booleans())


def random_problem(seed, n, d, unlike, tight):
    rng = np.random.default_rng(seed)
    edges = []
    for v in range(1, n):
        for u in rng.choice(v, size=min(v, int(rng.integers(0, 3))), replace=False):
            edges.append((int(u), v, int(rng.integers(0, 10**6))))
    costs = rng.uniform(1e-4, 1e-3, (n, d))
    if unlike:
        costs *= rng.uniform(0.3, 3.0, d)
        costs[rng.random((n, d)) < 0.2] = np.inf
        costs[np.arange(n), rng.integers(0, d, n)] = rng.uniform(1e-4, 1e-3, n)
    mem = rng.integers(1, 1000, n)
    memory = 1.5 * (mem.sum() / d + mem.max()) + 4e6 if tight else 1e12
    groups = [[0, n - 1]] if n > 2 and rng.random() < 0.5 else []
    if groups and unlike:  # a co-location group needs a device both members can run on
        costs[[0, n - 1], int(rng.integers(0, d))] = rng.uniform(1e-4, 1e-3, 2)
    return make_problem(n, edges, costs, d=d, mem=mem, memory=memory, colocate=groups)


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_case)
def test_bound_never_exceeds_a_simulated_plan(case):
    p = random_problem(*case)
    lb = lower_bound(p)
    assert lb["lp_s"] is not None
    assert lb["best"] == max(v for k, v in lb.items() if k.endswith("_s") and v is not None)
    assert lb["lp_s"] >= max(lb["critical_path_s"], lb["work_s"]) * (1 - 1e-5)
    checked = 0
    for name in ("single", "heft", "m-topo", "m-etf", "m-sct"):
        try:
            plan = solve(p, name)
        except InfeasibleError:
            continue
        makespan = simulate(p, plan).makespan
        assert lb["best"] <= makespan * (1 + 1e-9), (name, lb, makespan)
        checked += 1
    assert checked >= 1
