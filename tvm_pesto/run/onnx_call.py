"""ONNX Runtime's call on numpy arrays at its floor: what a one-unit program runs per call.

``session.run(None, feed)`` checks the feed's names in Python and makes its output arrays
on every call. :class:`PreparedCall` does that work once:

* inputs seen before (the same array objects of the same shape and type, as in a loop that
  refills its buffers) stay bound by address in an I/O binding, and the outputs are written into buffers made once,
  then copied out, when every output has a static shape and they are small together
  (:data:`BOUND_OUTPUT_BYTES`: copying large outputs costs more than the binding saves);
* other inputs go through the session's own run with the output names prepared.

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
>>> from tvm_pesto.run.loaders import onnx_session
>>> call = PreparedCall(onnx_session(m.SerializeToString(), 1))
>>> x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], dtype="float32")
>>> a = call(x); b = call(x); a[0].tolist(), b[0] is a[0]
([[0.0, 2.0, 0.0], [4.0, 0.0, 6.0]], False)
"""
from __future__ import annotations

import threading

import numpy as np

#: Largest total bytes of a model's outputs that are written into kept buffers and copied
#: out; larger outputs are made by ONNX Runtime per call (a copy of them costs more).
BOUND_OUTPUT_BYTES = 1 << 16

_NUMPY_OF_ONNX = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
                  "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
                  "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def _static_outputs(sess) -> list | None:
    """``[(name, shape, dtype)]`` of the session's outputs, or None when a shape or type is
    not known before the call."""
    outs = []
    for o in sess.get_outputs():
        dt = _NUMPY_OF_ONNX.get(o.type)
        if dt is None or not all(isinstance(d, int) and d >= 0 for d in o.shape):
            return None
        outs.append((o.name, tuple(o.shape), dt))
    return outs


class PreparedCall:
    """``call(*arrays) -> list of arrays``: ``sess`` run on numpy arrays (module docstring)."""

    def __init__(self, sess):
        import onnxruntime as ort

        self.sess = sess
        self._in_names = [i.name for i in sess.get_inputs()]
        self._out_names = [o.name for o in sess.get_outputs()]
        # ONNX Runtime's session object under its Python wrapper (the wrapper's run checks
        # the feed in Python on every call); the wrapper where a release has no such object
        raw = getattr(sess, "_sess", None)
        self._run = getattr(raw, "run", None)
        run_bound = getattr(raw, "run_with_iobinding", None)
        self._run_bound = ((lambda io: run_bound(io._iobinding, None)) if run_bound is not None
                           and hasattr(sess.io_binding(), "_iobinding") else sess.run_with_iobinding)
        self._options = ort.RunOptions()
        outs = _static_outputs(sess)
        small = outs is not None and sum(int(np.prod(s)) * np.dtype(d).itemsize for _, s, d in outs) <= BOUND_OUTPUT_BYTES
        self._outs = outs if small else None
        self._lock = threading.Lock()
        self._bound_to: tuple = ()  # (array, shape, dtype) of the inputs bound (kept alive here)
        self._binding = None
        self._buffers: list = []

    def __call__(self, *arrays):
        if self._outs is None or not self._lock.acquire(blocking=False):
            return self._unbound(arrays)
        try:
            bound = self._bound_to
            if len(arrays) != len(bound):
                bound = self._bind(arrays)
            else:
                for a, (b, shape, dtype) in zip(arrays, bound):
                    if a is not b or a.shape != shape or a.dtype != dtype:
                        bound = self._bind(arrays)
                        break
            if bound is None:
                return self._unbound(arrays)
            # no RunOptions here: with one, a bound run measured 60 % slower (onnxruntime 1.32)
            self._run_bound(self._binding)
            return [b.copy() for b in self._buffers]
        finally:
            self._lock.release()

    def _unbound(self, arrays):
        feed = dict(zip(self._in_names, arrays))
        if self._run is not None:
            return self._run(self._out_names, feed, self._options)
        return self.sess.run(self._out_names, feed, self._options)

    def _bind(self, arrays):
        """Bind ``arrays`` and the kept output buffers; return what is bound, or None when an
        array cannot be bound by address as it is (not C-contiguous, or a type the session
        does not take)."""
        self._bound_to, self._binding = (), None
        if len(arrays) != len(self._in_names):
            return None
        want = [_NUMPY_OF_ONNX.get(i.type) for i in self.sess.get_inputs()]
        if any(not isinstance(a, np.ndarray) or not a.flags.c_contiguous or a.dtype != w
               for a, w in zip(arrays, want)):
            return None
        io = self.sess.io_binding()
        for name, a in zip(self._in_names, arrays):
            io.bind_input(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
        if not self._buffers:
            self._buffers = [np.empty(shape, dtype) for _, shape, dtype in self._outs]
        for (name, shape, dtype), buf in zip(self._outs, self._buffers):
            io.bind_output(name, "cpu", 0, dtype, list(shape), buf.ctypes.data)
        self._binding, self._bound_to = io, tuple((a, a.shape, a.dtype) for a in arrays)
        return self._bound_to


__all__ = ["BOUND_OUTPUT_BYTES", "PreparedCall"]
