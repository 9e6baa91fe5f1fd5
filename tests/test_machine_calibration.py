"""This machine's calibration of the xgb cost model (tvm_pesto.costs.calibrate.machine,
tvm_pesto.calibrate_machine): fitted on real measurements of a small zoo model, kept per
model file and machine, applied by the xgb source ahead of the bundled calibration, fitted
by place/estimate_costs on first use when asked to, refitted for a new device size without
losing the others."""
import json

import numpy as np
import pytest

from tvm_pesto import zoo
from tvm_pesto.api import analyze, as_cluster, calibrate_machine, estimate_costs, make_candidates, place
from tvm_pesto.costs.calibrate import machine
from tvm_pesto.costs.predict.calibration import CALIBRATION_ENV, calibration_path, load_calibration, machine_calibration_path
from tvm_pesto.costs.predict.xgb import load_model, predict_candidate_costs
from tvm_pesto.errors import CostError

pytestmark = pytest.mark.slow  # fits this machine's calibration by measuring: out of the `-m "not slow"` lane

ONE = ("mlp_mixer",)


def _key(spec: str) -> str:
    """The device key of ``spec``'s first device on this machine (it names the CPU kind)."""
    from tvm_pesto.costs.predict.features import device_descriptor, device_key

    return device_key(device_descriptor(as_cluster(spec).devices[0]))


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_PESTO_CACHE", str(tmp_path))
    monkeypatch.delenv(CALIBRATION_ENV, raising=False)
    return tmp_path


def _candidates(cluster):
    a = analyze(zoo.load("mlp_mixer", "small").mod)
    return make_candidates(a, cluster, "all")


def test_a_fit_is_kept_per_machine_and_applied_before_the_bundled_one(own_cache, monkeypatch):
    monkeypatch.setenv(machine.MACHINE_ENV, "off")
    cm = load_model()
    cl = as_cluster("cpu:2")
    cal = calibrate_machine(cl, cm, models=ONE)
    path = machine_calibration_path(cm.path)
    assert cal.path == str(path) and path.parent == own_cache / "calibration"
    data = json.loads(path.read_text())
    assert data["machine"]["cores"] and data["models"] == list(ONE) and data["seconds"] > 0
    assert {"tvm", "onnxruntime"} <= {e["backend"] for e in data["entries"]}
    assert all(e["device"] == _key("cpu:2") and e["a"] >= 0 and e["n_groups"] >= 3 for e in data["entries"])
    # the xgb source applies it, not the bundled file
    got = load_calibration(cm)
    assert got is not None and got.path == str(path) and got.path != str(calibration_path(cm.path))
    cs = _candidates(cl)
    raw = predict_candidate_costs(cs, cl, cm, calibration=False)[0]
    used: dict = {}
    mine = predict_candidate_costs(cs, cl, cm, applied=used)[0]
    assert used[0]["tvm"]["file"] == str(path)
    a, b = got.entries[("tvm", _key("cpu:2"))]
    big = [i for i, c in enumerate(cs) if c.backend == "tvm" and raw[i, 0] > 1e-5]
    assert big
    np.testing.assert_allclose(mine[big, 0], a * raw[big, 0] + b, rtol=1e-9)
    # a file named in $TVM_PESTO_CALIBRATION still wins
    monkeypatch.setenv(CALIBRATION_ENV, "none")
    assert load_calibration(cm) is None


def test_first_use_fits_once_and_a_new_device_size_is_added(own_cache, monkeypatch, capsys):
    monkeypatch.setenv(machine.MACHINE_ENV, "auto")
    monkeypatch.setattr(machine, "MACHINE_MODELS", ONE)
    cm = load_model()
    path = machine_calibration_path(cm.path)
    a = analyze(zoo.load("mlp_mixer", "small").mod)
    assert not path.exists()
    estimate_costs(a, "cpu:2", "roofline")  # not a prediction of the model: nothing to fit
    assert not path.exists()
    estimate_costs(a, "cpu:2", "xgb")
    assert path.is_file() and "fitting the xgb cost model to this machine" in capsys.readouterr().err
    stamp = path.stat().st_mtime_ns
    pl = place(a, "cpu:2", costs="xgb")  # may fit the executor's figures (tests/test_machine_constants.py), not this
    assert path.stat().st_mtime_ns == stamp and "fitting the xgb cost model" not in capsys.readouterr().err
    assert pl.costs.prediction_fit[0]["tvm"]["file"] == str(path)
    # cpu:1 is one device of both cores: another size, fitted and added, the first kept
    place(a, "cpu:1", costs="xgb")
    devices = {e["device"] for e in json.loads(path.read_text())["entries"]}
    assert devices == {_key("cpu:2"), _key("cpu:1")} and _key("cpu:1").startswith("cpu/host-cpu/2@")


def test_bad_setting_and_clusters_without_local_cpus_are_refused(own_cache, monkeypatch):
    monkeypatch.setenv(machine.MACHINE_ENV, "sometimes")
    with pytest.raises(CostError, match="auto .* or off"):
        machine.auto_enabled()
    monkeypatch.setenv(machine.MACHINE_ENV, "off")
    with pytest.raises(CostError, match="no device of this machine"):
        calibrate_machine("2xV100-nvlink", models=ONE)


ZEN1 = "vendor_id : AuthenticAMD\ncpu family : 23\nmodel : 1\nmodel name : AMD EPYC\nstepping : 2\nflags : fma avx2\n"
ZEN4 = "vendor_id : AuthenticAMD\ncpu family : 25\nmodel : 17\nmodel name : AMD EPYC\nstepping : 1\nflags : avx512f\n"


def test_a_fit_made_on_another_cpu_with_the_same_brand_string_is_not_applied(own_cache, monkeypatch):
    """Two VMs both read 'AMD EPYC' with host name 'vm' (a Zen 1 with AVX2, a Zen 4 with
    AVX-512, 3x apart on untuned kernels): a fit made on one must not price the other."""
    from tvm_pesto.cluster.host import parse_cpuinfo
    from tvm_pesto.costs.predict import calibration

    cm = load_model()
    pairs = [("tvm", "cpu/host-cpu/1", p, 3.0 * p) for p in np.geomspace(1e-6, 1e-3, 8)]
    monkeypatch.setattr(calibration, "cpu_identity", lambda: parse_cpuinfo(ZEN4))
    zen4 = calibration.fit_calibration(pairs, meta={"machine": calibration.machine_info()})
    zen4.save(machine_calibration_path(cm.path))
    assert calibration.load_machine_calibration(cm) is not None  # found on the machine that made it
    monkeypatch.setattr(calibration, "cpu_identity", lambda: parse_cpuinfo(ZEN1))
    assert calibration.machine_info()["cpu"] == "AMD EPYC" and calibration.machine_info()["isa"] == ["avx2", "fma"]
    assert calibration.load_machine_calibration(cm) is None  # not on the other CPU
    monkeypatch.setenv(machine.MACHINE_ENV, "auto")
    assert machine.needs_fit(cm, as_cluster("cpu:2"))  # so its first xgb costs fit one of its own
