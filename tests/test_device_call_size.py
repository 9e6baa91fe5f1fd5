"""What a device call carries for the GPU check: the working tree plus the prepared folder.

``device_check.py --prepare`` takes minutes (four models compiled for CUDA and the CPU), so the
default models' folder is estimated here from :data:`prepare.FOLDER_MIB` (what a full
``--prepare`` wrote), with the runtime-only TVM package copied for real, and checked together
with this checkout's working tree by the same function the check uses.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_DIR = ROOT / "tests" / "gpu"
MIB = 1 << 20


@pytest.fixture(scope="module")
def prep():
    if str(GPU_DIR) not in sys.path:
        sys.path.insert(0, str(GPU_DIR))
    import prepare

    return prepare


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_counts_tracked_untracked_and_shared_files_not_ignored_ones(prep, tmp_path):
    repo = tmp_path / "repo"
    (repo / "shared").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("/build/\n/shared/\n/gpucheck/\n")
    (repo / "tracked.txt").write_bytes(b"t" * 100)
    _git(repo, "add", ".gitignore", "tracked.txt")
    (repo / "untracked.txt").write_bytes(b"u" * 200)
    (repo / "build").mkdir()
    (repo / "build" / "out.so").write_bytes(b"b" * 4000)  # ignored: does not travel
    (repo / "shared" / "notes.md").write_bytes(b"s" * 300)  # ignored, but shared/ travels
    folder = repo / "gpucheck"
    folder.mkdir()
    (folder / "m.so").write_bytes(b"m" * 5000)
    size = prep.device_call_bytes(repo, folder)
    gitignore = len((repo / ".gitignore").read_bytes())
    assert size["tree"] == 100 + 200 + 300 + gitignore
    assert size["folder"] == 5000 and size["total"] == size["tree"] + 5000
    assert size["largest"][0] == ("shared/notes.md", 300)
    (repo / ".gitignore").write_text("/build/\n/shared/\n")  # the folder not ignored: counted once, as the folder
    again = prep.device_call_bytes(repo, folder)
    assert again["folder"] == 5000 and again["tree"] == size["tree"] - 11


def test_the_check_fails_over_the_limit_and_names_the_largest_files(prep):
    size = {"tree": 20 * MIB, "folder": 45 * MIB, "total": 65 * MIB, "largest": [("cost_models/big.json", 6 * MIB)]}
    status, detail = prep.call_size_check(size, 60)
    assert status == "build_failed" and "65.0 MiB > 60 MiB" in detail and "cost_models/big.json 6.0" in detail
    assert prep.call_size_check(dict(size, total=59 * MIB), 60)[0] == "ok"
    assert prep.call_size_check(dict(size, total=63 * MIB), 70)[0] == "ok"
    assert prep.call_size_check(dict(size, total=65 * MIB), 70)[0] == "build_failed"  # never above the tool's 64


def test_default_models_with_this_working_tree_fit_a_device_call(prep, tmp_path):
    from tvm_pesto.run.bundle.runtime_pkg import copy_runtime_package, tree_bytes

    est = prep.FOLDER_MIB
    assert set(prep.DEFAULT_MODELS) <= set(est), "FOLDER_MIB needs every default model"
    runtime = tree_bytes(copy_runtime_package(tmp_path / "runtime"))
    assert runtime <= 1.05 * est["runtime"] * MIB, f"the runtime-only TVM package grew to {runtime / MIB:.1f} MiB"
    folder = runtime + sum(est[k] for k in ("wheels", "runner", *prep.DEFAULT_MODELS)) * MIB
    size = prep.device_call_bytes(ROOT, folder_bytes=int(folder))
    assert size["tree"] is not None, "not a git checkout: run the suite from one"
    status, detail = prep.call_size_check(size, prep.MAX_MIB)
    assert status == "ok", detail
