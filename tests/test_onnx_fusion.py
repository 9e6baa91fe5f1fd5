"""The Relax -> ONNX export writes activations in the form ONNX Runtime fuses (as it fuses
torch's own export), and computes what TVM computes."""
import collections

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_pesto.backends.onnx_export.export import relax_to_onnx

import onnx  # noqa: E402 - required dependencies: a broken install fails here, it does not skip
import onnxruntime as ort  # noqa: E402


def _mlp_with(act):
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((4, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, relax.const(rng.standard_normal((16, 16)).astype("float32"))))
            y = bb.emit_output(act(h))
        bb.emit_func_output(y)
    return bb.get(), rng.standard_normal((4, 16)).astype("float32")


def _optimized_ops(model_bytes, tmp_path) -> collections.Counter:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    return collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node)


def test_gelu_is_fused_by_onnx_runtime_and_matches_tvm(tmp_path):
    mod, x = _mlp_with(relax.op.nn.gelu)
    model = relax_to_onnx(mod["main"]).SerializeToString()
    ops = _optimized_ops(model, tmp_path)
    assert ops["Gelu"] == 1 and ops["Erf"] == 0, dict(ops)
    want, got = _tvm_and_ort(mod, model, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _tvm_and_ort(mod, model_bytes, x):
    """(TVM's output, ONNX Runtime's output) of ``mod`` and its export on ``x``."""
    tgt = tvm.target.Target({"kind": "llvm"})
    ex = tvm.compile(mod, target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    want = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    sess = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    return want, sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _hard_sigmoid(shape, result):
    """``x + 3 -> clip(0, 6) -> / 6`` (torch's hardsigmoid as the importer writes it), then
    ``result(x, clipped, h)`` as the function's result."""
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.add(x, relax.const(np.float32(3.0))))
            c = bb.emit(relax.op.clip(a, 0, 6))
            h = bb.emit(relax.op.divide(c, relax.const(np.float32(6.0))))
            y = bb.emit_output(result(x, c, h))
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.parametrize("mul,op", [(False, "HardSigmoid"), (True, "HardSwish")])
def test_hard_activations_export_as_one_op_and_match_tvm(mul, op):
    mod = _hard_sigmoid((2, 8), lambda x, c, h: relax.op.multiply(x, h) if mul else h)
    model = relax_to_onnx(mod["main"])
    assert [n.op_type for n in model.graph.node] == [op]
    xs = (np.random.default_rng(0).standard_normal((2, 8)) * 5).astype("float32")
    want, got = _tvm_and_ort(mod, model.SerializeToString(), xs)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_an_intermediate_the_graph_returns_is_not_fused_away():
    mod = _hard_sigmoid((4,), lambda x, c, h: relax.Tuple([c, h]))
    assert [n.op_type for n in relax_to_onnx(mod["main"]).graph.node] == ["Add", "Clip", "Div"]


def _rms_norm(x):
    """T5's RMS norm as the importer writes it: ``w * (x * rsqrt(mean(x ** 2) + eps))``."""
    w = relax.const((1 + 0.1 * np.random.default_rng(1).standard_normal(16)).astype("float32"))
    sq = relax.op.power(x, relax.const(np.array(2.0, "float32")))
    ms = relax.op.add(relax.op.mean(sq, axis=[-1], keepdims=True), relax.const(np.array(1e-6, "float32")))
    return relax.op.multiply(w, relax.op.multiply(x, relax.op.rsqrt(ms)))


def test_an_rms_norm_is_fused_by_onnx_runtime_and_matches_tvm(tmp_path):
    # rsqrt exports as Reciprocal(Sqrt); a Mul by a Reciprocal is written as a Div, the form
    # ONNX Runtime's SimplifiedLayerNormalization fusion matches (a T5 encoder: 23 % faster)
    mod, x = _mlp_with(_rms_norm)
    model = relax_to_onnx(mod["main"])
    assert [n.op_type for n in model.graph.node].count("Reciprocal") == 0
    ops = _optimized_ops(model.SerializeToString(), tmp_path)
    assert ops["SimplifiedLayerNormalization"] == 1, dict(ops)
    want, got = _tvm_and_ort(mod, model.SerializeToString(), x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_reciprocal_read_elsewhere_stays():
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(relax.op.rsqrt(x))
            y = bb.emit_output(relax.Tuple([relax.op.multiply(x, r), r]))
        bb.emit_func_output(y)
    ops = [n.op_type for n in relax_to_onnx(bb.get()["main"]).graph.node]
    assert ops.count("Reciprocal") == 1 and "Div" not in ops
