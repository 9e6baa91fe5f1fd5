"""Ceilings: how much a mix of backends (free boundaries) or a split (free communication)
could gain at most, on cases whose answer is known."""
from __future__ import annotations

import numpy as np
import pytest

import tvm_pesto
from tvm_pesto.candidates import Candidate
from tvm_pesto.candidates.examples import tiny_cnn
from tvm_pesto.cluster import Cluster, Device, parse_cluster
from tvm_pesto.cluster.dispatch import dispatch_info
from tvm_pesto.cluster.ideal import free_communication
from tvm_pesto.errors import InfeasibleError
from tvm_pesto.graph import OpGraph, OpNode
from tvm_pesto.plan import JointProblem, simulate
from tvm_pesto.solve.joint.ceiling import mix_ceiling, restrict_to
from tvm_pesto.solve.joint.solver import solve_joint


def _chain(n):
    return OpGraph([OpNode(f"op{i}", "relax.add") for i in range(n)], [(i, i + 1, 4) for i in range(n - 1)])


def _library_candidates(n, work: dict, call_s: float):
    """Per-op and whole-chain candidates of each library; ``work[b][i]``: op i's seconds in b."""
    cands, costs = [], []
    for b, w in work.items():
        for i in range(n):
            cands.append(Candidate(b, (i,)))
            costs.append(call_s + w[i])
        cands.append(Candidate(b, tuple(range(n))))
        costs.append(call_s + sum(w))
    return cands, np.array(costs)


def test_a_library_faster_everywhere_leaves_no_room_for_a_mix():
    # op 0 is a reshape (no work): each library's cheapest call is its fixed cost alone
    cands, costs = _library_candidates(4, {"a": [0.0, 1.0, 1.0, 1.0], "b": [0.0, 2.0, 2.0, 2.0]}, 0.1)
    c = mix_ceiling(_chain(4), cands, costs)
    assert c["best_single"] == "a" and c["mix_s"] == pytest.approx(3.1) and c["mix"] == pytest.approx(1.0)
    assert c["fixed_s"] == pytest.approx({"a": 0.1, "b": 0.1})
    assert c["free_boundaries_s"] == pytest.approx(3.1) and c["ceiling"] == pytest.approx(1.0)


def test_libraries_faster_on_different_ops_make_a_ceiling_above_the_mix():
    work = {"a": [1.0, 1.0, 5.0, 5.0], "b": [5.0, 5.0, 1.0, 1.0]}
    c = mix_ceiling(_chain(4), *_library_candidates(4, work, 3.0))
    # each alone: one call, 3 + 12 = 15; the mix needs four calls (4 + 4 + 4 + 4 = 16): it does not pay
    assert c["best_single_s"] == pytest.approx(15.0)
    assert c["mix_s"] == pytest.approx(15.0) and c["mix"] == pytest.approx(1.0)
    # the cheapest call (4.0, work included) taken off every call: a's two ops, b's two, one call back
    assert c["fixed_s"] == {"a": 4.0, "b": 4.0} and c["free_mix"] == {"a": 2, "b": 2}
    assert c["ceiling"] == pytest.approx(15.0 / 4.0, rel=1e-6)


def test_restrict_to_keeps_the_fallback_only_where_the_backend_has_no_candidate():
    cands = [Candidate("tvm", (0,)), Candidate("tvm", (1,)), Candidate("ort", (0,)), Candidate("ov", (1,))]
    costs = np.array([[1.0, 1.0], [2.0, 2.0], [0.5, np.inf], [0.2, 0.2]])
    out = restrict_to(cands, costs, "ort")
    assert np.isinf(out[0]).all() and out[1].tolist() == [2.0, 2.0] and out[2, 0] == 0.5 and np.isinf(out[3]).all()


def test_a_model_no_library_covers_has_no_mix_ceiling():
    cands = [Candidate("tvm", (0,)), Candidate("tvm", (1,))]
    with pytest.raises(InfeasibleError, match="no library backend covers"):
        mix_ceiling(_chain(2), cands, np.array([1.0, 1.0]))


def _two_branches():
    """source -> a1..a4 and b1..b4 -> sink, 1 s an op, edges of 8 bytes."""
    names = ["src"] + [f"a{i}" for i in range(4)] + [f"b{i}" for i in range(4)] + ["sink"]
    g = OpGraph([OpNode(n, "relax.add") for n in names],
                [(0, 1, 8), (1, 2, 8), (2, 3, 8), (3, 4, 8), (0, 5, 8), (5, 6, 8), (6, 7, 8), (7, 8, 8),
                 (4, 9, 8), (8, 9, 8)])
    return g, [Candidate("tvm", (v,), "single") for v in range(10)], np.ones((10, 2))


def test_free_communication_lets_a_split_pay_that_slow_links_forbid():
    devs = [Device(f"d{i}", "cpu", {"kind": "llvm"}, 1e12, 1e12, 1e11, index=i) for i in range(2)]
    slow = Cluster("2dev", devs, np.full((2, 2), 10.0), np.full((2, 2), 1e12))  # a hand-off costs 10 s
    g, cands, costs = _two_branches()
    spans = {}
    for name, cl in (("slow", slow), ("free", free_communication(slow))):
        plan, placed = solve_joint(JointProblem(g, cl, cands, costs), solver="ilp", time_limit_s=20, search_s=1.0)
        spans[name] = (simulate(placed, plan).makespan, plan.devices_used())
    assert spans["slow"][0] == pytest.approx(10.0) and len(spans["slow"][1]) == 1
    assert spans["free"][0] == pytest.approx(6.0) and len(spans["free"][1]) == 2
    assert slow.transfer_s(0, 1, 8) == pytest.approx(10.0)  # the original is untouched


def test_free_communication_keeps_a_runs_own_dispatch_and_drops_the_rest():
    c = parse_cluster("cpu:2")
    c.meta["contention"] = {"compute": 1.3, "memory": 1.6}
    free = free_communication(c)
    assert dispatch_info(free)["run_s"] == dispatch_info(c)["run_s"] > 0
    assert dispatch_info(free)["multi_device_s"] == dispatch_info(c)["run_s"] < dispatch_info(c)["multi_device_s"]
    assert free.meta["contention"] == {"compute": 1.0, "memory": 1.0} and c.meta["contention"]["memory"] == 1.6
    assert free.transfer_s(1, 0, 1 << 30) == 0.0 and c.transfer_s(1, 0, 1 << 30) > 0


def test_the_benchmark_ceilings_of_a_real_model():
    """:func:`tvm_pesto.bench.backends.ceilings` on a small CNN's candidates (roofline costs)."""
    from tvm_pesto.bench.backends import ceilings

    mod, _ = tiny_cnn()
    an = tvm_pesto.analyze(mod)
    c1, c2 = parse_cluster("cpu:1"), parse_cluster("cpu:2")
    costed1 = tvm_pesto.api.cost_candidates(an, c1, ["tvm", "onnxruntime", "torch"], costs="roofline")
    costed2 = tvm_pesto.api.cost_candidates(an, c2, ["tvm", "onnxruntime", "torch"], costs="roofline")
    predicted = {"single:onnxruntime": 2e-3, "single:torch": 1e-3, "collage_dp": 5e-4}
    c = ceilings(costed1, costed2, predicted, {"onnxruntime": 1e-6}, time_limit_s=10, search_s=0.5)
    assert c["mix_free_boundaries"] >= c["mix"] * (1 - 1e-9) > 0
    assert c["fixed_s"]["onnxruntime"] <= 1e-6  # the measured call cost, or a cheaper candidate
    # the bound holds for the free plan, and the ceiling is at least the cover's own speedup
    assert 0 < c["joint_free_bound_s"] <= c["joint_free_plan_s"] * (1 + 1e-9)
    assert c["joint_free_communication"] >= 1e-3 / 5e-4 * (1 - 1e-9)
    assert set(c["free_mix"]) <= {"tvm", "onnxruntime", "torch"}
    assert sum(c["free_mix"].values()) == an.op_graph.num_nodes
    assert c["joint_free_status"] and c["joint_free_devices"]


@pytest.mark.slow
def test_the_call_costs_of_the_backends_are_measured_on_a_one_op_model(tmp_path):
    from tvm_pesto.bench.backends import call_costs
    from tvm_pesto.costs.store.cache import MeasureCache

    got = call_costs(parse_cluster("cpu:1"), ["tvm", "onnxruntime"], MeasureCache(tmp_path / "m.jsonl"))
    assert set(got) == {"tvm", "onnxruntime"} and all(0 < v < 10 for v in got.values())  # seconds
    assert got["onnxruntime"] > got["tvm"]  # a library call costs more than an add inside TVM's segment


def test_a_library_alone_is_its_whole_model_call_even_where_a_split_is_predicted_cheaper():
    """A cover of two calls of one library predicted under its one call (1.0 + 1.0 < 2.5) is
    not that library alone: its users run the one call, which is what a mix must beat."""
    cands = [Candidate("a", (0,)), Candidate("a", (1,)), Candidate("a", (0, 1)),
             Candidate("b", (0,)), Candidate("b", (1,)), Candidate("b", (0, 1))]
    c = mix_ceiling(_chain(2), cands, np.array([1.0, 1.0, 2.5, 3.0, 3.0, 4.0]))
    assert c["single_s"] == {"a": 2.5, "b": 4.0} and c["best_single"] == "a"
    assert c["mix_s"] == pytest.approx(2.0) and c["mix"] == pytest.approx(1.25)
    # a backend with no whole-model candidate keeps its cheapest cover (the fallback for what it lacks)
    from tvm_pesto.solve.joint.ceiling import alone
    t = alone(cands[:2] + [Candidate("tvm", (0,)), Candidate("tvm", (1,))], np.array([1.0, 1.0, 5.0, 5.0]), "a", 2)
    assert t.tolist() == [1.0, 1.0, np.inf, np.inf]


def test_the_call_added_back_is_the_cheapest_of_any_library():
    """One call is added back to the free cover: the smallest fixed cost of any library, not of
    the libraries that cover uses, else a cover by the cheap-call library could beat the figure."""
    cands = [Candidate("a", (0,)), Candidate("a", (1,)), Candidate("a", (0, 1)),
             Candidate("b", (0,)), Candidate("b", (1,)), Candidate("b", (0, 1))]
    c = mix_ceiling(_chain(2), cands, np.array([11.0, 11.0, 21.0, 6.0, 6.0, 7.0]), fixed_s={"a": 1.0, "b": 5.0})
    assert c["fixed_s"] == {"a": 1.0, "b": 5.0} and c["best_single_s"] == pytest.approx(7.0)
    assert c["free_boundaries_s"] == pytest.approx(2.0 + 1.0) and c["ceiling"] == pytest.approx(7.0 / 3.0)
