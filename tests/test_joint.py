"""The joint solve: backend + device + order together, on cases with a known answer, and a
search that ends within its budget on a transformer-sized graph."""
from __future__ import annotations

import numpy as np
import pytest

import tvm_pesto
from tvm_pesto.candidates import Candidate
from tvm_pesto.candidates.examples import transformer_stack
from tvm_pesto.cluster import Cluster, Device
from tvm_pesto.costs import candidate_costs
from tvm_pesto.graph import OpGraph, OpNode
from tvm_pesto.plan import JointProblem, simulate
from tvm_pesto.solve.joint.cover import best_cover, brute_force_cover, pieces
from tvm_pesto.solve.joint.solver import joint_lower_bound, solve_joint


def _devices(n):
    devs = [Device(f"d{i}", "cpu", {"kind": "llvm"}, 1e12, 1e12, 1e11, index=i) for i in range(n)]
    return Cluster(f"{n}dev", devs, np.full((n, n), 1e-6), np.full((n, n), 1e12))


def _two_branches():
    """source -> a1..a4 and b1..b4 -> sink. One candidate covers everything (7.5 s) and beats
    the ten single ops (1 s each) on one device; on two devices the branches run side by side."""
    names = ["src"] + [f"a{i}" for i in range(4)] + [f"b{i}" for i in range(4)] + ["sink"]
    g = OpGraph([OpNode(n, "relax.add") for n in names],
                [(0, 1, 8), (1, 2, 8), (2, 3, 8), (3, 4, 8), (0, 5, 8), (5, 6, 8), (6, 7, 8), (7, 8, 8),
                 (4, 9, 8), (8, 9, 8)])
    cands = [Candidate("tvm", (v,), "single") for v in range(10)] + [Candidate("big", tuple(range(10)), "region")]
    return g, cands, np.array([1.0] * 10 + [7.5])


def test_the_cover_is_the_cheapest_on_one_device():
    g, cands, cost = _two_branches()
    res = best_cover(g, [c.nodes for c in cands], cost)
    assert res.chosen == [10] and res.cost == pytest.approx(7.5) and res.info["exact"]
    bf = brute_force_cover(g, [c.nodes for c in cands], cost)
    assert bf.cost == pytest.approx(res.cost)


def test_the_joint_solve_splits_a_call_that_blocks_parallelism():
    g, cands, cost = _two_branches()
    jp = JointProblem(g, _devices(2), cands, np.stack([cost, cost], axis=1))
    plan, placed = solve_joint(jp, solver="heft", search_s=5.0)
    span = simulate(placed, plan).makespan
    assert span < 7.0 and len(plan.devices_used()) == 2, (span, plan.backend_mix())
    assert plan.info["covers_tried"] >= 2  # the cheapest cover (one 7.5 s call) and covers by smaller calls
    assert span >= joint_lower_bound(jp)["best"] * (1 - 1e-9)
    # the units cover every op exactly once
    assert sorted(v for u in plan.units for v in u.nodes) == list(range(10))


def test_the_joint_local_search_splits_and_spreads_a_large_call():
    """From the one-call cover on one device, the split move (HEFT re-placement) finds the
    two-device plan."""
    from tvm_pesto.solve.heuristics.heft import solve as heft
    from tvm_pesto.solve.joint.search import improve

    g, cands, cost = _two_branches()
    jp = JointProblem(g, _devices(2), cands, np.stack([cost, cost], axis=1))
    placed = jp.contract([10])
    plan, placed, cover, span, info = improve(jp, heft(placed), placed, [10], budget_s=5.0)
    assert simulate(placed, plan).makespan == pytest.approx(span) and span < 7.0
    assert info["accepted"]["split"] >= 1 and 10 not in cover


def test_the_joint_search_merges_when_one_device_is_all_there_is():
    g, cands, cost = _two_branches()
    cost = cost.copy()
    cost[10] = 20.0  # now the big call is worse than the singles: the cover keeps singles
    jp = JointProblem(g, _devices(1), cands, cost[:, None])
    plan, placed = solve_joint(jp, solver="heft", search_s=1.0)
    assert simulate(placed, plan).makespan == pytest.approx(10.0)
    assert plan.backend_mix() == {"tvm": 10}


def test_a_cover_contracts_to_the_same_graph_with_each_candidates_node_made_once():
    g, cands, costs = _two_branches()
    cands = cands + [Candidate("tvm", (1, 2), "pair"), Candidate("tvm", (5, 6, 7, 8), "branch")]
    p = JointProblem(g, _devices(2), cands, np.concatenate([costs, [1.5, 3.0]])[:, None].repeat(2, axis=1))
    for cover in ([10], list(range(10)), [0, 11, 3, 4, 12, 9], [0, 1, 2, 3, 4, 12, 9]):
        got = p.contract(cover).graph
        want = g.contract([cands[c].nodes for c in cover])  # every merged node made afresh
        assert got.nodes == want.nodes and got.edges() == want.edges()  # every field of every node
    assert set(p._merged_nodes) == {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}  # one per candidate, reused


def test_pieces_split_where_no_candidate_spans():
    assert pieces(6, [[0], [1, 2], [3], [3, 4], [5]], range(5)) == [[0], [1, 2], [3, 4], [5]]


@pytest.mark.slow
@pytest.mark.parametrize("backends, solver", [("all", "auto"), ("tvm,torch", "heft")])
def test_the_search_on_a_2000_op_transformer_ends_within_its_budget(backends, solver):
    """2,001 ops, thousands of candidates (costs in hand: predicted). The cover search stays
    within its state budget, the joint local search within its time budget, and the plan
    covers every op once; ``auto``'s relaxed joint ILP proves a bound within its limit."""
    mod, _ = transformer_stack(69)
    an = tvm_pesto.analyze(mod)
    assert an.op_graph.num_nodes >= 2000
    cluster = tvm_pesto.parse_cluster("cpu:2")
    cs = tvm_pesto.make_candidates(an, cluster, backends)
    ct = candidate_costs(cs, cluster, "roofline")
    jp = JointProblem(an.op_graph, cluster, list(cs), ct.table)
    budget = 3.0
    plan, placed = solve_joint(jp, solver=solver, search_s=budget, time_limit_s=30)
    info = plan.info
    if solver == "auto":
        relax = info["decision"]["relaxation"]
        assert relax["seconds"] <= 30 + 10, relax
        assert info["bound_s"] is not None and info["bound_s"] <= info["makespan_s"] * (1 + 1e-6)
        assert info["status"] in ("optimal", "feasible") and info["mip_gap"] is not None
        assert set(info["heuristics"]) == {"heft", "m-etf", "m-topo", "m-sct"}
    assert sorted(v for u in plan.units for v in u.nodes) == list(range(an.op_graph.num_nodes))
    assert info["cover_states"] <= 200_000 * info.get("search", {}).get("rounds", 1) * 10
    search = info["search"]
    # the search checks its deadline between evaluations (it overruns by one evaluation): a guard
    # with room for a loaded machine
    assert search["evaluations"] > 0 and search["seconds"] <= budget + 10, search
    assert simulate(placed, plan).makespan == pytest.approx(info["makespan_s"])


def test_bench_search_reports_every_stage(tmp_path):
    import json

    from click.testing import CliRunner

    from tvm_pesto.cli.main import cli

    out = tmp_path / "s.json"
    res = CliRunner().invoke(cli, ["bench", "search", "mlp_mixer", "--size", "small", "--search-s", "0.5",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    m = json.loads(out.read_text())["models"]["mlp_mixer"]
    for key in ("candidates_s", "costs_s", "solve_s", "search_total_s", "cover", "backend_mix", "simulated_s"):
        assert key in m, key
    assert m["search_total_s"] >= m["solve_s"] > 0 and sum(m["backend_mix"].values()) == m["num_ops"]
