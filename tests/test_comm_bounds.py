"""Transfer- and memory-aware lower bounds: exact on small cases, never above the optimum."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_ilp import brute_force
from tvm_pesto.cluster import Cluster, Device
from tvm_pesto.graph.opgraph import OpGraph, OpNode
from tvm_pesto.plan import Problem, simulate
from tvm_pesto.solve import lower_bound, solve
from tvm_pesto.solve.bounds.comm import dominator_segments, path_memory_bound, segment_bound

warnings.filterwarnings("ignore", category=RuntimeWarning)


def make_problem(n, edges, costs, d=2, mem=None, memory=1e12, latency=1e-5, bandwidth=1e8, links=None):
    mem = [0] * n if mem is None else mem
    nodes = [OpNode(f"v{i}", "op", param_bytes=int(mem[i])) for i in range(n)]
    devs = [Device(f"g{i}", "gpu", {"kind": "cuda"}, memory, 1e12, 1e11, index=i) for i in range(d)]
    lat, bw = (np.full((d, d), latency), np.full((d, d), bandwidth)) if links is None else links
    costs = np.asarray(costs, dtype=float)
    if costs.ndim == 1:
        costs = np.repeat(costs[:, None], d, axis=1)
    return Problem(OpGraph(nodes, edges, name="t"), Cluster("test", devs, lat, bw), costs)


def residual_block(side_cost, nbytes):
    """x -> a -> b -> add, x -> side -> add (a ResNet block with a 1 ms main branch)."""
    edges = [(0, 1, nbytes), (1, 2, nbytes), (2, 4, nbytes), (0, 3, nbytes), (3, 4, nbytes)]
    return edges, [1e-4, 5e-4, 5e-4, side_cost, 1e-4]


def test_segments_split_at_nodes_every_path_crosses():
    edges, costs = residual_block(2e-4, 100)
    edges = edges + [(4, 5, 100), (5, 6, 100), (4, 6, 100)]
    p = make_problem(7, edges, costs + [1e-4, 1e-4])
    chain, segments = dominator_segments(p)
    assert chain == [0, 4, 6]
    assert segments == [[], [1, 2, 3], [5], []]


def test_two_inputs_and_two_outputs_have_no_dominator():
    p = make_problem(4, [(0, 2, 1), (1, 2, 1), (1, 3, 1)], [1e-3] * 4)
    chain, segments = dominator_segments(p)
    assert chain == [] and sorted(segments[0]) == [0, 1, 2, 3]


@pytest.mark.parametrize("nbytes,expect_serial", [(10**7, True), (1, False)])
def test_segment_bound_charges_the_shortcut(nbytes, expect_serial):
    # moving the 0.3 ms shortcut costs two transfers: 0.2 s each for 10 MB at 100 MB/s
    # (then running it in series, 1.3 ms + 0.2 ms ends, is optimal), ~10 us for 1 byte
    edges, costs = residual_block(3e-4, nbytes)
    p = make_problem(5, edges, costs)
    lb = lower_bound(p)
    best = brute_force(p)
    assert lb["critical_path_s"] == pytest.approx(1.2e-3)
    assert lb["segment_s"] <= best * (1 + 1e-9)
    if expect_serial:
        assert best == pytest.approx(1.5e-3)
        assert lb["best"] == pytest.approx(best, rel=1e-5)
    else:
        assert lb["segment_s"] == pytest.approx(best, rel=1e-5)
        assert best < 1.5e-3


def test_identical_blocks_are_solved_once():
    edges, costs = residual_block(3e-4, 10**7)
    n = 5
    all_edges, all_costs = list(edges), list(costs)
    for k in range(1, 4):  # three more blocks, each starting at the previous block's add
        off = 4 * k
        all_edges += [(u + off, v + off, b) for u, v, b in edges]
        all_costs += costs[1:]
        n += 4
    p = make_problem(n, all_edges, all_costs)
    seg = segment_bound(p)
    assert seg["segments"] == 4 and seg["solved"] == 1 and seg["capped"] == 0
    assert seg["bound_s"] == pytest.approx(4 * 1.4e-3 + 1e-4, rel=1e-5)


def test_large_segments_fall_back_to_their_critical_path():
    edges, costs = residual_block(3e-4, 10**7)
    p = make_problem(5, edges, costs)
    seg = segment_bound(p, max_segment_nodes=2)
    assert seg["capped"] == 1 and seg["bound_s"] == pytest.approx(1.2e-3)


def test_path_memory_bound_counts_the_forced_transfers():
    # a chain of 6 nodes of 100 kB each on devices of 250 kB: at least three runs (each
    # holds two nodes plus the 1 kB it received), so two transfers of 1 kB at 1e8 B/s
    n = 6
    p = make_problem(n, [(i, i + 1, 1000) for i in range(n - 1)], [1e-3] * n, d=3, mem=[10**5] * n,
                     memory=2.5e5)
    out = path_memory_bound(p)
    assert out["min_runs"] == 3
    assert out["bound_s"] == pytest.approx(6e-3 + 2 * (1e-5 + 1e-5), rel=1e-5)
    best = brute_force(p)
    assert out["bound_s"] <= best * (1 + 1e-9)
    assert lower_bound(p)["best"] == pytest.approx(best, rel=1e-5)


def test_path_memory_bound_is_zero_when_nothing_fits():
    p = make_problem(2, [(0, 1, 1)], [1e-3, 1e-3], mem=[100, 100], memory=50)
    assert path_memory_bound(p)["bound_s"] == 0.0


def random_blocks(seed, d, symmetric, tight):
    """A few random fork/join blocks in a row: nodes that every path crosses, and branches."""
    rng = np.random.default_rng(seed)
    edges, n, last = [], 1, 0
    while n < 6:
        width = int(rng.integers(1, 3))
        ends = []
        for _ in range(width):
            length = int(rng.integers(0, 2)) + 1
            prev = last
            for _ in range(length):
                if n >= 6:
                    break
                edges.append((prev, n, int(rng.integers(1, 4)) * 10**5))
                prev, n = n, n + 1
            ends.append(prev)
        join = n
        n += 1
        edges += [(e, join, int(rng.integers(1, 4)) * 10**5) for e in set(ends)]
        last = join
    costs = rng.uniform(1e-4, 1e-3, n if symmetric else (n, d))
    links = None
    if not symmetric:
        links = (1e-4 * (1 + rng.random((d, d))), 1e9 * (1 + rng.random((d, d))))
    mem = rng.integers(1, 4, n) * 10**6
    memory = mem.sum() * 0.6 + 4 * 10**5 if tight else 1e12
    return make_problem(n, edges, costs, d=d, mem=mem, memory=memory, latency=1e-4, bandwidth=1e9, links=links)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1), st.integers(2, 3), st.booleans(), st.booleans())
def test_bounds_never_exceed_the_brute_force_optimum(seed, d, symmetric, tight):
    p = random_blocks(seed, d, symmetric, tight)
    best = brute_force(p)
    if not np.isfinite(best):
        return  # no placement fits in memory; nothing to bound
    lb = lower_bound(p)
    assert lb["segment_s"] <= best * (1 + 1e-9), (lb, best)
    assert lb["path_memory_s"] <= best * (1 + 1e-9), (lb, best)
    assert lb["best"] >= lb["critical_path_s"]
    assert lb["best"] == max(v for k, v in lb.items() if k.endswith("_s") and v is not None)


def test_refined_plans_stay_above_the_bound():
    from tvm_pesto.solve.placement_ilp.refine import refine

    p = random_blocks(3, 3, True, False)
    plan = refine(p, solve(p, "single"), time_budget_s=5)
    assert simulate(p, plan).makespan >= lower_bound(p)["best"] * (1 - 1e-9)
