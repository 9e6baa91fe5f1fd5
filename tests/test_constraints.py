"""The user's constraints (issue 55, part 1): ``--pin``, ``--forbid`` and ``--device-memory``
parsed, matched against a model's nodes, refused with a reason when no plan can honour them,
and honoured by every solver family and by the final choice's options."""
from __future__ import annotations

import warnings
from types import SimpleNamespace as NS

import numpy as np
import pytest

import tvm_pesto
from tvm_pesto.candidates import Candidate, CandidateSet
from tvm_pesto.candidates.examples import tiny_cnn
from tvm_pesto.choose.decision import Decision, OptionResult
from tvm_pesto.choose.claim import certify
from tvm_pesto.choose.options import make_options
from tvm_pesto.cluster import as_cluster
from tvm_pesto.constraints import (Constraints, Forbid, MemoryCap, Pin, as_constraints, check_names, matching_nodes,
                                   parse_size, resolve)
from tvm_pesto.errors import ConstraintError, InfeasibleError
from tvm_pesto.graph import OpGraph, OpNode
from tvm_pesto.placing import cost_candidates, honouring_candidates, place

warnings.filterwarnings("ignore", category=RuntimeWarning)


@pytest.fixture(scope="module")
def analysis():
    return tvm_pesto.analyze(tiny_cnn()[0])


def _place(analysis, constraints, **kw):
    kw = {"costs": "roofline", "deterministic": True, "time_limit_s": 5.0, **kw}
    return place(analysis, "cpu:2", constraints=constraints, **kw)


def _where(pl) -> dict[int, tuple[str, str]]:
    return {r.node: (r.backend, r.device) for r in pl.node_table()}


# -- parsing -----------------------------------------------------------------------------------
def test_the_parser_reads_every_spelling():
    c = Constraints.parse(pin=["relax.nn.conv2d=tvm", "lv1*=onnxruntime@cpu1", "a=b=torch", "block*=*@1"],
                          forbid=["*matmul=torch"], device_memory=["cpu0=2GB", "1=512MiB", "cpu1=4096"])
    assert c.pins == (Pin("relax.nn.conv2d", "tvm"), Pin("lv1*", "onnxruntime", "cpu1"), Pin("a=b", "torch"),
                      Pin("block*", "*", "1"))
    assert c.forbids == (Forbid("*matmul", "torch"),)
    assert [(m.device, m.bytes) for m in c.memory] == [("cpu0", 2 * 10**9), ("1", 512 * 2**20), ("cpu1", 4096)]
    assert c.on_devices and not Constraints.parse(pin=["x=tvm"]).on_devices
    assert c.to_dict()["pin"][1] == "lv1*=onnxruntime@cpu1"
    assert parse_size("1.5GiB") == int(1.5 * 2**30) and parse_size("3 kb") == 3000


@pytest.mark.parametrize("kind, text, says", [
    ("pin", "conv2d", "PATTERN=BACKEND"), ("pin", "=tvm", "PATTERN=BACKEND"), ("pin", "conv2d=tvm@", "no device"),
    ("forbid", "conv2d=*", "one backend by name"), ("forbid", "conv2d=tvm@cpu0", "one backend by name"),
    ("device_memory", "cpu0=lots", "not a positive number"), ("device_memory", "cpu0=0GB", "not a positive"),
    ("device_memory", "cpu0=2XB", "units"),
])
def test_the_parser_refuses_a_bad_spelling_naming_it(kind, text, says):
    with pytest.raises(ConstraintError, match=says):
        Constraints.parse(**{kind: [text]})


def test_as_constraints_takes_a_record_a_dict_or_a_list():
    pins = (Pin("conv2d", "tvm"),)
    assert as_constraints(Constraints(pins)) == as_constraints({"pin": "conv2d=tvm"}) == as_constraints(list(pins))
    assert as_constraints(None) is None and as_constraints({"pin": []}) is None
    with pytest.raises(ConstraintError, match="keys"):
        as_constraints({"pins": ["conv2d=tvm"]})
    with pytest.raises(ConstraintError, match="not a Pin"):
        as_constraints(["conv2d=tvm"])
    assert as_constraints([MemoryCap("cpu0", 10)]).memory[0].bytes == 10


# -- matching ----------------------------------------------------------------------------------
def test_patterns_match_op_names_short_names_bindings_and_node_names(analysis):
    g = analysis.op_graph
    convs = [v for v, nd in enumerate(g.nodes) if nd.op == "relax.nn.conv2d"]
    assert len(convs) >= 2
    assert matching_nodes("relax.nn.conv2d", g) == matching_nodes("nn.conv2d", g) == matching_nodes("conv2d", g) == convs
    assert matching_nodes("*conv*", g) == convs
    first = g.nodes[convs[0]]
    assert matching_nodes(first.extra["var"], g) == [convs[0]]     # the binding's variable, exactly
    assert matching_nodes(first.name, g) == [convs[0]]             # lv:conv2d
    assert matching_nodes("Conv2d", g) == []                       # case-sensitive


# -- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("constraints, says", [
    ({"pin": "*=nosuch"}, r"--pin \*=nosuch: unknown backend 'nosuch'"),
    ({"forbid": "conv2d=nosuch"}, r"--forbid conv2d=nosuch: unknown backend"),
    ({"pin": "conv2d=tvm@cpu7"}, r"--pin conv2d=tvm@cpu7: cpu:2 has no device 'cpu7'"),
    ({"device_memory": "gpu0=1GB"}, r"--device-memory gpu0=1GB: cpu:2 has no device"),
])
def test_unknown_backends_and_devices_are_refused_before_the_model_is_read(constraints, says):
    with pytest.raises(ConstraintError, match=says):
        check_names(as_constraints(constraints), as_cluster("cpu:2"))


@pytest.mark.parametrize("constraints, says", [
    ({"pin": "*softmax2d*=tvm"}, r"--pin \*softmax2d\*=tvm: the pattern .* matches no node"),
    ({"forbid": "lv999=torch"}, r"--forbid lv999=torch: the pattern .* matches no node"),
    ({"pin": ["conv2d=torch", "*=tvm"]}, r"--pin \*=tvm and --pin conv2d=torch both match node .* disagree"),
    ({"pin": ["conv2d=tvm@cpu0", "*=*@cpu1"]}, r"both match node .* disagree"),
    ({"pin": "conv2d=tvm", "forbid": "*=tvm"}, r"--forbid \*=tvm and --pin conv2d=tvm both match node"),
    ({"pin": "conv2d=tvm@cpu1", "device_memory": "cpu1=1KB"}, r"--device-memory cpu1=1KB: the nodes pinned to "
                                                              r"cpu1 \(--pin conv2d=tvm@cpu1\) hold .* over the cap"),
])
def test_constraints_no_plan_can_honour_are_refused_naming_them(analysis, constraints, says):
    with pytest.raises(ConstraintError, match=says):
        _place(analysis, constraints)


def test_a_pin_to_a_backend_that_lacks_the_op_is_refused_with_the_reason(analysis):
    with pytest.raises(ConstraintError, match=r"--pin conv2d=cublas: node lv\d*:conv2d \(relax.nn.conv2d\) cannot run "
                                              r"in cublas: cublas is unavailable"):
        _place(analysis, {"pin": "conv2d=cublas"})
    # a backend left out of --backends has no candidate here: the pin says so and lists those that have
    with pytest.raises(ConstraintError, match=r"cannot run in onnxruntime: onnxruntime has no candidate for it; "
                                              r"backends that can run it here: torch, tvm"):
        _place(analysis, {"pin": "relax.nn.relu=onnxruntime"}, backends="tvm,torch")
    with pytest.raises(ConstraintError, match=r"--forbid \*=tvm, --forbid \*=torch: node .* is left with no backend"):
        _place(analysis, {"forbid": ["*=tvm", "*=torch"]}, backends="tvm,torch")


def test_device_pins_that_split_a_fixed_unit_are_refused(analysis):
    # backends="tvm": the fusion groups alone; conv2d and its fused relu cannot sit on two devices
    g = analysis.op_graph
    cs = tvm_pesto.make_candidates(analysis, "cpu:2", "tvm")
    unit = next(c for c in cs if len(c.nodes) > 1)
    a, b = (g.nodes[v].name for v in unit.nodes[:2])
    with pytest.raises(ConstraintError, match=rf"^--pin ({a}=\*@cpu0|{b}=\*@cpu1): node ({a}|{b}) .* no candidate "
                                              "without a node pinned to another device"):
        _place(analysis, {"pin": [f"{a}=*@cpu0", f"{b}=*@cpu1"]}, backends="tvm")


def test_pins_that_force_a_cycle_between_pinned_regions_are_refused():
    # a -> b, a -> d, c -> b, c -> d: the regions {a, d} and {c, b} are each convex, but a cover by
    # both is cyclic ({a, d} feeds b, {c, b} feeds d); pinning every node to onnxruntime leaves only them
    g = OpGraph([OpNode(n, "relax.add", extra={"var": n}) for n in "abcd"],
                [(0, 1, 4), (0, 3, 4), (2, 1, 4), (2, 3, 4)])
    cands = [Candidate("onnxruntime", (0, 3)), Candidate("onnxruntime", (1, 2))] + \
            [Candidate("tvm", (v,)) for v in range(4)]
    cs = CandidateSet(None, cands)
    free = resolve(Constraints(), g, as_cluster("cpu:2"))
    assert len(honouring_candidates(free, g, cs)) == 6
    nc = resolve(Constraints.parse(pin=["*=onnxruntime"]), g, as_cluster("cpu:2"))
    with pytest.raises(ConstraintError, match=r"--pin \*=onnxruntime: no plan honours these.*acyclic cover"):
        honouring_candidates(nc, g, cs)


def test_device_pins_no_solver_of_one_device_can_honour_are_refused(analysis):
    with pytest.raises(ConstraintError, match=r"--pin conv2d=tvm@cpu0, --pin relu=tvm@cpu1: no plan honours these"):
        _place(analysis, {"pin": ["conv2d=tvm@cpu0", "relu=tvm@cpu1"]}, solver="single")


# -- every solver honours them -------------------------------------------------------------------
@pytest.mark.parametrize("solver", ["heft", "m-etf", "m-topo", "m-sct", "ilp", "auto"])
def test_every_solver_honours_pins_and_forbids_with_backend_choice(analysis, solver):
    g = analysis.op_graph
    free = _where(_place(analysis, None, solver=solver))
    assert {b for b, _ in free.values()} != {"tvm"}  # unconstrained, a library runs some ops: the pin changes it
    pl = _place(analysis, {"pin": ["conv2d=tvm@cpu1", "relax.add=onnxruntime"], "forbid": ["*pool2d=onnxruntime"]},
                solver=solver)
    where = _where(pl)
    for v, nd in enumerate(g.nodes):
        if nd.op == "relax.nn.conv2d":
            assert where[v] == ("tvm", "cpu1"), (v, where[v])
        if nd.op == "relax.add":
            assert where[v][0] == "onnxruntime"
        if nd.op.endswith("pool2d"):
            assert where[v][0] != "onnxruntime"
    assert pl.claim()["holds_under"] == ["--pin conv2d=tvm@cpu1", "--pin relax.add=onnxruntime",
                                         "--forbid *pool2d=onnxruntime"]
    rows = {r.node: r for r in pl.node_table()}
    assert rows[[v for v, nd in enumerate(g.nodes) if nd.op == "relax.nn.conv2d"][0]].pinned.endswith("conv2d=tvm@cpu1")


@pytest.mark.parametrize("solver", ["heft", "m-etf", "m-topo", "m-sct", "ilp", "auto"])
def test_every_placement_solver_honours_device_pins_on_fixed_units(analysis, solver):
    # backends="tvm": one cover (the fusion groups), so "ilp" is the placement ILP
    pl = _place(analysis, {"pin": ["relax.nn.relu=*@cpu1", "softmax=*@cpu0"]}, backends="tvm", solver=solver)
    g = analysis.op_graph
    for r in pl.node_table():
        if g.nodes[r.node].op == "relax.nn.relu":
            assert r.device == "cpu1"
        if g.nodes[r.node].op == "relax.nn.softmax":
            assert r.device == "cpu0"


def test_a_memory_cap_becomes_the_devices_memory_and_the_plan_keeps_it(analysis):
    costed = cost_candidates(analysis, "cpu:2", costs="roofline", constraints={"device_memory": "cpu1=1B"})
    assert costed.cluster.devices[1].memory_bytes == 1.0
    assert costed.cluster.devices[0].memory_bytes == as_cluster("cpu:2").devices[0].memory_bytes
    pl = _place(analysis, {"device_memory": "cpu1=1B"}, solver="heft")
    assert {r.device for r in pl.node_table()} == {"cpu0"}
    assert pl.problem.cluster.devices[1].memory_bytes == 1.0
    with pytest.raises(InfeasibleError):  # no device holds the model: refused, naming the caps
        _place(analysis, {"device_memory": ["cpu0=1B", "cpu1=1B"]}, solver="heft")


def test_a_given_cost_table_of_every_candidate_made_is_cut_to_the_kept_rows(analysis):
    full = cost_candidates(analysis, "cpu:2", costs="roofline")
    cons = {"pin": "conv2d=tvm"}
    kept = cost_candidates(analysis, "cpu:2", costs=full.costs, constraints=cons)
    again = cost_candidates(analysis, "cpu:2", costs=kept.costs, constraints=cons)  # a table of the kept rows
    assert len(kept.candidates) < len(full.candidates)
    assert kept.costs.table.shape == again.costs.table.shape == (len(kept.candidates), 2)


# -- the final choice offers nothing that breaks them --------------------------------------------
def test_the_final_choice_offers_no_option_that_breaks_a_pin(analysis):
    cons = {"pin": "conv2d=tvm"}
    pl, one = _place(analysis, cons), place(analysis, "cpu:1", costs="roofline", deterministic=True, constraints=cons)
    free = make_options(_place(analysis, None), as_cluster("cpu:2"),
                        place(analysis, "cpu:1", costs="roofline", deterministic=True))
    assert any(o.name.startswith("library:onnxruntime") for o in free)  # what the pin takes away
    opts = make_options(pl, as_cluster("cpu:2"), one)
    assert [o.name for o in opts][:2] == ["plan", "one-device"] and len(opts) > 2
    g = analysis.op_graph
    for o in opts:
        for u in o.placement.plan.units:
            assert all(u.backend == "tvm" for v in u.nodes if g.nodes[v].op == "relax.nn.conv2d"), o.name
    assert not any(o.name.startswith("library:onnxruntime") and "+tvm" not in o.name for o in opts)


def test_a_device_constraint_leaves_the_other_core_shape_out(analysis):
    pl = _place(analysis, {"pin": "relu=*@cpu1"})
    opts = make_options(pl, as_cluster("cpu:2"), None, wide=False)
    assert "one-device" not in [o.name for o in opts]
    for o in opts:  # the whole-model library options on cpu0 cannot hold the pin: none is offered
        assert o.name == "plan" or o.cluster.num_devices == 2
        for u, d in zip(o.placement.plan.units, o.placement.plan.assignment):
            if any(analysis.op_graph.nodes[v].op == "relax.nn.relu" for v in u.nodes):
                assert int(d) == 1, o.name
    with pytest.raises(tvm_pesto.PestoError, match="one_device"):
        make_options(pl, as_cluster("cpu:2"), None)


def test_the_claim_names_the_constraints_it_holds_under():
    cpu1 = NS(name="cpu:1")
    flow = NS(plan=NS(info={"bound_s": 1e-3}, solve_s=0.1), sim=NS(makespan=1e-3), holds_under=["--pin conv2d=tvm"])
    d = Decision(True, "plan", "cpu:1", [OptionResult("plan", "cpu:1", 1e-3, measured_s=1e-3)])
    claim = certify([NS(name="plan", cluster=cpu1, placement=flow)], d)
    assert claim.status == "optimal" and claim.holds_under == ["--pin conv2d=tvm"]
    assert claim.to_json()["holds_under"] == ["--pin conv2d=tvm"]
    flow.holds_under = []
    assert certify([NS(name="plan", cluster=cpu1, placement=flow)], d).holds_under == []


def test_an_unconstrained_placement_holds_under_nothing(analysis):
    pl = _place(analysis, None, solver="heft")
    assert pl.claim()["holds_under"] == [] and pl.constraints is None
    assert len(pl.node_table()) == analysis.op_graph.num_nodes
    assert np.isfinite(pl.costs.table).any()
