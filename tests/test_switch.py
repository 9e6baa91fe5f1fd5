"""What a switch between libraries on a device costs (tvm_pesto.costs.calibrate.switch,
tvm_pesto.cluster.dispatch.set_switch / switch_figures): fitted on first use beside the
executor's dispatch figures and kept in the same record per device size, assumed where no fit
applies, and charged by the simulator once per change of backend between consecutive units of
a device (tvm_pesto.plan.simulate.switch_charges)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tvm_pesto.candidates import Candidate
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.cluster.dispatch import ASSUMED_SWITCH_S, set_switch, switch_figures
from tvm_pesto.costs.calibrate import dispatch as rd
from tvm_pesto.costs.calibrate import switch as sw
from tvm_pesto.costs.calibrate.machine import MACHINE_ENV
from tvm_pesto.errors import ClusterError
from tvm_pesto.graph.opgraph import OpGraph, OpNode
from tvm_pesto.plan import Plan, Problem, simulate


def _chain(n: int) -> Problem:
    """``n`` units in a chain, 1 ms each on either device, a 4 KiB tensor between neighbours."""
    nodes = [OpNode(f"u{k}", "relax.add", bytes_read=4096, bytes_written=4096) for k in range(n)]
    graph = OpGraph(nodes, [(k, k + 1, 4096) for k in range(n - 1)])
    return Problem(graph, parse_cluster("cpu:2"), np.full((n, 2), 1e-3))


def _plan(backends, assignment) -> Plan:
    assignment = np.asarray(assignment, dtype=np.int32)
    order = [[v for v in range(len(backends)) if assignment[v] == d] for d in range(2)]
    return Plan(assignment, order, units=[Candidate(b, (k,)) for k, b in enumerate(backends)])


@pytest.mark.parametrize("backends,assignment,switches", [
    (["tvm", "onnxruntime", "onnxruntime", "openvino", "tvm"], [0] * 5, 3),   # tvm>ort, ort>ov, ov>tvm
    (["tvm", "tvm", "tvm", "tvm", "tvm"], [0] * 5, 0),                          # one library: none
    (["tvm", "tvm", "onnxruntime", "onnxruntime", "tvm"], [0, 0, 1, 1, 0], 0),  # a change between devices: none
    (["tvm", "onnxruntime", "tvm", "onnxruntime", "tvm"], [0, 0, 1, 1, 0], 3),  # 0: tvm>ort>tvm, 1: tvm>ort
])
def test_the_simulator_charges_one_switch_per_change_of_library_on_a_device(backends, assignment, switches):
    p = _chain(len(backends))
    fig = 2.5e-4
    set_switch(p.cluster, {1: fig}, "measured", "2026-01-01T00:00:00")
    plan = _plan(backends, assignment)
    bare = Plan(plan.assignment, plan.order)  # the same schedule without units: nothing to switch
    with_units, without = simulate(p, plan), simulate(p, bare)
    assert with_units.switches == switches and without.switches == 0
    assert with_units.switch_s == pytest.approx(switches * fig)
    # a chain: every charge delays the end by itself
    assert with_units.makespan - without.makespan == pytest.approx(switches * fig)
    assert with_units.run_s - without.run_s == pytest.approx(switches * fig)
    assert with_units.summary()["switches"] == switches


def test_the_joint_solve_weighs_the_switches_a_mixed_cover_pays():
    # a chain a-b-c-d; library y runs b and d 0.1 s faster than x. Without switches the best
    # cover alternates x, y, x, y (3.8 s); each of its three switches costs 0.2 s here, so one
    # library for all four (4.0 s) is faster: the joint solve must see that
    from tvm_pesto.plan import JointProblem
    from tvm_pesto.solve.joint.solver import solve_joint

    g = OpGraph([OpNode(k, "relax.add") for k in "abcd"], [(0, 1, 8), (1, 2, 8), (2, 3, 8)])
    cands = [Candidate("x", (v,)) for v in range(4)] + [Candidate("y", (1,)), Candidate("y", (3,))]
    problem = JointProblem(g, parse_cluster("cpu:1"), cands, np.array([[1.0]] * 4 + [[0.9]] * 2))
    set_switch(problem.cluster, {problem.cluster.devices[0].cores: 0.2}, "measured")
    for solver in ("auto", "heft"):
        plan, placed = solve_joint(problem, solver, deterministic=True, time_limit_s=5)
        assert plan.backend_mix() == {"x": 4}, (solver, plan.backend_mix())
        assert simulate(placed, plan).makespan == pytest.approx(4.0, rel=1e-6)
    set_switch(problem.cluster, {problem.cluster.devices[0].cores: 0.0}, "measured")  # free: they alternate
    plan, placed = solve_joint(problem, "auto", deterministic=True, time_limit_s=5)
    assert plan.backend_mix() == {"x": 2, "y": 2} and simulate(placed, plan).makespan == pytest.approx(3.8)


def test_a_device_size_without_a_fit_pays_the_assumed_figure():
    p = _chain(3)
    plan = _plan(["tvm", "torch", "tvm"], [0, 0, 0])
    assert [f.source for f in switch_figures(p.cluster)] == ["assumed", "assumed"]
    assert simulate(p, plan).switch_s == pytest.approx(2 * ASSUMED_SWITCH_S)
    set_switch(p.cluster, {2: 1e-3}, "measured")  # a fit of two-core devices says nothing of these one-core ones
    assert switch_figures(p.cluster)[0].source == "assumed" and switch_figures(p.cluster)[0].why
    set_switch(p.cluster, {1: 0.0}, "measured")  # a switch that costs nothing is still a switch
    assert simulate(p, plan).switches == 2 and simulate(p, plan).switch_s == 0.0
    with pytest.raises(ClusterError, match="seconds >= 0"):
        set_switch(p.cluster, {1: -1.0}, "measured")
    with pytest.raises(ClusterError, match="unknown source"):
        set_switch(p.cluster, {1: 1e-6}, "guessed")


def test_each_pair_is_the_median_over_the_rounds():
    blocks = {"tvm": [1e-4, 1e-4, 3e-4], "torch": [5e-5, 5e-5, 5e-5],
              "tvm,torch": [1.7e-4, 1.64e-4, 1e-4]}   # rounds: 10, 7 and -125 us a switch (a slow spell on tvm)
    switch_s, pairs = sw.switch_from_rounds(blocks)
    assert pairs["tvm,torch"] == pytest.approx(7e-6) and switch_s == pytest.approx(7e-6)


def test_the_figure_from_the_blocks_times():
    times = {"tvm": 1e-4, "onnxruntime": 4e-5, "torch": 6e-5,
             "tvm,onnxruntime": 1.6e-4, "tvm,torch": 1.7e-4, "onnxruntime,torch": 0.9e-4}
    switch_s, pairs = sw.switch_from_times(times)
    assert pairs == pytest.approx({"tvm,onnxruntime": 10e-6, "tvm,torch": 5e-6, "onnxruntime,torch": -5e-6})
    assert switch_s == pytest.approx(5e-6)  # the median over the pairs
    assert sw.switch_from_times({"a": 1e-4, "b": 1e-4, "a,b": 1.5e-4})[0] == 0.0  # faster together: no charge
    with pytest.raises(ClusterError, match="two libraries"):
        sw.switch_from_times({"tvm": 1e-4})


@pytest.fixture
def own_cache(machine_fits):
    """The core counts the switch stand-in measured (``machine_fits`` in conftest.py)."""
    return machine_fits["switch"]


def test_the_fit_is_kept_beside_the_dispatch_figures_and_read_back(own_cache, monkeypatch):
    measured = own_cache
    c = parse_cluster("cpu:2")
    info = rd.machine_dispatch(c, "thread", announce=False)
    assert measured == [1]  # the fit's device size, once for its two devices
    kept = json.loads(open(info["file"]).read())
    assert kept["switch"]["1"]["switch_s"] == pytest.approx(11e-6) and kept["dispatch"]["run_s"] == 3e-6
    assert [(f.seconds, f.source) for f in switch_figures(c)] == [(pytest.approx(11e-6), "measured")] * 2
    again = parse_cluster("cpu:2")
    rd.machine_dispatch(again, "thread", announce=False)
    assert measured == [1] and {f.source for f in switch_figures(again)} == {"cached"}
    # one device of every core: the kept record's dispatch, and its own size measured once, kept in that record
    one = parse_cluster("cpu:1")
    rd.machine_dispatch(one, "thread")
    assert measured == [1, 2] and switch_figures(one)[0].seconds == pytest.approx(12e-6)
    assert set(json.loads(open(info["file"]).read())["switch"]) == {"1", "2"}
    rd.machine_dispatch(parse_cluster("cpu:1"), "thread")
    assert measured == [1, 2]


def test_a_kept_fit_from_before_the_figure_gets_it_on_first_use_unless_fitting_is_off(own_cache, monkeypatch):
    measured = own_cache
    path = rd.constants_path(parse_cluster("cpu:2"), "thread")
    path.parent.mkdir(parents=True)
    old = rd.fit_constants(parse_cluster("cpu:2"), "thread")  # a record without "switch"
    path.write_text(json.dumps(old))
    monkeypatch.setenv(MACHINE_ENV, "off")
    c = parse_cluster("cpu:2")
    assert rd.machine_dispatch(c, "thread")["source"] == "cached"
    assert measured == [] and {f.source for f in switch_figures(c)} == {"assumed"}
    monkeypatch.setenv(MACHINE_ENV, "auto")
    c = parse_cluster("cpu:2")
    rd.machine_dispatch(c, "thread")
    assert measured == [1] and {f.source for f in switch_figures(c)} == {"measured"}
    assert "1" in json.loads(path.read_text())["switch"]


def test_a_kept_switch_fit_that_is_not_one_names_the_fix(own_cache):
    path = rd.constants_path(parse_cluster("cpu:2"), "thread")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**rd.fit_constants(parse_cluster("cpu:2"), "thread"), "switch": {"1": {"cores": 1}}}))
    with pytest.raises(ClusterError, match="delete the file"):
        rd.machine_dispatch(parse_cluster("cpu:2"), "thread")


def test_devices_not_here_get_the_assumed_switch_that_says_why(own_cache):
    c = parse_cluster("4xV100-pcie")
    rd.machine_dispatch(c, "thread")
    figs = switch_figures(c)
    assert {f.source for f in figs} == {"assumed"} and all(f.seconds == 0.0 and "not a CPU" in f.why for f in figs)
    assert own_cache == []


def test_the_switch_is_measured_on_the_libraries_here():
    """A real measurement, short: TVM's and ONNX Runtime's unit on one core, one round."""
    dev = parse_cluster("cpu:2").devices[0]
    fit = sw.measure_switch(dev, libraries=("tvm", "onnxruntime"), rounds=1, block_s=0.01)
    assert fit.libraries == ["tvm", "onnxruntime"] and list(fit.pairs_s) == ["tvm,onnxruntime"]
    assert fit.cores == 1 and fit.switch_s >= 0.0 and min(fit.alone_s.values()) > 0
    assert sw.SwitchFit.from_json(json.loads(json.dumps(fit.to_json()))) == fit


def test_a_machine_with_one_library_keeps_the_assumed_figure(own_cache, monkeypatch, capsys):
    def one_library(dev, *a, **k):
        raise ClusterError("a switch between libraries needs two libraries to measure")

    monkeypatch.setattr(sw, "measure_switch", one_library)
    c = parse_cluster("cpu:2")
    info = rd.machine_dispatch(c, "thread", announce=False)
    assert info["source"] == "measured" and {f.source for f in switch_figures(c)} == {"assumed"}
    assert "two libraries" in capsys.readouterr().err
    assert json.loads(open(info["file"]).read()).get("switch", {}) == {}
