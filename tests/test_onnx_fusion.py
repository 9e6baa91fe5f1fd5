"""The Relax -> ONNX export writes activations in the form ONNX Runtime fuses (as it fuses
torch's own export), and computes what TVM computes."""
import collections

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_pesto.backends.onnx_export import relax_to_onnx

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


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
    tgt = tvm.target.Target({"kind": "llvm"})
    ex = tvm.compile(mod, target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    want = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: x})[0], want, rtol=1e-5, atol=1e-5)
