"""``solver="auto"``: every heuristic, then the joint ILPs decide and prove a bound.

Checked against a brute-force optimum on small random joint problems (every cover, every
device assignment, every order) and against every heuristic's own flow on random problems;
its end within budget on a 2,000-op transformer is in ``test_joint.py``."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from tvm_pesto.candidates import Candidate
from tvm_pesto.candidates.convex import Reach
from tvm_pesto.cluster import Cluster, Device
from tvm_pesto.errors import PestoError
from tvm_pesto.graph import OpGraph, OpNode
from tvm_pesto.plan import JointProblem, Plan, simulate
from tvm_pesto.solve.joint.relaxation import relaxed_joint_ilp
from tvm_pesto.solve.joint.solver import AUTO_PLACERS, solve_joint


def _cluster(num_devices: int, latency: float) -> Cluster:
    devs = [Device(f"d{i}", "cpu", {"kind": "llvm"}, 1e12, 1e12, 1e11, index=i) for i in range(num_devices)]
    return Cluster(f"{num_devices}dev", devs, np.full((num_devices, num_devices), latency),
                   np.full((num_devices, num_devices), 1e9))


def random_joint(seed: int, n: int, num_devices: int, extra: int = 6) -> JointProblem:
    """A random DAG of ``n`` ops, single-op candidates of two backends and random convex
    multi-op candidates of a third, with random costs per device and transfers that matter."""
    rng = np.random.default_rng(seed)
    edges = {(v - 1, v) for v in range(1, n) if rng.random() < 0.7}
    for _ in range(n):
        u, v = sorted(rng.choice(n, 2, replace=False).tolist())
        edges.add((u, v))
    g = OpGraph([OpNode(f"op{v}", "relax.add") for v in range(n)],
                [(u, v, int(rng.integers(1, 4)) * 10_000_000) for u, v in sorted(edges)])
    reach = Reach(g.dag, n)
    cands, costs = [], []
    speed = rng.uniform(0.7, 1.3, num_devices)
    for v in range(n):
        for b in ("tvm", "torch"):
            cands.append(Candidate(b, (v,)))
            costs.append(rng.uniform(0.5, 2.0) * speed)
    tries = 0
    while len(cands) < 2 * n + extra and tries < 200:
        tries += 1
        size = int(rng.integers(2, min(4, n) + 1))
        nodes = tuple(sorted(rng.choice(n, size, replace=False).tolist()))
        if reach.convex(nodes) and all(c.nodes != nodes for c in cands):
            cands.append(Candidate("big", nodes))
            costs.append(rng.uniform(0.4, 1.0) * size * speed)
    return JointProblem(g, _cluster(num_devices, float(rng.uniform(0.05, 0.6))), cands, np.array(costs))


def _exact_covers(problem: JointProblem):
    n = problem.graph.num_nodes
    sets = [frozenset(c.nodes) for c in problem.candidates]

    def rec(covered: frozenset, chosen: list):
        if len(covered) == n:
            yield list(chosen)
            return
        v = min(set(range(n)) - covered)
        for c, s in enumerate(sets):
            if v in s and not (s & covered):
                yield from rec(covered | s, chosen + [c])

    yield from rec(frozenset(), [])


def brute_force(problem: JointProblem) -> float:
    """The smallest simulated makespan over every acyclic cover, device assignment and order."""
    best = np.inf
    D = problem.num_devices
    for cover in _exact_covers(problem):
        try:
            placed = problem.contract(cover)
        except PestoError:
            continue  # the cover's units depend on each other in a cycle
        k = placed.num_nodes
        preds = [set(placed.graph.preds(u)) for u in range(k)]
        orders = [p for p in itertools.permutations(range(k))
                  if all(preds[u] <= set(p[:i]) for i, u in enumerate(p))]
        for assign in itertools.product(range(D), repeat=k):
            if not np.isfinite(problem.costs[cover, list(assign)]).all():
                continue
            for p in orders:
                plan = Plan(np.array(assign, dtype=np.int32), [[u for u in p if assign[u] == d] for d in range(D)])
                best = min(best, simulate(placed, plan).makespan)
    return float(best)


def _solved_span(placed, plan) -> float:
    """The makespan the search and the comparisons between plans minimise: with each switch
    between libraries charged (the ILPs do not model them; their bounds hold below it)."""
    return simulate(placed, plan).makespan


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_auto_finds_the_brute_force_optimum_and_its_bound_holds(seed, monkeypatch):
    # switches free, so that the optimum the ILPs prove is the one the plans are weighed by
    monkeypatch.setattr("tvm_pesto.cluster.dispatch.ASSUMED_SWITCH_S", 0.0)
    problem = random_joint(seed, n=5, num_devices=2, extra=4)
    opt = brute_force(problem)
    plan, placed = solve_joint(problem, "auto", deterministic=True, search_s=1.0, time_limit_s=10)
    span, charged = _solved_span(placed, plan), simulate(placed, plan).makespan
    bound = relaxed_joint_ilp(problem, time_limit_s=10, deterministic=True).bound_s
    assert bound is not None and bound <= opt * (1 + 1e-6), (bound, opt)
    assert span >= opt * (1 - 1e-9)
    assert span == pytest.approx(opt, rel=1e-6), (plan.info["decided_by"], plan.info["status"], span, opt)
    # the claim is the charged plan's: its bound holds, its gap is against the charged makespan
    assert plan.info["makespan_s"] == pytest.approx(charged) and plan.info["bound_s"] <= charged * (1 + 1e-9)
    if plan.info["status"] == "optimal":
        assert plan.info["mip_gap"] <= 1e-4


def _never_worse(seeds, search_s: float) -> list:
    """The cases among ``seeds`` where ``auto`` ends worse than a heuristic's own flow with the
    same budgets (deterministic); every ``auto`` result's claim is checked on the way."""
    worse = []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        problem = random_joint(seed, n=int(rng.integers(4, 9)), num_devices=int(rng.integers(1, 4)))
        plan, placed = solve_joint(problem, "auto", deterministic=True, search_s=search_s, time_limit_s=5)
        span, charged = _solved_span(placed, plan), simulate(placed, plan).makespan
        info = plan.info
        assert info["decided_by"] and info["status"] in ("optimal", "feasible", "heuristic")
        if info["bound_s"] is not None:  # the claim: of the plan with its switches charged
            assert info["bound_s"] <= charged * (1 + 1e-6)
            assert info["mip_gap"] == pytest.approx(max(0.0, (charged - info["bound_s"]) / charged), abs=1e-9)
        for name in AUTO_PLACERS:
            p, pl = solve_joint(problem, name, deterministic=True, search_s=search_s)
            other = _solved_span(pl, p)
            if span > other * (1 + 1e-9):
                worse.append((seed, name, span, other))
    return worse


@pytest.mark.slow
def test_auto_is_never_worse_than_any_heuristic_on_200_random_problems():
    assert not _never_worse(range(1000, 1200), search_s=0.0)


@pytest.mark.slow
def test_auto_with_the_joint_search_is_never_worse_than_any_heuristic_with_it():
    assert not _never_worse(range(2000, 2030), search_s=0.5)


def test_a_failing_relaxation_keeps_the_best_heuristic_plan_and_says_so(monkeypatch):
    from tvm_pesto.errors import SolverError
    from tvm_pesto.solve.joint import decide as joint_decide

    def broken(*args, **kwargs):
        raise SolverError("highs is not installed")

    monkeypatch.setattr(joint_decide, "relaxed_joint_ilp", broken)
    problem = random_joint(7, n=6, num_devices=2)
    plan, placed = solve_joint(problem, "auto", deterministic=True, search_s=0.5)
    heft, heft_placed = solve_joint(problem, "heft", deterministic=True, search_s=0.5)
    assert plan.info["status"] == "heuristic" and plan.info["mip_gap"] is None
    assert "highs is not installed" in plan.info["decision"]["relaxation"]["error"]
    assert simulate(placed, plan).makespan <= simulate(heft_placed, heft).makespan * (1 + 1e-9)


def test_the_ilp_decides_when_its_plan_ties_with_the_heuristics():
    """Where HEFT's plan is already optimal, the relaxed ILP's optimum is that cover and those
    devices: the ILP decided (in agreement), and proved it."""
    from tvm_pesto.plan.examples import chain_with_a_library_call
    from tvm_pesto.solve import solve
    from tvm_pesto.solve.joint.decide import decide

    problem = chain_with_a_library_call()
    cover = [2, 3]  # torch (a, b), then tvm c: the optimum, 4 s
    placed = problem.contract(cover)
    plan = solve(placed, "heft")
    span = simulate(placed, plan).makespan
    _, _, kept, kept_span, info = decide(problem, plan, placed, cover, span, time_limit_s=10, search_s=0,
                                         deterministic=True, decided_by="heft")
    assert sorted(kept) == cover and kept_span == span == 4.0
    assert info["decided_by"] == "relaxed-ilp (= heft)" and info["status"] == "optimal"
    worse = problem.contract([0, 1, 2])  # every op a tvm call of its own: 5 s; the ILP's plan replaces it
    wplan = solve(worse, "heft")
    *_, wspan, winfo = decide(problem, wplan, worse, [0, 1, 2], simulate(worse, wplan).makespan, time_limit_s=10,
                              search_s=0, deterministic=True, decided_by="heft")
    assert wspan == 4.0 and winfo["decided_by"] == "relaxed-ilp"


def test_a_path_through_one_output_of_a_call_waits_for_the_whole_call():
    """s -> x1 -> x2 -> x3 -> t and s -> y -> w -> t; one library call runs x1, x2, x3 and y
    (3 s). w waits for y, so for the whole call: every plan takes s + call + w + t = 10 s, and
    the relaxation proves it (charging a call by the share of its ops a path meets gave 8 s)."""
    names = ["s", "x1", "x2", "x3", "y", "w", "t"]
    edges = [(0, 1), (1, 2), (2, 3), (3, 6), (0, 4), (4, 5), (5, 6)]
    g = OpGraph([OpNode(n, "relax.add") for n in names], [(u, v, 4) for u, v in edges])
    own = {"s": 1.0, "x1": 10.0, "x2": 10.0, "x3": 10.0, "y": 10.0, "w": 5.0, "t": 1.0}
    cands = [Candidate("tvm", (v,)) for v in range(7)] + [Candidate("onnxruntime", (1, 2, 3, 4))]
    costs = np.array([[own[n]] * 2 for n in names] + [[3.0, 3.0]])
    problem = JointProblem(g, _cluster(2, 0.0), cands, costs)
    res = relaxed_joint_ilp(problem, time_limit_s=10, deterministic=True)
    assert res.status == "optimal" and res.bound_s == pytest.approx(10.0, rel=1e-6)
    plan, placed = solve_joint(problem, "auto", deterministic=True, search_s=0.5)
    assert simulate(placed, plan).makespan == pytest.approx(10.0, rel=1e-6) and plan.info["status"] == "optimal"
