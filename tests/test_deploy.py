"""A placed model exported and loaded in a fresh process: no search, no measurement, the
same output, TVM's runtime only."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tvm_pesto
from tvm_pesto import zoo
from tvm_pesto.errors import ExecutionError
from tvm_pesto.run.bundle.runtime_pkg import copy_runtime_package

LOAD_AND_RUN = textwrap.dedent("""
    import sys, numpy as np
    import tvm_pesto
    m = tvm_pesto.load(sys.argv[1])
    out = m(np.load(sys.argv[2]))
    np.save(sys.argv[3], out)
    import tvm
    maps = open("/proc/self/maps").read() if sys.platform.startswith("linux") else ""
    print("RELAX", "tvm.relax" in sys.modules, "COMPILER", "libtvm_compiler" in maps, "TVM", tvm.__file__)
""")


def _mixed_costs(name="mlp_mixer"):
    """Seeded random costs that make the plan mix TVM, ONNX Runtime and torch units: the first
    of 30 seeds whose plan does (which seed depends on the model's candidates)."""
    zm = zoo.load(name, "small")
    an = tvm_pesto.analyze(zm.mod)
    cs = tvm_pesto.make_candidates(an, "cpu:2", "all")
    sizes = np.array([len(c.nodes) for c in cs]) ** 0.8
    for seed in range(30):
        col = np.random.default_rng(seed).uniform(1e-5, 3e-5, len(cs)) * sizes
        table = np.stack([col, col], axis=1)
        pl = tvm_pesto.place(an, "cpu:2", costs=table, solver="m-topo", search_s=0)
        if {"onnxruntime", "torch", "tvm"} <= set(pl.plan.backend_mix()):
            return zm, an, table
    raise AssertionError("no seed of 30 gives a plan that mixes tvm, onnxruntime and torch")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    zm, an, table = _mixed_costs()
    pm = tvm_pesto.build(an.rg.mod, "cpu:2", costs=table, solver="m-topo", search_s=0)
    mix = pm.plan.backend_mix()
    assert {"onnxruntime", "torch", "tvm"} <= set(mix), mix
    root = tmp_path_factory.mktemp("bundle")
    path = str(root / "mixer")
    pm.export(path)
    x = zm.example_inputs[0]
    np.save(root / "x.npy", x)
    np.save(root / "want.npy", pm(x))
    devices = pm.devices_used
    pm.close()
    return root, path, devices


def _run(root, path, env=None):
    out = root / "got.npy"
    res = subprocess.run([sys.executable, "-c", LOAD_AND_RUN, path, str(root / "x.npy"), str(out)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return np.load(out), res.stdout


@pytest.mark.slow
def test_export_writes_libraries_artifacts_and_a_checked_manifest(bundle):
    _, path, devices = bundle
    man = json.loads(Path(path, "manifest.json").read_text())
    assert sorted(man["libraries"]) == [str(d) for d in devices]
    kinds = {a["kind"] for a in man["artifacts"]}
    assert {"onnx", "torch-export"} <= kinds
    for f in man["files"]:
        assert Path(path, f).is_file()


@pytest.mark.slow
def test_load_in_a_fresh_process_gives_the_same_output(bundle):
    root, path, _ = bundle
    got, _ = _run(root, path)
    np.testing.assert_array_equal(got, np.load(root / "want.npy"))


@pytest.fixture(scope="module")
def runtime_only_tvm(tmp_path_factory):
    """TVM's Python package without its compiler library (as TVM deploys, and as the lent GPU
    machine has it): ``lib/libtvm_compiler.so`` and ``3rdparty/`` left out."""
    dst = tmp_path_factory.mktemp("tvm_runtime_only")
    pkg = copy_runtime_package(dst)
    assert not list(pkg.rglob("libtvm_compiler*")) and (pkg / "lib" / "libtvm_runtime.so").is_file()
    return dst


@pytest.mark.slow
def test_load_needs_only_tvms_runtime(bundle, runtime_only_tvm):
    root, path, _ = bundle
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1",
               PYTHONPATH=os.pathsep.join([str(runtime_only_tvm), os.environ.get("PYTHONPATH", "")]))
    got, stdout = _run(root, path, env)
    np.testing.assert_array_equal(got, np.load(root / "want.npy"))
    assert "RELAX False" in stdout and "COMPILER False" in stdout, stdout
    assert str(runtime_only_tvm) in stdout, f"the runtime-only copy of TVM was not the one imported: {stdout}"


def test_a_missing_or_changed_file_is_named(bundle, tmp_path):
    _, path, _ = bundle
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    onnx_file = next(broken.glob("*.onnx"))
    with open(onnx_file, "ab") as f:
        f.write(b"\0")
    with pytest.raises(ExecutionError, match=rf"{onnx_file.name} .* does not match its checksum"):
        tvm_pesto.load(str(broken))
    onnx_file.unlink()
    with pytest.raises(ExecutionError, match=rf"{onnx_file.name} is missing"):
        tvm_pesto.load(str(broken))
    (broken / "manifest.json").unlink()
    with pytest.raises(ExecutionError, match="no manifest.json"):
        tvm_pesto.load(str(broken))
    with pytest.raises(ExecutionError, match="not a folder"):
        tvm_pesto.load(str(tmp_path / "nowhere"))
