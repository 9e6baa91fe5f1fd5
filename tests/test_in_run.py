"""A library unit's seconds in the model's run: its weights come from memory when the model's
weights are more than the caches keep (:mod:`tvm_pesto.costs.in_run`); the whole model, TVM's
native groups, roofline columns and a model the caches hold are left as timed."""
import numpy as np
import pytest
import torch

from tvm_pesto.costs import CostTable, candidate_costs
from tvm_pesto.costs.in_run import CACHE_BYTES, STREAM_BPS, from_memory_s, weights_from_memory
from tvm_pesto.costs.predict.hybrid import Hybrid
from tvm_pesto.costs.store.cache import MeasureCache
from tvm_pesto.frontend import from_torch
from tvm_pesto.placing import cost_candidates


def _mlp(width: int):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                              torch.nn.ReLU(), torch.nn.Linear(width, width)).eval()
    return from_torch(net, [torch.randn(1, width)])


@pytest.fixture(scope="module")
def large():
    """Three 1536x1536 layers: 28 MB of weights, over :data:`CACHE_BYTES`."""
    return cost_candidates(_mlp(1536), "cpu:2", costs="roofline")


def _weights(costed) -> np.ndarray:
    nodes = costed.candidates.rg.graph.nodes
    return np.array([sum(nodes[v].param_bytes for v in c.nodes) for c in costed.candidates], dtype=float)


def test_a_library_unit_pays_its_weights_from_memory_and_the_whole_model_does_not(large):
    cs, cluster = large.candidates, large.cluster
    ct = CostTable(np.full((len(cs), cluster.num_devices), 1e-4), ["xgb", "measured"])
    out = weights_from_memory(ct, cs, cluster)
    w, model = _weights(large), float(_weights(large).max())
    assert model > CACHE_BYTES
    added = out.table - ct.table
    lib = np.array([c.backend != "tvm" for c in cs])
    whole = w == model
    assert lib.any() and (whole & lib).any() and (~whole & lib & (w > 0)).any()
    assert np.all(added[whole] == 0)  # its loop streams its weights already
    assert np.all(added[~lib] == 0)  # TVM's groups are scaled to the whole model's run elsewhere
    one_layer = lib & ~whole & (w > 0) & (w < CACHE_BYTES)  # a layer of 9.4 MB ... at most the cache
    want = w[one_layer] * (1 - CACHE_BYTES / model) / STREAM_BPS
    np.testing.assert_allclose(added[one_layer, 0], want, rtol=1e-9)
    np.testing.assert_allclose(added[one_layer, 1], want, rtol=1e-9)
    assert set(out.from_memory) == {0, 1} and out.from_memory[0]["model_bytes"] == model
    assert out.summary()["from_memory"]["0"]["candidates"] == int((added[:, 0] > 0).sum())


def test_roofline_columns_infinite_costs_and_a_model_the_caches_hold_are_left(large):
    cs, cluster = large.candidates, large.cluster
    t = np.full((len(cs), 2), 1e-4)
    t[:, 1] = np.inf
    ct = CostTable(t.copy(), ["roofline", "xgb"])
    assert weights_from_memory(ct, cs, cluster) is ct
    small = cost_candidates(_mlp(256), "cpu:2", costs="roofline")  # 0.8 MB of weights
    ct = CostTable(np.full((len(small.candidates), 2), 1e-4), ["xgb", "xgb"])
    assert weights_from_memory(ct, small.candidates, small.cluster) is ct
    np.testing.assert_array_equal(from_memory_s([1e6, 2e6], 3e6, cache=CACHE_BYTES, bandwidth=STREAM_BPS), 0.0)


def test_every_source_but_roofline_prices_the_run(large, tmp_path):
    cs, cluster = large.candidates, large.cluster
    roof = candidate_costs(cs, cluster, "roofline")
    assert not roof.from_memory
    xgb = candidate_costs(cs, cluster, "xgb")
    assert set(xgb.from_memory) == {0, 1}
    hybrid = Hybrid(cs, cluster, cache=MeasureCache(str(tmp_path / "m.jsonl"))).cost_table()  # nothing measured yet
    assert set(hybrid.from_memory) == {0, 1}
    raw = xgb.table - weights_from_memory(CostTable(np.zeros_like(xgb.table), xgb.columns), cs, cluster).table
    lib = np.array([c.backend != "tvm" for c in cs])
    assert np.all(raw[lib & np.isfinite(raw[:, 0]), 0] > 0)  # what remains is the model's prediction
