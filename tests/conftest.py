"""Test-suite wide setup: measurements go to a cache of this run, not the user's, and the
``xgb`` source does not fit this machine's calibration on first use (``test_machine_calibration``
tests that on purpose): tests then see the bundled calibration, the same on every machine.

Tests time candidates under the suite's own load (and with tiny repeat counts); written to
``~/.cache/tvm-pesto`` they would be found later by ``tvm-pesto run`` as if measured on a
quiet machine. A ``TVM_PESTO_CACHE`` the caller set is kept (to share a cache on purpose).
"""
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _measurements_of_this_run(tmp_path_factory):
    os.environ.setdefault("TVM_PESTO_MACHINE_CALIBRATION", "off")
    if os.environ.get("TVM_PESTO_CACHE"):
        yield
        return
    os.environ["TVM_PESTO_CACHE"] = str(tmp_path_factory.mktemp("measurement-cache"))
    try:
        yield
    finally:
        os.environ.pop("TVM_PESTO_CACHE", None)
