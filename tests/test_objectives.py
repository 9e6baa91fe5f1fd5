"""Objectives (latency, throughput with microbatches) in both execution models (op, stage):
the evaluation, and lower bounds that hold against a brute-force optimum on small random graphs."""
from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from tvm_pesto.cluster import parse_cluster
from tvm_pesto.errors import PestoError, PlanError
from tvm_pesto.graph.opgraph import OpGraph, OpNode
from tvm_pesto.plan import Plan, Problem, simulate
from tvm_pesto.plan.objective import evaluate, op_loads, time_per_sample
from tvm_pesto.solve import solve
from tvm_pesto.solve.bounds.makespan import lower_bound
from tvm_pesto.solve.bounds.objective import objective_lower_bound

warnings.filterwarnings("ignore", category=RuntimeWarning)
MiB = float(1 << 20)
KS = (None, 1, 3)  # steady state, one microbatch (= latency), three


def random_problem(seed: int, n: int = 5, d: int = 2, tight: bool = True, training: bool = False,
                   model: str = "stage") -> Problem:
    """A random DAG (edges forward in id order), unlike devices, memory tight for ``model``
    (the op model also holds received tensors); with ``training`` a forward chain and its
    mirrored, co-located backward pass."""
    rng = np.random.default_rng(seed)
    if training:
        f = n // 2
        names = [f"f{i}" for i in range(f)] + [f"f{i}grad" for i in reversed(range(f))]
        ops = ["forward"] * f + ["backward"] * f
        edges = [(i, i + 1, int(rng.integers(1, 8) * MiB)) for i in range(2 * f - 1)]
        coloc = [[i, 2 * f - 1 - i] for i in range(f)]
        n = 2 * f
    else:
        names, ops, coloc = [f"n{i}" for i in range(n)], ["op"] * n, []
        edges = [(u, v, int(rng.integers(1, 8) * MiB)) for u in range(n) for v in range(u + 1, n)
                 if rng.random() < 0.45]
    nodes = [OpNode(names[i], ops[i], param_bytes=int(rng.integers(1, 6) * MiB)) for i in range(n)]
    g = OpGraph(nodes, edges, name=f"rand{seed}")
    cl = parse_cluster(f"{d}xV100-pcie")
    total = sum(nd.param_bytes for nd in nodes) + (sum(b for _, _, b in edges) if model == "op" else 0)
    cl = cl.with_memory(total * (0.7 if tight else 4.0))
    costs = rng.uniform(0.5e-3, 3e-3, (n, d)) * rng.uniform(0.5, 2.0, d)
    if d > 2:
        costs[rng.integers(0, n), rng.integers(0, d)] = np.inf
    return Problem(g, cl, costs, colocate=coloc)


def all_orders(problem: Problem, assignment):
    """Every per-device order of ``assignment`` (the simulator rejects the deadlocking ones)."""
    per = [[v for v in range(problem.num_nodes) if assignment[v] == d] for d in range(problem.num_devices)]
    return itertools.product(*[itertools.permutations(p) for p in per])


def brute_force(problem: Problem, model: str) -> dict:
    """Smallest latency, bottleneck and time per sample (for each K) over every valid plan."""
    best = {"latency": np.inf, "bottleneck": np.inf} | {k: np.inf for k in KS}
    n, d = problem.num_nodes, problem.num_devices
    for a in itertools.product(range(d), repeat=n):
        a = np.array(a)
        if not np.isfinite(problem.costs[np.arange(n), a]).all():
            continue
        orders = all_orders(problem, a) if model == "op" else [None]
        for order in orders:
            plan = Plan(a, [list(o) for o in order]) if order is not None else Plan.from_assignment(
                a, np.arange(n), d)
            try:
                ev = evaluate(problem, plan, model, "latency")
            except PlanError:  # an order against the graph
                continue
            if not ev.valid:
                continue
            best["latency"] = min(best["latency"], ev.latency_s)
            best["bottleneck"] = min(best["bottleneck"], ev.bottleneck_s)
            for k in KS:
                best[k] = min(best[k], time_per_sample(ev.latency_s, ev.bottleneck_s, k))
    return best


CASES = [dict(seed=s, n=5, d=2) for s in range(4)] + [dict(seed=10 + s, n=4, d=3) for s in range(2)] + \
        [dict(seed=20 + s, n=6, d=2, training=True) for s in range(2)] + [dict(seed=30, n=5, d=2, tight=False)]


#: The op-model brute force (placements x orders) is for up to 5 nodes: the larger cases are
#: checked against the stage model only.
PAIRS = [(c, m) for c in CASES for m in ("op", "stage") if m == "stage" or (c["n"] <= 5 and not c.get("training"))]


@pytest.mark.slow
@pytest.mark.parametrize("case, model", PAIRS, ids=[f"seed{c['seed']}-{m}" for c, m in PAIRS])
def test_bounds_hold_against_brute_force(case, model):
    problem = random_problem(**case, model=model)
    assert model == "stage" or problem.num_nodes <= 5
    best = brute_force(problem, model)
    assert np.isfinite(best["latency"]), "every case has a valid plan"
    lat = lower_bound(problem) if model == "op" else None
    lb = objective_lower_bound(problem, model, "latency", latency_bound=lat)
    assert lb["best"] <= best["latency"] * (1 + 1e-6), (lb, best)
    assert lb["bottleneck_s"] <= best["bottleneck"] * (1 + 1e-6), (lb["bottleneck"], best)
    for k in KS:
        tb = objective_lower_bound(problem, model, "throughput", k, latency_bound=lat)
        assert tb["best"] <= best[k] * (1 + 1e-6), (k, tb, best)
        assert tb["best"] == pytest.approx(time_per_sample(tb["latency_s"], tb["bottleneck_s"], k))
    # the bounds are not vacuous: the work spread over the devices, at least
    assert lb["bottleneck_s"] >= problem.min_cost().sum() / problem.num_devices * (1 - 1e-9)


def test_time_per_sample_combines_fill_and_bottleneck():
    assert time_per_sample(10.0, 2.0, 1) == 10.0  # one microbatch: its latency
    assert time_per_sample(10.0, 2.0, 5) == pytest.approx((10.0 + 4 * 2.0) / 5)
    assert time_per_sample(10.0, 2.0, None) == 2.0  # steady state: the bottleneck
    assert time_per_sample(10.0, 2.0, 10**6) == pytest.approx(2.0, rel=1e-5)


def test_op_model_loads_are_busy_time_and_link_time():
    p = random_problem(3, tight=False)
    plan = solve(p, "heft")
    sim = simulate(p, plan)
    busy, links = op_loads(p, sim)
    assert busy == pytest.approx(sim.busy)
    assert links.sum() == pytest.approx(float((sim.transfers[:, 4] - sim.transfers[:, 3]).sum()))
    ev = evaluate(p, plan, "op", "throughput", 4)
    assert ev.bottleneck_s == pytest.approx(max(busy.max(), links.max()))
    assert ev.latency_s == pytest.approx(sim.makespan)
    assert ev.objective_value == pytest.approx((sim.makespan + 3 * ev.bottleneck_s) / 4)


def test_op_model_reports_memory_instead_of_raising():
    p = random_problem(1)  # each device holds 0.7 of the weights
    plan = Plan.from_assignment(np.zeros(p.num_nodes, dtype=int), np.arange(p.num_nodes), p.num_devices)
    ev = evaluate(p, plan, "op", "latency")  # all of them on one device: too much
    assert not ev.valid and ev.violations[0]["kind"] == "memory" and ev.violations[0]["device"] == 0


@pytest.mark.parametrize("objective, k", [("throughput", None), ("throughput", 4), ("latency", None)])
def test_ilp_optimises_the_objective_it_is_given(objective, k):
    p = random_problem(2, n=6, tight=False)
    plan = solve(p, "ilp", objective=objective, microbatches=k, time_limit_s=20, deterministic=True)
    assert plan.info["objective"] == objective and plan.info["model"] == "op"
    value = evaluate(p, plan, "op", objective, k).objective_value
    for h in ("heft", "m-etf", "single"):
        assert value <= evaluate(p, solve(p, h), "op", objective, k).objective_value * (1 + 1e-9), h
    assert value >= objective_lower_bound(p, "op", objective, k)["best"] * (1 - 1e-9)


def test_bad_choices_name_the_fix():
    p = random_problem(0)
    plan = solve(p, "heft")
    with pytest.raises(PestoError, match="unknown execution model 'block'; use op or stage"):
        evaluate(p, plan, "block", "latency")
    with pytest.raises(PestoError, match="unknown objective"):
        evaluate(p, plan, "op", "speed")
    with pytest.raises(PestoError, match="whole number"):
        evaluate(p, plan, "op", "throughput", -2)
