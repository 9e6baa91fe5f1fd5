"""Every zoo model, placed over two CPU devices, computes what PyTorch computes: through the
project's executor, and through TVM's own compile flow and VM."""
import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_pesto
from tvm_pesto import zoo
from tvm_pesto.builder.lower import lower_units
from tvm_pesto.builder.placed import PlacedModule
from tvm_pesto.builder.rewrite import apply_plan
from tvm_pesto.candidates import placement_candidates
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.errors import InfeasibleError
from tvm_pesto.plan import Plan, Problem, simulate

pytestmark = pytest.mark.slow  # every zoo model built and run on two devices: out of the `-m "not slow"` lane


def _alternating_plan(analysis):
    """Groups alternate between the two devices along a topological order: the most
    cross-device edges a plan can have, the hardest case for the rewrite and executor."""
    order = analysis.graph.topo_order()
    pos = {v: k for k, v in enumerate(order)}
    assignment = np.array([pos[v] % 2 for v in range(analysis.graph.num_nodes)])
    units = list(placement_candidates(analysis.rg, analysis.groups))
    return Plan.from_assignment(assignment, [pos[v] for v in range(analysis.graph.num_nodes)], 2, solver="alternate",
                                units=units)


def _close(name, out, ref):
    outs, refs = (out, ref) if isinstance(ref, tuple) else ((out,), (ref,))
    for o, r in zip(outs, refs):
        scale = max(1.0, float(np.abs(r).max()))
        assert np.abs(o - r).max() <= 1e-4 * scale, f"{name}: max err {np.abs(o - r).max()}"


@pytest.mark.parametrize("name", zoo.list_models())
def test_zoo_model_placed_over_two_devices_matches_torch(name):
    zm = zoo.load(name, "small")
    cluster = parse_cluster("cpu:2")
    an = tvm_pesto.analyze(zm.mod)
    plan = _alternating_plan(an)
    # The plan is valid for the simulator too.
    problem = Problem(an.graph, cluster, np.full((an.graph.num_nodes, 2), 1e-5))
    simulate(problem, plan)
    placed = apply_plan(an.rg, plan, cluster)
    pm = PlacedModule(placed, cluster, plan)
    ref = zoo.torch_reference(zm)
    _close(name, pm(*zm.example_inputs), ref)
    _, trace = pm.run_traced(*zm.example_inputs)
    assert {t.device for t in trace if t.kind == "compute"} == {0, 1}
    pm.close()
    # The same plan through the pass, in TVM's own flow: tvm.compile and relax.VirtualMachine with two devices.
    ex = tvm.compile(tvm_pesto.PlacementPass(cluster, plan=plan)(zm.mod))
    vm = relax.VirtualMachine(ex, [d.tvm_device() for d in cluster.devices])
    out = vm["main"](*[tvm.runtime.tensor(a, cluster.devices[0].tvm_device()) for a in zm.example_inputs])
    out = tuple(o.numpy() for o in out) if isinstance(ref, tuple) else out.numpy()
    _close(name, out, ref)


@pytest.mark.parametrize("name", ["resnet50", "bert"])
def test_the_pass_with_its_own_solver_runs_in_the_stock_vm(name):
    """As a TVM user calls it: PlacementPass(cluster, solver='m-topo', costs='roofline') ->
    tvm.compile -> relax.VirtualMachine on two devices."""
    zm = zoo.load(name, "small")
    pp = tvm_pesto.PlacementPass("cpu:2", solver="m-topo", costs="roofline", search_s=0, measure_final=False)
    ex = tvm.compile(pp(zm.mod))
    vm = relax.VirtualMachine(ex, [tvm.cpu(0), tvm.cpu(1)])
    got = vm["main"](*[tvm.runtime.tensor(a) for a in zm.example_inputs])
    ref = zoo.torch_reference(zm)
    _close(name, tuple(o.numpy() for o in got) if isinstance(ref, tuple) else got.numpy(), ref)


def test_placement_pass_output_with_every_backend_runs_in_the_stock_vm():
    """The pass with backend choice (ONNX Runtime, torch and TVM units on two devices):
    ``tvm.compile`` + ``relax.VirtualMachine`` run it, extern calls included."""
    zm = zoo.load("mlp_mixer", "small")
    pp = tvm_pesto.PlacementPass("cpu:2", backends="all", solver="m-topo", costs="roofline", search_s=0,
                                 measure_final=False)
    out = pp(zm.mod)
    pl = pp.last_placement
    assert set(pl.backend_mix) - {"tvm"}, f"no library unit was chosen: {pl.backend_mix}"
    ex = tvm.compile(out)
    vm = relax.VirtualMachine(ex, [tvm.cpu(0), tvm.cpu(1)])
    got = vm["main"](tvm.runtime.tensor(zm.example_inputs[0])).numpy()
    _close("mlp_mixer", got, zoo.torch_reference(zm))


@pytest.mark.parametrize("name", ["mlp_mixer", "inception_v3"])
def test_the_plan_built_is_the_plan_solved(name):
    """The module the builder makes holds exactly the solver's units, on its devices, and
    the graph it lowered, grouped by those units, simulates to the solver's makespan."""
    zm = zoo.load(name, "small")
    cluster = parse_cluster("cpu:2")
    pl = tvm_pesto.place(zm.mod, cluster, backends="all", solver="heft", costs="roofline", search_s=1.0)
    plan = pl.plan
    low = lower_units(pl.analysis.rg, plan.units, [cluster.devices[d] for d in plan.assignment])
    rebuilt = Problem(low.rg.graph.contract(low.unit_nodes), cluster, pl.problem.costs)
    assert rebuilt.graph.edges() == pl.problem.graph.edges()
    assert simulate(rebuilt, plan).makespan == pytest.approx(pl.sim.makespan, rel=1e-12)
    # every extern call of the placed module is one non-TVM unit, on the plan's device
    pm = tvm_pesto.build(zm.mod, cluster, plan=plan)
    calls = {s.func: s.device for s in pm.program.calls()}
    assert set(calls.values()) == set(plan.devices_used())
    ext_units = sorted(k for k, u in enumerate(plan.units) if u.backend != "tvm")
    assert sorted(low.externs.values()) == ext_units
    pm.close()


def test_weights_larger_than_all_devices_name_the_need(tmp_path):
    zm = zoo.load("vgg11", "small")
    an = tvm_pesto.analyze(zm.mod)
    tiny = parse_cluster("cpu:2").with_memory(64 * 1024)
    with pytest.raises(InfeasibleError, match=r"need \d+\.\d MiB"):
        tvm_pesto.place(an, tiny, backends="tvm", costs="roofline")
