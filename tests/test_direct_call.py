"""A model that is one library unit runs as the library's own call, on numpy arrays and on
host TVM tensors alike; other models take numpy inputs through a copy that later changes to
the caller's array do not reach."""
from __future__ import annotations

import numpy as np
import pytest
import tvm

from tvm_pesto.api import build_placement, place
from tvm_pesto.candidates.examples import tiny_mlp
from tvm_pesto.cluster.specs import cpu_cluster
from tvm_pesto.choose import whole_model_placement
from tvm_pesto.errors import PestoError
from tvm_pesto.run.thread.executor import to_numpy
import onnxruntime  # noqa: F401 - a required dependency: a broken install fails, it does not skip


@pytest.fixture(scope="module")
def one_unit():
    mod, inputs = tiny_mlp()
    wide = cpu_cluster(1)
    lp = whole_model_placement(place(mod, wide, costs="roofline"), "onnxruntime", wide)
    placed = build_placement(lp, wide)
    yield placed, inputs
    placed.close()


def _no_vm(placed, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the VM path ran; the library's own call was expected")

    monkeypatch.setattr(placed, "_run", refuse)


def test_numpy_and_host_tensors_both_take_the_direct_call(one_unit, monkeypatch):
    placed, inputs = one_unit
    want = placed(*inputs)
    assert isinstance(want, np.ndarray)
    _no_vm(placed, monkeypatch)
    got = placed(*[tvm.runtime.tensor(a) for a in inputs])
    assert isinstance(got, tvm.runtime.Tensor) and got.device.dlpack_device_type() == 1
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(placed(*inputs), want)


def test_the_direct_call_result_feeds_a_tvm_kernel(one_unit):
    placed, inputs = one_unit
    out = placed(*[tvm.runtime.tensor(a) for a in inputs])
    doubled = tvm.runtime.tensor(np.zeros(out.shape, "float32"))
    a = tvm.te.placeholder(out.shape, "float32", "a")
    b = tvm.te.compute(out.shape, lambda *i: a(*i) * 2.0, "b")
    f = tvm.compile(tvm.te.create_prim_func([a, b]), target="llvm")
    f(out, doubled)
    np.testing.assert_allclose(doubled.numpy(), 2.0 * out.numpy())


def test_a_wrong_number_of_inputs_is_refused_on_either_path(one_unit):
    placed, inputs = one_unit
    with pytest.raises(PestoError, match="takes 1 inputs"):
        placed(*inputs, inputs[0])
    with pytest.raises(PestoError, match="takes 1 inputs"):
        placed(*[tvm.runtime.tensor(a) for a in inputs], tvm.runtime.tensor(inputs[0]))


@pytest.mark.slow
@pytest.mark.parametrize("value", [np.arange(6, dtype="int64").reshape(2, 3), np.array([True, False, True]),
                                   np.float32(2.5) * np.ones((), "float32"), np.ones((3, 4), "float16"),
                                   np.arange(12, dtype="float32").reshape(3, 4)[:, 1:3]])
def test_numpy_inputs_are_copied_to_the_device(value):
    mod, inputs = tiny_mlp()
    placed = build_placement(place(mod, "cpu:1", costs="roofline", backends="tvm"), cpu_cluster(1))
    t = placed._on_device(value, 0)
    assert tuple(t.shape) == value.shape and str(t.dtype) == str(value.dtype)
    if value.dtype != bool:  # TVM's kernels assume 64-byte aligned data
        assert np.from_dlpack(t).ctypes.data % 64 == 0
    before = np.array(value, copy=True)
    np.testing.assert_array_equal(to_numpy(t), before)
    if value.ndim:
        value.flat[0] = 0  # the caller's array changes after the call ...
        np.testing.assert_array_equal(to_numpy(t), before)  # ... and the device's copy does not
    placed.close()


def test_a_numpy_input_lands_on_the_cpu_index_of_its_device():
    """TVM's kernels check a tensor's device index against their arguments: an input bound for
    the second CPU device must be a ``cpu:1`` tensor, not a view that numpy's DLPack calls ``cpu:0``."""
    mod, inputs = tiny_mlp()
    placed = build_placement(place(mod, "cpu:2", costs="roofline", backends="tvm"), cpu_cluster(2))
    for d in (0, 1):
        t = placed._on_device(inputs[0], d)
        assert str(t.device) == f"cpu:{d}"
        np.testing.assert_array_equal(to_numpy(t), inputs[0])
    placed.close()


@pytest.mark.parametrize("offset", [0, 1])
def test_a_library_output_becomes_an_aligned_tensor_view_or_copy(offset):
    """A library's output array as a TVM tensor: a view when its data is 64-byte aligned, an
    aligned copy when not (TVM's kernels assume the alignment)."""
    from tvm_pesto.run.runtime import _aligned_copy, _as_tensor

    base = _aligned_copy(np.arange(32, dtype="float32"))
    a = base[offset:offset + 8].reshape(2, 4)
    t = _as_tensor(a, tvm.cpu(0))
    view = np.from_dlpack(t)
    assert str(t.device) == "cpu:0" and view.ctypes.data % 64 == 0
    np.testing.assert_array_equal(view, a)
    assert np.shares_memory(view, a) == (offset == 0)


def test_a_one_unit_model_is_set_up_before_its_first_call(monkeypatch):
    # the library's session for the direct call is made with the model, not inside its first call
    from tvm_pesto.run.libraries import loaders

    made = []
    real = loaders.onnx_session
    monkeypatch.setattr(loaders, "onnx_session", lambda *a, **k: made.append(k.get("spin")) or real(*a, **k))
    monkeypatch.setattr(loaders, "owns_every_core", lambda cores: True)
    mod, inputs = tiny_mlp(seed=7)  # weights of its own: a unit no other test built in this process
    wide = cpu_cluster(1)
    lp = whole_model_placement(place(mod, wide, costs="roofline"), "onnxruntime", wide)
    placed = build_placement(lp, wide)
    try:
        before = list(made)
        placed(*inputs)
        assert made == before and (wide.devices[0].cores < 2 or True in before)  # made, before the call
    finally:
        placed.close()
