"""Zoo models and frontends: import, compile with TVM, compare with PyTorch; static-shape checks."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import tvm
from tvm import relax, tirx

from tvm_pesto import zoo
from tvm_pesto.errors import GraphError, PestoError, UnsupportedModuleError
from tvm_pesto.frontend import check_static, from_onnx, from_torch, symbolic_dims

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def compile_and_run(mod: tvm.IRModule, inputs) -> np.ndarray:
    """Compile ``mod`` whole for one CPU core and run ``main`` on ``inputs``."""
    ex = tvm.compile(mod, target=TARGET, relax_pipeline=relax.get_default_pipeline(TARGET))
    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(ex, dev)
    return vm["main"](*[tvm.runtime.tensor(np.asarray(a), device=dev) for a in inputs]).numpy()


def op_calls(mod: tvm.IRModule, op_name: str | None = None) -> list[relax.Call]:
    calls = []
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call) and (op_name is None or getattr(v.op, "name", None) == op_name):
                calls.append(v)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.list_models())
def test_small_model_matches_torch(name):
    m = zoo.load(name, "small")
    check_static(m.mod)
    ref = zoo.torch_reference(m)
    out = compile_and_run(m.mod, m.example_inputs)
    assert out.shape == ref.shape
    out_scale = float(np.abs(ref).max())
    assert np.isfinite(out).all()
    # random weights are initialised so outputs are O(1); tiny outputs would make the check vacuous
    assert 0.1 < out_scale < 100.0, out_scale
    # tolerance: 1e-4 absolute, scaled by the output magnitude when that exceeds 1
    assert np.abs(out - ref).max() <= 1e-4 * max(1.0, out_scale)


def test_zoo_model_fields_and_cache():
    a = zoo.load("mlp_mixer")
    assert (a.name, a.size) == ("mlp_mixer", "small")
    assert zoo.load("mlp_mixer", "small") is a
    assert isinstance(a.mod, tvm.IRModule)
    assert all(isinstance(x, np.ndarray) and x.dtype == np.float32 for x in a.example_inputs)
    params = a.mod["main"].params
    assert [tuple(int(d) for d in p.ty.shape.values) for p in params] == [x.shape for x in a.example_inputs]
    assert not a.torch_model.training
    # single-output models return a tensor, not a 1-tuple
    assert isinstance(a.mod["main"].ret_ty, relax.TensorType)


def test_builds_are_seeded():
    m1, x1 = zoo.MODELS["gpt2"]("small")
    m2, x2 = zoo.MODELS["gpt2"]("small")
    np.testing.assert_array_equal(x1[0], x2[0])
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)


@pytest.mark.slow
def test_inception_small_is_branchy():
    mod = zoo.load("inception_v3", "small").mod
    concats = op_calls(mod, "relax.concat")
    widths = [len(c.args[0].fields) for c in concats]
    # small: 2 Inception-A, B, 2 Inception-C, D, E -> seven concats of parallel branches
    assert len([w for w in widths if w >= 3]) >= 7, widths
    assert max(widths) >= 4
    assert len(op_calls(mod, "relax.nn.conv2d")) >= 50


def test_batchnorm_imports_in_inference_mode():
    mod = zoo.load("resnet50", "small").mod
    bns = op_calls(mod, "relax.nn.batch_norm")
    assert len(bns) == len(op_calls(mod, "relax.nn.conv2d"))
    assert all(not bool(c.attrs.training) for c in bns)


@pytest.mark.parametrize("module_cls,n_params", [("resnet50.ResNet", 25_557_032),
                                                  ("mobilenet_v2.MobileNetV2", 3_504_872)])
def test_full_presets_have_paper_parameter_counts(module_cls, n_params):
    file, cls = module_cls.split(".")
    module = getattr(zoo, file)
    preset = dict(module.PRESETS["full"])
    preset.pop("image")
    model = getattr(module, cls)(**preset)
    assert sum(p.numel() for p in model.parameters()) == n_params


@pytest.mark.parametrize("name,size", [("resnet", "small"), ("resnet50", "medium"), ("", "full")])
def test_unknown_name_or_size(name, size):
    with pytest.raises(GraphError) as err:
        zoo.load(name, size)
    assert isinstance(err.value, PestoError)
    msg = str(err.value)
    if name in zoo.MODELS:
        assert "small" in msg and "full" in msg
    else:
        assert all(n in msg for n in zoo.list_models())


def test_unknown_size_from_builder():
    with pytest.raises(GraphError, match="valid sizes: full, small"):
        zoo.MODELS["bert"]("tiny")


def _dynamic_param_module() -> tvm.IRModule:
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 4], "float32"))
    w = relax.const(np.ones((4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(y)
    return bb.get()


def _dynamic_binding_module() -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType([8, 4], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            m = tirx.Var("m", "int64")
            r = bb.emit(relax.op.reshape(x, (32,)))
            d = bb.match_cast(r, relax.TensorType([m], "float32"))
            y = bb.emit_output(relax.op.nn.relu(d))
        bb.emit_func_output(y)
    return bb.get()


def test_check_static_rejects_symbolic_parameter():
    mod = _dynamic_param_module()
    with pytest.raises(UnsupportedModuleError) as err:
        check_static(mod)
    msg = str(err.value)
    assert "'x'" in msg and "n" in msg and "static shapes" in msg
    kinds = {(k, v) for k, v, _ in symbolic_dims(mod)}
    assert ("parameter", "x") in kinds


def test_check_static_rejects_symbolic_binding():
    mod = _dynamic_binding_module()
    assert all(int(d) for d in mod["main"].params[0].ty.shape.values)  # the parameter is static
    found = symbolic_dims(mod)
    assert found and found[0][0] == "binding" and found[0][2] == ["m"]
    with pytest.raises(UnsupportedModuleError, match="binding .* dynamic dimension.*m"):
        check_static(mod)


def test_check_static_accepts_zoo_model():
    mod = zoo.load("bert", "small").mod
    check_static(mod)
    assert symbolic_dims(mod) == []


class _TwoOut(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x), x * 2.0


class _DataDependent(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x + 1
        return x - 1


def test_from_torch_keeps_real_tuples():
    x = np.arange(6, dtype="float32").reshape(2, 3) - 2
    mod = from_torch(_TwoOut(), (x,))
    ret = mod["main"].ret_ty
    assert isinstance(ret, (relax.TupleType, tvm.ir.TupleType)) and len(ret.fields) == 2
    ex = tvm.compile(mod, target=TARGET, relax_pipeline=relax.get_default_pipeline(TARGET))
    out = relax.VirtualMachine(ex, tvm.cpu(0))["main"](tvm.runtime.tensor(x))
    np.testing.assert_allclose(out[0].numpy(), np.maximum(x, 0))
    np.testing.assert_allclose(out[1].numpy(), 2 * x)


@pytest.mark.slow
def test_from_torch_eval_batchnorm_and_decomposition_fallback():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 5)
    # eval BatchNorm with running statistics: imported directly as inference batch_norm
    bn = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4, eps=1e-3)).eval()
    bn[1].running_mean.uniform_(-1, 1)
    bn[1].running_var.uniform_(0.5, 2.0)
    # no running statistics: the direct converter refuses, the decomposed import takes over
    nostats = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4, track_running_stats=False))
    for model, op in ((bn, "relax.nn.batch_norm"), (nostats, "relax.nn.instance_norm")):
        mod = from_torch(model, (x,))
        assert op_calls(mod, op)
        with torch.no_grad():
            ref = model.eval()(x).numpy()
        np.testing.assert_allclose(compile_and_run(mod, (x.numpy(),)), ref, atol=1e-5, rtol=1e-5)
    assert all(not bool(c.attrs.training) for c in op_calls(from_torch(bn, (x,)), "relax.nn.batch_norm"))


def test_from_torch_wraps_export_failure():
    with pytest.raises(UnsupportedModuleError, match="torch.export failed for model 'branchy': GuardOnDataDependent"):
        from_torch(_DataDependent(), (torch.ones(2, 2),), name="branchy")


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 8 * 8, 5)

    def forward(self, x):
        return self.fc(torch.flatten(torch.relu(self.conv(x)), 1))


def test_from_onnx_matches_torch(tmp_path):
    model = _Tiny().eval()
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype("float32")
    path = tmp_path / "tiny.onnx"
    torch.onnx.export(model, (torch.from_numpy(x),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}})
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()

    dynamic = from_onnx(path)  # the batch axis stays symbolic
    with pytest.raises(UnsupportedModuleError, match="'x'"):
        check_static(dynamic)

    mod = from_onnx(str(path), shape_dict={"x": x.shape})
    check_static(mod)
    out = compile_and_run(mod, (x,))
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)


def test_from_onnx_model_proto_and_bad_file(tmp_path):
    import onnx

    buf = io.BytesIO()
    torch.onnx.export(torch.nn.Linear(4, 2), (torch.zeros(1, 4),), buf, dynamo=False, input_names=["x"])
    mod = from_onnx(onnx.load_from_string(buf.getvalue()))
    assert [p.name for p in mod["main"].params] == ["x"]
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx file")
    with pytest.raises(UnsupportedModuleError, match="bad.onnx"):
        from_onnx(bad)
