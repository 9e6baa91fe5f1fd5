"""Measurement that stays within time and memory on a large model: slow TVM groups end at
one call, library units are built in batches and released, a hopeless whole model is not
timed for calibration."""
import json
from types import SimpleNamespace

import numpy as np
import pytest
from tvm.script import ir as I
from tvm.script import relax as R

import tvm_pesto
from tvm_pesto.backends import get_backend
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.costs import MeasureCache
from tvm_pesto.costs.measure import measured
from tvm_pesto.costs.measure import timing as measure_mod


@I.ir_module
class BigMatmul:
    @R.function
    def main(x: R.Tensor((512, 512), "float32")):
        with R.dataflow():
            y = R.matmul(x, x)
            R.output(y)
        return y


def _records(path):
    return [json.loads(s) for s in path.read_text().splitlines() if "__vm_call_overhead__" not in s]


def test_a_group_slower_than_its_cap_is_timed_by_one_call_and_others_in_bursts(tmp_path):
    an = tvm_pesto.analyze(BigMatmul)
    dev = parse_cluster("cpu:1").devices[0]
    capped = tmp_path / "capped.jsonl"
    t = measure_mod.measure_groups(an.rg, an.groups, dev, MeasureCache(capped), repeat=3, caps=[1e-9] * len(an.groups))
    rec, = _records(capped)
    # a 512^3 matmul takes over CAP_MIN_S in any build: its second call is its time
    assert rec["timing"] == {"method": "one call", "cap_s": 1e-9} and len(rec["repeats"]) == 1
    assert rec["median_s"] > measure_mod.CAP_MIN_S and t[0] > 0
    free = tmp_path / "free.jsonl"
    measure_mod.measure_groups(an.rg, an.groups, dev, MeasureCache(free), repeat=3, caps=[None] * len(an.groups))
    rec, = _records(free)
    assert rec["timing"]["method"] == "interleaved" and len(rec["repeats"]) == 3


class _Set(list):
    rg = None


def _set(specs, weights=100):
    cs = _Set(SimpleNamespace(backend=b, nodes=tuple(n)) for b, n in specs)
    cs.rg = SimpleNamespace(graph=SimpleNamespace(nodes=[SimpleNamespace(param_bytes=weights) for _ in range(6)]))
    return cs


def test_a_groups_cap_is_slow_factor_times_the_cheapest_library_candidate_holding_it():
    cs = _set([("tvm", (0, 1)), ("tvm", (2,)), ("tvm", (5,)),
               ("onnxruntime", (0, 1, 2)), ("openvino", (0, 1, 2, 3)), ("onnxruntime", (1, 2))])
    costs = np.array([np.nan, np.nan, np.nan, 2e-3, 1e-3, np.inf])
    caps = measured._caps(cs, [0, 1, 2], costs)
    f = measured.SLOW_FACTOR
    # group (0, 1) sits in both regions: the cheaper bounds it; (2,) also in the infeasible (1, 2): ignored;
    # nothing holds (5,): no cap, it is timed as always
    assert caps == [pytest.approx(f * 1e-3), pytest.approx(f * 1e-3), None]


def test_library_entries_are_measured_in_batches_of_at_most_the_models_weights(monkeypatch):
    monkeypatch.setattr(measured, "BATCH_BYTES", 1)  # a model whose weights are over BATCH_BYTES
    cs = _set([("onnxruntime", (0, 1, 2)), ("onnxruntime", (3, 4, 5)), ("openvino", (0, 1, 2, 3, 4, 5)),
               ("openvino", (0,))])
    todo = {(f"k{i}", c.backend): [i] for i, c in enumerate(cs)}
    batches = [list(b) for b in measured._batches(cs, todo)]
    # the model holds 600 bytes: the two halves share a batch, the whole model is one alone
    assert [[k for k, _ in b] for b in batches] == [["k0", "k1"], ["k2"], ["k3"]]
    assert sum(len(b) for b in batches) == len(todo)
    monkeypatch.setattr(measured, "BATCH_BYTES", 1 << 20)  # a small model's candidates: one batch
    assert [list(b) for b in measured._batches(cs, todo)] == [list(todo)]


def test_a_measurement_releases_the_units_it_built_and_keeps_those_built_before(tmp_path):
    from tvm_pesto.candidates.examples import tiny_mlp
    from tvm_pesto.candidates.flow import make_candidates

    an = tvm_pesto.analyze(tiny_mlp()[0])
    cs = make_candidates(an, "cpu:1", backends="onnxruntime,tvm").subset(lambda c: c.backend == "onnxruntime")
    dev = parse_cluster("cpu:1").devices[0]
    ort = get_backend("onnxruntime")
    ort.release()
    from tvm_pesto.candidates import candidate_function

    kept = candidate_function(an.rg, cs[0].nodes, lift_constants=False).func
    gname = ort.build(kept, dev)  # a unit some placed model built before
    costs = measured.measure_candidates(cs, dev, MeasureCache(tmp_path / "m.jsonl"), repeat=2, min_repeat_ms=1)
    assert np.isfinite(costs).all() and len(cs) > 1
    assert ort.is_built(kept, dev) and ort.built(gname).name == gname
    others = [candidate_function(an.rg, c.nodes, lift_constants=False).func for c in list(cs)[1:]]
    assert not any(ort.is_built(f, dev) for f in others)
    ort.release()


def test_a_whole_model_of_seconds_or_far_slower_than_a_library_is_not_timed_for_calibration():
    worth = measured._worth_timing_whole
    assert worth(0.01, [np.inf]) and worth(0.01, [0.005]) and worth(0.01, [])
    assert not worth(measured.WHOLE_MAX_S * 1.01, [])
    assert not worth(0.01, [0.01 / (measured.SLOW_FACTOR + 0.1), 1.0])
