"""The ONNX exporter against what TVM's importers emit: every op they call has a converter or
a reason why not, and each converter's tiny module computes in ONNX Runtime and OpenVINO what
TVM's build computes."""
import numpy as np
import onnxruntime as ort
import pytest
import tvm
from tvm import relax

from tvm_pesto.backends.onnx_coverage import UNCONVERTED, importer_ops
from tvm_pesto.backends.onnx_export import relax_to_onnx
from tvm_pesto.backends.onnx_ops import CONVERTERS, supports_call

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
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


@pytest.mark.parametrize("op", sorted(CASES))
def test_each_new_converter_computes_what_tvm_computes_in_onnx_runtime_and_openvino(op):
    import openvino as ov

    params, body = CASES[op]
    mod, call = _func(params, body)
    assert call.op.name == op and supports_call(call)
    arrays = _inputs(params)
    want = _tvm(mod, arrays) if op not in TVM_CANNOT else TVM_CANNOT[op](*arrays)
    model = relax_to_onnx(mod["main"]).SerializeToString()
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    got = sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrays)})[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    compiled = ov.Core().compile_model(ov.Core().read_model(model), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    got = compiled(arrays)[0]
    np.testing.assert_allclose(np.asarray(got).astype(want.dtype), want, rtol=1e-4, atol=1e-4)


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
