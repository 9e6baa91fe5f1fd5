"""Backends: registry, availability with reasons, numerics of each CPU backend against TVM,
DLPack zero copy, build failures as BuildError, thread counts from the device's affinity."""
import builtins
import importlib.util
import threading
import warnings

import numpy as np
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from tvm import relax

import tvm_pesto
from tvm_pesto.backends import (
    available_backends, backend_status, get_backend, list_backends, register_backend, unregister_backend,
)
from tvm_pesto.backends.base import Backend, BackendUnavailableError, calling_thread_cores
from tvm_pesto.backends.registry import NAMED_ONLY
from tvm_pesto.backends.onnx_export.export import OnnxExportError, relax_to_onnx
from tvm_pesto.backends.torch_ops import TorchBackend
from tvm_pesto.candidates.examples import tiny_cnn, tiny_mlp
from tvm_pesto.candidates.flow import _WARNED, backend_names, make_candidates
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.cluster.device_thread import enter_device_thread
from tvm_pesto.errors import BuildError, PestoError

CPU = parse_cluster("cpu:1").devices[0]


def _run_tvm(func, args):
    tgt = tvm.target.Target({"kind": "llvm"})
    ex = tvm.compile(tvm.IRModule({"main": func}), target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    return relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _run_backend(name, func, args):
    gname = get_backend(name).build(func, CPU)
    out_ty = func.body.body.ty
    out = tvm.runtime.empty([int(s) for s in out_ty.shape.values], str(out_ty.dtype), tvm.cpu())
    tvm.get_global_func(gname)(*[tvm.runtime.tensor(a) for a in args], out)
    return out.numpy()


def test_registry_lists_cpu_backends_and_reasons():
    names = list_backends()
    assert {"tvm", "torch", "onnxruntime", "tvm-ms"} <= set(names)
    st_ = backend_status()
    for n in ("tvm", "torch", "onnxruntime"):
        assert st_[n] == (True, "")
    ok, why = get_backend("tvm-ms").available()
    assert not ok and "TVM_PESTO_MS_DB" in why
    with pytest.raises(PestoError, match="known backends"):
        get_backend("no-such-backend")


@pytest.mark.slow
@pytest.mark.parametrize("model", [tiny_cnn, tiny_mlp])
@pytest.mark.parametrize("backend", ["torch", "onnxruntime", "tvm"])
def test_whole_model_matches_tvm(model, backend):
    mod, inputs = model()
    func = mod["main"]
    ref = _run_tvm(func, inputs)
    got = _run_backend(backend, func, inputs)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(m=st.integers(1, 9), k=st.integers(1, 9), n=st.integers(1, 9), act=st.sampled_from(["relu", "tanh", "sigmoid"]),
       batch=st.booleans())
def test_matmul_bias_activation_property(m, k, n, act, batch):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    shape_a = (2, m, k) if batch else (m, k)
    x = relax.Var("x", relax.TensorType(shape_a, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((k, n)).astype("float32"))))
            y = bb.emit(relax.op.add(y, relax.const(rng.standard_normal(n).astype("float32"))))
            fn = {"relu": relax.op.nn.relu, "tanh": relax.op.tanh, "sigmoid": relax.op.sigmoid}[act]
            out = bb.emit_output(fn(y))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    a = rng.standard_normal(shape_a).astype("float32")
    ref = _run_tvm(func, [a])
    for b in ("torch", "onnxruntime"):
        np.testing.assert_allclose(_run_backend(b, func, [a]), ref, atol=1e-5, rtol=1e-5)


def test_torch_writes_into_the_dps_output_zero_copy():
    mod, inputs = tiny_mlp()
    fn = TorchBackend().make_callable(mod["main"], CPU)
    x = tvm.runtime.tensor(inputs[0])
    out = tvm.runtime.empty((8, 16), "float32", tvm.cpu())
    import torch

    view = torch.from_dlpack(out)  # shares memory with `out`
    before = view.data_ptr()
    fn(x, out)
    assert view.data_ptr() == before
    np.testing.assert_allclose(view.numpy(), out.numpy())
    assert np.abs(out.numpy()).sum() > 0


@pytest.mark.slow
def test_onnxruntime_keeps_its_binding_only_while_the_buffers_stay():
    """The kept binding must follow new buffers (rebind), new contents in the same buffers,
    and calls from another thread (each thread binds its own)."""
    from tvm_pesto.backends.onnxruntime import OnnxRuntimeBackend

    mod, inputs = tiny_mlp()
    fn = OnnxRuntimeBackend().make_callable(mod["main"], CPU)

    def ref(x):
        return _run_tvm(mod["main"], [x])

    rng = np.random.default_rng(1)
    x = tvm.runtime.tensor(inputs[0])
    out = tvm.runtime.empty((8, 16), "float32", tvm.cpu())
    fn(x, out)
    np.testing.assert_allclose(out.numpy(), ref(inputs[0]), atol=1e-5, rtol=1e-5)
    second = rng.standard_normal(inputs[0].shape).astype("float32")
    x.copyfrom(second)  # same buffer, new values
    fn(x, out)
    np.testing.assert_allclose(out.numpy(), ref(second), atol=1e-5, rtol=1e-5)
    third = rng.standard_normal(inputs[0].shape).astype("float32")
    x2, out2 = tvm.runtime.tensor(third), tvm.runtime.empty((8, 16), "float32", tvm.cpu())
    fn(x2, out2)  # new buffers: the old output must not be written
    np.testing.assert_allclose(out2.numpy(), ref(third), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(out.numpy(), ref(second), atol=1e-5, rtol=1e-5)
    out3 = tvm.runtime.empty((8, 16), "float32", tvm.cpu())
    t = threading.Thread(target=fn, args=(x, out3))
    t.start()
    t.join()
    np.testing.assert_allclose(out3.numpy(), ref(second), atol=1e-5, rtol=1e-5)


def _resize_func(method, coord, rounding, layout="NCHW", hw=(5, 7), size=(9, 4)):
    shape = (1, 3, *hw) if layout == "NCHW" else (1, *hw, 3)
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.image.resize2d(x, size, layout=layout, method=method,
                                                         coordinate_transformation_mode=coord,
                                                         rounding_method=rounding))
        bb.emit_func_output(out)
    return bb.get()["main"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("method, coord, rounding", [
    ("nearest_neighbor", "asymmetric", "floor"), ("nearest_neighbor", "half_pixel", "round_prefer_ceil"),
    ("linear", "half_pixel", ""), ("linear", "align_corners", ""), ("linear", "pytorch_half_pixel", ""),
    ("cubic", "half_pixel", "")])
def test_resize2d_runs_in_the_onnx_libraries_as_tvm_computes_it(backend, method, coord, rounding):
    from tvm_pesto.backends.onnx_export.ops import supports_call

    _library(backend)
    func = _resize_func(method, coord, rounding)
    assert supports_call(func.body.blocks[0].bindings[0].value)
    x = np.random.default_rng(0).standard_normal((1, 3, 5, 7)).astype("float32")
    np.testing.assert_allclose(_run_backend(backend, func, [x]), _run_tvm(func, [x]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method, coord, rounding, layout, why", [
    ("nearest_neighbor", "asymmetric", "round", "NCHW", "rounding_method 'round'"),
    ("linear", "tf_half_pixel_for_nn", "", "NCHW", "coordinate_transformation_mode"),
    ("linear", "half_pixel", "", "NHWC", "layout NHWC")])
def test_a_resize2d_without_an_exact_onnx_resize_is_left_to_tvm(method, coord, rounding, layout, why):
    from tvm_pesto.backends.onnx_export.ops import supports_call

    func = _resize_func(method, coord, rounding, layout)
    assert not supports_call(func.body.blocks[0].bindings[0].value)
    with pytest.raises(OnnxExportError, match=why):
        relax_to_onnx(func)


@pytest.mark.parametrize("coord, hw, size, exported", [
    ("half_pixel", (14, 7), (28, 21), True),     # F.interpolate(scale_factor=2 or 3): no coordinate ties
    ("asymmetric", (8, 6), (4, 3), True),
    ("half_pixel", (2, 2), (3, 3), False),        # source 0.5 for x = 1: a tie, where ONNX's roundings differ
    ("asymmetric", (5, 7), (10, 14), False)])     # source 0.5, 1.5, ...
def test_a_nearest_resize_rounding_with_round_is_exported_where_no_coordinate_ties(coord, hw, size, exported):
    # PyTorch's importer writes rounding_method="round" for F.interpolate(mode="nearest")
    # (HRNet's 10 upsamplings): without ties it is any of ONNX's roundings
    from tvm_pesto.backends.onnx_export.ops import supports_call

    func = _resize_func("nearest_neighbor", coord, "round", hw=hw, size=size)
    assert supports_call(func.body.blocks[0].bindings[0].value) == exported
    if not exported:
        with pytest.raises(OnnxExportError, match="halfway"):
            relax_to_onnx(func)
        return
    _library("onnxruntime")
    x = np.random.default_rng(0).standard_normal((1, 3, *hw)).astype("float32")
    np.testing.assert_array_equal(_run_backend("onnxruntime", func, [x]), _run_tvm(func, [x]))


def _pad_func(mode, widths=(0, 0, 0, 0, 1, 2, 2, 0), value=0.5):
    x = relax.Var("x", relax.TensorType((1, 3, 5, 7), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.pad(x, list(widths), mode, value))
        bb.emit_func_output(out)
    return bb.get()["main"]


def _library(backend):
    """Fail unless ``backend`` is available; skip only for OpenVINO not installed (an optional extra)."""
    ok, why = available_backends()
    if backend not in {b.name for b in ok}:
        if backend == "openvino" and importlib.util.find_spec("openvino") is None:
            pytest.skip(f"{backend} is not available here: {why.get(backend)}")
        pytest.fail(f"{backend} is not available here: {why.get(backend)}")


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate"])
def test_pad_runs_in_the_onnx_libraries_as_tvm_computes_it(backend, mode):
    from tvm_pesto.backends.onnx_export.ops import supports_call

    _library(backend)
    func = _pad_func(mode)
    assert supports_call(func.body.blocks[0].bindings[0].value)
    x = np.random.default_rng(0).standard_normal((1, 3, 5, 7)).astype("float32")
    want = _run_tvm(func, [x])
    assert want.shape == (1, 3, 8, 9)
    np.testing.assert_array_equal(_run_backend(backend, func, [x]), want)


@pytest.mark.parametrize("mode, widths, why", [("circular", (0, 0, 0, 0, 1, 1, 1, 1), "pad mode 'circular'"),
                                               ("constant", (0, 0, 0, 0, -1, 0, 0, 0), "negative pad widths")])
def test_a_pad_without_an_onnx_pad_is_left_to_tvm(mode, widths, why):
    from tvm_pesto.backends.onnx_export.ops import supports_call

    func = _pad_func(mode, widths)
    assert not supports_call(func.body.blocks[0].bindings[0].value)
    with pytest.raises(OnnxExportError, match=why):
        relax_to_onnx(func)


def test_unsupported_op_is_a_build_error():
    x = relax.Var("x", relax.TensorType((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.cumprod(x, axis=0))
        bb.emit_func_output(out)
    func = bb.get()["main"]
    for b in ("torch", "onnxruntime"):
        with pytest.raises(BuildError, match="cannot build"):
            get_backend(b).build(func, CPU)
    with pytest.raises(OnnxExportError, match="cumprod"):
        relax_to_onnx(func)


def test_missing_library_is_reported_unavailable(monkeypatch):
    real_import = builtins.__import__

    def no_torch(name, *a, **k):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch' (simulated)")
        return real_import(name, *a, **k)

    class Fresh(TorchBackend):
        pass

    register_backend("torch-missing", Fresh)
    try:
        monkeypatch.setattr(builtins, "__import__", no_torch)
        ok, why = get_backend("torch-missing").available()
        assert not ok and "pip install torch" in why
        with pytest.raises(BackendUnavailableError, match="unavailable"):
            get_backend("torch-missing").require()
        usable, reasons = available_backends(["tvm", "torch-missing"])
        assert [b.name for b in usable] == ["tvm"] and "pip install torch" in reasons["torch-missing"]
    finally:
        monkeypatch.setattr(builtins, "__import__", real_import)
        unregister_backend("torch-missing")


def test_cpu_builds_are_per_core_count():
    mod, _ = tiny_mlp()
    c1, c2 = parse_cluster("cpu:1").devices[0], parse_cluster("cpu:2").devices[0]
    n1 = get_backend("torch").build(mod["main"], c1)
    n2 = get_backend("torch").build(mod["main"], c2)
    assert n1.endswith(f".c{c1.cores}") and n2.endswith(f".c{c2.cores}")
    assert (n1 == n2) == (c1.cores == c2.cores)


def test_thread_count_follows_the_device_threads_affinity():
    c2 = parse_cluster("cpu:2")
    seen = {}

    def work(dev):
        enter_device_thread(dev)
        seen[dev.index] = calling_thread_cores()

    ths = [threading.Thread(target=work, args=(d,)) for d in c2.devices]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert seen == {d.index: d.cores for d in c2.devices}


def test_backend_interface_is_abstract():
    class Half(Backend):
        name = "half"

    with pytest.raises(TypeError):
        Half()


@pytest.mark.slow
def test_metaschedule_variant_reads_a_database(tmp_path, monkeypatch):
    from tvm_pesto.backends.tvm_cpu import TvmMetaScheduleBackend

    monkeypatch.delenv("TVM_PESTO_MS_DB", raising=False)
    ok, why = TvmMetaScheduleBackend(str(tmp_path)).available()
    assert not ok and "database_workload.json" in why
    (tmp_path / "database_workload.json").write_text("")
    (tmp_path / "database_tuning_record.json").write_text("")
    bk = TvmMetaScheduleBackend(str(tmp_path))
    assert bk.available() == (True, "") and bk.tvm_groups and not bk.native
    mod, inputs = tiny_mlp()
    gname = bk.build(mod["main"], CPU)
    out = tvm.runtime.empty((8, 16), "float32", tvm.cpu())
    tvm.get_global_func(gname)(tvm.runtime.tensor(inputs[0]), out)
    np.testing.assert_allclose(out.numpy(), _run_tvm(mod["main"], inputs), atol=1e-5)
    assert bk.release() == 1
    with pytest.raises(Exception):
        tvm.get_global_func(gname)


def test_an_import_error_in_a_backend_module_is_reported_not_swallowed(monkeypatch):
    """A bug in one GPU backend's module (here: cublas.py raising NameError on import) makes
    that backend unavailable with the module and the error named; the others still report."""
    from tvm_pesto.backends import registry

    real = registry.importlib.import_module

    def broken(name, package=None):
        if name == ".gpu.cublas":
            raise NameError("name 'cublasLtCreate' is not defined")
        return real(name, package)

    monkeypatch.setattr(registry.importlib, "import_module", broken)
    unregister_backend("cublas")  # drop a loaded instance: the built-in comes back through the import
    try:
        st_ = backend_status()
        ok, why = st_["cublas"]
        assert not ok and "tvm_pesto/backends/gpu/cublas.py failed to import" in why and "NameError" in why
        assert "cudnn" in st_ and "tensorrt" in st_ and "tvm-cuda" in st_  # the other GPU backends still listed
        assert st_["torch"] == (True, "")
    finally:
        unregister_backend("cublas")


def test_the_backends_command_lists_every_backend_with_its_reason(tmp_path):
    import json

    from click.testing import CliRunner

    from tvm_pesto.cli.main import cli

    out = tmp_path / "b.json"
    res = CliRunner().invoke(cli, ["backends", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(out.read_text())
    assert set(rows) == set(list_backends())
    for name, r in rows.items():
        assert r["available"] or r["reason"], name  # unavailable always says why
    assert rows["tvm"]["available"] and rows["tvm"]["device_kinds"] == ["cpu", "gpu"]


def test_all_with_a_named_only_backend_offers_every_backend_and_that_one():
    """``all,openvino-bf16``: every backend ``all`` offers plus the one named; only the named
    ones are warned about when they cannot run here."""
    names = backend_names("all,openvino-bf16")
    assert names[0] == "tvm" and "openvino-bf16" in names and "onnxruntime" in names
    assert not (set(names) & NAMED_ONLY - {"openvino-bf16"})  # inductor stays out unless named
    assert backend_names(["all", "inductor"]) == backend_names("inductor, all")
    with pytest.raises(PestoError, match="bogus"):
        backend_names("all,bogus")
    mod, _ = tiny_mlp()
    _WARNED.discard("openvino-bf16")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cs = make_candidates(tvm_pesto.analyze(mod), "cpu:1", "all,openvino-bf16")
    warned = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert not [w for w in warned if "'openvino-bf16'" not in w], warned  # not cublas, tensorrt, ...
    have = {c.backend for c in cs.candidates}
    ok, why = backend_status(["openvino-bf16"])["openvino-bf16"]
    assert ("openvino-bf16" in have) == ok and (ok or warned), (have, why)


def test_a_build_lets_go_of_the_weights_whose_digests_it_kept():
    # the digests of a build's weights hold those constants (so no other takes their address
    # meanwhile); once the build returns, the model is the caller's to drop
    import tvm_pesto
    from tvm_pesto.backends import base
    from tvm_pesto.candidates.examples import tiny_cnn

    mod, _ = tiny_cnn()
    placed = tvm_pesto.build(mod, "cpu:1", costs="roofline", measure_final=False)
    assert placed is not None and len(base._digests) == 0
    for c in _constants(mod)[:3]:
        base.constant_digest(c)
    assert len(base._digests) > 0
    base.forget_constants()
    assert len(base._digests) == 0


def _constants(mod):
    from tvm import relax

    from tvm_pesto.backends.onnx_export.graph import is_tensor_const

    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if is_tensor_const(e) else None)
    return found
