"""A build budget: build seconds estimated per candidate, and plans kept within ``max_build_s``."""
import json

import numpy as np
import pytest

import tvm_pesto
from tvm_pesto.api import build_placement, cost_candidates, place_from_costs
from tvm_pesto.backends import get_backend
from tvm_pesto.candidates import Candidate
from tvm_pesto.candidates.examples import tiny_mlp
from tvm_pesto.candidates.flow import make_candidates
from tvm_pesto.candidates.generate import candidate_function
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.cluster.host import cpu_identity
from tvm_pesto.costs.measure import build_time
from tvm_pesto.errors import PestoError
from tvm_pesto.graph import OpGraph, OpNode
from tvm_pesto.plan import JointProblem
from tvm_pesto.solve.build_budget import MAX_SOLVES, plan_build_s, solve_within
from tvm_pesto.solve.joint.solver import solve_joint


def _two_library_calls():
    """a -> b -> c -> d: tvm per op (2 s each), or torch for (a, b) and for (c, d) (3 s each)."""
    g = OpGraph([OpNode(c, "relax.add") for c in "abcd"], [(0, 1, 4), (1, 2, 4), (2, 3, 4)])
    cands = [Candidate("tvm", (i,)) for i in range(4)] + [Candidate("torch", (0, 1)), Candidate("torch", (2, 3))]
    costs = np.array([[2.0]] * 4 + [[3.0], [3.0]])
    jp = JointProblem(g, parse_cluster("cpu:1"), cands, costs)
    build_s = np.array([[0.0]] * 4 + [[0.6], [0.6]])

    def once(table):
        p = JointProblem(jp.graph, jp.cluster, jp.candidates, table)
        return (p, *solve_joint(p, solver="heft"))

    return jp, build_s, once


def test_a_budget_for_one_library_call_keeps_the_better_one_only():
    jp, build_s, once = _two_library_calls()
    _, free, _ = once(jp.costs)
    assert free.backend_mix() == {"torch": 4}  # both calls: 6 s, building 1.2 s
    _, plan, placed = solve_within(jp, build_s, 1.0, once)
    b = plan.info["build_budget"]
    assert plan.backend_mix() == {"torch": 2, "tvm": 2}  # one call fits the budget: 7 s
    assert b["build_s"] == pytest.approx(0.6) == plan_build_s(jp, plan, build_s)
    assert b["unbudgeted_build_s"] == pytest.approx(1.2) and b["price"] > 0 and 2 <= b["solves"] <= MAX_SOLVES
    assert tvm_pesto.simulate(placed, plan).makespan == pytest.approx(7.0)  # on the real costs, not the priced


def test_no_budget_needed_solves_once_and_a_budget_of_nothing_runs_tvm_alone():
    jp, build_s, once = _two_library_calls()
    _, plan, _ = solve_within(jp, build_s, 2.0, once)
    assert plan.backend_mix() == {"torch": 4} and plan.info["build_budget"]["solves"] == 1
    _, plan, _ = solve_within(jp, build_s, 0.0, once)
    assert plan.backend_mix() == {"tvm": 4} and plan.info["build_budget"]["build_s"] == 0.0


def test_no_plan_within_the_budget_says_so():
    jp, build_s, once = _two_library_calls()
    jp2 = JointProblem(jp.graph, jp.cluster, jp.candidates, np.where(build_s > 0, jp.costs, np.inf))  # torch only
    with pytest.raises(PestoError, match="max_build_s=0.5"):
        solve_within(jp2, build_s, 0.5, once)
    with pytest.raises(PestoError, match="not a number of seconds"):
        solve_within(jp, build_s, -1.0, once)


def test_estimates_come_from_this_machines_builds_then_the_guess(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_PESTO_CACHE", str(tmp_path))
    get_backend("torch").release()  # a unit this process built already would cost nothing
    cluster = parse_cluster("cpu:1")
    cs = make_candidates(tvm_pesto.analyze(tiny_mlp()[0]), cluster, ["tvm", "torch"])
    est = build_time.estimate(cs, cluster)
    torch_rows = [i for i, c in enumerate(cs) if c.backend == "torch"]
    assert torch_rows and all(est[i, 0] == 0 for i, c in enumerate(cs) if c.backend == "tvm")
    a, b = get_backend("torch").build_s_guess
    assert est[torch_rows[0], 0] == pytest.approx(a + b * len(cs[torch_rows[0]].nodes))
    log = tmp_path / "builds.jsonl"
    cpu = cpu_identity()["kind"]
    with open(log, "w") as f:
        for ops, s in [(1, 0.5), (2, 0.7), (4, 1.1)]:
            f.write(json.dumps({"backend": "torch", "ops": ops, "build_s": s, "cpu": cpu}) + "\n")
        f.write(json.dumps({"backend": "torch", "ops": 1, "build_s": 99.0, "cpu": "Other/1/1"}) + "\n")
    est = build_time.estimate(cs, cluster)
    i = torch_rows[0]
    assert est[i, 0] == pytest.approx(0.3 + 0.2 * len(cs[i].nodes))  # the line through this CPU's builds


def test_a_unit_built_in_this_process_costs_nothing_to_build(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_PESTO_CACHE", str(tmp_path))
    get_backend("torch").release()
    cluster = parse_cluster("cpu:1")
    cs = make_candidates(tvm_pesto.analyze(tiny_mlp()[0]), cluster, ["tvm", "torch"])
    i = next(i for i, c in enumerate(cs) if c.backend == "torch")
    bk = get_backend("torch")
    gname = bk.build(candidate_function(cs.rg, cs[i].nodes).func, cluster.devices[0])
    try:
        assert build_time.estimate(cs, cluster)[i, 0] == 0.0
    finally:
        bk.release()
    assert gname and build_time.estimate(cs, cluster)[i, 0] > 0


def test_building_a_plan_records_its_library_builds(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_PESTO_CACHE", str(tmp_path))
    mod, _ = tiny_mlp()
    costed = cost_candidates(mod, "cpu:1", backends=["tvm", "onnxruntime"], costs="roofline")
    tvm_rows = [i for i, c in enumerate(costed.candidates) if c.backend == "tvm"]
    costed.costs.table[tvm_rows] = np.inf  # every op in ONNX Runtime
    pl = place_from_costs(costed, "heft")
    placed = build_placement(pl, costed.cluster)
    recs = [json.loads(line) for line in open(tmp_path / "builds.jsonl")]
    assert pl.backend_mix == {"onnxruntime": pl.analysis.op_graph.num_nodes}
    assert len(recs) == pl.problem.num_nodes == len(placed.units)
    assert all(r["backend"] == "onnxruntime" and r["build_s"] > 0 and r["ops"] >= 1 for r in recs)


def test_the_build_log_is_compacted_to_what_a_fit_reads(tmp_path, monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(build_time, "MAX_RECORDS", 3)
    monkeypatch.setattr(build_time, "COMPACT_BYTES", 600)
    log = tmp_path / "builds.jsonl"
    for k in range(30):
        unit = SimpleNamespace(name=f"u{k}", backend=("torch", "openvino")[k % 2], build_s=0.1 + k, device=None)
        build_time.record(unit, ops=1 + k % 4, path=log)
        assert log.stat().st_size <= 600 + 200  # compacted on the append that crossed the limit
    recs = [json.loads(line) for line in open(log)]
    by = {b: [r["build_s"] for r in recs if r["backend"] == b] for b in ("torch", "openvino")}
    assert all(len(v) <= 3 for v in by.values())
    assert by["torch"][-1] == pytest.approx(28.1) and by["openvino"][-1] == pytest.approx(29.1)  # the newest kept
    assert build_time.fitted(log)["torch"][1] > 0


def test_place_keeps_the_plan_within_the_budget_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_PESTO_CACHE", str(tmp_path))
    mod, _ = tiny_mlp()
    pl = tvm_pesto.place(mod, "cpu:2", backends=["tvm", "torch"], costs="roofline", max_build_s=0.0)
    assert pl.backend_mix == {"tvm": pl.analysis.op_graph.num_nodes}
    b = pl.summary()["build_budget"]
    assert b["max_build_s"] == 0.0 and b["build_s"] == 0.0 and pl.build_s is not None
    assert pl.build_s.shape == (len(pl.candidates), 2)
