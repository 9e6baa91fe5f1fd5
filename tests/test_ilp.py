"""The placement + scheduling ILP: exactness against brute force, constraints, time-outs."""
from __future__ import annotations

import itertools
import warnings

import numpy as np
import pulp
import pytest

from tvm_pesto.cluster import Cluster, Device
from tvm_pesto.errors import InfeasibleError, SolverError
from tvm_pesto.graph import OpGraph, OpNode
from tvm_pesto.plan import Plan, Problem, simulate
from tvm_pesto.solve import mip
from tvm_pesto.solve.heuristics.portfolio import HeuristicRuns
from tvm_pesto.solve.placement_ilp import warm_solve as ilp_solve
from tvm_pesto.solve.placement_ilp.driver import solve
from tvm_pesto.solve.placement_ilp.model.build import build_ilp
from tvm_pesto.solve.placement_ilp.warm_solve import solve_ilp

warnings.filterwarnings("ignore", category=RuntimeWarning)


def make_problem(n, d, seed, p=0.35, mem=1e9, inf_frac=0.0, colocate=None, lat_scale=1.0):
    """A random DAG whose tensors take about as long to move as the nodes take to run."""
    rng = np.random.default_rng(seed)
    edges = [(i, j, int(rng.integers(1, 5)) * 100_000) for i in range(n) for j in range(i + 1, n)
             if rng.random() < p]
    nodes = [OpNode(f"n{i}", "op", bytes_written=int(rng.integers(1, 4)) * 1_000_000) for i in range(n)]
    devs = [Device(f"d{i}", "gpu", {"kind": "cuda"}, mem, 1e12, 1e11, index=i) for i in range(d)]
    lat = 1e-4 * lat_scale * (1 + rng.random((d, d)))
    bw = 1e9 * (1 + rng.random((d, d)))
    costs = rng.uniform(1e-4, 1e-3, (n, d))
    if inf_frac:
        off = rng.random((n, d)) < inf_frac
        off[np.arange(n), rng.integers(0, d, n)] = False
        costs[off] = np.inf
    return Problem(OpGraph(nodes, edges, name=f"rand{seed}"), Cluster("test", devs, lat, bw), costs,
                   colocate=colocate or [])


def linear_extensions(dag, n):
    out, seq, placed = [], [], [False] * n
    indeg = [dag.in_degree(v) for v in range(n)]

    def rec():
        if len(seq) == n:
            out.append(tuple(seq))
            return
        for v in range(n):
            if not placed[v] and indeg[v] == 0:
                placed[v] = True
                seq.append(v)
                for s in dag.successors(v):
                    indeg[s] -= 1
                rec()
                for s in dag.successors(v):
                    indeg[s] += 1
                seq.pop()
                placed[v] = False

    rec()
    return out


def brute_force(problem):
    """Best simulated makespan over all placements and all per-device orders that some
    topological order induces (every deadlock-free plan arises this way)."""
    n, d = problem.num_nodes, problem.num_devices
    exts = linear_extensions(problem.graph.dag, n)
    best = np.inf
    for a in itertools.product(range(d), repeat=n):
        a = np.array(a)
        if not np.isfinite(problem.costs[np.arange(n), a]).all():
            continue
        if any(len({a[v] for v in grp}) > 1 for grp in problem.colocate):
            continue
        seen = set()
        for ext in exts:
            order = tuple(tuple(v for v in ext if a[v] == k) for k in range(d))
            if order in seen:
                continue
            seen.add(order)
            try:
                span = simulate(problem, Plan(a, [list(o) for o in order])).makespan
            except InfeasibleError:  # memory depends on the placement only
                break
            best = min(best, span)
    return best


CASES = [
    dict(n=6, d=2, seed=1),
    dict(n=7, d=2, seed=2, p=0.3),
    dict(n=6, d=3, seed=3, lat_scale=0.05),
    dict(n=6, d=3, seed=4, mem=6e6),  # memory forces a split
    dict(n=6, d=2, seed=5, inf_frac=0.3),
    dict(n=6, d=3, seed=6, colocate=[[0, 5]], lat_scale=0.1),
    dict(n=5, d=3, seed=7, mem=6e6, colocate=[[0, 4]]),
    dict(n=7, d=2, seed=8, p=0.5, lat_scale=0.01),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[f"case{k}" for k in range(len(CASES))])
def test_ilp_matches_brute_force(case):
    problem = make_problem(**case)
    best = brute_force(problem)
    assert np.isfinite(best)
    plan = solve_ilp(problem, time_limit_s=30, gap=0)
    sim = simulate(problem, plan)  # memory checked too
    assert sim.makespan == pytest.approx(best, rel=1e-6)
    assert plan.info["makespan_s"] == pytest.approx(sim.makespan, rel=1e-12)
    assert not plan.info["timed_out"]
    # the model is exact: its objective is the simulated makespan of its own plan
    assert plan.info["objective"] == pytest.approx(best, rel=1e-6)


def test_memory_limit_forces_split_and_is_respected():
    problem = make_problem(n=6, d=3, seed=4, mem=6e6)
    assert problem.mem.sum() > problem.capacity.max()  # one device cannot hold it
    plan = solve_ilp(problem, time_limit_s=30, gap=0)
    sim = simulate(problem, plan, check_memory=False)
    assert (sim.peak_memory <= problem.capacity * (1 + 1e-9)).all()
    assert len(plan.devices_used()) >= 2


def test_colocation_and_infinite_costs_respected():
    problem = make_problem(n=7, d=3, seed=11, inf_frac=0.3, colocate=[[0, 3, 6]], lat_scale=0.05)
    plan = solve_ilp(problem, time_limit_s=30, gap=0)
    assert len({int(plan.assignment[v]) for v in (0, 3, 6)}) == 1
    assert np.isfinite(problem.costs[np.arange(7), plan.assignment]).all()
    assert plan.info["makespan_s"] == pytest.approx(brute_force(problem), rel=1e-6)


def test_highs_backend_matches_brute_force():
    problem = make_problem(n=6, d=3, seed=3, lat_scale=0.05)
    plan = solve_ilp(problem, time_limit_s=30, solver="highs", gap=0)
    assert plan.info["solver_backend"] == "highs"
    assert plan.info["makespan_s"] == pytest.approx(brute_force(problem), rel=1e-6)


@pytest.mark.slow
def test_time_out_returns_incumbent_never_worse_than_warm_start():
    problem = make_problem(n=30, d=3, seed=5, p=0.12, lat_scale=0.1)
    warm = Plan.from_assignment(np.arange(30) % 3, np.arange(30), 3, solver="round_robin")
    warm_span = simulate(problem, warm).makespan
    plan = solve_ilp(problem, time_limit_s=1, warm_start=warm)
    assert plan.info["timed_out"] is True
    assert plan.info["warm_start_makespan_s"] == pytest.approx(warm_span)
    assert simulate(problem, plan).makespan <= warm_span * (1 + 1e-9)
    assert plan.info["bound"] <= plan.info["makespan_s"]
    for key in ("status", "mip_gap", "objective", "num_vars", "num_constraints"):
        assert key in plan.info


def test_no_incumbent_falls_back_to_warm_start(monkeypatch):
    problem = make_problem(n=5, d=2, seed=9)
    warm = Plan.from_assignment(np.zeros(5, dtype=int), np.arange(5), 2, solver="mine")

    def no_solution(self, solver=None, **kw):
        self.status, self.sol_status = pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound
        return self.status

    monkeypatch.setattr(pulp.LpProblem, "solve", no_solution)
    plan = solve_ilp(problem, time_limit_s=5, warm_start=warm)
    assert plan.info["source"] == "warm_start"
    assert "no usable solution" in plan.info["note"]
    assert plan.assignment.tolist() == [0] * 5
    with pytest.raises(SolverError, match="no warm start"):
        monkeypatch.setattr(ilp_solve, "run_heuristics", lambda p: HeuristicRuns())
        solve_ilp(problem, time_limit_s=5)


def test_missing_solver_names_the_install(monkeypatch):
    monkeypatch.setattr(mip, "_system_cbc", lambda: None)
    monkeypatch.setattr(pulp.PULP_CBC_CMD, "available", lambda self: False)
    problem = make_problem(n=4, d=2, seed=1)
    with pytest.raises(SolverError, match="pip install"):
        solve_ilp(problem, time_limit_s=1)
    with pytest.raises(SolverError, match="unknown ILP solver"):
        solve_ilp(problem, solver="gurobi-please")


def test_constraints_are_named_and_pairs_only_for_unordered_nodes():
    # 0 -> 1 -> 2 and an independent node 3: only pairs (0,3), (1,3), (2,3) need ordering binaries
    nodes = [OpNode(f"n{i}", "op", bytes_written=1000) for i in range(4)]
    g = OpGraph(nodes, [(0, 1, 1000), (1, 2, 1000)])
    devs = [Device(f"d{i}", "gpu", {"kind": "cuda"}, 1e9, 1e12, 1e11, index=i) for i in range(2)]
    problem = Problem(g, Cluster("c", devs, np.full((2, 2), 1e-5), np.full((2, 2), 1e9)),
                      np.full((4, 2), 1e-3))
    prob, v = build_ilp(problem)
    assert sorted(v.y) == [(0, 3), (1, 3), (2, 3)]
    names = [c.name for c in prob.constraints()]
    assert not any(nm.startswith("_C") for nm in names)  # pulp's default names
    for prefix in ("assign_", "finish_", "prec_", "arrive_", "txready_", "dur_", "order_", "fifo_",
                   "mem_", "span_", "load_"):
        assert any(nm.startswith(prefix) for nm in names), prefix


def test_pairs_window_is_sound():
    problem = make_problem(n=12, d=2, seed=21, p=0.2, lat_scale=0.1)
    full = solve_ilp(problem, time_limit_s=20, gap=0)
    windowed = solve_ilp(problem, time_limit_s=20, gap=0, pairs=1)
    assert windowed.info["fixed_pairs"] > 0
    assert windowed.info["num_order_binaries"] < full.info["num_order_binaries"]
    simulate(problem, windowed)
    assert windowed.info["makespan_s"] >= full.info["makespan_s"] * (1 - 1e-6)
    assert windowed.info["makespan_s"] <= windowed.info["warm_start_makespan_s"] * (1 + 1e-9)


def test_registry_entry_point_solves_small_graphs_directly():
    problem = make_problem(n=6, d=2, seed=1)
    plan = solve(problem, target=10, time_limit_s=20, gap=0)
    assert plan.solver == "ilp"
    assert "coarse_nodes" not in plan.info
    assert plan.info["makespan_s"] == pytest.approx(brute_force(problem), rel=1e-6)


def test_a_start_that_meets_the_lower_bound_skips_the_mip():
    # a chain whose every op is 3x faster on device 0: the heuristics' one-device plan is the
    # critical path, i.e. the cheap lower bound, so the MIP (and its root) is not built
    from tvm_pesto.solve.bounds.makespan import lower_bound

    n = 8
    g = OpGraph([OpNode(f"n{i}", "op", bytes_written=1000) for i in range(n)], [(i, i + 1, 1000) for i in range(n - 1)],
                name="chain")
    devs = [Device(f"d{i}", "gpu", {"kind": "cuda"}, 1e9, 1e12, 1e11, index=i) for i in range(2)]
    costs = np.tile([1e-3, 3e-3], (n, 1))
    problem = Problem(g, Cluster("two", devs, np.full((2, 2), 1e-5), np.full((2, 2), 1e9)), costs)
    plan = solve(problem, time_limit_s=5)
    info = plan.info
    assert info["status"] == "optimal" and info["proven_by"] == "lower bound", info
    assert "num_vars" not in info and info["source"] == "warm_start"
    assert info["objective_value_s"] <= lower_bound(problem, lp=False, comm=False)["best"] * (1 + 1e-4)
    assert plan.assignment.tolist() == [0] * n
    # without a bound, or asked for a proof (gap 0), the MIP runs and agrees
    for kw in ({}, {"floor_s": info["lower_bound_s"], "gap": 0}):
        mip_plan = solve_ilp(problem, time_limit_s=20, **kw)
        assert "proven_by" not in mip_plan.info and mip_plan.info["num_vars"] > 0
        assert mip_plan.info["makespan_s"] == pytest.approx(info["makespan_s"], rel=1e-6)


def test_solver_crash_falls_back_to_the_other_solver_then_warm_start(monkeypatch):
    problem = make_problem(n=5, d=2, seed=3)

    def crash(self, lp, **kw):
        raise pulp.PulpSolverError("Pulp: Error while trying to execute cbc")

    monkeypatch.setattr(mip, "_system_cbc", lambda: None)  # use PuLP's bundled CBC
    monkeypatch.setattr(pulp.PULP_CBC_CMD, "actualSolve", crash)
    plan = solve_ilp(problem, time_limit_s=10, gap=0)
    assert plan.info["solver_backend"] == "highs"
    assert "cbc" in plan.info["solver_failures"][0]
    assert plan.info["makespan_s"] == pytest.approx(brute_force(problem), rel=1e-6)

    monkeypatch.setattr(pulp.HiGHS, "actualSolve", crash)
    warm = Plan.from_assignment(np.zeros(5, dtype=int), np.arange(5), 2, solver="mine")
    plan = solve_ilp(problem, time_limit_s=10, warm_start=warm)
    assert plan.info["status"] == "solver_failed" and plan.info["source"] == "warm_start"


# -- honest solver status ------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_time_limit_is_reported_as_time_limit_not_optimal(solver):
    # 30 nodes on 3 devices cannot be closed in 1 s (gap 10-20 % on this machine); PuLP's
    # own status says "Optimal" for the HiGHS stop, the normalised status must not
    problem = make_problem(n=30, d=3, seed=5, p=0.12, lat_scale=0.1)
    warm = Plan.from_assignment(np.arange(30) % 3, np.arange(30), 3, solver="round_robin")
    plan = solve_ilp(problem, time_limit_s=1, solver=solver, warm_start=warm)
    info = plan.info
    assert info["status"] == "time_limit", info["solver_status"]
    assert info["timed_out"] is True and info["solver_backend"] == solver
    assert info["mip_gap"] is not None and info["mip_gap"] > 1e-4  # not closed
    assert info["bound"] <= info["objective"] * (1 + 1e-9)
    assert info["objective"] <= info["warm_start_makespan_s"] * (1 + 1e-6)  # the incumbent's objective
    if solver == "highs":
        assert info["pulp_status"] == "Optimal" and info["solver_status"] == "kTimeLimit"


@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_small_problem_is_reported_optimal(solver):
    problem = make_problem(n=5, d=2, seed=1)
    plan = solve_ilp(problem, time_limit_s=30, solver=solver, gap=0)
    assert plan.info["status"] == "optimal" and plan.info["timed_out"] is False
    assert plan.info["objective"] == pytest.approx(brute_force(problem), rel=1e-6)


def test_memory_infeasible_placement_raises_infeasible_error():
    # every node fits a device on its own, the whole graph does not fit both: no heuristic
    # finds a plan, so there is no warm start, and the MIP proves infeasibility
    problem = make_problem(n=6, d=2, seed=4, mem=1e9)
    cap = problem.mem.sum() / 2.5
    assert problem.mem.max() <= cap
    problem = make_problem(n=6, d=2, seed=4, mem=cap)
    with pytest.raises(InfeasibleError, match="ILP has no feasible placement.*memory"):
        solve_ilp(problem, time_limit_s=30)


def _tiny_mip(infeasible: bool):
    prob = pulp.LpProblem("tiny", pulp.LpMinimize)
    x = mip.add_var(prob, "x", 0, 3, cat=pulp.LpInteger)
    prob += mip.lin([(x, 1.0)]), "obj"
    prob += pulp.LpConstraint(mip.lin([(x, 2.0)]), pulp.LpConstraintGE, rhs=7.0 if infeasible else 3.0), "two_x"
    return prob


@pytest.mark.parametrize("solver", ["cbc", "highs"])
def test_solve_mip_reads_the_solvers_outcome(solver):
    res = mip.solve_mip(_tiny_mip(False), solver, time_limit_s=10)
    assert (res.status, res.has_solution, res.backend) == ("optimal", True, solver)
    assert res.objective == pytest.approx(2.0) and not res.timed_out
    res = mip.solve_mip(_tiny_mip(True), solver, time_limit_s=10)
    assert (res.status, res.has_solution, res.objective) == ("infeasible", False, None)
    assert set(mip.STATUSES) >= {res.status}


def test_solve_mip_reports_solver_failed_without_fallback(monkeypatch):
    def crash(self, lp, **kw):
        raise pulp.PulpSolverError("Pulp: Error while trying to execute cbc")

    monkeypatch.setattr(mip, "_system_cbc", lambda: None)
    monkeypatch.setattr(pulp.PULP_CBC_CMD, "actualSolve", crash)
    res = mip.solve_mip(_tiny_mip(False), "cbc", time_limit_s=10, fallback=False)
    assert (res.status, res.has_solution, res.backend) == ("solver_failed", False, None)
    assert "cbc" in res.failures[0]
    res = mip.solve_mip(_tiny_mip(False), "cbc", time_limit_s=10)  # falls back to HiGHS
    assert (res.status, res.backend) == ("optimal", "highs")
