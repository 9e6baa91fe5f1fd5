"""The hybrid cost source: predictions everywhere, measurements where the choice is close."""
import numpy as np

import tvm_pesto
from tvm_pesto.candidates.examples import tiny_cnn
from tvm_pesto.costs import candidate_costs
from tvm_pesto.costs.cache import MeasureCache
from tvm_pesto.costs.hybrid import uncertain_candidates


def test_hybrid_measures_the_close_calls_and_predicts_the_rest(tmp_path):
    mod, _ = tiny_cnn()
    an = tvm_pesto.analyze(mod)
    cl = tvm_pesto.parse_cluster("cpu:1")
    cs = tvm_pesto.make_candidates(an, cl, "all")
    cache = MeasureCache(tmp_path / "m.jsonl")
    hyb = candidate_costs(cs, cl, "hybrid", cache=cache)
    pred = candidate_costs(cs, cl, "xgb")
    picked = uncertain_candidates(an.op_graph, list(cs), pred.table)
    assert 0 < len(picked) < len(cs)
    assert hyb.columns == ["hybrid"] and hyb.predicted == len(cs) - len(picked)
    assert hyb.measured + hyb.cached <= len(picked) + 1  # (+1: the VM call overhead record)
    # the picked candidates carry measurements (the measured source agrees, from the same cache)
    meas = candidate_costs(cs, cl, "measured", cache=cache, calibrate=False)
    finite = [i for i in picked if np.isfinite(meas.table[i, 0])]
    np.testing.assert_allclose(hyb.table[finite, 0], meas.table[finite, 0], rtol=1e-12)
    # the others are predictions, corrected per backend by what was measured
    rest = sorted(set(range(len(cs))) - set(picked))
    assert not np.allclose(hyb.table[rest, 0], meas.table[rest, 0])
    assert hyb.saved_s > 0
