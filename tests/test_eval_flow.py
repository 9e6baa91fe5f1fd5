"""``cost-model eval --flow``: the xgb cost source scored on fused groups measured on this machine,
and the whole-model calibration (fit, storage next to the model, application by the xgb source)."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

import tvm_pesto
from tvm_pesto.backends.registry import available_backends
from tvm_pesto.candidates.examples import tiny_cnn, tiny_mlp
from tvm_pesto.candidates.flow import make_candidates
from tvm_pesto_lab.cli import cost_model
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.costs import candidate_costs
from tvm_pesto.costs.calibrate.machine import calibration_units
from tvm_pesto.costs.predict.calibration import (
    CALIBRATION_ENV,
    FORMAT,
    Calibration,
    calibration_path,
    file_sha256,
    fit_affine,
    fit_calibration,
    load_calibration,
)
from tvm_pesto.costs.predict.features import device_descriptor, device_key
from tvm_pesto.costs.predict.xgb import default_model_path, load_model
from tvm_pesto.costs.store.cache import MeasureCache
from tvm_pesto.errors import CostError, PestoError
from tvm_pesto_lab.flow_eval import FlowEvalSettings, flow_eval, flow_models
from tvm_pesto_lab.sweep import sweep_module

FLOOR = 2e-7


def dev() -> str:
    """The key of cpu:2's devices, ``cpu/host-cpu/1@<CPU kind>`` on a 2-core machine: of the
    kind in force now (the ``cpu_kind`` fixture sets one)."""
    return device_key(device_descriptor(parse_cluster("cpu:2").devices[0]))


def _loads(value):
    return lambda: (value, value, value)


@pytest.fixture(scope="module")
def measured(tmp_path_factory, cpu_kind):
    """Two tiny models measured for real on cpu:2 (fresh cache), at a quiet load, and scored
    as a CPU of each kind of ``cpu_kind``."""
    cache = MeasureCache(tmp_path_factory.mktemp("flow") / "m.jsonl")
    mods = {"cnn": tiny_cnn()[0], "mlp": tiny_mlp()[0]}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "getloadavg", _loads(0.25))
        res = flow_eval(mods, "cpu:2", cache=cache)
    return res, mods, cache


@pytest.mark.slow
def test_flow_eval_scores_real_fused_groups(measured, cpu_kind):
    res, mods, cache = measured
    json.dumps(res)  # JSON-ready as returned
    assert res["kind"] == "flow" and res["cluster"] == "cpu:2" and res["devices"] == [dev()]
    assert res["high_load"] is False and res["high_load_models"] == []
    # the bundled calibration (the suite turns the machine's fit off) has entries for the kinds it
    # was fitted on (one-core devices): other kinds and sizes are left as predicted
    entries = [bk for bk, dk in load_calibration(load_model()).entries if dk == dev()]
    if cpu_kind.calibrated and dev().startswith("cpu/host-cpu/1@"):
        assert "tvm" in entries
    elif not cpu_kind.calibrated:
        assert entries == []
    for name, mod in mods.items():
        r = res["flow"][name]
        a = tvm_pesto.analyze(mod)
        assert r["n_groups"] == len(a.groups) == r["n"] and r["calibrated"] is True and r["in_fit"] is False
        assert r["raw"]["calibrated"] is False
        for k in ("mape", "median_ape", "sum_ratio", "sum_pred_s", "sum_meas_s"):
            assert isinstance(r[k], float) and r[k] > 0, k
        assert r["spearman"] is None or -1.0 <= r["spearman"] <= 1.0
        assert r["load"]["label_1min"] == 0.25 and r["load"]["known"] is True and r["high_load"] is False
        assert r["measured"] > 0  # labels were measured in this call
        # the figures are those of the product's path: estimate_costs with the same cache, calibrated as
        # the xgb source calibrates (the bundled calibration: the suite turns the machine's fit off) ...
        meas, _ = tvm_pesto.estimate_costs(a, "cpu:2", "measured", cache=cache)
        for fig, calibrate in ((r, True), (r["raw"], False)):  # ... and raw
            pred, _ = tvm_pesto.estimate_costs(a, "cpu:2", "xgb", calibrate=calibrate)
            assert np.isclose(fig["sum_ratio"], pred[:, 0].sum() / meas[:, 0].sum())
            ape = np.abs(pred[:, 0] - meas[:, 0]) / meas[:, 0]
            assert np.isclose(fig["mape"], 100 * ape.mean())
        if entries:
            assert r["mape"] != r["raw"]["mape"]  # the calibration changed something
        else:
            assert (r["mape"], r["sum_ratio"]) == (r["raw"]["mape"], r["raw"]["sum_ratio"])  # nothing to apply
        # the whole model's measured time is what the groups add up to
        assert r["whole_model_factor"]["0"] > 0
        c = r["calibrated_heldout"]
        assert c["calibrated"] is True and c["fit_models"] == [n for n in mods if n != name]
        assert isinstance(c["mape"], float) and isinstance(c["sum_ratio"], float)
        assert c["entries"][0]["backend"] == "tvm" and c["entries"][0]["device"] == dev()
    assert res["calibration"]["fitted"] is True and res["calibration"]["applied"] == str(calibration_path(
        default_model_path()).resolve())
    assert set(res["pooled"]) == {"applied", "raw", "calibrated_heldout"}
    assert set(res["targets"]) == {"applied", "raw", "calibrated_heldout"}
    assert set(res["targets"]["raw"]) == {"models", "mape_met", "sum_met", "all_met"}


@pytest.mark.slow
def test_flow_scores_the_library_units_per_backend(measured):
    """Each library backend's units (those covering one fused group, and its largest) are
    measured and predicted as the product's path gives them, scored per backend."""
    res, mods, cache = measured
    cl = parse_cluster("cpu:2")
    available = {b.name for b in available_backends()[0]} - {"tvm"}
    assert available and set(res["library"]) <= available
    per_backend: dict = {}
    for name, mod in mods.items():
        a = tvm_pesto.analyze(mod)
        units = calibration_units(make_candidates(a, cl, "all"), a.groups).subset(lambda c: c.backend != "tvm")
        meas = candidate_costs(units, cl, "measured", cache=cache, in_run=False).table[:, 0]  # in a loop, as
        pred = candidate_costs(units, cl, "xgb", in_run=False).table[:, 0]  # the xgb source predicts it, calibrated
        for b in {c.backend for c in units}:
            rows = [i for i, c in enumerate(units) if c.backend == b and np.isfinite(meas[i]) and meas[i] > 0]
            if not rows:  # e.g. ONNX Runtime's parallel mode on one-core devices: nothing to score
                assert b not in res["flow"][name]["library"]
                continue
            fig = res["flow"][name]["library"][b]
            assert fig["n"] == len(rows)
            ape = np.abs(pred[rows] - meas[rows]) / meas[rows]
            assert np.isclose(fig["mape"], 100 * ape.mean()) and "mape" in fig["raw"]
            per_backend.setdefault(b, []).append(name)
    assert {b: r["models"] for b, r in res["library"].items()} == per_backend
    assert all(r["n"] == sum(res["flow"][n]["library"][b]["n"] for n in r["models"]) for b, r in res["library"].items())


@pytest.mark.slow
def test_flow_library_backends_are_chosen_and_checked_first(monkeypatch):
    import tvm_pesto_lab.flow_eval as fe

    measured_models = []
    monkeypatch.setattr(fe, "_score_model", lambda name, mod, run: measured_models.append(name))
    with pytest.raises(PestoError, match="unknown backend 'nope'"):
        flow_eval({"mlp": tiny_mlp()[0]}, "cpu:2", settings=FlowEvalSettings(calibrate=False, backends="tvm,nope"))
    assert measured_models == []  # refused before anything was measured
    monkeypatch.undo()
    monkeypatch.setattr(os, "getloadavg", _loads(0.25))
    res = flow_eval({"mlp": tiny_mlp()[0]}, "cpu:2", settings=FlowEvalSettings(calibrate=False, backends="tvm"))
    assert res["library"] == {} and res["flow"]["mlp"]["library"] == {}
    res = CliRunner().invoke(cost_model, ["eval", "--backends", "onnxruntime"])
    assert isinstance(res.exception, PestoError) and "add --flow" in str(res.exception)


@pytest.mark.slow
def test_flow_fits_this_machines_calibration_first_as_estimate_costs_does(measured, monkeypatch):
    """Where the xgb source would fit this machine's calibration before its first costs, the
    flow does too, and scores what that calibration then gives (here: the bundled one)."""
    import tvm_pesto.costs.calibrate.machine as machine

    _, mods, cache = measured
    fits = []
    monkeypatch.setattr(machine, "needs_fit", lambda model, cluster: True)
    monkeypatch.setattr(machine, "calibrate_machine", lambda cluster, model, announce=False: fits.append(cluster.name))
    res = flow_eval(mods, "cpu:2", cache=cache)
    assert fits == ["cpu:2"]
    assert res["calibration"]["applied"] and all(r["calibrated"] for r in res["flow"].values())
    fits.clear()
    res = flow_eval(mods, "cpu:2", cache=cache, settings=FlowEvalSettings(calibrate=False))
    assert fits == [] and res["calibration"]["applied"] is None
    assert all(r["mape"] == r["raw"]["mape"] and r["calibrated"] is False for r in res["flow"].values())


@pytest.mark.slow
def test_high_load_is_flagged_and_strict_refuses(measured, monkeypatch):
    _, mods, cache = measured
    monkeypatch.setattr(os, "getloadavg", _loads(3.5))
    # labels cached: no new measurement
    res = flow_eval(mods, "cpu:2", cache=cache, settings=FlowEvalSettings(calibrate=False))
    assert res["high_load"] is True and res["high_load_models"] == sorted(mods)
    assert "above load 1.0" in res["load_note"]
    assert all(r["high_load"] and r["load"]["label_1min"] == 3.5 for r in res["flow"].values())
    assert res["load_unknown_models"] == sorted(mods)  # a given cache: labels from earlier
    assert res["calibration"]["fitted"] is False and "calibrated_heldout" not in res["flow"]["cnn"]
    with pytest.raises(CostError, match=r"load average 3\.50 is above 1\.0.*quieter machine"):
        flow_eval(mods, "cpu:2", cache=cache, settings=FlowEvalSettings(strict=True))
    res = flow_eval(mods, "cpu:2", cache=cache, settings=FlowEvalSettings(calibrate=False, max_load=4.0))
    assert res["high_load"] is False


@pytest.mark.slow
def test_label_runs_take_the_median_and_say_how_far_the_runs_differ(monkeypatch, tmp_path):
    import tvm_pesto_lab.flow_eval as fe

    real, calls, first = fe.candidate_costs, [], {}

    def measured_thrice_as_slow_the_second_time(cs, cluster, source, **kw):  # a drifting machine
        ct = real(cs, cluster, source, **kw)
        calls.append(kw["cache"].path)
        if len(calls) == 1:
            first["table"] = ct.table.copy()
        else:  # the first run's labels, three times over
            ct.table = first["table"] * 3.0
        return ct

    monkeypatch.setattr(fe, "candidate_costs", measured_thrice_as_slow_the_second_time)
    monkeypatch.setattr(os, "getloadavg", _loads(0.25))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    mods = {"mlp": tiny_mlp()[0]}
    once = flow_eval(mods, "cpu:2", settings=FlowEvalSettings(calibrate=False, backends="tvm"))  # groups' labels only
    calls.clear()
    res = flow_eval(mods, "cpu:2", settings=FlowEvalSettings(calibrate=False, label_runs=2, backends="tvm"))
    col = first["table"][:, 0]  # cpu:2: two devices of one size, scored once (the first)
    sum_first = float(col[np.isfinite(col)].sum())
    assert len(calls) == 2 and calls[0] != calls[1]  # each run measured into a fresh log
    assert all(str(p).startswith(str(scratch)) for p in calls) and not any(scratch.iterdir())  # and removed
    n = res["flow"]["mlp"]["label_noise"]
    assert n["runs"] == 2 and n["rerun_sum_ratio"] == [pytest.approx(3.0)]
    assert n["rerun_mape"] == pytest.approx(200.0) and n["above_target"] is True
    assert res["label_noise"]["above_target_models"] == ["mlp"]
    assert res["label_noise"]["rerun_mape"] == pytest.approx(200.0)
    # the labels are the median of the runs (of two: their mean, twice the first run here)
    assert res["flow"]["mlp"]["sum_meas_s"] == pytest.approx(2.0 * sum_first)
    assert "label_noise" not in once["flow"]["mlp"] and "label_noise" not in once
    json.dumps(res)
    with pytest.raises(CostError, match="label_runs must be"):
        flow_eval(mods, "cpu:2", settings=FlowEvalSettings(label_runs=0))
    with pytest.raises(CostError, match="cannot reuse a measurement log"):
        flow_eval(mods, "cpu:2", cache=MeasureCache(tmp_path / "m.jsonl"), settings=FlowEvalSettings(label_runs=2))


def test_fit_recovers_a_known_correction():
    rng = np.random.default_rng(0)
    p = 10 ** rng.uniform(-6.5, -3, 300)
    a, b = fit_affine(p, 0.4 * p + 3e-6)
    assert np.isclose(a, 0.4, rtol=1e-6) and np.isclose(b, 3e-6, rtol=1e-5)
    # a negative per-call term sends the smallest groups to the floor, as measured
    a, b = fit_affine(p, np.maximum(0.45 * p - 2e-6, FLOOR), floor=FLOOR)
    assert np.isclose(a, 0.45, rtol=1e-4) and np.isclose(b, -2e-6, rtol=1e-3)
    d = dev()
    cal = fit_calibration([("tvm", d, x, y) for x, y in zip(p, 0.4 * p + 3e-6)] + [("torch", d, 1e-5, 1e-5)])
    assert set(cal.entries) == {("tvm", d)}  # one torch group: too few to fit, left as predicted
    assert np.allclose(cal.apply([1e-5, 1e-5], ["tvm", "torch"], d), [7e-6, 1e-5])


def test_calibration_of_held_out_models_beats_raw_on_synthetic_data():
    rng = np.random.default_rng(1)

    def model(n):  # predictions 2x too slow plus 3 us of call time; measured with 20 % noise
        m = 10 ** rng.uniform(-6, -3, n)
        p = (m / 0.5 + 3e-6) * rng.lognormal(0, 0.2, n)
        return p, m

    train = [model(40) for _ in range(3)]
    d = dev()
    cal = fit_calibration([("tvm", d, x, y) for p, m in train for x, y in zip(p, m)])
    p, m = model(60)
    calibrated = np.maximum(cal.apply(p, ["tvm"] * len(p), d), FLOOR)
    mape = lambda q: float(np.mean(np.abs(q - m) / m))
    assert mape(calibrated) < 0.5 * mape(p)
    assert abs(calibrated.sum() / m.sum() - 1) < abs(p.sum() / m.sum() - 1)


@pytest.fixture
def model_copy(tmp_path, monkeypatch):
    """The bundled model copied to a folder of its own (no calibration next to it), as the default."""
    path = tmp_path / "m.json"
    shutil.copy(default_model_path(), path)
    monkeypatch.setenv("TVM_PESTO_COST_MODEL", str(path))
    monkeypatch.delenv(CALIBRATION_ENV, raising=False)
    return path


def _write_cal(model_path, a, b, sha=None, version=1):
    data = Calibration({("tvm", dev()): (a, b)}, {"model": model_path.name,
                                                 "model_sha256": sha or file_sha256(model_path)}).to_json()
    data["version"] = version
    calibration_path(model_path).write_text(json.dumps(data))


@pytest.mark.slow
def test_xgb_source_applies_the_stored_calibration(model_copy, cpu_kind):
    a = tvm_pesto.analyze(sweep_module("matmul", limit=3))
    cs = tvm_pesto.make_candidates(a, "cpu:2", "tvm")
    cl = tvm_pesto.parse_cluster("cpu:2")
    raw = candidate_costs(cs, cl, "xgb")
    assert raw.prediction_fit == {} and raw.summary()["prediction_fit"] == {}
    _write_cal(model_copy, 0.5, 0.0)
    cal = candidate_costs(cs, cl, "xgb")
    xgb = "xgb" if cpu_kind.trained else "xgb-other-cpu"  # the column says when the model never saw the kind
    assert cal.columns == [xgb, xgb]
    assert np.allclose(cal.table, np.maximum(0.5 * raw.table, FLOOR))
    assert cal.prediction_fit[0]["tvm"]["a"] == 0.5 and cal.prediction_fit[0]["tvm"]["file"].endswith("m.calibration.json")
    off = candidate_costs(cs, cl, "xgb", calibrate=False)
    assert np.array_equal(off.table, raw.table) and off.prediction_fit == {}
    t, src = tvm_pesto.estimate_costs(a, cl, "xgb")
    assert src == xgb and np.allclose(t, cal.table)


def test_the_calibration_can_be_named_or_turned_off(model_copy, tmp_path, monkeypatch):
    from tvm_pesto.cli.main import cli

    a = tvm_pesto.analyze(sweep_module("matmul", limit=3))
    cs = tvm_pesto.make_candidates(a, "cpu:2", "tvm")
    cl = tvm_pesto.parse_cluster("cpu:2")
    raw = candidate_costs(cs, cl, "xgb").table
    _write_cal(model_copy, 0.5, 0.0)  # next to the model: applied by default
    other = tmp_path / "other.calibration.json"
    other.write_text(json.dumps(Calibration({("tvm", dev()): (0.25, 0.0)},
                                            {"model_sha256": file_sha256(model_copy)}).to_json()))
    monkeypatch.setenv(CALIBRATION_ENV, "none")
    off = candidate_costs(cs, cl, "xgb")
    assert np.array_equal(off.table, raw) and off.prediction_fit == {}
    monkeypatch.setenv(CALIBRATION_ENV, str(other))
    named = candidate_costs(cs, cl, "xgb")
    assert named.prediction_fit[0]["tvm"]["a"] == 0.25 and named.prediction_fit[0]["tvm"]["file"] == str(other.resolve())
    assert np.allclose(named.table, np.maximum(0.25 * raw, FLOOR))
    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(CostError, match="does not exist.*none for raw predictions"):
        candidate_costs(cs, cl, "xgb")
    # the CLI option sets it for every command of the process
    monkeypatch.setenv(CALIBRATION_ENV, "")
    res = CliRunner().invoke(cli, ["--calibration", "none", "cluster", "show", "cpu:1"])
    assert res.exit_code == 0, res.output
    assert os.environ[CALIBRATION_ENV] == "none"


def test_stale_or_bad_calibration_files(model_copy):
    model = load_model(model_copy)
    assert load_calibration(model) is None  # none stored
    _write_cal(model_copy, 0.5, 0.0, sha="0" * 64)
    with pytest.warns(RuntimeWarning, match="another version of .*not applied"):
        assert load_calibration(model) is None
    _write_cal(model_copy, 0.5, 0.0, version=99)
    with pytest.raises(CostError, match="version 99.*refit"):
        load_calibration(model)
    calibration_path(model_copy).write_text("{not json")
    with pytest.raises(CostError, match="not readable JSON.*delete it"):
        load_calibration(model)
    calibration_path(model_copy).write_text(json.dumps({"format": FORMAT, "version": 1, "entries": [{"a": 1}]}))
    with pytest.raises(CostError, match="entry 0 lacks backend"):
        load_calibration(model)


def test_bad_inputs_are_clear_errors(model_copy, tmp_path):
    with pytest.raises(CostError, match="at least 3 measured groups"):
        fit_affine([1e-6, 2e-6], [1e-6, 2e-6])
    with pytest.raises(CostError, match="positive, finite"):
        fit_affine([1e-6, 2e-6, np.inf], [1e-6, 2e-6, 3e-6])
    with pytest.raises(CostError, match="all predictions are equal"):
        fit_affine([1e-6] * 3, [1e-6, 2e-6, 3e-6])
    with pytest.raises(CostError, match="no backend and device has 3"):
        fit_calibration([("tvm", dev(), 1e-6, 1e-6)])
    with pytest.raises(CostError, match="unknown model 'nope'.*zoo.*outside the zoo.*vit"):
        flow_models(["nope"])
    with pytest.raises(CostError, match="no models to evaluate"):
        flow_eval({})
    with pytest.raises(CostError, match="not trained on device .*V100"):
        flow_eval({"mlp": tiny_mlp()[0]}, "2xV100-nvlink")
    run = CliRunner().invoke
    res = run(cost_model, ["eval", "--flow", "--cv"])
    assert isinstance(res.exception, PestoError) and "--flow measures models" in str(res.exception)
    res = run(cost_model, ["eval", "--save-calibration"])
    assert isinstance(res.exception, PestoError) and "add --flow" in str(res.exception)


def test_cli_flow_refuses_under_load_with_strict(model_copy, monkeypatch, tmp_path):
    monkeypatch.setattr(os, "getloadavg", _loads(2.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = CliRunner().invoke(cost_model, ["eval", "--flow", "--models", "mlp_mixer", "--strict",
                                              "--json", str(tmp_path / "o.json")])
    assert isinstance(res.exception, CostError) and "load average 2.00 is above 1.0" in str(res.exception)
    assert not (tmp_path / "o.json").exists()
