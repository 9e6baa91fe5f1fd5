"""Search: Collage's DP and the joint ILP agree with brute force on tiny cases, the ILP is
never worse than the DP on one device, uses a second device when it pays, and the lowered,
placed module matches TVM-only numerics."""
import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tvm_pesto.candidates import Reach, combined_acyclic
from tvm_pesto.candidates.examples import reference_output, tiny_cnn
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.costs.cache import MeasureCache
from tvm_pesto.errors import InfeasibleError
from tvm_pesto.graph import OpGraph, OpNode
from tvm_pesto.search import brute_force_cover, collage_dp, joint_ilp
from tvm_pesto.search.joint_ilp import prune_dominated


def _graph(n, edges):
    return OpGraph([OpNode(f"n{i}", "relax.add") for i in range(n)], [(u, v, 1024) for u, v in edges])


@st.composite
def cover_cases(draw, max_n=6, max_extra=8):
    n = draw(st.integers(2, max_n))
    pairs = [(u, v) for u in range(n) for v in range(u + 1, n)]
    edges = [p for p in pairs if draw(st.booleans())]
    g = _graph(n, edges)
    reach = Reach(g.dag, n)
    und = g.dag.to_undirected()
    sets = [(v,) for v in range(n)]
    for _ in range(draw(st.integers(0, max_extra))):
        bits = draw(st.integers(1, (1 << n) - 1))
        s = tuple(v for v in range(n) if (bits >> v) & 1)
        if len(s) > 1 and s not in sets and reach.convex(s) and nx.is_connected(und.subgraph(s)):
            sets.append(s)
    costs = [draw(st.floats(0.1, 10.0)) for _ in sets]
    return g, sets, np.array(costs)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cover_cases())
def test_dp_equals_brute_force(case):
    g, sets, costs = case
    dp = collage_dp(g, sets, costs)
    bf = brute_force_cover(g, sets, costs)
    assert dp.cost == pytest.approx(bf.cost, rel=1e-9)
    assert combined_acyclic(g, [sets[c] for c in dp.chosen])
    assert sorted(v for c in dp.chosen for v in sets[c]) == list(range(g.num_nodes))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cover_cases(max_n=5, max_extra=6))
def test_single_device_ilp_equals_dp_and_brute_force(case):
    g, sets, costs = case
    c1 = parse_cluster("cpu:1")
    dp = collage_dp(g, sets, costs)
    bf = brute_force_cover(g, sets, costs)
    cold = joint_ilp(g, sets, costs[:, None], c1, time_limit_s=20, prune=False)
    warm = joint_ilp(g, sets, costs[:, None], c1, warm=dp, time_limit_s=20)
    for r in (cold, warm):
        assert sum(costs[c] for c in r.chosen) == pytest.approx(bf.cost, rel=1e-6, abs=1e-9)
        assert combined_acyclic(g, [sets[c] for c in r.chosen])
    assert warm.objective_s <= dp.cost * (1 + 1e-6)


def test_ilp_rejects_a_cheap_but_cyclic_cover():
    # {0,3} and {1,2} are each convex but together cyclic; the cheapest acyclic cover differs
    g = _graph(4, [(0, 1), (2, 3), (0, 3), (2, 1)])
    sets = [(0,), (1,), (2,), (3,), (0, 3), (1, 2)]
    costs = np.array([1.0, 1.0, 1.0, 1.0, 0.1, 0.1])
    bf = brute_force_cover(g, sets, costs)
    dp = collage_dp(g, sets, costs)
    ilp = joint_ilp(g, sets, costs[:, None], parse_cluster("cpu:1"), time_limit_s=20, prune=False)
    assert bf.cost == pytest.approx(2.1)
    assert dp.cost == pytest.approx(bf.cost) and sum(costs[c] for c in ilp.chosen) == pytest.approx(bf.cost)


def test_joint_ilp_uses_two_devices_for_parallel_branches():
    # diamond: 0 -> (1 | 2) -> 3, heavy branches, a merged candidate {1,2} that is slower
    g = _graph(4, [(0, 1), (0, 2), (1, 3), (2, 3)])
    sets = [(0,), (1,), (2,), (3,), (1, 2)]
    per_dev = np.array([1e-4, 5e-3, 5e-3, 1e-4, 9.5e-3])
    costs = np.stack([per_dev, per_dev], axis=1)
    c2 = parse_cluster("cpu:2")
    dp = collage_dp(g, sets, per_dev)
    res = joint_ilp(g, sets, costs, c2, warm=dp, warm_device=0, time_limit_s=20)
    assert dp.cost == pytest.approx(9.7e-3)
    assert res.objective_s < dp.cost * 0.8
    assert {res.device[1], res.device[2]} == {0, 1}


def test_pruning_keeps_the_optimum():
    g = _graph(3, [(0, 1), (1, 2)])
    sets = [(0,), (1,), (2,), (0, 1), (1, 2), (0, 1, 2), (0, 1)]
    costs = np.array([[1.0], [1.0], [1.0], [1.5], [2.5], [2.4], [1.6]])
    keep = prune_dominated(g, sets, costs)
    assert 4 not in keep and 6 not in keep and 5 in keep and 3 in keep
    sub = [sets[i] for i in keep]
    assert collage_dp(g, sub, costs[keep, 0]).cost == pytest.approx(collage_dp(g, sets, costs[:, 0]).cost)


def test_dp_reports_uncoverable_nodes():
    g = _graph(2, [(0, 1)])
    with pytest.raises(InfeasibleError, match="tvm"):
        collage_dp(g, [(0,)], [1.0])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from tvm_pesto.search.pipeline import prepare

    mod, inputs = tiny_cnn()
    cache = MeasureCache(tmp_path_factory.mktemp("cache") / "m.jsonl")
    c1, c2 = parse_cluster("cpu:1"), parse_cluster("cpu:2")
    p1 = prepare(mod, c1, backends=["tvm", "torch", "onnxruntime", "tvm-ms"], cache=cache)
    p2 = prepare(mod, c2, backends=["tvm", "torch", "onnxruntime"], cache=cache)
    return mod, inputs, p1, p2


def test_end_to_end_numerics_for_every_backend_mix(prepared):
    from tvm_pesto.search.pipeline import build_placed, search

    mod, inputs, p1, p2 = prepared
    ref = reference_output(mod, inputs)
    assert "tvm-ms" in p1.unavailable and "TVM_PESTO_MS_DB" in p1.unavailable["tvm-ms"]
    results = {}
    for prep, method in [(p1, "single:tvm"), (p1, "single:torch"), (p1, "single:onnxruntime"), (p1, "dp"),
                         (p1, "joint"), (p2, "joint")]:
        bp = search(prep, method, time_limit_s=20)
        placed, low = build_placed(bp)
        out = placed(*inputs)
        placed.close()
        assert np.max(np.abs(out - ref)) < 1e-4, (method, bp.backend_mix())
        results[(prep.cluster.name, method)] = bp
        externs = [b for b in low.mod["main"].body.blocks[0].bindings
                   if getattr(getattr(b.value, "op", None), "name", "") == "relax.call_dps_packed"]
        assert len(externs) == sum(1 for c in bp.cover if prep.cs[c].backend != "tvm")
    assert results[("cpu:1", "single:tvm")].backend_mix() == {"tvm": p1.rg.graph.num_nodes}
    assert set(results[("cpu:1", "single:torch")].backend_mix()) <= {"torch", "tvm"}
    # one device: the ILP's choice is never worse (predicted) than Collage's DP
    assert results[("cpu:1", "joint")].predicted_s <= results[("cpu:1", "dp")].predicted_s * (1 + 1e-6)
    assert results[("cpu:1", "dp")].predicted_s <= min(
        results[("cpu:1", f"single:{b}")].predicted_s for b in ("tvm", "torch", "onnxruntime")) * (1 + 1e-6)


def test_brute_force_is_guarded():
    g = _graph(2, [(0, 1)])
    sets = [(0,), (1,)] * 12
    with pytest.raises(Exception, match="too large"):
        brute_force_cover(g, sets, np.ones(len(sets)))
