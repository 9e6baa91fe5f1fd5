"""The ``screened`` cost source: a second core count sampled, the rest scaled from the first."""
import os
from types import SimpleNamespace

import numpy as np
import pytest

from tvm_pesto.choose.final import one_device_costs
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.costs import MeasureCache, candidate_costs
from tvm_pesto.costs.auto import AutoChoice
from tvm_pesto.costs.measure import screen as scr
from tvm_pesto.costs.store.cache import measure_target

ONE, TWO = '{"kind":"llvm","num-cores":1}', '{"kind":"llvm","num-cores":2}'


class _Cache:
    """``get(key, backend, target)`` over a dict of records' seconds (negative: infeasible)."""

    def __init__(self, seconds: dict):
        self.seconds = seconds

    def get(self, key, backend, target):
        s = self.seconds.get((key, backend, target))
        return None if s is None else {"median_s": s, "infeasible": "no converter" if s < 0 else None}


class _Set(list):
    rg = None


def _set(specs, n_nodes):
    cs = _Set(SimpleNamespace(backend=b, nodes=tuple(n)) for b, n in specs)
    cs.rg = SimpleNamespace(graph=SimpleNamespace(nodes=[None] * n_nodes))
    return cs


def _two_core_device():
    return SimpleNamespace(kind="cpu", rpc_key="", target={"kind": "llvm", "num-cores": 2}, cores=2)


def test_ratio_fit_follows_the_size_of_the_region_and_is_clipped():
    sib = np.geomspace(1e-5, 1e-2, 12)
    here = sib * np.exp(-0.1 * np.log(sib / 1e-5))  # larger regions gain more from a second thread
    fit = scr.RatioFit.fit(sib, here)
    assert fit.b == pytest.approx(-0.1) and fit.pairs == 12
    assert fit.ratio(sib) == pytest.approx(here / sib)
    wild = scr.RatioFit(a=5.0, b=0.0, pairs=3)
    assert wild.ratio(np.array([1e-3])).tolist() == [scr.RATIO_CLIP[1]]


def test_sibling_targets_are_the_other_core_counts_of_this_cpu_and_none_for_rpc():
    dev = parse_cluster("cpu:2").devices[0]
    sibs = scr.sibling_targets(dev)
    assert measure_target(dev) not in sibs and len(sibs) == (os.cpu_count() or 1) - 1
    remote = SimpleNamespace(**{**vars(_two_core_device()), "rpc_key": "board"})
    assert scr.sibling_targets(remote) == []


def test_screen_measures_whole_models_samples_and_unknown_regions_and_scales_the_rest(monkeypatch):
    monkeypatch.setattr(scr, "sibling_targets", lambda device: [ONE])
    regions = [("onnxruntime", (k,)) for k in range(16)]
    cs = _set(regions + [("onnxruntime", tuple(range(16))), ("openvino", (0,)), ("openvino", (1,)),
                         ("onnxruntime", (0, 1))], n_nodes=16)
    todo = {(f"k{i}", c.backend): [i] for i, c in enumerate(cs)}
    seconds = {(f"k{i}", "onnxruntime", ONE): 1e-5 * (i + 1) for i in range(16)}
    seconds[("k3", "onnxruntime", ONE)] = -1.0  # no converter on one core: none on two
    seconds[("k16", "onnxruntime", ONE)] = 2e-3  # the whole model
    seconds.update({("k17", "openvino", ONE): 1e-5, ("k18", "openvino", ONE): 2e-5})
    now, screen = scr.screen(cs, _two_core_device(), _Cache(seconds), todo)
    assert screen is not None and screen.sibling == ONE
    # the whole model, a region never measured on one core (k19) and a backend of few regions: measured
    assert {"k16", "k19", "k17", "k18"} <= {k for k, _ in now}
    sample = [k for k, b in screen.sampled if b == "onnxruntime"]
    assert scr.SAMPLE_MIN <= len(sample) <= 15 // scr.SAMPLE_EVERY + 1 + scr.SAMPLE_MIN
    assert set(now) | set(screen.later) == set(todo) and not set(now) & set(screen.later)
    # the sample measured here at 0.6x its one-core time
    here = {(k, b, TWO): 0.6 * seconds[(k, b, ONE)] for k, b in screen.sampled}
    costs = np.full(len(cs), np.nan)
    infeasible = {}
    left = screen.fill(costs, _Cache({**seconds, **here}), TWO, infeasible)
    assert left == {}
    for (k, b), (idxs, _) in screen.later.items():
        i, = idxs
        if k == "k3":
            assert costs[i] == np.inf and infeasible[i] == "no converter"
        else:
            assert costs[i] == pytest.approx(0.6 * seconds[(k, b, ONE)], rel=1e-6)
    assert screen.scaled == len(screen.later) - 1 and screen.summary()["fits"]["onnxruntime"]["pairs"] == len(sample)


def test_a_backend_whose_sample_did_not_run_here_is_measured_instead(monkeypatch):
    monkeypatch.setattr(scr, "sibling_targets", lambda device: [ONE])
    cs = _set([("openvino", (k,)) for k in range(12)], n_nodes=20)
    todo = {(f"k{i}", "openvino"): [i] for i in range(12)}
    seconds = {(f"k{i}", "openvino", ONE): 1e-5 * (i + 1) for i in range(12)}
    now, screen = scr.screen(cs, _two_core_device(), _Cache(seconds), todo)
    costs = np.full(len(cs), np.nan)
    left = screen.fill(costs, _Cache(seconds), TWO, {})  # nothing of the sample measured on two cores
    assert set(left) == set(screen.later) and np.isnan(costs).all() and screen.scaled == 0


def test_no_sibling_record_leaves_everything_to_measure(monkeypatch):
    monkeypatch.setattr(scr, "sibling_targets", lambda device: [ONE])
    cs = _set([("onnxruntime", (0,)), ("onnxruntime", (1,))], n_nodes=2)
    todo = {("a", "onnxruntime"): [0], ("b", "onnxruntime"): [1]}
    assert scr.screen(cs, _two_core_device(), _Cache({}), todo) == (todo, None)


def test_the_one_device_shape_is_screened_only_after_the_flow_measured_as_auto_chose():
    measured = SimpleNamespace(costs=SimpleNamespace(auto=AutoChoice("measured", 1.0, 30.0, "")))
    hybrid = SimpleNamespace(costs=SimpleNamespace(auto=AutoChoice("hybrid", 90.0, 30.0, "")))
    given = SimpleNamespace(costs=SimpleNamespace(auto=None))
    auto, told = SimpleNamespace(costs="auto"), SimpleNamespace(costs="measured")
    assert one_device_costs(measured, auto) == "screened"
    assert one_device_costs(hybrid, auto) is None and one_device_costs(given, auto) is None
    assert one_device_costs(measured, told) is None  # the user's --costs measured times every candidate


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="a second core count needs a machine of two or more cores")
def test_screened_costs_of_a_model_scale_what_one_core_measured(tmp_path):
    import tvm_pesto
    from tvm_pesto.candidates.examples import tiny_cnn
    from tvm_pesto.candidates.flow import make_candidates

    an = tvm_pesto.analyze(tiny_cnn()[0])
    wide = parse_cluster("cpu:1")
    cs = make_candidates(an, wide, backends="onnxruntime,tvm")
    cache = MeasureCache(tmp_path / "m.jsonl")
    candidate_costs(cs, parse_cluster("cpu:2"), "measured", cache=cache)  # one core: every candidate
    first = len(cache)
    ct = candidate_costs(cs, wide, "screened", cache=cache)
    assert ct.screened["from"]["num-cores"] == 1 and ct.screened["scaled"] > 0
    fits = ct.summary()["screened"]["fits"]
    assert fits["onnxruntime"]["pairs"] >= scr.SAMPLE_MIN and fits["tvm"]["pairs"] >= scr.SAMPLE_MIN
    # every candidate has seconds: finite, or infinite with the reason
    assert all(np.isfinite(ct.table[i, 0]) != (i in ct.infeasible) for i in range(len(cs)))
    assert (ct.table[np.isfinite(ct.table[:, 0]), 0] > 0).all()
    # far fewer library regions timed on the second core count than on the first
    assert ct.measured < first / 2
