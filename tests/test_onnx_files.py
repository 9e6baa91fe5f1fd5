"""Large models exported to files (ONNX external data) instead of bytes: both libraries read
them with the same numerics, bundles carry the weights file, and the files go with their last
holder. The size rule is lowered here so a tiny model takes the file path."""
import gc
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_pesto.backends import get_backend, onnxruntime as ort_backend, release_all
from tvm_pesto.backends.base import constant_bytes
from tvm_pesto.backends.onnx_export import export as onnx_export
from tvm_pesto.candidates.examples import tiny_cnn, tiny_mlp
from tvm_pesto.cluster import parse_cluster
from test_openvino_backend import _bundle_round_trip
from tvm_pesto.run.libraries import loaders
from tvm_pesto.run.libraries.loaders import direct_call

HAS_OPENVINO = importlib.util.find_spec("openvino") is not None
CPU = parse_cluster("cpu:1").devices[0]


@pytest.fixture
def files_for_all(monkeypatch):
    """Every export goes to files, every initializer beside the graph (the size rules at one
    byte), from an empty export cache."""
    monkeypatch.setattr(ort_backend, "FILE_MIN_BYTES", 1)
    monkeypatch.setattr(onnx_export, "EXTERNAL_MIN_BYTES", 1)
    ort_backend._exports.clear()
    yield
    ort_backend._exports.clear()
    release_all()


def _reference(mod, inputs):
    vm = relax.VirtualMachine(tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


@pytest.mark.parametrize("backend", ["onnxruntime", pytest.param("openvino", marks=pytest.mark.skipif(
    not HAS_OPENVINO, reason="openvino is not installed (pip install openvino)"))])
@pytest.mark.parametrize("model", [tiny_mlp, tiny_cnn])
def test_both_libraries_read_the_files_with_the_same_numerics(files_for_all, backend, model):
    mod, inputs = model()
    export = ort_backend.onnx_model(mod["main"])
    assert isinstance(export, ort_backend.OnnxFile)
    assert export.files == ["model.onnx", "model.onnx.data"]
    # the weights are beside the graph, not in it
    assert os.path.getsize(os.path.join(export.folder, "model.onnx.data")) >= 0.9 * constant_bytes(mod["main"])
    ref = _reference(mod, inputs)
    gname = get_backend(backend).build(mod["main"], CPU)
    out = tvm.runtime.empty(ref.shape, "float32", tvm.cpu())
    tvm.get_global_func(gname)(*[tvm.runtime.tensor(a) for a in inputs], out)
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-5, rtol=1e-5)
    (got,) = direct_call(gname)(*inputs)
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=1e-5)


def test_the_files_go_with_their_last_holder(files_for_all, monkeypatch):
    monkeypatch.setattr(loaders, "owns_every_core", lambda cores: True)  # a runner that makes a spinning session
    mod, (x,) = tiny_mlp()
    export = ort_backend.onnx_model(mod["main"])
    folder = export.folder
    assert ort_backend.onnx_model(mod["main"]) is export  # kept: the next library reads the same files
    run = loaders.onnx_runner(export, 2)
    del export
    ort_backend._exports.clear()
    gc.collect()
    assert os.path.isdir(folder)  # the runner makes its spinning session from them on its first direct call
    (got,) = run.direct(x)
    gc.collect()
    assert not os.path.exists(folder)  # read: nothing holds them
    np.testing.assert_allclose(got, _reference(mod, [x]), atol=1e-5, rtol=1e-5)


def _other_mlp():
    """A function of other weights than the examples' (another export)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.matmul(x, relax.const(np.full((16, 16), 0.5, "float32")))))
    return bb.get()["main"]


def test_only_the_last_files_are_kept(files_for_all):
    folders = [ort_backend.onnx_model(m()[0]["main"]).folder for m in (tiny_mlp, tiny_cnn)]
    newest = ort_backend.onnx_model(_other_mlp())
    gc.collect()
    assert [os.path.exists(f) for f in folders] == [False, True] and os.path.exists(newest.folder)
    assert ort_backend.FILES_KEPT == 2


def test_a_bundle_carries_the_weights_file(files_for_all, tmp_path):
    # the bundle round trip of the library backends (export, release, load, compare), its
    # ONNX Runtime unit exported to files: the weights file travels with the bundle
    art, _ = _bundle_round_trip(tmp_path, "onnxruntime", "onnx")
    assert art["files"] == [art["files"][0], art["files"][0] + ".data"]


def test_the_exports_of_an_ended_process_are_removed(files_for_all, tmp_path):
    import subprocess
    import sys

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    root = Path(os.environ["TVM_PESTO_CACHE"]) / "exports"
    orphan = root / f"{int(ended.stdout)}-abc"
    orphan.mkdir(parents=True)
    (orphan / "model.onnx").write_bytes(b"")
    mine = ort_backend.onnx_model(tiny_mlp()[0]["main"])
    assert not orphan.exists() and os.path.isdir(mine.folder)


def test_a_cache_folder_that_cannot_be_written_keeps_the_export_in_memory(files_for_all, monkeypatch, tmp_path):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("TVM_PESTO_CACHE", str(blocked))
    mod, inputs = tiny_mlp()
    with pytest.warns(RuntimeWarning, match="TVM_PESTO_CACHE at a writable folder"):
        export = ort_backend.onnx_model(mod["main"])
    assert isinstance(export, bytes)
    gname = get_backend("onnxruntime").build(mod["main"], CPU)
    (got,) = direct_call(gname)(*inputs)
    np.testing.assert_allclose(got, _reference(mod, inputs), atol=1e-5, rtol=1e-5)
