"""The ONNX exporter against what TVM's importers emit: every op they call has a converter or
a reason why not, and each converter's tiny module computes in ONNX Runtime and OpenVINO what
TVM's build computes."""
import numpy as np
import onnxruntime as ort
import pytest
import tvm
from tvm import relax

from tvm_pesto.backends.onnx_export.coverage import UNCONVERTED, importer_ops
from tvm_pesto.backends.onnx_export.export import relax_to_onnx
from tvm_pesto.backends.onnx_export.export import OnnxExportError
from tvm_pesto.backends.onnx_export.ops import CONVERTERS, call_problem, openvino_problem, supports_call

F32 = "float32"


def test_every_op_the_importers_emit_is_converted_or_says_why_not():
    ops = importer_ops()
    assert len(ops) > 100  # the reading found the importers' calls
    missing = sorted(o for o in ops if o not in CONVERTERS and o not in UNCONVERTED)
    assert not missing, f"ops the importers emit with neither a converter nor a reason: {missing}"
    both = sorted(o for o in UNCONVERTED if o in CONVERTERS)
    assert not both, f"listed as unconverted but converted: {both}"


def _v(name, shape, dtype=F32):
    return relax.Var(name, relax.TensorType(shape, dtype))


x4 = lambda: _v("x", (1, 4, 3, 3))  # noqa: E731
x2 = lambda: _v("x", (3, 4))  # noqa: E731
UNIT = lambda: _v("x", (3, 4))  # noqa: E731
i32 = lambda n="a": _v(n, (3, 4), "int32")  # noqa: E731
idx = lambda n, shape: _v(n, shape, "int64")  # noqa: E731
x1d, x3d = lambda: _v("x", (1, 2, 7)), lambda: _v("x", (1, 2, 4, 4, 4))  # noqa: E731
op_ = relax.op

#: The converters of issue #53; ``op:variant`` keys test one op more than once.
NEW_CASES = {
    # sections that do not divide the axis: ceil(n / k) long, the last one shorter (EdgeNeXt's 88 in 3)
    "relax.split:uneven sections": ([_v("x", (1, 8, 2))], lambda p: op_.split(p[0], 3, axis=1)),
    # uneven windows (an output size that does not divide the input): averaging matrices
    "relax.nn.adaptive_avg_pool1d:uneven": ([x1d()], lambda p: op_.nn.adaptive_avg_pool1d(p[0], 3)),
    "relax.nn.adaptive_avg_pool2d:uneven": ([_v("x", (1, 2, 7, 5))], lambda p: op_.nn.adaptive_avg_pool2d(p[0], (3, 4))),
    "relax.nn.adaptive_avg_pool2d:grown": ([_v("x", (1, 3, 1, 2))], lambda p: op_.nn.adaptive_avg_pool2d(p[0], (6, 6))),
    "relax.nn.adaptive_avg_pool3d:uneven": ([_v("x", (1, 2, 5, 3, 4))],
                                            lambda p: op_.nn.adaptive_avg_pool3d(p[0], (2, 2, 3))),
    "relax.nn.rms_norm": ([x2(), _v("w", (4,))], lambda p: op_.nn.rms_norm(p[0], p[1], axes=[-1], epsilon=1e-5)),
    "relax.nn.softplus": ([UNIT()], lambda p: op_.nn.softplus(p[0], beta=2.0, threshold=1.0)),
    "relax.variance": ([x2()], lambda p: op_.variance(p[0], axis=[1], keepdims=True)),
    "relax.std": ([x2()], lambda p: op_.std(p[0])),
    **{f"relax.{n}": ([x2(), _v("y", (3, 4))], lambda p, n=n: getattr(op_, n)(p[0], p[1]))
       for n in ("floor_divide", "floor_mod", "mod")},
    **{f"relax.{n}:int32": ([i32(), i32("b")], lambda p, n=n: getattr(op_, n)(p[0], p[1]))
       for n in ("floor_divide", "floor_mod", "mod")},
    "relax.trunc": ([UNIT()], lambda p: op_.trunc(op_.multiply(p[0], relax.const(5.0, F32)))),
    "relax.trunc:int32": ([i32()], lambda p: op_.trunc(p[0])),
    "relax.isfinite": ([UNIT()], lambda p: op_.isfinite(op_.log(p[0]))),  # NaN of the negative ones
    "relax.bitwise_and": ([_v("a", (3, 4), "bool"), _v("b", (3, 4), "bool")], lambda p: op_.bitwise_and(p[0], p[1])),
    "relax.bitwise_not": ([i32()], lambda p: op_.bitwise_not(p[0])),
    "relax.bitwise_not:bool": ([_v("a", (3, 4), "bool")], lambda p: op_.bitwise_not(p[0])),
    "relax.outer": ([_v("a", (3,)), _v("b", (4,))], lambda p: op_.outer(p[0], p[1])),
    "relax.topk": ([x2()], lambda p: op_.topk(p[0], 2, axis=1, ret_type="both", largest=False)),
    "relax.topk:indices": ([x2()], lambda p: op_.topk(p[0], 2, axis=0, ret_type="indices", dtype="int64")),
    "relax.argsort": ([x2()], lambda p: op_.argsort(p[0], axis=1, descending=True)),
    "relax.median": ([x2()], lambda p: op_.median(p[0], axis=1)),
    "relax.median:all": ([x2()], lambda p: op_.median(p[0])),
    "relax.one_hot": ([idx("i", (3, 2))], lambda p: op_.one_hot(p[0], tvm.tirx.FloatImm(F32, 2.0),
                                                               tvm.tirx.FloatImm(F32, -1.0), 4, axis=1)),
    "relax.meshgrid": ([_v("a", (3,)), _v("b", (4,)), _v("c", (2,))], lambda p: op_.meshgrid(relax.Tuple(p), "ij")),
    "relax.meshgrid:xy": ([_v("a", (3,)), _v("b", (3,))], lambda p: op_.meshgrid(relax.Tuple(p), "xy")),
    "relax.scatter_elements": ([x2(), idx("i", (3, 2)), _v("u", (3, 2))],
                               lambda p: op_.scatter_elements(p[0], p[1], p[2], axis=1, reduction="add")),
    "relax.scatter_nd": ([x2(), idx("i", (2, 1)), _v("u", (2, 4))],
                         lambda p: op_.scatter_nd(p[0], p[1], p[2], reduction="add")),
    "relax.index_tensor": ([x2(), idx("i", (2, 1)), idx("j", (3,))],
                           lambda p: op_.index_tensor(p[0], relax.Tuple(p[1:]))),
    "relax.index_put": ([x2(), idx("i", (2,)), idx("j", (2,)), _v("v", (2,))],
                        lambda p: op_.index_put(p[0], relax.Tuple(p[1:3]), p[3], accumulate=True)),
    "relax.slice_scatter": ([x2(), _v("s", (3, 2))], lambda p: op_.slice_scatter(p[0], p[1], 1, 4, 2, axis=1)),
    "relax.bucketize": ([x2()], lambda p: op_.bucketize(
        p[0], relax.const(np.array([-0.5, -0.1, 0.0, 0.3, 0.7], F32)), out_int32=True, right=True)),
    "relax.nn.conv2d_transpose": ([x4(), _v("w", (4, 2, 3, 3))], lambda p: op_.nn.conv2d_transpose(
        p[0], p[1], strides=2, padding=1, output_padding=1)),
    "relax.nn.conv2d_transpose:groups": ([x4(), _v("w", (4, 3, 3, 3))], lambda p: op_.nn.conv2d_transpose(
        p[0], p[1], strides=2, padding=(1, 0, 0, 1), output_padding=1, dilation=2, groups=2)),
    "relax.topk:int32": ([i32()], lambda p: op_.topk(p[0], 3, axis=1, ret_type="values")),
    "relax.scatter_elements:int32": ([i32(), idx("i", (3, 2)), i32("u")], lambda p: op_.scatter_elements(
        p[0], p[1], op_.strided_slice(p[2], [1], [0], [2]), axis=1, reduction="mul")),
    "relax.nn.conv1d_transpose": ([_v("x", (1, 4, 5)), _v("w", (4, 3, 3))], lambda p: op_.nn.conv1d_transpose(
        p[0], p[1], strides=2, padding=(1, 0), dilation=2)),
    "relax.nn.conv3d": ([_v("x", (1, 2, 5, 5, 5)), _v("w", (3, 2, 2, 2, 2))],
                        lambda p: op_.nn.conv3d(p[0], p[1], strides=2, padding=1)),
    "relax.nn.avg_pool1d": ([x1d()], lambda p: op_.nn.avg_pool1d(p[0], 3, 2, padding=1, count_include_pad=False)),
    "relax.nn.avg_pool3d": ([x3d()], lambda p: op_.nn.avg_pool3d(p[0], 2, 2, padding=1, count_include_pad=True)),
    "relax.nn.max_pool1d": ([x1d()], lambda p: op_.nn.max_pool1d(p[0], 2, 2, padding=1, dilation=2)),
    "relax.nn.max_pool3d": ([x3d()], lambda p: op_.nn.max_pool3d(p[0], 3, 1, padding=1)),
    "relax.nn.adaptive_avg_pool1d": ([_v("x", (1, 2, 8))], lambda p: op_.nn.adaptive_avg_pool1d(p[0], 4)),
    "relax.nn.adaptive_avg_pool3d": ([x3d()], lambda p: op_.nn.adaptive_avg_pool3d(p[0], (2, 1, 4))),
    "relax.image.resize3d": ([_v("x", (1, 2, 2, 3, 3))], lambda p: op_.image.resize3d(
        p[0], (4, 6, 5), method="linear", coordinate_transformation_mode="half_pixel")),
    "relax.image.resize3d:nearest": ([_v("x", (1, 2, 2, 3, 3))], lambda p: op_.image.resize3d(
        p[0], (4, 6, 5), method="nearest_neighbor", coordinate_transformation_mode="asymmetric",
        rounding_method="floor")),
}

#: op -> (params, body(params) -> relax expr, input arrays); one tiny module each.
CASES = {
    **{f"relax.{n}": ([UNIT()], lambda p, n=n: getattr(relax.op, n)(p[0])) for n in
       ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "atanh", "isnan", "isinf")},
    "relax.acosh": ([UNIT()], lambda p: relax.op.acosh(relax.op.add(relax.op.abs(p[0]), relax.const(1.5, F32)))),
    "relax.logical_xor": ([_v("a", (3, 4), "bool"), _v("b", (3, 4), "bool")],
                          lambda p: relax.op.logical_xor(p[0], p[1])),
    "relax.flip": ([x2()], lambda p: relax.op.flip(p[0], axis=1)),
    "relax.tile": ([x2()], lambda p: relax.op.tile(p[0], [2, 1, 3])),
    "relax.stack": ([x2(), _v("y", (3, 4))], lambda p: relax.op.stack(relax.Tuple(p), axis=1)),
    "relax.cumsum": ([x2()], lambda p: relax.op.cumsum(p[0], axis=1, exclusive=True)),
    "relax.tril": ([x2()], lambda p: relax.op.tril(p[0], 1)),
    "relax.triu": ([x2()], lambda p: relax.op.triu(p[0], -1)),
    "relax.argmax": ([x2()], lambda p: relax.op.argmax(p[0], axis=1, keepdims=True)),
    "relax.argmin": ([x2()], lambda p: relax.op.argmin(p[0], axis=0)),
    "relax.gather_elements": ([x2(), _v("i", (3, 2), "int64")], lambda p: relax.op.gather_elements(p[0], p[1], 1)),
    "relax.gather_nd": ([x2(), _v("i", (2, 2), "int64")], lambda p: relax.op.gather_nd(p[0], p[1])),
    "relax.einsum": ([x2(), _v("y", (4, 5))], lambda p: relax.op.einsum(relax.Tuple(p), "ij,jk->ik")),
    "relax.nn.prelu": ([x4(), _v("a", (4,))], lambda p: relax.op.nn.prelu(p[0], p[1])),
    "relax.nn.instance_norm": ([x4(), _v("g", (4,)), _v("b", (4,))],
                               lambda p: relax.op.nn.instance_norm(p[0], p[1], p[2], 1, [2, 3])),
    "relax.nn.pixel_shuffle": ([x4()], lambda p: relax.op.nn.pixel_shuffle(p[0], 2)),
    "relax.nn.group_norm": ([x4(), _v("g", (4,)), _v("b", (4,))],
                            lambda p: relax.op.nn.group_norm(p[0], p[1], p[2], 2, 1, [2, 3])),
    **NEW_CASES,
}


def _pixel_shuffle(x):
    import torch

    return torch.nn.functional.pixel_shuffle(torch.from_numpy(x), 2).numpy()


#: Ops TVM 0.27 cannot build (no legalization: topi has no pixel_shuffle): PyTorch's result is
#: the reference, and exported, the op runs in a library where TVM cannot run it at all.
TVM_CANNOT = {"relax.nn.pixel_shuffle": _pixel_shuffle}


def _inputs(params):
    rng = np.random.default_rng(0)
    out = []
    for p in params:
        shape, dt = tuple(int(d) for d in p.ty.shape.values), str(p.ty.dtype)
        if dt == "bool":
            out.append(rng.integers(0, 2, shape).astype(bool))
        elif dt == "int64":
            out.append(rng.integers(0, 2, shape).astype(np.int64))  # valid indices of every axis here
        elif dt == "int32":  # nonzero, of both signs: divisors too
            out.append((rng.integers(1, 9, shape) * rng.choice([-1, 1], shape)).astype(np.int32))
        else:
            out.append(rng.uniform(-0.9, 0.9, shape).astype(F32))
    return out


def _func(params, body):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            call = bb.emit(body(params))
            y = bb.emit_output(call)
        bb.emit_func_output(y)
    mod = bb.get()
    return mod, [b.value for b in mod["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)][-1]


def _tvm(mod, arrays):
    target = tvm.target.Target({"kind": "llvm"})
    ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    res = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return [res.numpy()] if hasattr(res, "numpy") else [r.numpy() for r in res]


@pytest.mark.parametrize("op", sorted(CASES))
def test_each_new_converter_computes_what_tvm_computes_in_onnx_runtime_and_openvino(op):
    import openvino as ov

    params, body = CASES[op]
    mod, call = _func(params, body)
    assert call.op.name == op.split(":")[0] and supports_call(call)
    arrays = _inputs(params)
    wants = _tvm(mod, arrays) if op not in TVM_CANNOT else [TVM_CANNOT[op](*arrays)]
    model = relax_to_onnx(mod["main"]).SerializeToString()
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    gots = sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrays)})
    assert len(gots) == len(wants)
    for got, want in zip(gots, wants):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    compiled = ov.Core().compile_model(ov.Core().read_model(model), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    gots = compiled(arrays)
    for k, want in enumerate(wants):
        got = np.asarray(gots[k])
        assert got.shape == want.shape
        np.testing.assert_allclose(got.astype(want.dtype), want, rtol=1e-4, atol=1e-4)


def test_calls_an_op_converter_cannot_take_exactly_are_refused_with_the_op_left_to_tvm():
    x = _v("x", (3, 4))
    _, call = _func([x], lambda p: relax.op.argmax(p[0]))  # over every axis
    assert not supports_call(call)
    _, call = _func([x], lambda p: relax.op.cumsum(p[0], axis=0, dtype="int64"))  # into another dtype
    assert not supports_call(call)
    g, b = _v("g", (4,)), _v("b", (4,))
    _, call = _func([x4(), g, b], lambda p: relax.op.nn.instance_norm(p[0], p[1], p[2], 1, [2]))  # one spatial axis
    assert not supports_call(call)
    _, call = _func([x4(), g, b], lambda p: relax.op.nn.group_norm(p[0], p[1], p[2], 2, 1, [2, 3], center=False))
    assert not supports_call(call)


#: A call each new converter refuses (an attribute value or layout ONNX cannot compute exactly)
#: -> the words of its reason.
REFUSED = {
    "scatter_elements max": ([x2(), idx("i", (3, 2)), _v("u", (3, 2))], lambda p: op_.scatter_elements(
        p[0], p[1], p[2], axis=1, reduction="max"), "reduction 'max'"),
    "scatter_nd min": ([x2(), idx("i", (2, 1)), _v("u", (2, 4))], lambda p: op_.scatter_nd(
        p[0], p[1], p[2], reduction="min"), "reduction 'min'"),
    "avg_pool dilated": ([x1d()], lambda p: op_.nn.avg_pool1d(p[0], 2, dilation=2), "no dilation at opset 17"),
    "max_pool NWC": ([x1d()], lambda p: op_.nn.max_pool1d(p[0], 2, layout="NWC"), "layout NWC"),
    "conv2d_transpose NHWC": ([_v("x", (1, 3, 3, 4)), _v("w", (4, 3, 3, 2))], lambda p: op_.nn.conv2d_transpose(
        p[0], p[1], data_layout="NHWC", kernel_layout="IHWO"), "only ('NCHW', 'IOHW', 'NCHW')"),
    "conv3d into float64": ([_v("x", (1, 2, 3, 3, 3)), _v("w", (2, 2, 1, 1, 1))], lambda p: op_.nn.conv3d(
        p[0], p[1], out_dtype="float64"), "into float64"),
    "bitwise_and of int32": ([i32(), i32("b")], lambda p: op_.bitwise_and(p[0], p[1]), "opset 18"),
    "variance of int32": ([i32()], lambda p: op_.variance(p[0]), "integer mean"),
    "resize3d cubic": ([_v("x", (1, 2, 2, 3, 3))], lambda p: op_.image.resize3d(p[0], (4, 6, 5), method="cubic"),
                       "method 'cubic'"),
    "meshgrid xy of unequal sizes": ([_v("a", (3,)), _v("b", (4,))], lambda p: op_.meshgrid(relax.Tuple(p), "xy"),
                                     "'ij' shape"),
    "index_put of one value": ([x2(), idx("i", (2,)), idx("j", (2,)), _v("v", (1,))],
                               lambda p: op_.index_put(p[0], relax.Tuple(p[1:3]), p[3]), "not one per index"),
    "median over two axes": ([x2()], lambda p: op_.median(p[0], axis=[0, 1]), "several axes"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_attribute_value_keeps_the_call_in_tvm_with_its_reason(case):
    params, body, why = REFUSED[case]
    mod, call = _func(params, body)
    assert not supports_call(call) and why in call_problem(call)
    with pytest.raises(OnnxExportError, match=why.replace("(", r"\(").replace(")", r"\)")):
        relax_to_onnx(mod["main"])


def test_sorts_put_equal_values_lower_index_first_and_openvino_leaves_their_indices_to_tvm():
    """ONNX's TopK (ONNX Runtime) orders ties as TVM's stable sort does; OpenVINO's does not, so
    its backend keeps the calls whose indices it would order otherwise, and takes the rest."""
    from tvm_pesto.backends import get_backend

    ov_backend = get_backend("openvino")
    ties = np.random.default_rng(1).integers(0, 3, (3, 40)).astype(np.int32)
    for body in (lambda p: op_.argsort(p[0], axis=1, descending=True), lambda p: op_.topk(p[0], 30, axis=1),
                 lambda p: op_.median(p[0], axis=1)):
        mod, call = _func([_v("x", (3, 40), "int32")], body)
        wants = _tvm(mod, [ties])
        sess = ort.InferenceSession(relax_to_onnx(mod["main"]).SerializeToString(), providers=["CPUExecutionProvider"])
        for got, want in zip(sess.run(None, {sess.get_inputs()[0].name: ties}), wants):
            np.testing.assert_array_equal(got, want)
        assert supports_call(call) and not ov_backend.supports_op(call)
        assert "lower index first" in openvino_problem(call)
    _, values_only = _func([_v("x", (3, 40), "int32")], lambda p: op_.topk(p[0], 30, axis=1, ret_type="values"))
    assert ov_backend.supports_op(values_only)
    _, overhang = _func([_v("x", (1, 2, 7, 6))], lambda p: op_.nn.avg_pool2d(
        p[0], 3, 2, padding=1, ceil_mode=True, count_include_pad=True))
    assert supports_call(overhang) and "OpenVINO counts it otherwise" in openvino_problem(overhang)
