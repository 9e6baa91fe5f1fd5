"""Every zoo model, placed over two CPU devices, computes what PyTorch computes."""
import numpy as np
import pytest

import tvm_pesto
from tvm_pesto import zoo
from tvm_pesto.builder.placed import PlacedModule
from tvm_pesto.builder.rewrite import apply_plan
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.errors import InfeasibleError
from tvm_pesto.plan import Plan, Problem, simulate


def _alternating_plan(analysis):
    """Groups alternate between the two devices along a topological order: the most
    cross-device edges a plan can have, the hardest case for the rewrite and executor."""
    order = analysis.graph.topo_order()
    pos = {v: k for k, v in enumerate(order)}
    assignment = np.array([pos[v] % 2 for v in range(analysis.graph.num_nodes)])
    return Plan.from_assignment(assignment, [pos[v] for v in range(analysis.graph.num_nodes)], 2, solver="alternate")


@pytest.mark.parametrize("name", zoo.list_models())
def test_zoo_model_placed_over_two_devices_matches_torch(name):
    zm = zoo.load(name, "small")
    cluster = parse_cluster("cpu:2")
    an = tvm_pesto.analyze(zm.mod)
    plan = _alternating_plan(an)
    # The plan is valid for the simulator too.
    problem = Problem(an.graph, cluster, np.full((an.graph.num_nodes, 2), 1e-5))
    simulate(problem, plan)
    pm = PlacedModule(apply_plan(an.rg, an.groups, plan, cluster), cluster)
    out = pm(*zm.example_inputs)
    ref = zoo.torch_reference(zm)
    outs, refs = (out, ref) if isinstance(ref, tuple) else ((out,), (ref,))
    for o, r in zip(outs, refs):
        scale = max(1.0, float(np.abs(r).max()))
        assert np.abs(o - r).max() <= 1e-4 * scale, f"{name}: max err {np.abs(o - r).max()}"
    _, trace = pm.run_traced(*zm.example_inputs)
    assert {t.device for t in trace if t.kind == "compute"} == {0, 1}
    pm.close()


def test_weights_larger_than_all_devices_name_the_need(tmp_path):
    zm = zoo.load("vgg11", "small")
    an = tvm_pesto.analyze(zm.mod)
    tiny = parse_cluster("cpu:2").with_memory(64 * 1024)
    with pytest.raises(InfeasibleError, match=r"need \d+\.\d MiB"):
        tvm_pesto.place(an, tiny, costs="roofline")
