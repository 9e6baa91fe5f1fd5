"""A library's call on numpy arrays at its floor: what a one-unit program runs per call.

A library's convenient call (ONNX Runtime's ``session.run(None, feed)``, OpenVINO's
``request.infer(feed)``) checks and wraps its inputs and makes its output arrays on every
call. :class:`OnnxRuntimeCall` skips the wrapper's checks; :class:`OpenVinoCall` does the rest of
that work once:

* inputs seen before (the same memory, shape and type: the same array objects, as in a loop
  that refills its buffers, or new views of them, as a torch tensor's is on every call) stay
  bound by address, and the outputs are written into buffers made
  once, then copied out, when every output has a static shape and they are small together
  (:data:`BOUND_OUTPUT_BYTES`: copying large outputs costs more than the binding saves);
* other inputs go through the library's own call (its unbound path).

Both paths return fresh arrays: a result is never overwritten by a later call. A call from
a second thread while the binding is in use takes the unbound path (the binding is not
shared between concurrent calls).

Examples
--------
>>> import numpy as np, onnx
>>> from onnx import helper, TensorProto
>>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
>>> m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]); m.ir_version = 8
>>> from tvm_pesto.run.libraries.loaders import onnx_session
>>> call = OnnxRuntimeCall(onnx_session(m.SerializeToString(), 1))
>>> x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], dtype="float32")
>>> a = call(x); b = call(x); a[0].tolist(), b[0] is a[0]
([[0.0, 2.0, 0.0], [4.0, 0.0, 6.0]], False)
"""
from __future__ import annotations

import threading

import numpy as np

#: Largest total bytes of a model's outputs that are written into kept buffers and copied
#: out; larger outputs are made by the library per call (a copy of them costs more).
BOUND_OUTPUT_BYTES = 1 << 16


class OnnxRuntimeCall:
    """An ONNX Runtime session's call: the session's own run under its Python wrapper (the
    wrapper checks the feed's names in Python on every call), output names prepared once.

    No binding here: an I/O binding by address measured 3-6 % slower than this run on 0.1 ms
    models (vit, convnext; onnxruntime 1.32), though faster on a one-op model.
    """

    def __init__(self, sess):
        import onnxruntime as ort

        self.sess = sess
        self._in_names = [i.name for i in sess.get_inputs()]
        self._out_names = [o.name for o in sess.get_outputs()]
        raw = getattr(sess, "_sess", None)  # the session under the wrapper; absent in a release: the wrapper
        self._run = getattr(raw, "run", None) or sess.run
        self._options = ort.RunOptions()

    def __call__(self, *arrays):
        return self._run(self._out_names, dict(zip(self._in_names, arrays)), self._options)


class OpenVinoCall:
    """``call(*arrays) -> list of arrays``: an OpenVINO compiled model's call. Bound (module
    docstring): a request whose tensors share the arrays' memory and the kept output buffers;
    unbound, ``infer`` on a request of the calling thread. ``used`` pairs each argument
    position with the model input it feeds (OpenVINO drops inputs the model does not read)."""

    def __init__(self, compiled, used: list, n_args: int):
        self.compiled = compiled
        self._used = used
        self._request = compiled.create_infer_request()  # the bound one, used under the lock
        self._per_thread = threading.local()
        self._in_types = [None] * n_args  # per argument its numpy dtype; None: not read
        for pos, k in used:
            self._in_types[pos] = compiled.inputs[k].get_element_type().to_dtype()
        outs = []
        for o in compiled.outputs:
            ps = o.get_partial_shape()
            if not ps.is_static:
                outs = None
                break
            outs.append((tuple(int(d) for d in ps.to_shape()), o.get_element_type().to_dtype()))
        small = outs is not None and sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in outs) \
            <= BOUND_OUTPUT_BYTES
        self._outs = outs if small else None
        self._lock = threading.Lock()
        self._bound_to: tuple = ()  # (array, address, shape, dtype) of the inputs bound (kept alive here)
        self._buffers: list = []

    def __call__(self, *arrays):
        if self._outs is None or not self._lock.acquire(blocking=False):
            return self._unbound(arrays)
        try:
            bound = self._bound_to
            if len(arrays) != len(bound):
                bound = self._bind(arrays)
            else:
                for a, (b, address, shape, dtype) in zip(arrays, bound):
                    if a is not b and not _same_memory(a, address, shape, dtype):
                        bound = self._bind(arrays)
                        break
            if bound is None:
                return self._unbound(arrays)
            self._request.infer()
            return [b.copy() for b in self._buffers]
        finally:
            self._lock.release()

    def _bind(self, arrays):
        """Bind ``arrays`` and the kept output buffers; return what is bound, or None when an
        array cannot be bound by address as it is (not C-contiguous, or a type the model does
        not take)."""
        import openvino as ov

        self._bound_to = ()
        want = self._in_types
        if len(arrays) != len(want) or any(
                not isinstance(a, np.ndarray) or not a.flags.c_contiguous or (w is not None and a.dtype != w)
                for a, w in zip(arrays, want)):
            return None
        if not self._buffers:
            self._buffers = [np.empty(shape, dtype) for shape, dtype in self._outs]
        for pos, k in self._used:
            self._request.set_input_tensor(k, ov.Tensor(arrays[pos], shared_memory=True))
        for k, buf in enumerate(self._buffers):
            self._request.set_output_tensor(k, ov.Tensor(buf, shared_memory=True))
        self._bound_to = tuple((a, a.ctypes.data, a.shape, a.dtype) for a in arrays)
        return self._bound_to

    def _unbound(self, arrays):
        req = getattr(self._per_thread, "request", None)
        if req is None:
            req = self._per_thread.request = self.compiled.create_infer_request()
        res = req.infer({k: arrays[pos] for pos, k in self._used}, share_inputs=True)
        return list(res.to_tuple())


def _same_memory(a, address: int, shape: tuple, dtype) -> bool:
    """Whether ``a`` is a C-contiguous array of ``shape`` and ``dtype`` at ``address``: the
    memory a binding already points to. The bound array is kept alive, so no other memory can
    be at that address: ``a`` views the same data."""
    return (isinstance(a, np.ndarray) and a.shape == shape and a.dtype == dtype and a.flags.c_contiguous
            and a.ctypes.data == address)


__all__ = ["BOUND_OUTPUT_BYTES", "OnnxRuntimeCall", "OpenVinoCall"]
