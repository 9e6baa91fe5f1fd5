"""Placement heuristics: known optima on small DAGs, memory, co-location, registry, speed.

The property tests at the end draw random DAGs from one generator (:func:`random_problem`;
:func:`random_joint_problem` adds random candidate sets on the same DAGs) and check every
plan the solvers return with :func:`check_plan`: the simulator's own checks plus the
schedule read back from its start/finish/transfer arrays (precedence, no overlap on a
device or a link, memory), and that no lower bound exceeds the best plan found.
"""
from __future__ import annotations

import sys
import time
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_pesto.candidates import Candidate
from tvm_pesto.candidates.convex import Reach, is_valid
from tvm_pesto.cluster import Cluster, Device
from tvm_pesto.errors import InfeasibleError, SolverError
from tvm_pesto.graph.opgraph import OpGraph, OpNode
from tvm_pesto.plan import JointProblem, Plan, Problem, simulate
from tvm_pesto.plan.objective import evaluate
from tvm_pesto.solve import HEURISTICS, SOLVERS, get_solver, solve
from tvm_pesto.solve.bounds.makespan import lower_bound
from tvm_pesto.solve.heuristics.heft import Timeline
from tvm_pesto.solve.joint.solver import joint_lower_bound, solve_joint

warnings.filterwarnings("ignore", message=".*_core is not built.*")

MiB = 1 << 20
SCHEDULERS = ("heft", "m-etf", "m-sct")


def make_cluster(d: int, memory: float = 1e12, latency: float = 1e-5, bandwidth: float = 1e9) -> Cluster:
    devs = [Device(name=f"g{i}", kind="gpu", target={"kind": "cuda"}, memory_bytes=memory, peak_flops=1e12,
                   mem_bandwidth=1e11, index=i) for i in range(d)]
    return Cluster("test", devs, np.full((d, d), latency), np.full((d, d), bandwidth))


def make_problem(n, edges, costs, d=2, mem=None, memory=1e12, colocate=(), latency=1e-5, bandwidth=1e9):
    mem = [0] * n if mem is None else mem
    nodes = [OpNode(f"v{i}", "op", param_bytes=int(mem[i])) for i in range(n)]
    g = OpGraph(nodes, edges, name="t")
    costs = np.asarray(costs, dtype=float)
    if costs.ndim == 1:
        costs = np.repeat(costs[:, None], d, axis=1)
    return Problem(g, make_cluster(d, memory, latency, bandwidth), costs, colocate=[list(c) for c in colocate])


def random_problem(seed, n, d, p_inf=0.0, mem_factor=None, groups=0, comm_scale=1.0):
    rng = np.random.default_rng(seed)
    mem = rng.integers(0, 1000, n)
    edges = []
    for v in range(1, n):
        for u in rng.choice(v, size=min(v, int(rng.integers(0, 4))), replace=False):
            edges.append((int(u), v, int(rng.integers(0, 2000 * comm_scale + 1))))
    costs = rng.uniform(1e-4, 1e-3, (n, d)) * rng.choice([1.0, 1.0, 3.0], d)
    costs[rng.random((n, d)) < 0.05] = 0.0
    if p_inf:
        bad = rng.random((n, d)) < p_inf
        bad[np.arange(n), rng.integers(0, d, n)] = False
        costs[bad] = np.inf
    colocate = []
    free = list(rng.permutation(n))
    for _ in range(groups):
        if len(free) < 2:
            break
        k = int(rng.integers(2, 4))
        colocate.append([int(x) for x in free[:k]])
        free = free[k:]
    memory = 1e12
    if mem_factor is not None:
        memory = max(1.0, mem_factor * (mem.sum() / d + mem.max()))
    return make_problem(n, edges, costs, d=d, mem=mem, memory=memory, colocate=colocate,
                        latency=1e-5, bandwidth=1e7)


def check_plan(problem, plan, name, check_info=True):
    """Everything a plan must satisfy; returns the simulated makespan. ``check_info=False``
    leaves out the facts the solver reports in ``plan.info`` (peak memory)."""
    assert plan.solver == name
    assert plan.solve_s > 0 and isinstance(plan.info, dict)
    plan.validate(problem.num_nodes, problem.num_devices)
    a = plan.assignment
    assert np.isfinite(problem.costs[np.arange(problem.num_nodes), a]).all()
    for grp in problem.colocate:
        assert len(set(a[grp].tolist())) == 1, f"{name} split co-location group {grp}"
    res = simulate(problem, plan)  # raises on deadlock, inf cost or memory overflow
    assert (res.peak_memory <= problem.capacity * (1 + 1e-9)).all()
    if check_info and "peak_memory_bytes" in plan.info:
        np.testing.assert_allclose(plan.info["peak_memory_bytes"], res.peak_memory, rtol=1e-9)
    check_schedule(problem, plan, res, name)
    return res.makespan


def check_bounds(bounds: dict, span: float) -> None:
    """Every bound in ``bounds`` (the dict of :func:`lower_bound` or :func:`joint_lower_bound`;
    None where skipped) is at most ``span``, the makespan of a plan the simulator accepted."""
    for key, value in bounds.items():
        if key.endswith("_s") or key == "best":
            if value is not None:
                assert value <= span * (1 + 1e-9) + 1e-15, f"{key} = {value} exceeds a plan's makespan {span}"


def _no_overlap(starts, ends, what):
    """Intervals that follow each other in the given order never overlap."""
    if len(starts) > 1:
        tol = 1e-12 + 1e-9 * float(np.max(ends))
        gap = np.asarray(starts[1:]) - np.asarray(ends[:-1])
        assert (gap >= -tol).all(), f"{what}: interval {int(np.argmin(gap)) + 1} starts before the previous ends"


def check_schedule(problem, plan, res, name):
    """The simulated schedule, read back from its arrays: each node runs for its cost on its
    device; each device runs its order one node at a time; each input is there before its
    consumer starts (the producer finished, or a transfer of at least the edge's bytes
    arrived); each link carries one transfer at a time; the memory peak is the nodes'
    weights and outputs plus what the device received."""
    n, a = problem.num_nodes, plan.assignment
    start, finish, tx = res.start, res.finish, res.transfers
    cost = problem.costs[np.arange(n), a]
    tol = 1e-12 + 1e-9 * (float(finish.max()) if n else 0.0)
    assert np.isfinite(start).all() and (start >= 0).all(), name
    np.testing.assert_allclose(finish - start, cost, rtol=1e-9, atol=1e-15, err_msg=f"{name}: durations")
    assert res.makespan == pytest.approx(float(finish.max()) if n else 0.0, rel=1e-12, abs=1e-15)
    for d, seq in enumerate(plan.order):
        _no_overlap(start[seq], finish[seq], f"{name}: device {d}")
    arrival = {}
    for u, s, t, t0, t1, b in tx:
        u, s, t = int(u), int(s), int(t)
        assert s == a[u] != t, f"{name}: transfer of node {u} from device {s} to {t}"
        assert t0 >= finish[u] - tol, f"{name}: node {u}'s output leaves before it is computed"
        assert t1 - t0 == pytest.approx(problem.latency[s, t] + b * problem.inv_bw[s, t], rel=1e-9, abs=1e-15)
        assert (u, t) not in arrival, f"{name}: node {u}'s output is sent to device {t} twice"
        arrival[u, t] = (t1, b)
    for s in range(problem.num_devices):
        for t in range(problem.num_devices):
            on = tx[(tx[:, 1] == s) & (tx[:, 2] == t)] if len(tx) else tx
            on = on[np.argsort(on[:, 3], kind="stable")]
            _no_overlap(on[:, 3], on[:, 4], f"{name}: link {s}->{t}")
    for u, v, b in zip(problem.src.tolist(), problem.dst.tolist(), problem.ebytes.tolist()):
        if a[u] == a[v]:
            assert start[v] >= finish[u] - tol, f"{name}: {v} starts before its input {u} finishes"
        else:
            assert (u, a[v]) in arrival, f"{name}: {u}'s output never reaches {v} on device {a[v]}"
            t1, sent = arrival[u, a[v]]
            assert sent >= b and start[v] >= t1 - tol, f"{name}: {v} starts before {u}'s output arrives"
    received = np.zeros(problem.num_devices)
    if len(tx):
        np.add.at(received, tx[:, 2].astype(int), tx[:, 5])
    peak = np.bincount(a, weights=problem.mem, minlength=problem.num_devices) + received
    np.testing.assert_allclose(res.peak_memory, peak, rtol=1e-9, err_msg=f"{name}: memory")
    assert (peak <= problem.capacity * (1 + 1e-9)).all(), f"{name}: memory"


# -- known optima ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ("single",) + SCHEDULERS)
def test_chain_on_two_identical_devices_takes_the_sum(name):
    costs = [1e-3, 2e-3, 3e-3, 4e-3]
    p = make_problem(4, [(0, 1, 10**6), (1, 2, 10**6), (2, 3, 10**6)], costs)
    plan = solve(p, name)
    assert check_plan(p, plan, name) == pytest.approx(sum(costs))
    assert len(set(plan.assignment.tolist())) == 1


@pytest.mark.parametrize("name", SCHEDULERS)
def test_two_independent_chains_run_in_parallel(name):
    edges = [(0, 1, 100), (1, 2, 100), (3, 4, 100), (4, 5, 100)]
    p = make_problem(6, edges, [1e-3] * 6)
    plan = solve(p, name)
    assert check_plan(p, plan, name) == pytest.approx(3e-3)
    assert plan.assignment[0] == plan.assignment[2] != plan.assignment[3] == plan.assignment[5]


@pytest.mark.parametrize("name", SCHEDULERS)
def test_fork_join_with_expensive_transfers_stays_on_one_device(name):
    # 0 -> {1,2,3} -> 4, each transfer 100 ms, each node 1 ms: splitting never pays
    edges = [(0, k, 10**8) for k in (1, 2, 3)] + [(k, 4, 10**8) for k in (1, 2, 3)]
    p = make_problem(5, edges, [1e-3] * 5, d=3)
    plan = solve(p, name)
    assert check_plan(p, plan, name) == pytest.approx(5e-3)
    assert len(set(plan.assignment.tolist())) == 1


@pytest.mark.parametrize("name", SCHEDULERS)
def test_fork_join_with_cheap_transfers_spreads(name):
    edges = [(0, k, 1) for k in (1, 2, 3)] + [(k, 4, 1) for k in (1, 2, 3)]
    p = make_problem(5, edges, [1e-3, 1e-2, 1e-2, 1e-2, 1e-3], d=3, latency=0.0, bandwidth=1e12)
    plan = solve(p, name)
    assert check_plan(p, plan, name) < 1.3e-2
    assert len(set(plan.assignment[[1, 2, 3]].tolist())) == 3


def test_single_picks_the_fastest_device_that_fits():
    costs = np.array([[3e-3, 1e-3, 2e-3]] * 3)
    p = make_problem(3, [(0, 1, 1), (1, 2, 1)], costs, d=3, mem=[10, 10, 10])
    plan = solve(p, "single")
    assert set(plan.assignment.tolist()) == {1}
    assert plan.order[1] == [0, 1, 2]


def test_mtopo_fills_devices_in_topological_turns():
    p = make_problem(8, [(i, i + 1, 1) for i in range(7)], [1e-3] * 8, d=2, mem=[100] * 8)
    plan = solve(p, "m-topo", share="memory")
    check_plan(p, plan, "m-topo")
    a = plan.assignment.tolist()
    assert a == sorted(a) and a[0] == 0 and a[-1] == 1  # a prefix on device 0, the rest on 1


def test_mtopo_compute_share_favours_the_fast_device():
    costs = np.array([[1e-3, 1e-2]] * 20)  # device 1 is ten times slower
    p = make_problem(20, [], costs, d=2)
    plan = solve(p, "m-topo", share="compute")
    check_plan(p, plan, "m-topo")
    assert (plan.assignment == 0).sum() >= 17


def test_nodes_only_go_where_they_can_run():
    costs = np.array([[1e-3, np.inf], [np.inf, 1e-3], [1e-3, 1e-3]])
    p = make_problem(3, [(0, 2, 10), (1, 2, 10)], costs)
    for name in SCHEDULERS + ("m-topo",):
        plan = solve(p, name)
        check_plan(p, plan, name)
        assert plan.assignment[0] == 0 and plan.assignment[1] == 1
    with pytest.raises(InfeasibleError, match="no single device"):
        solve(p, "single")


# -- memory ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SCHEDULERS + ("m-topo",))
def test_memory_forces_a_split(name):
    # 4 x 100 MiB on devices of 250 MiB: two per device
    p = make_problem(4, [(0, 1, 0), (1, 2, 0), (2, 3, 0)], [1e-3] * 4, mem=[100 * MiB] * 4, memory=250 * MiB)
    plan = solve(p, name)
    check_plan(p, plan, name)
    assert np.bincount(plan.assignment, minlength=2).tolist() == [2, 2]


@pytest.mark.parametrize("name", HEURISTICS)
def test_infeasible_error_names_a_capacity_that_works(name):
    # a -> b, 100 MiB each, a 100 MiB tensor between them, devices of 150 MiB: whatever the
    # split, some device needs 200 MiB
    p = make_problem(2, [(0, 1, 100 * MiB)], [1e-3, 1e-3], mem=[100 * MiB] * 2, memory=150 * MiB)
    with pytest.raises(InfeasibleError) as info:
        solve(p, name)
    msg = str(info.value)
    assert name in msg and "150.0 MiB" in msg and "per device" in msg
    assert "succeeds with" in msg
    works = float(msg.split("succeeds with ")[1].split(" MiB")[0])
    assert 200 <= works <= 210
    p2 = make_problem(2, [(0, 1, 100 * MiB)], [1e-3, 1e-3], mem=[100 * MiB] * 2, memory=works * MiB)
    check_plan(p2, solve(p2, name), name)


def test_memory_check_comes_first():
    p = make_problem(3, [], [1e-3] * 3, mem=[100 * MiB] * 3, memory=120 * MiB)
    with pytest.raises(InfeasibleError, match="weights and activations need"):
        solve(p, "heft")


# -- co-location ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", HEURISTICS)
def test_colocated_nodes_share_a_device(name):
    edges = [(0, 1, 10), (1, 2, 10), (0, 3, 10), (3, 4, 10), (2, 5, 10), (4, 5, 10)]
    p = make_problem(6, edges, [1e-3] * 6, d=3, colocate=[[1, 4], [0, 5]], latency=0.0, bandwidth=1e12)
    plan = solve(p, name)
    check_plan(p, plan, name)


def test_colocated_group_with_no_common_device_is_infeasible():
    costs = np.array([[1e-3, np.inf], [np.inf, 1e-3]])
    p = make_problem(2, [], costs, colocate=[[0, 1]])
    with pytest.raises(InfeasibleError, match="co-location group"):
        solve(p, "heft")


def test_group_reserves_room_for_its_later_members():
    # forward f (on whatever device) and its backward twin b must share a device; b also
    # needs a 100 MiB tensor from x. Filling f's device with other nodes must not starve b.
    mem = [10 * MiB, 60 * MiB, 60 * MiB, 10 * MiB, 10 * MiB]
    edges = [(0, 1, 0), (0, 2, 0), (1, 4, 0), (2, 4, 0), (3, 4, 100 * MiB)]
    p = make_problem(5, edges, [1e-3] * 5, mem=mem, memory=180 * MiB, colocate=[[0, 4]])
    for name in HEURISTICS:
        plan = solve(p, name)
        check_plan(p, plan, name)


# -- random DAGs (hypothesis) ----------------------------------------------------------------
random_case = st.tuples(
    st.integers(0, 2**31 - 1),                   # seed
    st.integers(1, 18),                          # nodes
    st.integers(1, 4),                           # devices
    st.sampled_from([0.0, 0.0, 0.3]),            # share of (node, device) pairs that cannot run
    st.sampled_from([None, None, 0.8, 1.2, 2.0]),  # memory per device, relative to a fair share
    st.integers(0, 3),                           # co-location groups
)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_case)
def test_every_heuristic_gives_a_valid_plan(case):
    # issue 3: every algorithm's plan passes the simulator's checks on >= 1000 random DAGs
    # issue 15: ... and no lower bound (here: critical path, work, LP) exceeds the best of them
    seed, n, d, p_inf, mem_factor, groups = case
    p = random_problem(seed, n, d, p_inf, mem_factor, groups)
    best = np.inf
    for name in ("single", "heft", "m-topo", "m-etf", "m-sct"):
        try:
            plan = solve(p, name)
        except InfeasibleError as err:
            assert mem_factor is not None or name == "single" or p_inf > 0, str(err)
            continue
        best = min(best, check_plan(p, plan, name))
    if np.isfinite(best):
        check_bounds(lower_bound(p, lp=True, comm=False), best)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_case)
def test_ilp_gives_a_valid_plan(case):
    # the same check for the ILP on 200 DAGs (short limits: validity, not optimality); each
    # example starts CBC once or twice (~100 ms on 2 cores), 300 of them 32 s of the suite (new
    # DAGs each run: Hypothesis draws them afresh)
    seed, n, d, p_inf, mem_factor, groups = case
    p = random_problem(seed, n, d, p_inf, mem_factor, groups)
    try:
        plan = solve(p, "ilp", time_limit_s=0.5, refine_s=0.1)
    except (InfeasibleError, SolverError) as err:
        # only when no heuristic finds a plan either (the ILP has no warm start then)
        for name in ("heft", "m-topo", "m-etf", "m-sct"):
            with pytest.raises(InfeasibleError):
                solve(p, name)
        assert mem_factor is not None or p_inf > 0, str(err)
        return
    span = check_plan(p, plan, "ilp")
    check_bounds(lower_bound(p, lp=True, comm=False), span)
    check_bounds({"cheap_lower_bound_s": plan.info.get("cheap_lower_bound_s")}, span)  # the ILP's own floor


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_case, st.sampled_from([0.2, 0.5, 0.8]))
def test_msct_with_lp_gives_a_valid_plan(case, threshold):
    seed, n, d, p_inf, mem_factor, groups = case
    p = random_problem(seed, n, d, p_inf, mem_factor, groups, comm_scale=50.0)
    try:
        plan = solve(p, "m-sct", threshold=threshold)
    except InfeasibleError:
        assert mem_factor is not None or p_inf > 0
        return
    check_plan(p, plan, "m-sct")
    assert plan.info["threshold"] == threshold
    assert plan.info["favorite"] in ("lp", "none")


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_case)
def test_no_lower_bound_exceeds_the_best_plan(case):
    # every bound lower_bound computes by default, the LP and the transfer-aware segment and
    # path-memory bounds included, against the best plan of all solvers (the ILP too), with
    # transfers large enough to matter
    seed, n, d, p_inf, mem_factor, groups = case
    p = random_problem(seed, n, d, p_inf, mem_factor, groups, comm_scale=50.0)
    spans = []
    for name in SOLVERS:
        opts = {"time_limit_s": 0.5, "refine_s": 0.1} if name == "ilp" else {}
        try:
            spans.append(check_plan(p, solve(p, name, **opts), name))
        except (InfeasibleError, SolverError):
            assert mem_factor is not None or name == "single" or p_inf > 0
    if spans:
        lb = lower_bound(p, lp=True, comm=True)
        assert lb["lp_s"] is not None and lb["segment_s"] is not None and lb["path_memory_s"] is not None, lb
        check_bounds(lb, min(spans))


def test_stage_dp_puts_a_dropped_node_where_it_can_run():
    # node 10 costs nothing on g0 (so the DP drops it) and cannot run on g1 or g2, where its
    # neighbours are: it goes back on a device that runs it, not next to a neighbour
    p = random_problem(1, 11, 3, 0.3, 0.8, 0, comm_scale=50.0)
    assert p.costs[10, 0] == 0 and np.isinf(p.costs[10, 1:]).all()
    plan = solve(p, "stage-dp")
    assert plan.assignment[10] == 0
    kinds = {v["kind"] for v in evaluate(p, plan, "stage", "latency").violations}
    assert "placement" not in kinds, kinds


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 4))
def test_memory_for_everything_always_succeeds(seed, d):
    # with room for every weight, output and copied tensor on each device, nothing can fail
    p = random_problem(seed, 15, d, 0.0, None, 2)
    room = p.mem.sum() + p.ebytes.sum()
    p = make_problem(p.num_nodes, p.graph.edges(), p.costs, d=d, mem=p.mem, memory=room,
                     colocate=p.colocate, bandwidth=1e7)
    for name in HEURISTICS:
        check_plan(p, solve(p, name), name)


def test_heft_is_no_worse_than_single_on_identical_devices():
    worse = 0
    for seed in range(20):
        p = random_problem(seed, 30, 3)
        single = simulate(p, solve(p, "single")).makespan
        heft = simulate(p, solve(p, "heft")).makespan
        worse += heft > single * 1.001
    assert worse <= 2


def test_the_schedule_check_catches_what_it_checks():
    # a valid plan's simulated schedule, then one flaw at a time: check_schedule must object
    import dataclasses

    p = make_problem(3, [(0, 2, 10**4), (1, 2, 10**4)], [1e-3, 1e-3, 1e-3], mem=[5, 7, 11])
    plan = Plan([0, 1, 0], [[0, 2], [1]], solver="hand")
    res = simulate(p, plan)
    check_schedule(p, plan, res, "hand")
    flaws = {"overlap on device 0": dict(start=res.start + [0, 0, -1e-3], finish=res.finish + [0, 0, -1e-3]),
             "starts before its input arrives": dict(start=res.start + [0, 0, -5e-4], finish=res.finish + [0, 0, -5e-4]),
             "transfer too fast": dict(transfers=res.transfers * [1, 1, 1, 1, 0.5, 1]),
             "memory": dict(peak_memory=res.peak_memory + [1, 0])}
    for what, change in flaws.items():
        with pytest.raises(AssertionError):  # pytest names the flaw it let through: see `what`
            check_schedule(p, plan, dataclasses.replace(res, **change), what)


# -- pieces ------------------------------------------------------------------------------------
def test_timeline_finds_the_first_gap_that_is_long_enough():
    tl = Timeline(capacity=1)
    for i, (s, e) in enumerate([(0.0, 1.0), (2.0, 3.0), (6.0, 7.0)]):
        tl.insert(i, s, e)
    assert tl.earliest(0.0, 1.0) == (1.0, 1)
    assert tl.earliest(0.0, 2.5) == (3.0, 2)
    assert tl.earliest(0.0, 3.5) == (7.0, 3)
    assert tl.earliest(2.5, 0.5) == (3.0, 2)
    assert tl.earliest(0.0, 1.0, insertion=False) == (7.0, 3)
    tl.insert(1, 1.0, 2.0)
    assert tl.starts[:4].tolist() == [0.0, 1.0, 2.0, 6.0]


def test_registry_lists_names_and_rejects_unknown():
    assert set(SOLVERS) == {"single", "heft", "m-topo", "m-etf", "m-sct", "ilp", "stage-dp", "auto"}
    assert get_solver("HEFT") is SOLVERS["heft"] and get_solver("metf") is SOLVERS["m-etf"]
    with pytest.raises(SolverError, match="known solvers: single, heft, m-topo, m-etf, m-sct, ilp"):
        get_solver("magic")


def test_ilp_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "tvm_pesto.solve.placement_ilp.driver", None)  # import now fails
    p = make_problem(2, [(0, 1, 1)], [1e-3, 1e-3])
    with pytest.raises(SolverError, match="ilp solver not available"):
        solve(p, "ilp")


def test_bad_options_are_solver_errors():
    p = make_problem(2, [(0, 1, 1)], [1e-3, 1e-3])
    with pytest.raises(SolverError, match="share"):
        solve(p, "m-topo", share="half")
    with pytest.raises(SolverError, match="favorite"):
        solve(p, "m-sct", favorite="random")


@pytest.mark.slow
def test_large_graph_is_fast():
    n = 5000
    p = random_problem(7, n, 8)
    for name in ("heft", "m-topo", "m-etf"):
        t0 = time.perf_counter()
        plan = solve(p, name)
        took = time.perf_counter() - t0
        plan.validate(n, 8)
        assert took < 15.0, f"{name} took {took:.1f} s for {n} nodes"


# -- joint solve on random candidate sets ------------------------------------------------------
def random_joint_problem(seed, n, d, p_inf=0.0, mem_factor=None, groups=0, extra=None):
    """The DAG, costs, memory and co-location groups of :func:`random_problem`, with random
    candidates on it: every op alone on ``tvm`` (its placement costs), and up to ``extra``
    (default: random, at most ``2 n``) random valid subgraphs of 2 to 5 ops on a ``lib``
    backend, costing their members' sum times a factor in [0.3, 1.5] and unable to run on
    about one device in five."""
    p = random_problem(seed, n, d, p_inf, mem_factor, groups)
    rng = np.random.default_rng(seed + 1)
    g = p.graph
    reach = Reach(g.dag, n)
    und = g.dag.to_undirected(as_view=True)
    cands = [Candidate("tvm", (v,), "single") for v in range(n)]
    costs = [p.costs[v] for v in range(n)]
    seen = set()
    for _ in range(int(rng.integers(0, 2 * n + 1)) if extra is None else extra):
        nodes = {int(rng.integers(n))}
        for _ in range(int(rng.integers(1, 5))):
            frontier = sorted({w for v in nodes for w in und.neighbors(v)} - nodes)
            if not frontier:
                break
            nodes.add(int(rng.choice(frontier)))
        key = tuple(sorted(nodes))
        if len(key) < 2 or key in seen or not is_valid(g, key, reach):
            continue
        seen.add(key)
        c = p.costs[list(key)].sum(axis=0) * rng.uniform(0.3, 1.5)
        cands.append(Candidate("lib", key, "region"))
        costs.append(np.where(rng.random(d) < 0.2, np.inf, c))
    return JointProblem(g, p.cluster, cands, np.array(costs), colocate=[list(c) for c in p.colocate])


def check_joint_plan(jp, plan, placed, name, check_info=True):
    """What a joint plan must satisfy: its units are candidates of ``jp`` that cover every op
    once, ``placed`` is their contraction, the plan passes :func:`check_plan` on it (with the
    op-level co-location groups kept), and neither bound exceeds its makespan."""
    index = {c: i for i, c in enumerate(jp.candidates)}
    assert plan.units is not None and all(u in index for u in plan.units), name
    cover = [index[u] for u in plan.units]
    assert sorted(v for u in plan.units for v in u.nodes) == list(range(jp.graph.num_nodes)), name
    ref = jp.contract(cover)
    for attr in ("costs", "src", "dst", "ebytes", "mem"):
        np.testing.assert_array_equal(getattr(placed, attr), getattr(ref, attr), err_msg=f"{name}: {attr}")
    span = check_plan(placed, plan, plan.solver, check_info)
    device_of = {v: int(plan.assignment[k]) for k, u in enumerate(plan.units) for v in u.nodes}
    for grp in jp.colocate:
        assert len({device_of[v] for v in grp}) == 1, f"{name} split co-location group {grp}"
    check_bounds(joint_lower_bound(jp), span)
    check_bounds(lower_bound(placed, lp=False, comm=False), span)
    return span


def _solve_joint_or_explain(jp, case, solver, **options):
    """``solve_joint``'s plan, or None when it fails for a reason the case allows: memory
    (``mem_factor``), ops that cannot run everywhere (``p_inf``), or one device (``single``)."""
    _, _, _, p_inf, mem_factor, _ = case
    try:
        return solve_joint(jp, solver=solver, **options)
    except (InfeasibleError, SolverError) as err:
        assert mem_factor is not None or solver == "single" or p_inf > 0, str(err)
        return None


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_case, st.sampled_from(HEURISTICS))
def test_joint_solve_gives_a_valid_plan(case, solver):
    # issue 15: the joint solve (cover + placement) on >= 1000 random DAGs with random
    # candidate sets: valid plans, and neither the joint nor the placement bound above them
    jp = random_joint_problem(*case)
    res = _solve_joint_or_explain(jp, case, solver, search_s=0.0)
    if res is not None:
        assert res[0].solver == solver
        check_joint_plan(jp, *res, solver)


@pytest.mark.slow
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_case, st.sampled_from(HEURISTICS))
def test_joint_local_search_gives_a_valid_plan(case, solver):
    # the same with the joint local search on (10 ms), co-location groups included: the plan
    # keeps the solver's name and plan.info describes the plan returned
    jp = random_joint_problem(*case)
    res = _solve_joint_or_explain(jp, case, solver, search_s=0.01)
    if res is not None:
        assert res[0].solver == solver
        check_joint_plan(jp, *res, solver)


# Both found by test_joint_local_search_gives_a_valid_plan (then fixed); the search ends long
# before its budget on these (no move is left), so they do not depend on the machine's speed.
def test_joint_local_search_reports_the_memory_of_the_plan_it_returns():
    jp = random_joint_problem(0, 3, 3)
    plan, placed = solve_joint(jp, solver="m-topo", search_s=2.0)
    assert plan.info["search"]["accepted"]["refine"] >= 1
    np.testing.assert_allclose(plan.info["peak_memory_bytes"], simulate(placed, plan).peak_memory)


def test_joint_local_search_with_colocation_groups_does_not_crash():
    # refine.kick used to draw a device for a co-location group with no common device
    jp = random_joint_problem(1_077_293_696, 6, 3, 0.3, None, 3)
    for solver in ("single", "heft"):
        check_joint_plan(jp, *solve_joint(jp, solver=solver, search_s=2.0), solver)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_case)
def test_joint_ilp_gives_a_valid_plan(case):
    # the joint ILP (small graphs) and the placement ILP under it, with short limits,
    # co-location groups included
    jp = random_joint_problem(*case)
    res = _solve_joint_or_explain(jp, case, "ilp", time_limit_s=0.5, search_s=0.0, refine_s=0.1)
    if res is not None:
        assert res[0].solver in ("ilp", "joint-ilp")
        check_joint_plan(jp, *res, "ilp")


@pytest.mark.slow
def test_joint_ilp_warm_start_is_never_a_device_that_cannot_run_it():
    # found by test_joint_ilp_gives_a_valid_plan: the warm start (the cover on the plan's busiest
    # device) held a unit that cannot run there; when the ILP found nothing better within its
    # limit, that infeasible warm start came back as the plan
    jp = random_joint_problem(42784, 15, 4, 0.0, None, 2)
    for limit in (0.001, 0.05):
        check_joint_plan(jp, *solve_joint(jp, solver="ilp", time_limit_s=limit, search_s=0.0, refine_s=0.1), "ilp")
    from tvm_pesto.solve.joint.cover import CoverResult
    from tvm_pesto.solve.joint.ilp import joint_ilp

    # a region that cannot run on device ``bad``, every other op alone
    region = next(i for i, c in enumerate(jp.candidates) if not np.isfinite(jp.costs[i]).all())
    bad = int(np.flatnonzero(~np.isfinite(jp.costs[region]))[0])
    alone = {c.nodes[0]: i for i, c in enumerate(jp.candidates) if len(c.nodes) == 1}
    cover = [region] + [alone[v] for v in range(jp.graph.num_nodes) if v not in jp.candidates[region].nodes]
    with pytest.raises(ValueError, match=f"cannot run on device {bad}"):
        joint_ilp(jp.graph, [c.nodes for c in jp.candidates], jp.costs, jp.cluster,
                  warm=CoverResult(cover, 0.0), warm_device=bad, time_limit_s=1.0)


def test_joint_ilp_keeps_colocation_groups_together():
    jp = random_joint_problem(0, 2, 3, 0.0, None, 1)  # found by test_joint_ilp_gives_a_valid_plan; optimal in ms
    assert jp.colocate == [[0, 1]]
    check_joint_plan(jp, *solve_joint(jp, solver="ilp", time_limit_s=5.0, search_s=0.0), "ilp")
