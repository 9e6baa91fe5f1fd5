"""The hybrid cost source: predictions everywhere, measurements where the choice is close."""
import math

import numpy as np
import pytest

import tvm_pesto
from tvm_pesto.candidates.examples import tiny_cnn
from tvm_pesto.costs import candidate_costs
from tvm_pesto.costs.store.cache import MeasureCache
from tvm_pesto.costs.predict.hybrid import (
    DEFAULT_FRACTION, PLAN_TAIL_SHARE, candidate_keys, hybrid_costs, plan_units_to_measure, stakes, uncertain_candidates,
)
from tvm_pesto.errors import CostError, UnseenOpsWarning


@pytest.fixture(scope="module")
def tiny():
    mod, _ = tiny_cnn()
    an = tvm_pesto.analyze(mod)
    cl = tvm_pesto.parse_cluster("cpu:1")
    return an, cl, tvm_pesto.make_candidates(an, cl, "all")


@pytest.mark.slow
def test_hybrid_measures_the_close_calls_and_predicts_the_rest(tiny, tmp_path):
    an, cl, cs = tiny
    cache = MeasureCache(tmp_path / "m.jsonl")
    hyb = hybrid_costs(cs, cl, cache=cache, fraction=None)  # every candidate with a stake
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


@pytest.mark.slow
def test_the_default_measures_a_fraction_of_the_distinct_candidates(tiny, tmp_path):
    an, cl, cs = tiny
    keys = candidate_keys(cs)
    assert len(set(keys)) < len(keys)  # repeated shapes share a key (and a measurement)
    hyb = candidate_costs(cs, cl, "hybrid", cache=MeasureCache(tmp_path / "m.jsonl"))
    budget = math.ceil(DEFAULT_FRACTION * len(set(keys)))
    assert 0 < hyb.measured <= budget + 1  # (+1: the VM call overhead record)
    pred = candidate_costs(cs, cl, "xgb").table
    picked = uncertain_candidates(an.op_graph, list(cs), pred, fraction=DEFAULT_FRACTION, keys=keys)
    assert len({keys[i] for i in picked}) == budget
    # the picked keys are those with the largest stakes
    st = stakes(an.op_graph, list(cs), pred)
    total = {}
    for i, k in enumerate(keys):
        total[k] = total.get(k, 0.0) + st[i]
    least_picked = min(total[keys[i]] for i in picked)
    assert all(w <= least_picked for k, w in total.items() if k not in {keys[i] for i in picked})
    assert hyb.predicted == len(cs) - len(picked)


def test_a_fraction_outside_zero_to_one_is_refused(tiny):
    an, _, cs = tiny
    with pytest.raises(CostError, match="fraction"):
        uncertain_candidates(an.op_graph, list(cs), np.ones((len(cs), 1)), fraction=1.5)


@pytest.mark.slow
def test_place_with_hybrid_costs_measures_the_plan_and_plans_again(tiny, tmp_path):
    an, cl, cs = tiny
    pl = tvm_pesto.place(an, cl, costs="hybrid", cache=MeasureCache(tmp_path / "m.jsonl"), deterministic=True)
    ct = pl.costs
    rounds = ct.hybrid["rounds"]
    assert rounds[0]["why"] == "stakes" and all(r["why"] == "plan" for r in rounds[1:])
    # the rounds chose what to measure with HEFT's plans; the plan is auto's, of the last table
    assert pl.plan.info["decided_by"] and pl.plan.info["bound_s"] is not None
    spent = sum(r["keys"] for r in rounds)
    assert spent <= ct.hybrid["budget"] and ct.measured <= ct.hybrid["budget"] + 1
    # the rounds stopped because the plan is measured, or because the budget is spent
    meas = candidate_costs(cs, cl, "measured", cache=MeasureCache(tmp_path / "m.jsonl"), calibrate=False).table
    pos = {id(c): i for i, c in enumerate(pl.joint.candidates)}
    units = [pos[id(u)] for u in pl.plan.units]
    measured_units = [i for i in units if np.isfinite(meas[i, 0]) and np.isclose(ct.table[i, 0], meas[i, 0])]
    left = sum(ct.table[i, 0] for i in units if i not in measured_units)  # the plan's cheap tail, at most
    assert left <= PLAN_TAIL_SHARE * sum(ct.table[i, 0] for i in units) + 1e-12 or spent == ct.hybrid["budget"]
    # the placement's cost table is the one of the last round: the plan simulated under it
    # (a problem built afresh from the table) gives the placement's makespan
    from tvm_pesto.plan import JointProblem, simulate

    again = JointProblem(an.op_graph, cl, list(cs), ct.table).contract(units)
    assert np.isclose(simulate(again, pl.plan).makespan, pl.sim.makespan, rtol=1e-9)


def test_the_plan_rounds_skip_the_units_too_cheap_to_matter():
    """Units whose costs together are 2 % of the plan or less are not measured (their whole
    cost is inside the plan's noise); the rest go costliest first, what is measured drops out."""
    t = np.array([[100e-6], [0.2e-6], [0.3e-6], [6e-6], [120e-6], [1.5e-6]])
    assert plan_units_to_measure(t, range(6)) == [4, 0, 3]  # 0.2 + 0.3 + 1.5 us: 0.9 % of 228 us
    assert plan_units_to_measure(t, range(6), tail_share=0.0) == [4, 0, 3, 5, 2, 1]
    assert plan_units_to_measure(t, range(6), done=[4, 0]) == [3]
    even = np.full((60, 1), 1e-6)  # 60 equal units: one fits in the 2 % tail, 59 are measured
    assert len(plan_units_to_measure(even, range(60))) == 59
    assert plan_units_to_measure(np.array([[1.0, np.inf]]), [0]) == [0]  # the largest finite entry


def _decoder():
    """relu(conv2d_transpose(x, W)) + 1: an op (the transposed convolution) a model trained on
    tiny_cnn's subgraphs never saw."""
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 8), "float32"))
    w = relax.const(rng.standard_normal((8, 4, 3, 3)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d_transpose(x, w, strides=2, padding=1)))
            y = bb.emit_output(relax.op.add(h, relax.const(1.0, "float32")))
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.slow
def test_ops_the_model_never_trained_on_are_said_and_measured_first(tiny, tmp_path, monkeypatch):
    """A model trained on tiny_cnn's subgraphs only: the xgb table names the decoder's
    ``conv2d_transpose`` candidates as unseen, and hybrid measures their contenders before any
    stake, keeping them out of the backend bias."""
    from tvm_pesto.costs.predict.features import describe_group, device_descriptor
    from tvm_pesto.costs.predict.hybrid import Hybrid, unseen_contenders
    from tvm_pesto_lab.fit import train

    an, cl, cs = tiny
    dev = device_descriptor(cl.devices[0])
    rows = [{"desc": describe_group(an.op_graph, c.nodes), "device": dev, "backend": c.backend, "tuned": 0.0,
             "time_s": 1e-6 * (1 + len(c.nodes)), "model": "tiny", "key": str(k)} for k, c in enumerate(cs)]
    model = train(rows, rounds=10)
    assert "relax.nn.conv2d_transpose" not in model.meta["ops"] and "relax.nn.conv2d" in model.meta["ops"]
    model.save(tmp_path / "m.json")
    monkeypatch.setenv("TVM_PESTO_COST_MODEL", str(tmp_path / "m.json"))
    monkeypatch.setenv("TVM_PESTO_MACHINE_CALIBRATION", "off")
    dec = tvm_pesto.analyze(_decoder())
    dcs = tvm_pesto.make_candidates(dec, cl, "all")
    with pytest.warns(UnseenOpsWarning, match="never trained on .*conv2d_transpose.*hybrid"):
        pred = candidate_costs(dcs, cl, "xgb")
    holders = {i for i, c in enumerate(dcs)
               if any(dec.op_graph.nodes[n].op == "relax.nn.conv2d_transpose" for n in c.nodes)}
    assert holders and set(pred.unseen) == holders
    assert pred.summary()["unseen_ops"] == {"relax.nn.conv2d_transpose": len(holders)}
    first = unseen_contenders(dec.op_graph, list(dcs), pred.table, pred.unseen, top_k=2)
    assert set(first) <= holders and 0 < len(first) <= 2 * len(dec.op_graph.nodes)
    h = Hybrid(dcs, cl, cache=MeasureCache(tmp_path / "c.jsonl"), fraction=1.0).measure_stakes(1.0, top_k=2)
    assert h.rounds[0]["why"] == "unseen-ops" and set(first) <= h.done
    for key, f in h.corrections.items():  # each backend's bias is from the descriptions of ops it knew
        j, b = key.split(":")
        sel = {h.keys[i]: i for i in h.done if dcs[i].backend == b and i not in h.unseen
               and np.isfinite(h.table[i, int(j)])}
        assert f == pytest.approx(float(np.median([h.table[i, int(j)] / h.raw[i, int(j)] for i in sel.values()])))
    ct = h.cost_table()
    assert set(ct.prediction_fit) <= set(range(len(h.columns)))  # what its predictions carry
    assert not set(ct.unseen) & h.done  # what is still a guess is said; the measured are not guesses


def test_the_run_report_names_ops_never_trained_on():
    """The CLI's run report says which op kinds the cost model never saw, and what to do."""
    from tvm_pesto.cli.main import _print_run
    from tvm_pesto.cli.progress import console

    res = {"model": "dec", "source": "pt2", "num_ops": 3, "num_candidates": 5, "num_units": 2, "solver": "heft",
           "solver_status": "heuristic", "cluster": "cpu:2", "cost_source": "xgb", "backend_mix": {"tvm": 3},
           "devices_used": [0], "simulated_s": 1e-3, "measured_s": 1e-3, "measured_over_simulated": 1.0,
           "max_abs_err": 0.0, "costs": {"source": "xgb", "measured": 0, "cached": 0, "predicted": 5,
                                         "unseen_ops": {"relax.nn.conv2d_transpose": 2}, "unseen_candidates": 2}}
    with console.capture() as cap:
        _print_run(res)
    text = " ".join(cap.get().split())
    assert "never trained on nn.conv2d_transpose" in text and "2 candidates" in text and "--costs hybrid" in text
    res["costs"]["unseen_ops"] = {}
    with console.capture() as cap:
        _print_run(res)
    assert "never trained on" not in cap.get()


def test_a_run_far_from_its_prediction_points_at_the_calibration_and_its_age():
    """A run whose predicted plan measured more than 15 % off names the calibration applied,
    when it was fitted, and the command that refits it; a close run or measured costs say nothing."""
    from tvm_pesto.cli.main import _stale_calibration_hint

    cal = {"0": {"onnxruntime": {"a": 1.25, "b": 0.0, "file": "/c/m.json", "fitted_at": "2026-12-02T18:02:51+0000"},
                 "tvm": {"a": 1.2, "b": 0.0, "file": "/c/m.json", "fitted_at": "2026-12-02T18:02:51+0000"}}}
    res = {"measured_over_simulated": 0.8, "costs": {"source": "xgb", "prediction_fit": cal}}
    hint = _stale_calibration_hint(res)
    assert "0.80x" in hint and "/c/m.json (fitted 2026-12-02T18:02:51+0000)" in hint and "cost-model calibrate" in hint
    assert hint.count("/c/m.json") == 1  # one file, said once
    assert _stale_calibration_hint({**res, "measured_over_simulated": 1.1}) is None
    assert _stale_calibration_hint({**res, "costs": {"source": "measured", "native_scale": {"0": 1.1}}}) is None
    assert "no calibration was applied" in _stale_calibration_hint({**res, "costs": {"source": "xgb", "prediction_fit": {}}})
    # hybrid's table keeps its rounds beside the calibration its predictions carry
    hybrid = {"source": "hybrid", "prediction_fit": cal, "hybrid": {"bias": {"0:tvm": 0.9}, "budget": 4, "rounds": []}}
    assert "/c/m.json (fitted 2026-12-02T18:02:51+0000)" in _stale_calibration_hint({**res, "costs": hybrid})


@pytest.mark.parametrize("keys, bias", [(["a"] * 4 + ["b", "c"], 1.0), (["a"] * 4 + ["b", "b"], None)])
def test_a_repeated_layer_is_one_sample_of_a_backends_bias(keys, bias):
    # mixnet_s at 224x224: eight copies of one split measured 4x under its prediction and one
    # other description made TVM's bias 0.23, and every TVM candidate was priced 4x low. One
    # ratio per description: three descriptions give the median of three; two give no correction
    from types import SimpleNamespace

    from tvm_pesto.costs.predict.hybrid import Hybrid

    h = Hybrid.__new__(Hybrid)
    h.cs, h.present, h.unseen, h.corrections = [SimpleNamespace(backend="tvm")] * 7, [0], {}, {}
    h.keys, h.done = keys + ["d"], set(range(6))
    h.raw = np.ones((7, 1))
    h.table = np.array([[0.25]] * 4 + [[1.0], [1.2] if keys[5] == "c" else [1.0], [1.0]])
    h.correct_bias(min_samples=3)
    assert h.corrections == ({} if bias is None else {"0:tvm": bias})
    assert h.table[6, 0] == (1.0 if bias is None else bias)  # the unmeasured candidate


@pytest.mark.slow
def test_whole_model_candidates_left_to_the_caller_are_never_measured(tiny, tmp_path, monkeypatch):
    # build's final choice times each library's whole model as an option: with leave_whole the
    # hybrid source predicts those predicted slow enough to cost seconds to measure (at 224x224)
    from tvm_pesto.costs.predict import hybrid

    an, cl, cs = tiny
    whole = cs.whole_model()
    assert whole and all(len(cs[i].nodes) == an.op_graph.num_nodes for i in whole)
    quick = hybrid.Hybrid(cs, cl, cache=MeasureCache(tmp_path / "q.jsonl"), fraction=None, leave_whole=True)
    assert not quick.left_whole  # a tiny model's whole model is measured all the same: a fraction of a second
    monkeypatch.setattr(hybrid, "LEAVE_WHOLE_FROM_S", 0.0)  # as if each took seconds a call
    left = tvm_pesto.costs.predict.hybrid.Hybrid(cs, cl, cache=MeasureCache(tmp_path / "a.jsonl"), fraction=None,
                                                 leave_whole=True)
    left.measure_stakes(1.0)
    assert left.measure(whole, why="plan") == [] and not set(whole) & left.done
    assert left.cost_table().hybrid["left_whole"] == len(whole)
    asked = tvm_pesto.costs.predict.hybrid.Hybrid(cs, cl, cache=MeasureCache(tmp_path / "b.jsonl"), fraction=None)
    assert sorted(asked.measure(whole, why="plan")) == sorted(whole)  # without it they are measured


@pytest.mark.parametrize("measure_final, left", [(True, True), (False, False)])
def test_build_leaves_the_whole_models_to_its_final_choice_only_when_it_times_them(monkeypatch, measure_final, left):
    from tvm_pesto import placing

    seen = []
    real = placing.place
    monkeypatch.setattr(placing, "place", lambda *a, **k: seen.append(k.get("leave_whole")) or real(*a, **k))
    mod, _ = tiny_cnn()
    tvm_pesto.build(mod, "cpu:2", costs="roofline", solver="heft", measure_final=measure_final).close()
    assert seen and all(s is left for s in seen)
