"""Fold layout ops on constants, and ranges of constant bounds, in NumPy, before Relax
``FoldConstant`` sees them.

``FoldConstant`` evaluates each call on constants by legalizing it and compiling a kernel
for it, which costs a compile per call. A model exported with ``torch.export`` carries one
``permute_dims`` of a constant per linear layer (the weight's transpose), so on a deep
transformer those compiles are most of the import. The calls this module folds only move
data (a transpose, or a reshape-like op that keeps the element order), so NumPy gives the
same values bit for bit, in microseconds; the result is structurally the module
``FoldConstant`` gives (``tests/test_graph.py``), except after a ``split`` of a constant
(``nn.MultiheadAttention``'s packed q/k/v weight): ``FoldConstant`` folds the split but
leaves the transposes of its parts to run at every inference, and this fold takes them too.
An ``arange`` whose bounds are numbers (the position ids of a transformer exported from
PyTorch) becomes its values too: ``FoldConstant`` folds only calls on tensor constants, so it
left the range, and everything computed from it, to run at every inference, in a kernel that
no ONNX library is given. A ``cumsum`` of an integer or boolean constant (the position
embedding of a mask, as timm's EdgeNeXt builds it; ``FoldConstant`` does not fold scans)
becomes its values too: integer sums are exact in NumPy. Anything else on constants is left to
``FoldConstant``.

Examples
--------
>>> import numpy as np
>>> from tvm import relax
>>> bb = relax.BlockBuilder()
>>> x = relax.Var("x", relax.TensorType((2, 3), "float32"))
>>> with bb.function("main", [x]):
...     w = bb.emit(relax.op.permute_dims(relax.const(np.ones((4, 3), "float32"))))
...     _ = bb.emit_func_output(bb.emit(relax.op.matmul(x, w)))
>>> folded = fold_layout_constants(bb.get())
>>> [b.value.op.name for b in folded["main"].body.blocks[0].bindings]  # the transpose is gone
['relax.matmul']
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator


def _permute(data: np.ndarray, call, shape) -> np.ndarray:
    axes = call.attrs.axes
    return np.ascontiguousarray(np.transpose(data, None if axes is None else [int(a) for a in axes]))


def _keep_order(data: np.ndarray, call, shape) -> np.ndarray:
    return np.ascontiguousarray(data.reshape(shape))


def _cumsum(data: np.ndarray, call, shape) -> np.ndarray | None:
    """A running sum of integers or booleans (exact in any dtype that holds it); None for floats,
    whose sums NumPy may round otherwise than TVM's kernel."""
    if data.dtype.kind not in "biu":
        return None
    at = call.attrs
    axis = None if at.axis is None else int(at.axis)
    values = np.cumsum(data.astype(np.int64), axis=axis)
    if bool(at.exclusive):
        values = values - (data.astype(np.int64) if axis is not None else data.astype(np.int64).ravel())
    return np.ascontiguousarray(values.reshape(shape))


#: Relax op -> how NumPy computes it from the constant data and the call's static output
#: shape (None: leave it to ``FoldConstant``). Each one moves data or sums integers, so the
#: result is exact.
FOLDERS = {
    "relax.cumsum": _cumsum,
    "relax.permute_dims": _permute,
    "relax.reshape": _keep_order,
    "relax.expand_dims": _keep_order,
    "relax.squeeze": _keep_order,
    "relax.flatten": _keep_order,
}  # and ``relax.split`` (a tuple of constants), with the parts taken from it


def _static_shape(ty):
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = list(ty.shape.values)
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


@mutator
class _LayoutFolder(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.folded: dict = {}  # binding var -> the constant it was replaced by
        self.parts: dict = {}  # binding var of a folded split -> its tuple of constants

    def visit_var_(self, op):
        return self.folded.get(op, op)

    def visit_dataflow_var_(self, op):
        return self.folded.get(op, op)

    def visit_var_binding_(self, binding):
        const = self._fold(binding)
        if const is None:
            return super().visit_var_binding_(binding)
        if isinstance(const, relax.Tuple):  # kept, bound to its constants, as FoldConstant keeps it
            self.parts[binding.var] = const
            self.builder_.emit_normalized(relax.VarBinding(binding.var, const))
            return None
        self.folded[binding.var] = const  # the binding goes; its uses read the constant
        return None

    def _fold(self, binding):
        call = binding.value
        if isinstance(call, relax.TupleGetItem):  # a part of a folded split
            parts = self.parts.get(call.tuple_value)
            return None if parts is None else parts.fields[call.index]
        if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
            return None
        if call.op.name == "relax.split":
            return self._split(call, binding.var.ty)
        if call.op.name == "relax.arange":
            return _arange(call, binding.var.ty)
        fold = FOLDERS.get(call.op.name)
        shape = _static_shape(binding.var.ty)
        if fold is None or shape is None or not call.args:
            return None
        data = self.visit_expr(call.args[0])
        if not isinstance(data, tvm.ir.GenericConst) or not hasattr(data.value, "numpy"):
            return None
        value = fold(data.value.numpy(), call, shape)
        if value is None or value.shape != shape:
            return None  # not what the type says: leave it to FoldConstant
        return relax.const(value, binding.var.ty.dtype)

    def _split(self, call, ty):
        """``split`` of a constant (a packed q/k/v projection's weight): a tuple of constants."""
        data = self.visit_expr(call.args[0])
        if not isinstance(data, tvm.ir.GenericConst) or not hasattr(data.value, "numpy") \
                or not isinstance(ty, relax.TupleType):
            return None
        how = call.attrs.indices_or_sections
        cuts = int(how) if isinstance(how, tvm.tirx.IntImm) else [int(i) for i in how]
        parts = np.split(data.value.numpy(), cuts, axis=int(call.attrs.axis))
        shapes = [_static_shape(f) for f in ty.fields]
        if len(parts) != len(shapes) or any(p.shape != sh for p, sh in zip(parts, shapes)):
            return None
        return relax.Tuple([relax.const(np.ascontiguousarray(p), f.dtype) for p, f in zip(parts, ty.fields)])


def _number(arg):
    """The Python number of a constant scalar argument, or None (a symbolic one)."""
    return arg.value if isinstance(arg, (tvm.tirx.IntImm, tvm.tirx.FloatImm)) else None


def _arange(call, ty):
    """``arange(start, end, step)`` of numbers: its values as a constant (None: not numbers, or
    not of the static shape its type says)."""
    bounds = [_number(a) for a in call.args]
    shape = _static_shape(ty)
    if any(b is None for b in bounds) or shape is None:
        return None
    value = np.arange(*bounds).astype(str(ty.dtype))
    return relax.const(value, str(ty.dtype)) if value.shape == shape else None


def fold_layout_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every :data:`FOLDERS` op whose data is a constant and every ``arange`` of
    numbers replaced by its value, and every ``split`` of a constant bound to its parts (the
    parts' uses read them)."""
    folder = _LayoutFolder(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            folder.builder_.update_func(gv, folder.visit_expr(func))
    return folder.builder_.get()  # a new module (copy on write): ``mod`` is left as it was


__all__ = ["FOLDERS", "fold_layout_constants"]
