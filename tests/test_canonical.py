"""The canonical form of an imported module (:mod:`tvm_pesto.graph.canonical`): what TVM's
PyTorch importer spells out in many calls said in one, the values unchanged."""
import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import tvm_pesto
from tvm_pesto.graph.canonical import canonicalize
from tvm_pesto.graph.relax_import import fold_constants


def _ops(mod) -> list[str]:
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call)]


def _run(mod, *arrays) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return (out[0] if not hasattr(out, "numpy") else out).numpy()


class _Attention(torch.nn.Module):
    """timm's attention block: packed q/k/v, heads split by reshape and permute, SDPA, and
    the output projection; ``mask`` adds an additive mask whose first query row is all -inf."""

    def __init__(self, dim=32, heads=4, mask=False):
        super().__init__()
        self.heads, self.qkv, self.proj = heads, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mask = mask

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        m = None
        if self.mask:
            m = torch.zeros(n, n)
            m[0, :] = float("-inf")
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
        return self.proj(y.transpose(1, 2).reshape(b, n, c))


def _tvm_import(model, x):
    from tvm.relax.frontend.torch import from_exported_program

    with torch.no_grad():
        ep = torch.export.export(model.eval(), (torch.from_numpy(x),))
    return fold_constants(from_exported_program(ep, keep_params_as_input=False))


def test_tvm_importers_attention_is_said_once_and_computes_the_same():
    torch.manual_seed(0)
    model, x = _Attention(), np.random.default_rng(0).standard_normal((1, 10, 32)).astype("float32")
    mod = _tvm_import(model, x)
    printed = mod.script()
    canon = canonicalize(mod)
    assert mod.script() == printed  # the module given is left as it was
    before, after = _ops(mod), _ops(canon)
    # the expands, the 3-D views around each bmm and addmm, and the safe softmax's seven calls
    for gone in ("relax.broadcast_to", "relax.where", "relax.equal", "relax.max", "relax.logical_not"):
        assert gone in before and gone not in after, gone
    assert after.count("relax.matmul") == before.count("relax.matmul") and len(after) < len(before) / 2
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_run(canon, x), expected, rtol=1e-5, atol=1e-5)
    assert _ops(canonicalize(canon)) == after  # a fixed point


def test_a_masked_softmax_keeps_its_safe_form():
    # a row the mask removes entirely is 0 in torch's safe softmax, NaN in a plain one
    torch.manual_seed(0)
    model, x = _Attention(mask=True), np.random.default_rng(1).standard_normal((1, 6, 32)).astype("float32")
    canon = canonicalize(_tvm_import(model, x))
    assert "relax.where" in _ops(canon) and "relax.broadcast_to" not in _ops(canon)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    got = _run(canon, x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def _module(build, *shapes):
    params = [relax.Var(f"p{k}", relax.TensorType(s, "float32")) for k, s in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(bb, *params))
        bb.emit_func_output(out)
    return bb.get()


def test_reshapes_around_a_matmul_stay_unless_they_split_the_batch_they_merged():
    op = relax.op

    def around(order):
        def build(bb, a, b):
            a3, b3 = bb.emit(op.reshape(a, (8, 8, 16))), bb.emit(op.reshape(b, (8, 16, 8)))
            return op.reshape(bb.emit(op.matmul(a3, b3)), order)
        return build

    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((2, 4, 8, 16), "float32"), rng.standard_normal((2, 4, 16, 8), "float32")
    same = _module(around((2, 4, 8, 8)), a.shape, b.shape)
    assert _ops(canonicalize(same)) == ["relax.matmul"]
    np.testing.assert_allclose(_run(canonicalize(same), a, b), a @ b, rtol=1e-5, atol=1e-5)
    other = _module(around((4, 2, 8, 8)), a.shape, b.shape)  # splits the batch otherwise: a different array
    assert _ops(canonicalize(other)) == _ops(other)
    np.testing.assert_allclose(_run(canonicalize(other), a, b), (a @ b).reshape(4, 2, 8, 8), rtol=1e-5, atol=1e-5)

    def read_twice(bb, a, b):  # the 3-D product is read by another call too: rewriting would compute it twice
        mm = bb.emit(op.matmul(bb.emit(op.reshape(a, (8, 8, 16))), bb.emit(op.reshape(b, (8, 16, 8)))))
        return op.add(bb.emit(op.reshape(mm, (2, 4, 8, 8))), bb.emit(op.reshape(op.exp(mm), (2, 4, 8, 8))))

    shared = _module(read_twice, a.shape, b.shape)
    assert _ops(canonicalize(shared)).count("relax.matmul") == 1


def test_a_broadcast_that_grows_stays_and_transposes_compose():
    op = relax.op

    def build(bb, x):
        grown = bb.emit(op.broadcast_to(x, (3, 4, 5)))
        same = bb.emit(op.broadcast_to(grown, (3, 4, 5)))
        t = bb.emit(op.permute_dims(bb.emit(op.permute_dims(same, [1, 0, 2])), [2, 1, 0]))
        back = bb.emit(op.permute_dims(bb.emit(op.permute_dims(t, [0, 2, 1])), [0, 2, 1]))
        return op.add(back, bb.emit(op.reshape(bb.emit(op.reshape(t, (20, 3))), (5, 3, 4))))

    x = np.random.default_rng(3).standard_normal((1, 4, 5)).astype("float32")
    mod = _module(build, x.shape)
    canon = canonicalize(mod)
    assert _ops(canon) == ["relax.broadcast_to", "relax.permute_dims", "relax.add"]
    t = np.broadcast_to(x, (3, 4, 5)).transpose(2, 0, 1)
    np.testing.assert_allclose(_run(canon, x), t + t, rtol=0, atol=0)


@pytest.mark.slow
def test_a_tvm_imported_attention_builds_across_libraries_as_torch_computes_it():
    # the canonical module is the one the plan's units are cut from and lowered back into
    from tvm_pesto.backends import backend_status

    if not backend_status(["onnxruntime"])["onnxruntime"][0]:
        pytest.skip("ONNX Runtime is not installed here")
    torch.manual_seed(0)
    model, x = _Attention(), np.random.default_rng(4).standard_normal((1, 10, 32)).astype("float32")
    mod = _tvm_import(model, x)
    an = tvm_pesto.analyze(mod)
    assert an.op_graph.num_nodes == len(_ops(canonicalize(mod)))
    placed = tvm_pesto.build(mod, "cpu:1", backends="tvm,onnxruntime", costs="roofline", measure_final=False)
    with torch.no_grad():
        expected = model(torch.from_numpy(x)).numpy()
    got = placed(x)
    np.testing.assert_allclose(got[0] if isinstance(got, (list, tuple)) else got, expected, rtol=1e-5, atol=1e-5)


def _safe_softmax_of(divisor: float):
    """``where(row all -inf, 0, softmax(a @ b / divisor))`` as TVM's importer spells torch's safe softmax."""
    op = relax.op

    def build(bb, a, b):
        s = bb.emit(op.divide(bb.emit(op.matmul(a, b)), relax.const(np.float32(divisor))))
        p = bb.emit(op.nn.softmax(s, axis=-1))
        finite = bb.emit(op.logical_not(bb.emit(op.equal(s, relax.const(np.float32(-np.inf))))))
        anyf = bb.emit(op.astype(bb.emit(op.max(bb.emit(op.astype(finite, "int8")), axis=[-1], keepdims=True)),
                                 "bool"))
        return op.where(bb.emit(op.logical_not(anyf)), relax.const(np.float32(0)), p)
    return _module(build, (2, 3, 4), (2, 4, 3))


def test_the_safe_softmax_goes_only_where_no_row_can_be_all_minus_infinity():
    assert "relax.where" not in _ops(canonicalize(_safe_softmax_of(2.0)))
    assert "relax.where" in _ops(canonicalize(_safe_softmax_of(0.0)))  # x / 0 is -inf where x < 0
