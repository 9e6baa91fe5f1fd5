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


def safe_softmax_model(rows: int = 4, cols: int = 6):
    """torch's safe softmax as ``torch.export`` writes it in a timm attention: rows wholly
    ``-inf`` give 0, not NaN; ``any`` of the mask is a ``max`` over int8."""
    x = relax.Var("x", relax.TensorType((1, rows, cols), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            masked = bb.emit(relax.op.equal(x, relax.const(float("-inf"), "float32")))
            kept = bb.emit(relax.op.logical_not(masked))
            any_kept = bb.emit(relax.op.max(relax.op.astype(kept, "int8"), axis=[-1], keepdims=True))
            none = bb.emit(relax.op.logical_not(relax.op.astype(any_kept, "bool")))
            soft = bb.emit(relax.op.nn.softmax(x, axis=-1))
            out = bb.emit_output(relax.op.where(none, relax.const(0.0, "float32"), soft))
        bb.emit_func_output(out)
    data = np.random.default_rng(0).standard_normal((1, rows, cols)).astype("float32")
    data[0, 1, :] = -np.inf  # a row wholly masked
    return bb.get(), [data]


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_safe_softmax_is_one_library_region_and_runs_within_tolerance(backend):
    # the 12 `max` calls over int8 of a ViT-B/16 at 224x224 from TVM's importer were the only
    # ops left to TVM, so neither library had a whole-model option
    import tvm_pesto

    mod, inputs = safe_softmax_model()
    rg = from_relax(mod)
    bks, why = available_backends([backend])
    assert bks, why
    whole = [c for c in generate_candidates(rg, bks).candidates if c.size == rg.graph.num_nodes]
    assert whole, f"no {backend} candidate covers all {rg.graph.num_nodes} ops"
    placed = tvm_pesto.build(mod, cluster="cpu:1", backends=[backend], costs="roofline", measure_final=False)
    want = tvm_pesto.build(mod, cluster="cpu:1", backends=["tvm"], costs="roofline", measure_final=False)
    assert placed.plan.backend_mix() == {backend: rg.graph.num_nodes}
    got, ref = np.asarray(placed(*inputs)), np.asarray(want(*inputs))
    assert np.all(got[0, 1] == 0) and np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
