"""The Relax -> ONNX export of ``nn.attention`` (what the torch importer makes of
``scaled_dot_product_attention``) against TVM's own legalization."""
import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_pesto.backends.onnx_export.export import relax_to_onnx
from tvm_pesto.backends.onnx_export.ops import supports_call
from tvm_pesto.run.libraries.loaders import onnx_session


@pytest.mark.slow
@pytest.mark.parametrize("causal", [None, "TopLeft", "BottomRight"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("sq,skv", [(5, 5), (3, 6)])
def test_attention_exports_as_tvm_computes_it(causal, bias, sq, skv):
    b, h, d, dv = 2, 3, 4, 6
    q = relax.Var("q", relax.TensorType((b, sq, h, d), "float32"))
    k = relax.Var("k", relax.TensorType((b, skv, h, d), "float32"))
    v = relax.Var("v", relax.TensorType((b, skv, h, dv), "float32"))
    bv = relax.Var("bias", relax.TensorType((b, h, sq, skv), "float32")) if bias else None
    params = [q, k, v] + ([bv] if bias else [])
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            call = bb.normalize(relax.op.nn.attention(q, k, v, bias=bv, scale=0.3 if bias else None, causal_mask=causal))
            assert supports_call(call)
            y = bb.emit_output(call)
        bb.emit_func_output(y)
    mod = bb.get()
    rng = np.random.default_rng(0)
    arrs = [rng.standard_normal([int(x) for x in p.ty.shape.values]).astype("float32") for p in params]
    tgt = tvm.target.Target({"kind": "llvm"})
    ex = tvm.compile(mod, target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    ref = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in arrs]).numpy()
    sess = onnx_session(relax_to_onnx(mod["main"]).SerializeToString(), 1)
    got = sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrs)})[0]
    assert got.shape == (b, sq, h, dv)
    np.testing.assert_allclose(got, ref, atol=1e-5)
