"""The critical-path local search: never worse, always valid, and it finds easy wins."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from test_heuristics import check_plan, make_problem, random_case, random_problem
from tvm_pesto.errors import InfeasibleError
from tvm_pesto.plan import Plan, simulate
from tvm_pesto.solve import solve
from tvm_pesto.solve.placement_ilp.refine import critical_chain, refine

warnings.filterwarnings("ignore", category=RuntimeWarning)


def two_chains():
    """Two independent 3-node chains of 1 ms; moving one chain halves the makespan."""
    edges = [(0, 1, 10), (1, 2, 10), (3, 4, 10), (4, 5, 10)]
    return make_problem(6, edges, [1e-3] * 6, d=2, latency=0.0, bandwidth=1e12)


def test_critical_chain_walks_device_order_and_data():
    p = two_chains()
    plan = Plan(np.zeros(6, dtype=np.int32), [[0, 1, 2, 3, 4, 5], []])
    sim = simulate(p, plan)
    assert critical_chain(p, plan, sim) == [5, 4, 3, 2, 1, 0]


def test_refine_moves_a_chain_to_the_idle_device():
    p = two_chains()
    plan = Plan(np.zeros(6, dtype=np.int32), [[0, 1, 2, 3, 4, 5], []], solver="single")
    out = refine(p, plan, time_budget_s=5)
    assert simulate(p, out).makespan == pytest.approx(3e-3)
    assert out.solver == "single"
    r = out.info["refine"]
    assert r["makespan_before_s"] == pytest.approx(6e-3) and r["makespan_after_s"] == pytest.approx(3e-3)
    assert r["moves"] >= 1 and r["simulations"] > r["moves"]


def test_refine_swaps_an_order_that_delays_the_critical_node():
    # x -> y on device 0 feed z, which only runs on device 1; the side node s, also only on
    # device 0, is scheduled first and delays the chain; only reordering device 0 helps
    inf = np.inf
    costs = [[1e-3, inf], [1e-3, inf], [inf, 3e-3], [5e-4, inf]]  # x, y, z, s
    p = make_problem(4, [(0, 1, 10), (1, 2, 10)], costs, d=2, latency=0.0, bandwidth=1e12)
    plan = Plan(np.array([0, 0, 1, 0], dtype=np.int32), [[3, 0, 1], [2]], solver="x")
    assert simulate(p, plan).makespan == pytest.approx(5.5e-3)
    out = refine(p, plan, time_budget_s=5)
    assert simulate(p, out).makespan == pytest.approx(5.0e-3)
    assert out.order[0].index(1) < out.order[0].index(3)


def test_zero_budget_returns_the_plan_unchanged():
    p = two_chains()
    plan = Plan(np.zeros(6, dtype=np.int32), [[0, 1, 2, 3, 4, 5], []], solver="single")
    out = refine(p, plan, time_budget_s=0)
    assert out.order == plan.order and out.info["refine"]["moves"] == 0


def test_refine_respects_memory():
    # each chain needs the whole of one device's memory: moving one node would overflow
    edges = [(0, 1, 10), (1, 2, 10), (3, 4, 10), (4, 5, 10)]
    p = make_problem(6, edges, [1e-3] * 6, d=2, mem=[100] * 6, memory=300 + 10, latency=0.0, bandwidth=1e12)
    plan = solve(p, "heft")
    out = refine(p, plan, time_budget_s=5)
    assert (simulate(p, out).peak_memory <= p.capacity).all()


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_case)
def test_refined_plan_is_valid_and_never_worse(case):
    seed, n, d, p_inf, mem_factor, groups = case
    p = random_problem(seed, n, d, p_inf, mem_factor, groups)
    try:
        plan = solve(p, "m-topo")
    except InfeasibleError:
        return
    before = simulate(p, plan).makespan
    out = refine(p, plan, time_budget_s=2)
    after = check_plan(p, out, "m-topo")
    assert after <= before * (1 + 1e-12)
    assert out.info["refine"]["makespan_after_s"] == pytest.approx(after, rel=1e-12)


def test_ilp_registry_entry_reports_the_refinement():
    p = two_chains()
    plan = solve(p, "ilp", time_limit_s=5)
    assert "refine" in plan.info and plan.info["makespan_s"] == pytest.approx(3e-3)
    off = solve(p, "ilp", time_limit_s=5, refine_s=0)
    assert "refine" not in off.info


def test_heft_pins_and_keeps_others_off_pinned_devices():
    # four independent nodes on three devices: node 0 pinned to device 2; the rest avoid it
    p = make_problem(4, [], [1e-3] * 4, d=3)
    plan = solve(p, "heft", pins={0: 2})
    assert plan.assignment[0] == 2
    assert 2 not in plan.assignment[1:].tolist()
    check_plan(p, plan, "heft")


def test_critical_path_splits_pin_the_path_in_runs():
    from tvm_pesto.solve.placement_ilp.polish import critical_path_splits

    n = 9
    edges = [(i, i + 1, 10) for i in range(n - 1)] + [(0, n, 10), (n, n - 1, 10)]
    p = make_problem(n + 1, edges, [1e-3] * n + [1e-4], d=3, latency=0.0, bandwidth=1e12)
    seeds = critical_path_splits(p, parts=(3, 5))
    assert [s.info["seed"] for s in seeds] == ["critical path in 3 runs"]  # 5 is capped at 3 devices
    a = seeds[0].assignment
    assert [len(set(a[i:i + 3].tolist())) for i in (0, 3, 6)] == [1, 1, 1]
    assert len(set(a[:n].tolist())) == 3
    check_plan(p, seeds[0], "heft")


def test_polish_keeps_the_best_start_and_stops_at_the_bound():
    from tvm_pesto.solve.placement_ilp.polish import polish

    p = two_chains()
    bad = Plan(np.zeros(6, dtype=np.int32), [[0, 1, 2, 3, 4, 5], []], solver="single")
    good = Plan(np.array([0, 0, 0, 1, 1, 1], dtype=np.int32), [[0, 1, 2], [3, 4, 5]], solver="split")
    out = polish(p, [bad, good], time_budget_s=30, floor_s=3e-3)
    assert simulate(p, out).makespan == pytest.approx(3e-3)
    r = out.info["refine"]
    assert r["starts"] == 2 and r["kicks"] == 0  # at the bound: no iterated search
    assert r["makespan_before_s"] == pytest.approx(6e-3)
