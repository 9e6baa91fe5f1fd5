"""ONNX Runtime's call at its floor (:mod:`tvm_pesto.run.onnx_call`): bound inputs, fresh outputs."""
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from tvm_pesto.run import onnx_call
from tvm_pesto.run.loaders import onnx_session
from tvm_pesto.run.onnx_call import PreparedCall


def _model(shape, out_shape=None):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape or shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return onnx_session(m.SerializeToString(), 1)


def test_a_refilled_input_is_read_again_and_results_are_never_overwritten():
    call = PreparedCall(_model([2, 3]))
    x = np.arange(6, dtype="float32").reshape(2, 3) - 2
    first = call(x)[0]
    assert call._bound_to and call._bound_to[0][0] is x  # bound by address
    x[...] = -x  # the same array refilled, as in a serving loop
    second = call(x)[0]
    np.testing.assert_array_equal(first, -np.maximum(-x, 0))
    np.testing.assert_array_equal(second, -np.maximum(x, 0))
    assert first is not second and not np.shares_memory(first, second)


def test_other_arrays_rebind_and_unbindable_ones_take_the_session_run():
    call = PreparedCall(_model([2, 3]))
    a, b = np.ones((2, 3), "float32"), np.full((2, 3), -1.0, "float32")
    np.testing.assert_array_equal(call(a)[0], -a)
    np.testing.assert_array_equal(call(b)[0], np.zeros((2, 3)))
    assert call._bound_to[0][0] is b
    strided = np.ones((3, 2), "float32").T  # not C-contiguous: no binding by address
    np.testing.assert_array_equal(call(strided)[0], -np.ones((2, 3)))
    assert call._bound_to == ()


def test_a_wrong_shape_is_the_library_error():
    call = PreparedCall(_model([2, 3]))
    with pytest.raises(Exception, match="(?i)shape|dimension|index"):
        call(np.ones((4, 5), "float32"))


def test_large_or_dynamic_outputs_are_made_by_the_library():
    big = onnx_call.BOUND_OUTPUT_BYTES // 4 + 1
    assert PreparedCall(_model([1, big]))._outs is None
    assert PreparedCall(_model(["n", 3]))._outs is None
    call = PreparedCall(_model(["n", 3]))
    np.testing.assert_array_equal(call(np.ones((5, 3), "float32"))[0], -np.ones((5, 3)))


def test_concurrent_calls_each_get_their_own_result():
    call = PreparedCall(_model([4, 8]))
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
