"""A library's call at its floor (:mod:`tvm_pesto.run.libraries.calls`): bound inputs, fresh outputs."""
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from tvm_pesto.run.libraries import calls
from tvm_pesto.run.libraries.calls import OnnxRuntimeCall, OpenVinoCall
from tvm_pesto.run.libraries.loaders import onnx_session, openvino_runner


def _onnx(shape, out_shape=None) -> bytes:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape or shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _ort(shape):
    return OnnxRuntimeCall(onnx_session(_onnx(shape), 1))


def _openvino(shape):
    pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install openvino)")
    call = openvino_runner(_onnx(shape), 1).direct
    assert isinstance(call, OpenVinoCall)
    return call


@pytest.fixture(params=["onnxruntime", "openvino"])
def make(request):
    return {"onnxruntime": _ort, "openvino": _openvino}[request.param]


def test_a_refilled_input_is_read_again_and_results_are_never_overwritten(make):
    call = make([2, 3])
    x = np.arange(6, dtype="float32").reshape(2, 3) - 2
    first = call(x)[0]
    if isinstance(call, OpenVinoCall):
        assert call._bound_to and call._bound_to[0][0] is x  # bound by address
    x[...] = -x  # the same array refilled, as in a serving loop
    second = call(x)[0]
    np.testing.assert_array_equal(first, -np.maximum(-x, 0))
    np.testing.assert_array_equal(second, -np.maximum(x, 0))
    assert first is not second and not np.shares_memory(first, second)


def test_other_arrays_rebind_and_unbindable_ones_take_the_librarys_own_call():
    call = _openvino([2, 3])
    a, b = np.ones((2, 3), "float32"), np.full((2, 3), -1.0, "float32")
    np.testing.assert_array_equal(call(a)[0], -a)
    np.testing.assert_array_equal(call(b)[0], np.zeros((2, 3)))
    assert call._bound_to[0][0] is b
    strided = np.ones((3, 2), "float32").T  # not C-contiguous: no binding by address
    np.testing.assert_array_equal(call(strided)[0], -np.ones((2, 3)))
    assert call._bound_to == ()


def test_a_wrong_shape_is_the_library_error(make):
    call = make([2, 3])
    with pytest.raises(Exception, match="(?i)shape|dimension|index"):
        call(np.ones((4, 5), "float32"))


def test_large_or_dynamic_outputs_are_made_by_the_library(make):
    big = calls.BOUND_OUTPUT_BYTES // 4 + 1
    if make is _openvino:
        assert make([1, big])._outs is None and make([2, 3])._outs is not None
        assert make(["n", 3])._outs is None
    call = make(["n", 3])
    np.testing.assert_array_equal(call(np.ones((5, 3), "float32"))[0], -np.ones((5, 3)))


def test_concurrent_calls_each_get_their_own_result(make):
    call = make([4, 8])
    xs = [np.full((4, 8), float(k), "float32") for k in range(8)]
    got, errors = {}, []

    def work(k):
        try:
            for _ in range(50):
                got[k] = call(xs[k])[0]
                np.testing.assert_array_equal(got[k], -xs[k])
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
