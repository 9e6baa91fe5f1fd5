"""``costs="auto"``: every candidate measured while that is affordable, ``hybrid`` beyond."""
import dataclasses

import numpy as np
import pytest

import tvm_pesto
from tvm_pesto.candidates.examples import tiny_cnn, tiny_mlp
from tvm_pesto.costs import auto as auto_mod
from tvm_pesto.costs.auto import ENTRY_S, auto_source, measuring_estimate_s
from tvm_pesto.costs.store.cache import MeasureCache
from tvm_pesto.placing import cost_candidates, place_from_costs


def _cands(mod, spec):
    an = tvm_pesto.analyze(mod)
    cl = tvm_pesto.parse_cluster(spec)
    return tvm_pesto.make_candidates(an, cl, "all"), cl


def test_the_estimate_counts_each_description_once_per_device_size():
    cs, cl = _cands(tiny_cnn()[0], "cpu:2")  # two one-core devices: one size, measured once
    one = measuring_estimate_s(cs, cl)
    assert one > ENTRY_S
    assert measuring_estimate_s(cs, tvm_pesto.parse_cluster("cpu:1")) > 0
    # the same candidates on a cluster of two device sizes are measured twice
    two = tvm_pesto.parse_cluster("cpu:2")
    two = dataclasses.replace(two, devices=[two.devices[0], dataclasses.replace(two.devices[1], cores=2)])
    assert measuring_estimate_s(cs, two) > 1.5 * one


def test_a_larger_input_is_estimated_longer_to_measure():
    small, cl = _cands(tiny_cnn(size=12)[0], "cpu:1")
    big, _ = _cands(tiny_cnn(size=96)[0], "cpu:1")
    assert measuring_estimate_s(big, cl) > measuring_estimate_s(small, cl)


def test_auto_measures_within_the_budget_and_takes_hybrid_beyond():
    cs, cl = _cands(tiny_mlp()[0], "cpu:2")
    est = measuring_estimate_s(cs, cl)
    assert auto_source(cs, cl, budget_s=est + 1).source == "measured"
    over = auto_source(cs, cl, budget_s=est / 4)
    assert over.source == "hybrid" and over.estimate_s == pytest.approx(est, abs=0.1)
    assert "--costs measured" in over.reason  # the way back to timing every candidate


def test_auto_predicts_devices_not_on_this_machine_and_measures_rpc_devices():
    cs, cl = _cands(tiny_mlp()[0], "2xV100-nvlink")
    assert auto_source(cs, cl).source == "xgb"
    cs, cl = _cands(tiny_mlp()[0], "cpu:1")
    remote = dataclasses.replace(cl, devices=[dataclasses.replace(d, rpc_tracker="127.0.0.1:9190", rpc_key="k")
                                              for d in cl.devices])
    assert auto_source(cs, remote, budget_s=0.0).source == "measured"  # hybrid measures only local devices


@pytest.mark.slow
def test_cost_candidates_over_the_budget_place_with_hybrid_costs(tmp_path, monkeypatch):
    monkeypatch.setattr(auto_mod, "MEASURE_BUDGET_S", 0.0)  # every model is over it
    mod, _ = tiny_cnn()
    costed = cost_candidates(mod, "cpu:1", costs="auto", cache=MeasureCache(tmp_path / "m.jsonl"))
    ct = costed.costs
    assert ct.auto is not None and ct.auto.source == "hybrid"
    assert ct.columns == ["hybrid"] and ct.predicted > 0 and costed.hybrid is not None
    assert np.isfinite(ct.table).any() and ct.summary()["auto"]["source"] == "hybrid"
    pl = place_from_costs(costed, "heft")  # the plan's rounds measure more; the table still says why
    assert pl.costs.auto.source == "hybrid" and pl.costs.columns == ["hybrid"]
    monkeypatch.setattr(auto_mod, "MEASURE_BUDGET_S", 1e9)  # and every model within it
    costed = cost_candidates(mod, "cpu:1", costs="auto", cache=MeasureCache(tmp_path / "m2.jsonl"))
    assert costed.costs.auto.source == "measured" and costed.costs.columns == ["measured"]
