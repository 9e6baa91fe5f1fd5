"""Candidates: validity (no cycle when outlined), what each backend is offered, tensor-only
parameters, measured costs cached persistently (second run measures nothing, a corrupted
line is skipped and reported), and build failures marked infeasible."""
import itertools
import warnings

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

from tvm_pesto.backends import available_backends, register_backend, unregister_backend
from tvm_pesto.backends.torch_ops import TorchBackend
from tvm_pesto.candidates import (
    Reach, candidate_function, candidate_outputs, combined_acyclic, generate_candidates, is_valid,
)
from tvm_pesto.candidates.examples import tiny_cnn, tiny_mlp
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.costs.measure.measured import MeasureReport, measure_candidates
from tvm_pesto.costs.store.cache import MeasureCache
from tvm_pesto.errors import BuildError
from tvm_pesto.graph import OpGraph, OpNode
from tvm_pesto.graph.regions import convex_regions
from tvm_pesto.graph.relax_import import from_relax


def _graph(n, edges):
    return OpGraph([OpNode(f"n{i}", "relax.add") for i in range(n)], [(u, v, 4) for u, v in edges])


def test_convexity_and_combined_cycles():
    g = _graph(3, [(0, 1), (1, 2), (0, 2)])
    assert not is_valid(g, [0, 2])  # 0 -> 1 -> 2 leaves and re-enters
    assert is_valid(g, [0, 1]) and is_valid(g, [0, 1, 2])
    # two individually valid candidates that form a cycle together: {0, 3} and {2, 1}
    g2 = _graph(4, [(0, 1), (2, 3), (0, 3), (2, 1)])
    assert is_valid(g2, [0, 3]) and is_valid(g2, [1, 2])
    assert not combined_acyclic(g2, [[0, 3], [1, 2]])
    assert combined_acyclic(g2, [[0, 3]])


@st.composite
def dags(draw, max_n=8):
    n = draw(st.integers(2, max_n))
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]
    edges = [p for p in pairs if draw(st.booleans())]
    return n, edges


@settings(max_examples=60, deadline=None)
@given(d=dags(), bits=st.integers(1, 255))
def test_convexity_matches_the_path_definition(d, bits):
    n, edges = d
    g = _graph(n, edges)
    nodes = [v for v in range(n) if (bits >> v) & 1] or [0]
    inside = set(nodes)
    clos = nx.transitive_closure_dag(g.dag)
    bad = any(clos.has_edge(a, w) and clos.has_edge(w, b) for a, b in itertools.product(inside, inside)
              for w in range(n) if w not in inside)
    assert Reach(g.dag, n).convex(nodes) == (not bad)


def test_regions_are_convex():
    g = _graph(5, [(0, 1), (1, 2), (0, 3), (3, 2), (2, 4)])
    regions = convex_regions(g, {0, 1, 2, 4})  # node 3 unsupported
    reach = Reach(g.dag, 5)
    assert all(reach.convex(r) for r in regions)
    assert sorted(v for r in regions for v in r) == [0, 1, 2, 4]
    assert [0, 1, 2, 4] not in regions


def test_generated_candidates_are_valid_and_cover():
    mod, _ = tiny_cnn()
    rg = from_relax(mod)
    cs = generate_candidates(rg, available_backends()[0])
    reach = Reach(rg.graph.dag, rg.graph.num_nodes)
    assert all(reach.convex(c.nodes) for c in cs)
    for v in range(rg.graph.num_nodes):  # tvm single ops cover everything
        assert any(c.backend == "tvm" and c.nodes == (v,) for c in cs)
    pats = {c.pattern for c in cs}
    assert {"torch.conv2d_bias_add_relu", "torch.conv2d_clip", "onnxruntime.matmul_bias", "fusion_group",
            "region"} <= pats
    # the onnxruntime region is the whole graph here (every op is supported)
    assert any(c.backend == "onnxruntime" and c.pattern == "region" and len(c.nodes) == rg.graph.num_nodes
               for c in cs)
    # conv -> batch_norm -> [0] -> relu: the tuple and TupleGetItem are inside one candidate
    conv_bn_relu = [c for c in cs if c.pattern.endswith("conv2d_bn_relu")]
    assert conv_bn_relu and all(len(c.nodes) == 3 for c in conv_bn_relu)


def test_a_candidates_measurement_key_is_made_once_per_node_set(monkeypatch):
    import tvm_pesto.candidates.generate as generate

    rg = from_relax(tiny_cnn()[0])
    made = []
    real = generate.structural_key
    monkeypatch.setattr(generate, "structural_key", lambda f: made.append(f) or real(f))
    cs = generate_candidates(rg, available_backends()[0])
    first = [generate.candidate_key(rg, c.nodes) for c in cs]
    again = [generate.candidate_key(rg, tuple(reversed(c.nodes))) for c in cs]
    node_sets = {frozenset(c.nodes) for c in cs}
    assert first == again and len(made) == len(node_sets) < len(cs)  # backends share node sets


def test_candidate_parameters_are_tensors():
    mod, _ = tiny_cnn()
    rg = from_relax(mod)
    relu = next(v for v in range(rg.graph.num_nodes) if rg.graph.nodes[v].op == "relax.nn.relu")
    seg = candidate_function(rg, [relu])  # reads bn[0], a tuple computed outside
    assert all(isinstance(p.ty, relax.TensorType) for p in seg.func.params)
    bn = next(v for v in range(rg.graph.num_nodes) if rg.graph.nodes[v].op == "relax.nn.batch_norm")
    outs = candidate_outputs(rg, [bn - 1, bn])  # conv + bn: the output is the alias bn[0]
    assert len(outs) == 1 and isinstance(outs[0].ty, relax.TensorType)


@pytest.mark.slow
def test_measure_cache_persists_and_survives_a_corrupted_line(tmp_path):
    mod, _ = tiny_mlp()
    rg = from_relax(mod)
    cs = generate_candidates(rg, available_backends(["tvm", "torch", "onnxruntime"])[0])
    dev = parse_cluster("cpu:1").devices[0]
    path = tmp_path / "m.jsonl"
    r1 = MeasureReport()
    c1 = measure_candidates(cs, dev, MeasureCache(path), repeat=3, min_repeat_ms=1, report=r1)
    assert r1.measured > 0 and np.isfinite(c1).all() and (c1 > 0).all()
    with open(path, "a") as f:
        f.write('{"key": "broken", "backend": \n')
        f.write("not json at all\n")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        cache = MeasureCache(path)
    assert len(cache.skipped) == 2 and any("corrupted" in str(x.message) for x in w)
    r2 = MeasureReport()
    c2 = measure_candidates(cs, dev, cache, report=r2)
    assert r2.measured == 0 and r2.cached == len(cs)
    np.testing.assert_allclose(c1, c2)


class _Flaky(TorchBackend):
    """A backend that cannot build any subgraph containing a matmul."""

    name = "flaky"

    def make_callable(self, func, device):
        calls = []
        relax.analysis.post_order_visit(func.body, lambda e: calls.append(e) if isinstance(e, relax.Call) else None)
        if any(getattr(c.op, "name", "") == "relax.matmul" for c in calls):
            raise BuildError("flaky cannot do matmul")
        return super().make_callable(func, device)


@pytest.mark.slow
def test_build_failure_marks_candidate_infeasible(tmp_path):
    register_backend("flaky", _Flaky)
    try:
        mod, _ = tiny_mlp()
        rg = from_relax(mod)
        bks, _ = available_backends(["tvm", "flaky"])
        cs = generate_candidates(rg, bks)
        dev = parse_cluster("cpu:1").devices[0]
        rep = MeasureReport()
        costs = measure_candidates(cs, dev, MeasureCache(tmp_path / "c.jsonl"), repeat=3, min_repeat_ms=1,
                                   report=rep)
        bad = [i for i, c in enumerate(cs) if c.backend == "flaky"
               and any(rg.graph.nodes[v].op == "relax.matmul" for v in c.nodes)]
        assert bad and all(np.isinf(costs[i]) for i in bad)
        assert set(bad) <= set(rep.infeasible) and "matmul" in rep.infeasible[bad[0]]
        good = [i for i, c in enumerate(cs) if c.backend == "flaky" and i not in bad]
        assert good and all(np.isfinite(costs[i]) for i in good)
        # the infeasible marks are cached too: a second pass builds nothing
        rep2 = MeasureReport()
        measure_candidates(cs, dev, MeasureCache(tmp_path / "c.jsonl"), report=rep2)
        assert rep2.measured == 0 and set(rep2.infeasible) == set(rep.infeasible)
    finally:
        unregister_backend("flaky")


def test_validity_rejects_disconnected():
    g = _graph(3, [(0, 1)])
    assert not is_valid(g, [0, 2])
    assert not is_valid(g, [])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["inception_v3", "bert"])
def test_patterns_indexed_by_root_op_find_what_matching_every_pattern_finds(name, monkeypatch):
    """Each pattern is tried only at nodes whose op its root can match; every pattern at
    every node (the index turned off) must give the very same candidates."""
    import tvm_pesto
    from tvm_pesto import zoo
    from tvm_pesto.candidates import generate

    rg = tvm_pesto.analyze(zoo.load(name, "small").mod).rg
    backends = [b for b in available_backends()[0] if b.name != "tvm-ms"]
    indexed = generate.generate_candidates(rg, backends)
    monkeypatch.setattr(generate, "_patterns_by_root", lambda pats: {None: list(pats)})
    everything = generate.generate_candidates(rg, backends)
    assert {"torch", "onnxruntime"} <= {c.backend for c in indexed}
    assert [c.label() for c in indexed] == [c.label() for c in everything]
    assert indexed.rejected == everything.rejected
