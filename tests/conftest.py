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

#: The test files that take longest, longest first (seconds of test time on a 2-core AMD Zen 1
#: VM, `pytest --durations=0` at da77efa): Ray actors 286, CLI runs 197, the GPU check's dry
#: runs 146, tutorials 131, cost model 115, training 114, heuristics 102, determinism 98, the
#: zoo placed 98, users' models 94, model files 89, the zoo 65. xdist's ``loadfile`` hands
#: files out in collection order (``--no-loadscope-reorder`` in pyproject.toml; its default
#: order is by the number of tests, which put the Ray file, 9 tests and 5 minutes, last);
#: these first, the rest after in their usual order, so the two workers end together.
SLOWEST_FILES = ("test_ray_executor.py", "test_run_cli.py", "test_gpu_backends.py", "test_tutorials.py",
                 "test_cost_model.py", "test_train.py", "test_heuristics.py", "test_determinism.py",
                 "test_placed_zoo.py", "test_user_models.py", "test_models.py", "test_zoo.py")


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


@pytest.fixture(scope="module", params=[("AuthenticAMD/23/1", True), ("GenuineIntel/6/999", False)],
                ids=["trained-cpu-kind", "unknown-cpu-kind"])
def cpu_kind(request):
    """This machine's CPU taken as another kind (``$TVM_PESTO_CPU_KIND``), once per kind: the
    AMD EPYC of family 23 model 1 (``trained``: the bundled cost model was trained on it, and
    its calibration was fitted there) and a kind it never saw. Whatever CPU runs the suite, a test that depends
    on the kind then checks both outcomes. Module-scoped, so that module fixtures can depend
    on it: while a kind is set, the module's tests that do not use it may run under it too.

    Yields
    ------
    types.SimpleNamespace
        ``kind`` (``vendor/family/model``) and ``trained`` (bool).
    """
    import types

    from tvm_pesto.cluster.host import CPU_KIND_ENV

    kind, trained = request.param
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CPU_KIND_ENV, kind)
        yield types.SimpleNamespace(kind=kind, trained=trained)
