"""The placement pass in ``tvm.compile`` chooses as ``build`` does: on ``cpu:N`` of this
machine the flow's plan, its one-device shape and each library's whole model are measured,
and the module is the fastest; with ``deterministic=True`` or ``measure_final=False`` nothing
is measured. (The suite turns the final choice off by default, ``TVM_PESTO_MEASURE_FINAL=0`` in
conftest.py, so these ask for it.)"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_pesto
from tvm_pesto.candidates.examples import reference_output, tiny_cnn


def _run(pp, mod, x):
    ex = tvm.compile(tvm.transform.Sequential([pp])(mod))
    vm = relax.VirtualMachine(ex, [tvm.cpu(0), tvm.cpu(1)])
    return vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.slow
def test_the_pass_keeps_the_fastest_measured_option_and_runs_it_in_the_stock_vm():
    mod, (x,) = tiny_cnn()
    pp = tvm_pesto.PlacementPass("cpu:2", backends="tvm,onnxruntime", costs="roofline", measure_final=True)
    got = _run(pp, mod, x)
    np.testing.assert_allclose(got, reference_output(mod, (x,)), rtol=1e-4, atol=1e-4)
    assert pp.last_decision is not None
    d = pp.last_decision.to_json()
    assert d["measured"] and len(d["options"]) >= 3  # the plan, one device, the libraries
    chosen = next(o for o in d["options"] if o["name"] == d["chosen"])
    timed = [o["measured_s"] for o in d["options"] if o.get("measured_s") is not None]
    assert chosen["measured_s"] is not None and len(timed) >= 3
    # the module is the chosen option's: its plan, on its cluster
    assert pp.last_cluster.name == chosen["cluster"]
    assert pp.last_placement.plan.backend_mix() == chosen["backend_mix"]


@pytest.mark.slow
def test_a_deterministic_pass_measures_nothing():
    mod, (x,) = tiny_cnn()
    for pp in (tvm_pesto.PlacementPass("cpu:2", costs="roofline", deterministic=True, measure_final=True),
               tvm_pesto.PlacementPass("cpu:2", costs="roofline", measure_final=False)):
        got = _run(pp, mod, x)
        np.testing.assert_allclose(got, reference_output(mod, (x,)), rtol=1e-4, atol=1e-4)
        assert pp.last_decision is None and pp.last_cluster is pp.cluster
