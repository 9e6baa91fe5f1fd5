"""Graph-level regions take integer data movement (token ids cast and reshaped before an
embedding), so a model on integer inputs can run as one library region; arithmetic stays
float32-only, and op-level backends keep the float32 predicate."""
from __future__ import annotations

import numpy as np
import pytest
from tvm import relax

from tvm_pesto.backends import available_backends
from tvm_pesto.backends.base import MatchContext, region_check
from tvm_pesto.candidates.generate import generate_candidates
from tvm_pesto.graph.relax_import import from_relax
import onnxruntime  # noqa: F401 - a required dependency: a broken install fails, it does not skip


def token_model(tokens: int = 8, vocab: int = 32, dim: int = 16, normalize: bool = False):
    """ids (int64) -> astype int32 -> reshape -> take(embedding) -> relu -> matmul; with
    ``normalize``, first ``where(ids < 0, ids + vocab, ids)`` (what the ONNX importer writes
    before a Gather)."""
    rng = np.random.default_rng(0)
    ids = relax.Var("ids", relax.TensorType((1, tokens), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [ids]):
        with bb.dataflow():
            idx = ids
            if normalize:
                neg = bb.emit(relax.op.less(ids, relax.const(0, "int64")))
                idx = bb.emit(relax.op.where(neg, relax.op.add(ids, relax.const(vocab, "int64")), ids))
            i32 = bb.emit(relax.op.astype(idx, "int32"))
            flat = bb.emit(relax.op.reshape(i32, (tokens,)))
            emb = bb.emit(relax.op.take(relax.const(rng.standard_normal((vocab, dim)).astype("float32")), flat, axis=0))
            act = bb.emit(relax.op.nn.relu(emb))
            out = bb.emit_output(relax.op.matmul(act, relax.const(rng.standard_normal((dim, dim)).astype("float32"))))
        bb.emit_func_output(out)
    return bb.get(), [rng.integers(0, vocab, (1, tokens)).astype("int64")]


@pytest.mark.parametrize("normalize", [False, True])
def test_an_integer_input_model_is_one_onnxruntime_region(normalize):
    mod, _ = token_model(normalize=normalize)
    rg = from_relax(mod)
    bks, _ = available_backends(["tvm", "onnxruntime", "torch"])
    cs = generate_candidates(rg, bks)
    n = rg.graph.num_nodes
    whole = [c for c in cs.candidates if c.backend == "onnxruntime" and c.size == n]
    assert whole, f"no onnxruntime candidate covers all {n} ops: {sorted({c.nodes for c in cs.candidates if c.backend == 'onnxruntime'})}"
    # the op-level torch patterns keep the float32 predicate: no torch candidate holds the int ops
    int_nodes = {v for v in range(n) if str(rg.bindings[rg.node_binding[v]].var.ty.dtype) != "float32"}
    assert len(int_nodes) == (5 if normalize else 2)
    assert not [c for c in cs.candidates if c.backend == "torch" and int_nodes & set(c.nodes)]


def test_integer_division_and_other_float_types_stay_out_of_regions():
    x = relax.Var("x", relax.TensorType((4,), "int32"))
    h = relax.Var("h", relax.TensorType((4,), "float16"))
    bb = relax.BlockBuilder()

    def ok(call):
        return region_check(MatchContext(root=call, calls=[call], annotated_expr={call.op.name[6:]: call}))

    assert ok(bb.normalize(relax.op.add(x, x))) and ok(bb.normalize(relax.op.less(x, x)))
    assert ok(bb.normalize(relax.op.astype(x, "int64")))
    assert not ok(bb.normalize(relax.op.floor_divide(x, x)))  # ONNX's Div truncates, TVM floors
    assert not ok(bb.normalize(relax.op.add(h, h)))  # float arithmetic: float32 only


@pytest.mark.parametrize("normalize", [False, True])
def test_the_whole_region_runs_within_tolerance(normalize):
    import tvm_pesto

    mod, inputs = token_model(normalize=normalize)
    inputs[0][0, :2] = [-1, -3]  # negative ids count from the end after normalization
    if not normalize:
        inputs[0][0, :2] = [1, 3]
    placed = tvm_pesto.build(mod, cluster="cpu:1", backends=["onnxruntime"], costs="roofline", measure_final=False)
    want = tvm_pesto.build(mod, cluster="cpu:1", backends=["tvm"], costs="roofline", measure_final=False)
    assert placed.plan.backend_mix() == {"onnxruntime": 8 if normalize else 5}
    np.testing.assert_allclose(np.asarray(placed(*inputs)), np.asarray(want(*inputs)), rtol=1e-5, atol=1e-5)
