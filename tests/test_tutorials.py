"""Every tutorial runs top to bottom at its small size."""
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each tutorial runs whole models: out of the `-m "not slow"` lane

TUTORIALS = sorted((pathlib.Path(__file__).parent.parent / "tutorials").glob("*.py"))


def test_there_are_tutorials():
    assert TUTORIALS, "tutorials/ has no scripts"


@pytest.fixture(scope="module")
def measurement_cache(tmp_path_factory):
    """One measurement cache for the tutorials, as a user's ``~/.cache`` is: the second one
    that times inception_v3's groups on cpu:2 finds them there."""
    return tmp_path_factory.mktemp("tutorial-cache")


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.name)
def test_tutorial_runs(path, tmp_path, measurement_cache):
    env = dict(os.environ, TVM_PESTO_TUTORIAL_SIZE="small", TVM_PESTO_TUTORIAL_OUT=str(tmp_path),
               TVM_PESTO_CACHE=str(measurement_cache), MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"{path.name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert any(tmp_path.glob("*.png")), "the tutorial should write its Gantt chart"
