"""Large-neighbourhood search: MIP windows of a schedule, and the ILP path that uses it on
graphs too large for one MIP."""
from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

from tvm_pesto.bench.random_dag import dnn_like_problem
from tvm_pesto.plan import simulate
from tvm_pesto.solve import solve
from tvm_pesto.solve import budget
from tvm_pesto.solve.budget import wall_cap
from tvm_pesto.solve.heuristics.single import one_device_plan
from tvm_pesto.solve.placement_ilp.driver import solve as ilp_solve
from tvm_pesto.solve.placement_ilp.lns import LnsSettings, lns, remaining_time

warnings.filterwarnings("ignore", category=RuntimeWarning)


@pytest.fixture(scope="module")
def dag():
    return dnn_like_problem(300, seed=3)


@pytest.mark.slow
def test_windows_improve_heft_and_repeat_exactly(dag):
    heft = solve(dag, "heft")
    before = simulate(dag, heft).makespan
    a = lns(dag, heft, time_budget_s=1.5, deterministic=True)
    b = lns(dag, heft, time_budget_s=1.5, deterministic=True)
    after = simulate(dag, a).makespan  # memory checked too
    info = a.info["lns"]
    assert after < before * (1 - 1e-6), info
    assert info["accepted"] >= 1 and info["windows"] >= info["accepted"]
    assert info["makespan_after_s"] == pytest.approx(after) and info["deterministic"] is True
    assert a.assignment.tolist() == b.assignment.tolist() and a.order == b.order


def test_remaining_time_bounds_the_rest_of_the_schedule(dag):
    plan = solve(dag, "heft")
    sim = simulate(dag, plan)
    q = remaining_time(dag, plan, sim)
    assert (sim.start + q <= sim.makespan * (1 + 1e-9)).all()
    one = one_device_plan(dag, 0)  # no transfers: what is left after a node is exactly the rest of its device
    s1 = simulate(dag, one)
    np.testing.assert_allclose(s1.start + remaining_time(dag, one, s1), s1.makespan, rtol=1e-9)


@pytest.mark.slow
def test_the_ilp_path_runs_the_lns_from_heft_and_says_where_the_plan_came_from(dag):
    plan = ilp_solve(dag, target=40, time_limit_s=1.0, fine_heuristics=False, lns=LnsSettings(seconds=1.5), refine_s=0.5,
                     deterministic=True)
    steps = [s["step"] for s in plan.info["improvement"]]
    assert "heft" in steps and "lns" in plan.info and plan.info["lns"]["windows"] > 0
    heft = simulate(dag, solve(dag, "heft")).makespan
    span = simulate(dag, plan).makespan
    assert span <= heft * (1 + 1e-9)
    assert plan.info["objective_value_s"] == pytest.approx(span)
    assert "lns" in plan.info["source"] or "refine" in plan.info["source"]


@pytest.mark.slow
def test_a_wall_cap_ends_the_ilp_paths_work_budgets_and_says_where(dag):
    """Work budgets far larger than the cap: the cap ends the LNS (and skips the local search);
    the plan is still valid and no worse than HEFT, and says a clock decided it."""
    t = time.perf_counter()
    with wall_cap(1.5):
        plan = ilp_solve(dag, target=40, time_limit_s=1.0, fine_heuristics=False, lns=LnsSettings(seconds=600), refine_s=600,
                         deterministic=True)
    took = time.perf_counter() - t
    assert took < 60, took  # a hang guard: the work budgets alone would run 1200 s
    assert plan.info["deterministic"] is False
    why = plan.info["deterministic_reason"]
    assert "wall-clock cap hit in the LNS" in why and "polish" in why, why
    assert simulate(dag, plan).makespan <= simulate(dag, solve(dag, "heft")).makespan * (1 + 1e-9)
    with wall_cap(30.0), wall_cap(0.2):  # the earlier cap holds, inner or outer
        assert budget.cap_left_s() <= 0.2 and budget.mip_limits(5.0, "cbc", deterministic=True).time_limit_s <= 0.2
    assert budget.cap_left_s() == float("inf")


@pytest.mark.slow
def test_a_multithreaded_solve_earlier_in_the_process_does_not_change_a_deterministic_one(dag):
    """HiGHS keeps one scheduler per process, started by the first solve with that solve's
    threads; a deterministic solve (one thread) after a solve on two threads must still
    search on one (it ran on two and accepted no window here before the fix)."""
    import highspy
    import pulp

    from tvm_pesto.solve.mip import make_backend

    heft = solve(dag, "heft")
    highspy.Highs.resetGlobalScheduler(True)  # as in a fresh process
    p = pulp.LpProblem("two_threads", pulp.LpMinimize)
    x = pulp.LpVariable("x", 0, 10, cat="Integer")
    p += x
    p += x >= 1.5
    p.solve(make_backend("highs", 5.0, threads=2))
    after_two = lns(dag, heft, time_budget_s=1.5, deterministic=True)
    highspy.Highs.resetGlobalScheduler(True)
    fresh = lns(dag, heft, time_budget_s=1.5, deterministic=True)
    assert after_two.info["lns"]["accepted"] == fresh.info["lns"]["accepted"]
    assert after_two.assignment.tolist() == fresh.assignment.tolist() and after_two.order == fresh.order
