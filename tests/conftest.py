"""Test-suite wide setup: measurements go to a cache of this run, not the user's, and the
``xgb`` source does not fit this machine's calibration on first use (``test_machine_calibration``
tests that on purpose): tests then see the bundled calibration, the same on every machine.
``tvm_pesto.build`` keeps the flow's plan without timing it against its alternatives
(``TVM_PESTO_MEASURE_FINAL=0``; ``test_decide`` times them on purpose): which option a
measurement picks under the suite's load is not what the other tests check.

Tests time candidates under the suite's own load (and with tiny repeat counts); written to
``~/.cache/tvm-pesto`` they would be found later by ``tvm-pesto run`` as if measured on a
quiet machine. A ``TVM_PESTO_CACHE`` the caller set is kept (to share a cache on purpose).
"""
import os

import pytest
from hypothesis import HealthCheck, settings

import browser

# No clock decides a property test: no per-example deadline, and slow data generation (a
# loaded machine) is not a failure. Tests' own @settings start from this profile.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

#: The test files that take longest, longest first (their slowest tests, `pytest --durations=40`,
#: on a 2-vCPU AMD Zen 5, clean clone of 3bc3169): Ray actors 121 s, CLI runs 61, tutorials 54,
#: users' models 52, determinism 44, the zoo placed 39, the GPU check's dry runs 38, cost model
#: 37, heuristics 32, bench backends 25. xdist's ``loadfile`` hands files out in collection
#: order (``--no-loadscope-reorder`` in pyproject.toml; its default order is by the number of
#: tests, which put the Ray file last); these first, the rest after in their usual order, so the
#: two workers end together.
SLOWEST_FILES = ("test_ray_executor.py", "test_run_cli.py", "test_tutorials.py", "test_user_models.py",
                 "test_determinism.py", "test_placed_zoo.py", "test_gpu_backends.py", "test_cost_model.py",
                 "test_heuristics.py", "test_bench_backends.py", "test_train.py", "test_models.py", "test_zoo.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: k for k, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(scope="session", autouse=True)
def _measurements_of_this_run(tmp_path_factory):
    os.environ.setdefault("TVM_PESTO_MACHINE_CALIBRATION", "off")
    os.environ.setdefault("TVM_PESTO_MEASURE_FINAL", "0")
    if os.environ.get("TVM_PESTO_CACHE"):
        yield
        return
    os.environ["TVM_PESTO_CACHE"] = str(tmp_path_factory.mktemp("measurement-cache"))
    try:
        yield
    finally:
        os.environ.pop("TVM_PESTO_CACHE", None)


@pytest.fixture
def machine_fits(tmp_path, monkeypatch):
    """A measurement cache of the test's own with first-use fitting on, and the executor's fit
    (``fit_constants``) and the per-device-size measurements (the switch between libraries, the
    cold-call grid) replaced by stand-ins that count their calls. Returns ``{"switch": [...],
    "cold": [...]}``: the core counts each stand-in measured, in order, and ``"grid"``, the
    grid the cold-call stand-in gives."""
    from tvm_pesto.costs.calibrate import cold as cf
    from tvm_pesto.costs.calibrate import dispatch as rd
    from tvm_pesto.costs.calibrate import switch as sw
    from tvm_pesto.costs.calibrate.machine import MACHINE_ENV

    monkeypatch.setenv("TVM_PESTO_CACHE", str(tmp_path))
    monkeypatch.setenv(MACHINE_ENV, "auto")
    got = {"switch": [], "cold": [], "grid": {"flush_bytes": [1e6, 100e6], "unit_bytes": [1e3, 10e6],
                                            "extra_s": [[1e-5, 1e-5], [1e-4, 1.1e-3]]}}

    def fit(cluster, executor, session=None):
        return {"format": rd.FORMAT, "version": rd.VERSION, "executor": executor, "cluster": cluster.name,
                "fitted_at": "fit-1", "load": [0.0, 0.0], "links": {},
                "dispatch": {"run_s": 3e-6, "multi_device_s": 40e-6}}

    def switch(dev, *a, **k):
        got["switch"].append(int(dev.cores))
        return sw.SwitchFit(int(dev.cores), 1e-6 * (10 + int(dev.cores)), {"tvm,onnxruntime": 1e-5 * int(dev.cores)},
                            {}, ["tvm", "onnxruntime"], f"switch-{len(got['switch'])}")

    def cold(dev, *a, **k):
        got["cold"].append(int(dev.cores))
        return {**got["grid"], "cores": int(dev.cores), "fitted_at": f"cold-{len(got['cold'])}"}

    monkeypatch.setattr(rd, "fit_constants", fit)
    monkeypatch.setattr(sw, "measure_switch", switch)
    monkeypatch.setattr(cf, "measure_cold", cold)
    return got


#: A CPU kind no shipped data were made on (the matrix's unseen column).
UNSEEN_CPU_KIND = "UnseenVendor/0/0"


def _kind_of(key: str) -> str:
    """``AuthenticAMD/23/1`` from a device key ``cpu/host-cpu/1@AuthenticAMD/23/1`` ("" for none)."""
    return key.split("@", 1)[1] if "@" in key else ""


def shipped_cpu_kinds() -> dict:
    """Each CPU kind the shipped data were made on, read from the data, with what was made there.

    Returns
    -------
    dict
        kind -> ``{"trained": the bundled cost model has rows of it, "calibrated": its
        calibration has entries for it, "tuned": a shipped tuning database was tuned on it}``.
    """
    from tvm_pesto.costs.predict.calibration import CALIBRATION_ENV, calibration_path, load_calibration
    from tvm_pesto.costs.predict.xgb import load_model
    from tvm_pesto.costs.tune.tuning_db import read_device_file
    from tvm_pesto.package_data import data_dirs

    model = load_model()
    trained = {_kind_of(k) for k in model.meta.get("devices", [])}
    shipped = calibration_path(model.path)  # the shipped file, not a fit this machine keeps in its cache
    with pytest.MonkeyPatch.context() as mp:
        if shipped.is_file():
            mp.setenv(CALIBRATION_ENV, str(shipped))
        else:
            mp.setenv(CALIBRATION_ENV, "none")
        cal = load_calibration(model)
    calibrated = {_kind_of(dk) for _, dk in (cal.entries if cal else {})}
    tuned = set()
    for d in data_dirs("cost_models"):
        for folder in sorted(d.glob("*/")) if d.is_dir() else []:
            desc = read_device_file(folder)
            if desc and desc.get("cpu_kind"):
                tuned.add(desc["cpu_kind"])
    kinds = sorted((trained | calibrated | tuned) - {""})
    assert kinds, "no CPU kind in the shipped data: the cost model, its calibration or the tuning databases"
    return {k: {"trained": k in trained, "calibrated": k in calibrated, "tuned": k in tuned} for k in kinds}


def _cpu_kind_params():
    kinds = shipped_cpu_kinds()
    assert UNSEEN_CPU_KIND not in kinds
    kinds[UNSEEN_CPU_KIND] = {"trained": False, "calibrated": False, "tuned": False}
    return [pytest.param((k, facts), id=k.replace("/", "-")) for k, facts in kinds.items()]


@pytest.fixture(scope="module", params=_cpu_kind_params())
def cpu_kind(request):
    """This machine's CPU taken as another kind (``$TVM_PESTO_CPU_KIND``), once per kind: each
    kind the shipped data were made on (:func:`shipped_cpu_kinds`: the cost model's rows, its
    calibration, the tuning databases) and one they never saw (:data:`UNSEEN_CPU_KIND`).
    Whatever CPU runs the suite, a test that depends on the kind then checks every outcome.
    Module-scoped, so that module fixtures can depend on it: while a kind is set, the module's
    tests that do not use it may run under it too.

    Yields
    ------
    types.SimpleNamespace
        ``kind`` (``vendor/family/model``), ``trained``, ``calibrated`` and ``tuned`` (bool:
        what the shipped data hold of that kind).
    """
    import types

    from tvm_pesto.cluster.host import CPU_KIND_ENV

    kind, facts = request.param
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CPU_KIND_ENV, kind)
        yield types.SimpleNamespace(kind=kind, **facts)


@pytest.fixture(scope="session")
def chromium():
    """Headless Chromium (``tests/browser.py``): the machine's, or installed on first use into the
    checkout's git-ignored ``.browser/`` from the Debian packages; the test skips, with the
    reason, where neither can be had."""
    try:
        return browser.find_or_install()
    except browser.BrowserUnavailable as e:
        pytest.skip(str(e))
