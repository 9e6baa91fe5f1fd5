"""A library unit's seconds in the model's run: what a call costs more after the rest of the
model ran, from the device's cold-call grid (:mod:`tvm_pesto.costs.in_run`,
:mod:`tvm_pesto.cluster.cold`, fitted by :mod:`tvm_pesto.costs.calibrate.cold`); the whole
model, TVM's native groups and roofline columns are left as timed."""
import json

import numpy as np
import pytest
import torch

from tvm_pesto.cluster import parse_cluster
from tvm_pesto.cluster.cold import ASSUMED_COLD, check_grid, cold_figures, set_cold
from tvm_pesto.costs import CostTable, candidate_costs
from tvm_pesto.costs.calibrate import cold as cf
from tvm_pesto.costs.calibrate import dispatch as rd
from tvm_pesto.costs.calibrate.machine import MACHINE_ENV
from tvm_pesto.costs.in_run import cold_extra_s, weights_from_memory
from tvm_pesto.costs.predict.hybrid import Hybrid
from tvm_pesto.costs.store.cache import MeasureCache
from tvm_pesto.errors import ClusterError
from tvm_pesto.frontend import from_torch
from tvm_pesto.placing import cost_candidates

#: A grid whose figures are easy to tell apart: 10 us fixed after 1 MB, 100 us after 100 MB,
#: and 1 ms more per 10 MB of weights after 100 MB.
GRID = {"flush_bytes": [1e6, 100e6], "unit_bytes": [1e3, 10e6],
        "extra_s": [[1e-5, 1e-5], [1e-4, 1.1e-3]]}


def _mlp(width: int):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                              torch.nn.ReLU(), torch.nn.Linear(width, width)).eval()
    return from_torch(net, [torch.randn(1, width)])


@pytest.fixture(scope="module")
def large():
    """Three 1536x1536 layers: 28 MB of weights."""
    return cost_candidates(_mlp(1536), "cpu:2", costs="roofline")


def _bytes(costed):
    nodes = costed.candidates.rg.graph.nodes
    w = np.array([sum(nodes[v].param_bytes for v in c.nodes) for c in costed.candidates], dtype=float)
    m = np.array([sum(nodes[v].memory_bytes for v in c.nodes) for c in costed.candidates], dtype=float)
    return w, sum(n.memory_bytes for n in nodes) - m


def test_the_grid_is_read_in_the_bytes_passed_and_the_weights():
    s = np.array([0.0, 5e5, 1e6, 1e7, 1e8, 1e9])
    small = cold_extra_s(GRID, s, np.full(6, 1e3))
    np.testing.assert_allclose(small, [0.0, 5e-6, 1e-5, 5.5e-5, 1e-4, 1e-4])  # log between, flat beyond
    w = np.array([1e2, 1e3, 5.0005e6, 10e6, 20e6 - 1e3])
    np.testing.assert_allclose(cold_extra_s(GRID, np.full(5, 1e8), w), [1e-4, 1e-4, 6e-4, 1.1e-3, 2.1e-3])
    # more bytes in between or more weights never cost less
    grid = np.array([[cold_extra_s(GRID, [a], [b])[0] for b in (1e3, 1e6, 1e7, 1e8)] for a in (1e5, 1e6, 1e7, 1e9)])
    assert np.all(np.diff(grid, axis=0) >= 0) and np.all(np.diff(grid, axis=1) >= 0)


def test_a_library_unit_pays_the_grid_and_the_whole_model_tvm_and_roofline_do_not(large):
    cs, cluster = large.candidates, large.cluster
    set_cold(cluster, {1: GRID}, "measured", "2026-01-01T00:00:00")
    t = np.full((len(cs), cluster.num_devices), 1e-4)
    t[0, 0] = np.inf
    ct = CostTable(t.copy(), ["xgb", "measured"])
    out = weights_from_memory(ct, cs, cluster)
    added = np.where(np.isfinite(t), out.table - np.where(np.isfinite(t), t, 0.0), 0.0)
    w, passed = _bytes(large)
    lib = np.array([c.backend != "tvm" for c in cs])
    whole = passed == 0
    assert lib.any() and (whole & lib).any() and (~whole & lib & (w > 0)).any()
    assert np.all(added[whole] == 0)  # nothing runs between two of its calls
    assert np.all(added[~lib] == 0)  # TVM's groups are scaled to the whole model's run elsewhere
    assert out.table[0, 0] == np.inf
    part = lib & ~whole
    want = cold_extra_s(GRID, passed[part], w[part])
    assert np.all(want > 0)
    np.testing.assert_allclose(added[part, 1], want, rtol=1e-12)
    np.testing.assert_allclose(added[part, 0][np.isfinite(t[part, 0])], want[np.isfinite(t[part, 0])], rtol=1e-12)
    assert set(out.from_memory) == {0, 1} and out.from_memory[1]["grid"] == "measured"
    assert out.summary()["from_memory"]["1"]["candidates"] == int((added[:, 1] > 0).sum())
    roof = CostTable(t.copy(), ["roofline", "roofline"])
    assert weights_from_memory(roof, cs, cluster) is roof


def test_a_cluster_without_a_fit_gets_the_assumed_grid_and_says_so(large):
    c = parse_cluster("cpu:2")
    figs = cold_figures(c)
    assert [f.source for f in figs] == ["assumed"] * 2 and "no fit" in figs[0].why
    assert figs[0].extra_s == tuple(tuple(r) for r in ASSUMED_COLD["extra_s"])
    gpu = cold_figures(parse_cluster("2xV100-nvlink"))
    assert gpu == [None, None]


@pytest.mark.parametrize("grid, what", [
    ({"flush_bytes": [1e6], "unit_bytes": [1e3, 1e6]}, "not a grid"),
    ({"flush_bytes": [1e6, 1e5], "unit_bytes": [1e3, 1e6], "extra_s": [[0, 0], [0, 0]]}, "must increase"),
    ({"flush_bytes": [1e6], "unit_bytes": [1e3, 1e6], "extra_s": [[0, -1e-6]]}, "must increase"),
    ({"flush_bytes": [1e6], "unit_bytes": [1e3, 1e6], "extra_s": [[0]]}, "one row"),
])
def test_a_grid_that_is_not_one_names_the_fix(grid, what):
    with pytest.raises(ClusterError, match=what):
        check_grid(grid, "the grid")
    with pytest.raises(ClusterError, match="delete the kept fit"):
        set_cold(parse_cluster("cpu:1"), {1: grid}, "cached")


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
    loop = candidate_costs(cs, cluster, "xgb", in_run=False)  # what labels and calibrations compare: a loop's
    assert not loop.from_memory and np.allclose(loop.table, raw, rtol=1e-12, equal_nan=True)


def test_the_fit_times_library_units_in_a_loop_and_after_other_bytes():
    dev = parse_cluster("cpu:1").devices[0]
    fit = cf.measure_cold(dev, flush_bytes=(1 << 20, 32 << 20), unit_bytes=(16 << 10, 4 << 20), calls=5)
    grid = check_grid(fit, "the fit")
    ex = np.array(grid["extra_s"])
    assert ex.shape == (2, 2) and np.all(np.diff(ex, axis=0) >= 0) and np.all(np.diff(ex, axis=1) >= 0)
    assert np.array(fit["warm_code_s"]).shape == (2, 2) and len(fit["loop_s"]) == 2
    assert fit["loop_s"][1] > fit["loop_s"][0] > 0 and fit["cores"] == dev.cores and fit["fitted_at"]


def test_the_grid_is_fitted_on_first_use_kept_beside_the_dispatch_figures_and_read_back(machine_fits, monkeypatch):
    measured, grid = machine_fits["cold"], machine_fits["grid"]
    c = parse_cluster("cpu:2")
    info = rd.machine_dispatch(c, "thread", announce=False)
    assert measured == [1]  # the fit's device size, once for its two devices
    kept = json.loads(open(info["file"]).read())
    assert kept["cold"]["1"]["extra_s"] == grid["extra_s"]
    assert [f.source for f in cold_figures(c)] == ["measured"] * 2
    again = parse_cluster("cpu:2")
    rd.machine_dispatch(again, "thread", announce=False)
    assert measured == [1] and {f.source for f in cold_figures(again)} == {"cached"}
    monkeypatch.setenv(MACHINE_ENV, "off")
    off = parse_cluster("cpu:1")  # another size, fitting off: the assumed grid, nothing measured
    rd.machine_dispatch(off, "thread")
    assert measured == [1] and cold_figures(off)[0].source == "assumed"
