"""Op graph extraction from Relax: nodes, edges, FLOPs and bytes against hand counts."""
import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_pesto.errors import CycleError, GraphError, UnsupportedModuleError
from tvm_pesto.graph import OpGraph, OpNode
from tvm_pesto.graph.fusion import fusion_groups
from tvm_pesto.graph.relax_import import from_relax


@I.ir_module
class ConvMatmulSoftmax:
    @R.function
    def main(x: R.Tensor((1, 3, 16, 16), "float32"), w: R.Tensor((8, 3, 3, 3), "float32"),
             m: R.Tensor((512, 10), "float32")):
        R.func_attr({"num_input": 1})
        with R.dataflow():
            c = R.nn.conv2d(x, w, strides=2, padding=1)  # -> (1, 8, 8, 8)
            r = R.reshape(c, (1, 512))
            y = R.matmul(r, m)  # (1, 512) x (512, 10)
            s = R.nn.softmax(y, axis=-1)
            R.output(s)
        return s


def test_conv_matmul_softmax_flops_and_bytes():
    rg = from_relax(ConvMatmulSoftmax)
    g = rg.graph
    assert [n.op for n in g.nodes] == ["relax.nn.conv2d", "relax.reshape", "relax.matmul", "relax.nn.softmax"]
    conv, reshape, mm, sm = g.nodes
    # conv: 8x8x8 outputs, each 3*3*3 MACs -> 2 * 512 * 27
    assert conv.flops == 2 * 512 * 27
    assert conv.bytes_read == 4 * (3 * 16 * 16 + 8 * 3 * 3 * 3)
    assert conv.bytes_written == 4 * 512
    assert conv.param_bytes == 4 * 8 * 27  # w is a bound parameter (beyond num_input)
    # matmul: 10 outputs, each 512 MACs
    assert mm.flops == 2 * 10 * 512
    assert mm.param_bytes == 4 * 512 * 10
    # softmax: 5 FLOPs per element
    assert sm.flops == 5 * 10
    assert reshape.flops == 0
    assert g.edges() == [(0, 1, 2048), (1, 2, 2048), (2, 3, 40)]
    assert [p.name for p in rg.inputs] == ["x"]


@I.ir_module
class TuplesAndConstants:
    @R.function
    def main(x: R.Tensor((4, 6), "float32")):
        with R.dataflow():
            parts = R.split(x, 2, axis=1)  # one op, two outputs (4, 3) each
            a = parts[0]
            b = parts[1]
            c = R.add(a, R.const(np.ones((4, 3), "float32")))
            d = R.multiply(b, c)
            t = (c, d)
            R.output(t)
        return t


def test_tuples_multiple_outputs_and_constants():
    g = from_relax(TuplesAndConstants).graph
    assert [n.op for n in g.nodes] == ["relax.split", "relax.add", "relax.multiply"]
    split, add, mul = g.nodes
    assert split.bytes_written == 2 * 4 * 3 * 4
    assert len(split.outputs) == 2
    assert add.param_bytes == 4 * 3 * 4  # the constant
    # Edges go through TupleGetItem to the producing op, sized by the item used.
    assert g.edges() == [(0, 1, 48), (0, 2, 48), (1, 2, 48)]


W_T = np.arange(12, dtype="float32").reshape(3, 4)


@I.ir_module
class ConstantTranspose:
    @R.function
    def main(x: R.Tensor((2, 4), "float32")):
        with R.dataflow():
            wt = R.permute_dims(R.const(W_T))  # (4, 3): work on constants alone
            b = R.reshape(R.const(np.ones(3, "float32")), (1, 3))
            y = R.add(R.matmul(x, wt), b)
            R.output(y)
        return y


@I.ir_module
class ConstantTransposeFolded:
    @R.function
    def main(x: R.Tensor((2, 4), "float32")):
        with R.dataflow():
            y = R.add(R.matmul(x, R.const(np.ascontiguousarray(W_T.T))), R.const(np.ones((1, 3), "float32")))
            R.output(y)
        return y


def test_calls_on_constants_alone_are_folded_as_the_build_would():
    """TVM's build pipeline folds a weight's transpose and a reshaped bias: they are not
    work to place or measure, so the graph has no nodes for them."""
    rg = from_relax(ConstantTranspose)
    assert [n.op for n in rg.graph.nodes] == ["relax.matmul", "relax.add"]
    mm, add = rg.graph.nodes
    assert mm.param_bytes == 4 * 12 and add.param_bytes == 4 * 3  # the folded values are the weights
    tvm.ir.assert_structural_equal(rg.func.body.blocks, ConstantTransposeFolded["main"].body.blocks,
                                   map_free_vars=True)


@I.ir_module
class LayoutOnConstants:
    @R.function
    def main(x: R.Tensor((2, 12), "float32")):
        with R.dataflow():
            w = R.permute_dims(R.const(np.arange(24, dtype="float32").reshape(2, 3, 4)), axes=[2, 0, 1])
            w2 = R.reshape(w, (4, 6))
            w3 = R.expand_dims(R.permute_dims(w2), axis=0)  # (1, 6, 4), a chain of folds
            w4 = R.squeeze(w3, axis=[0])
            b = R.flatten(R.const(np.ones((1, 4), "float32")))
            e = R.exp(R.const(np.zeros((6, 4), "float32")))  # not a layout op: FoldConstant's
            y = R.add(R.matmul(R.reshape(x, (4, 6)), R.add(w4, e)), b)
            R.output(y)
        return y


def test_layout_ops_on_constants_fold_in_numpy_to_what_fold_constant_gives():
    from tvm_pesto.graph.fold import fold_layout_constants

    before = LayoutOnConstants
    printed = before.script()
    mine = fold_layout_constants(before)
    assert before.script() == printed  # the module given is left as it was
    ops = [b.value.op.name for b in mine["main"].body.blocks[0].bindings]
    assert sorted(ops) == ["relax.add", "relax.add", "relax.exp", "relax.matmul", "relax.reshape"]
    expected = relax.transform.FoldConstant()(before)
    tvm.ir.assert_structural_equal(relax.transform.FoldConstant()(mine), expected, map_free_vars=True)
    assert [n.op for n in from_relax(before).graph.nodes] == ["relax.reshape", "relax.matmul", "relax.add"]


def test_layout_folding_keeps_a_transformer_stack_as_fold_constant_does():
    from tvm_pesto.candidates.examples import transformer_stack
    from tvm_pesto.graph.fold import fold_layout_constants

    mod, _ = transformer_stack(2)
    mine = fold_layout_constants(mod)
    assert len(mine["main"].body.blocks[0].bindings) == len(mod["main"].body.blocks[0].bindings) - 12
    tvm.ir.assert_structural_equal(relax.transform.FoldConstant()(mine), relax.transform.FoldConstant()(mod),
                                   map_free_vars=True)


def test_a_split_weight_folds_through_its_parts_further_than_fold_constant():
    """``nn.MultiheadAttention`` exports one packed q/k/v weight, split, then each part
    transposed. FoldConstant folds the split but leaves the parts' transposes to run at every
    inference; the NumPy fold takes them too, and the module computes the same."""
    from tvm_pesto.graph.fold import fold_layout_constants

    c = np.arange(32, dtype="float32").reshape(8, 4)
    x = relax.Var("x", relax.TensorType((2, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(relax.op.split(relax.const(c), [3], axis=0))
            w = bb.emit(relax.op.permute_dims(bb.emit(relax.TupleGetItem(parts, 1))))
            y = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(y)
    before = bb.get()
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            bb.emit(relax.Tuple([relax.const(c[:3]), relax.const(c[3:])]))
            y = bb.emit_output(relax.op.matmul(x, relax.const(np.ascontiguousarray(c[3:].T))))
        bb.emit_func_output(y)
    tvm.ir.assert_structural_equal(fold_layout_constants(before), bb.get(), map_free_vars=True)
    assert [n.op for n in from_relax(before).graph.nodes] == ["relax.matmul"]
    left = relax.transform.FoldConstant()(before)["main"].body.blocks[0].bindings  # FoldConstant alone
    assert any(isinstance(b.value, relax.Call) and b.value.op.name == "relax.permute_dims" for b in left)
    xs = np.random.default_rng(0).standard_normal((2, 4)).astype("float32")
    outs = [relax.VirtualMachine(tvm.compile(m, "llvm"), tvm.cpu())["main"](tvm.runtime.tensor(xs)).numpy()
            for m in (before, fold_layout_constants(before))]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[1], xs @ c[3:].T, rtol=1e-6)


def test_position_ids_from_an_arange_of_numbers_fold_to_a_constant():
    """A transformer's position ids (``arange`` of numbers, then a lookup in the position
    table): FoldConstant leaves the range, and all that is computed from it, to run at every
    inference; the fold makes the lookup a constant, so only the model's own ops remain."""
    table = np.random.default_rng(0).standard_normal((16, 4)).astype("float32")
    x = relax.Var("x", relax.TensorType((2, 5, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            ids = bb.emit(relax.op.expand_dims(relax.op.arange(0, 5, 1, "int64"), axis=[0]))
            pos = bb.emit(relax.op.take(relax.const(table), relax.op.astype(ids, "int32"), axis=0))
            y = bb.emit_output(relax.op.add(x, pos))
        bb.emit_func_output(y)
    before = bb.get()
    _folded_beyond_fold_constant(before, "relax.arange")
    xs = np.random.default_rng(1).standard_normal((2, 5, 4)).astype("float32")
    out = relax.VirtualMachine(tvm.compile(before, "llvm"), tvm.cpu())["main"](tvm.runtime.tensor(xs)).numpy()
    np.testing.assert_array_equal(out, xs + table[:5][None])


def _folded_beyond_fold_constant(mod, op: str) -> None:
    """TVM's FoldConstant alone leaves ``op`` in ``mod``; the import's fold leaves only the add."""
    left = relax.transform.FoldConstant()(mod)["main"].body.blocks[0].bindings
    assert any(isinstance(b.value, relax.Call) and b.value.op.name == op for b in left)
    assert [n.op for n in from_relax(mod).graph.nodes] == ["relax.add"]


@pytest.mark.parametrize("axis,exclusive", [(1, False), (2, True), (None, False)])
def test_a_running_sum_of_a_mask_folds_to_a_constant(axis, exclusive):
    """A position embedding of a mask (timm's EdgeNeXt: zeros -> bool -> not -> cumsum in
    float32): FoldConstant folds the mask but not the scan, which then runs at every inference
    and keeps every ONNX library from the whole model; the fold makes it a constant, with the
    values TVM's own kernel computes."""
    x = relax.Var("x", relax.TensorType((1, 3, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            mask = bb.emit(relax.op.logical_not(relax.op.astype(relax.op.zeros((1, 3, 4), "float32"), "bool")))
            pos = bb.emit(relax.op.cumsum(mask, axis=axis, dtype="float32", exclusive=exclusive))
            y = bb.emit_output(relax.op.add(x, relax.op.reshape(pos, (1, 3, 4))))
        bb.emit_func_output(y)
    before = bb.get()
    _folded_beyond_fold_constant(before, "relax.cumsum")
    xs = np.random.default_rng(1).standard_normal((1, 3, 4)).astype("float32")
    want = relax.VirtualMachine(tvm.compile(before, "llvm"), tvm.cpu())["main"](tvm.runtime.tensor(xs)).numpy()
    got = relax.VirtualMachine(tvm.compile(from_relax(before).mod, "llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(xs)).numpy()
    np.testing.assert_array_equal(got, want)


def test_an_arange_of_symbolic_bounds_is_left_as_it_is():
    from tvm_pesto.graph.fold import fold_layout_constants

    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n,), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, relax.op.arange(0, n, 1, "int64")))
        bb.emit_func_output(y)
    before = bb.get()
    tvm.ir.assert_structural_equal(fold_layout_constants(before), before)


def test_dynamic_shapes_are_rejected_with_a_clear_message():
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(y)
    with pytest.raises(UnsupportedModuleError, match="dynamic dimension"):
        from_relax(bb.get())


def test_not_a_module_and_missing_function():
    with pytest.raises(GraphError, match="tvm.IRModule"):
        from_relax("not a module")
    with pytest.raises(GraphError, match="no function 'forward'"):
        from_relax(ConvMatmulSoftmax, "forward")


def test_opgraph_rejects_cycles_and_unknown_nodes():
    nodes = [OpNode("a", "x"), OpNode("b", "y")]
    with pytest.raises(CycleError, match="cycle"):
        OpGraph(nodes, [(0, 1, 1), (1, 0, 1)])
    with pytest.raises(GraphError, match="unknown node 5"):
        OpGraph(nodes, [(0, 5, 1)])
    with pytest.raises(GraphError, match="negative"):
        OpGraph(nodes, [(0, 1, -3)])


@I.ir_module
class ConvBiasRelu:
    @R.function
    def main(x: R.Tensor((1, 3, 8, 8), "float32")):
        with R.dataflow():
            c = R.nn.conv2d(x, R.const(np.ones((4, 3, 3, 3), "float32")), padding=1)
            bias = R.reshape(R.const(np.ones((4,), "float32")), (1, 4, 1, 1))
            a = R.add(c, bias)
            r = R.nn.relu(a)
            p = R.nn.max_pool2d(r, pool_size=(2, 2), strides=(2, 2))
            q = R.nn.relu(p)
            R.output(q)
        return q


def test_fusion_groups_conv_bias_relu_like_tvm():
    g = from_relax(ConvBiasRelu).graph
    groups = fusion_groups(g)
    assert [n.op for n in g.nodes][:3] == ["relax.nn.conv2d", "relax.add", "relax.nn.relu"]  # the bias is folded
    assert groups == [[0, 1, 2], [3, 4]]
    cg = g.contract(groups)
    assert cg.num_nodes == 2 and cg.edges() == [(0, 1, 4 * 4 * 8 * 8)]
    assert cg.nodes[0].flops == sum(g.nodes[i].flops for i in range(3))
