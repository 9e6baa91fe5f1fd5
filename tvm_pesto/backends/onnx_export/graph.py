"""The ONNX graph that :func:`tvm_pesto.backends.onnx_export.export.relax_to_onnx` builds: the
:class:`Exporter` (nodes, initializers, unique names, the ONNX names of Relax values) and
the type helpers the op converters of :mod:`tvm_pesto.backends.onnx_export.ops` share.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ...errors import BuildError


class OnnxExportError(BuildError):
    """A Relax function uses something the ONNX exporter cannot express."""


DTYPES = {
    "float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
    "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13, "bfloat16": 16,
}


def _onnx():
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError as e:  # pragma: no cover - onnx is a core dependency
        raise OnnxExportError("the onnx package is missing: pip install onnx") from e
    return onnx, helper, numpy_helper


def dtype_of(ty) -> str:
    """The dtype of a tensor type, as a string."""
    return str(ty.dtype)


def tensor_shape(ty, what: str) -> tuple[int, ...]:
    """The static shape of a tensor type (``what`` names it in the error)."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise OnnxExportError(f"{what} has no static tensor shape; ONNX export needs static shapes")
    out = []
    for s in ty.shape.values:
        if not isinstance(s, tvm.tirx.IntImm):
            raise OnnxExportError(f"{what} has a dynamic dimension {s}; export the model with static shapes")
        out.append(int(s))
    return tuple(out)


def elem_type(dtype: str, what: str) -> int:
    """The ONNX tensor element type of ``dtype`` (``what`` names the value in the error)."""
    if dtype not in DTYPES:
        raise OnnxExportError(f"{what} has dtype {dtype}, which has no ONNX tensor type; "
                              f"supported: {', '.join(sorted(DTYPES))}")
    return DTYPES[dtype]


def is_tensor_const(expr) -> bool:
    """A Relax tensor constant (``IntImm``/``FloatImm`` also derive from ``tvm.ir.Constant``)."""
    return isinstance(expr, tvm.ir.Constant) and hasattr(getattr(expr, "value", None), "numpy")


def ints(v) -> list[int]:
    """``v`` (an array of IntImm or ints) as Python ints."""
    return [int(x) for x in v]


def flat_types(ty) -> list:
    """The tensor types of ``ty``, tuples flattened in order."""
    if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)):
        out = []
        for f in ty.fields:
            out.extend(flat_types(f))
        return out
    return [ty]


def constant_array(value) -> np.ndarray:
    """A TVM tensor's data as a numpy array: a view of its memory where DLPack gives one (no
    copy of a large weight), else a copy."""
    try:
        return np.from_dlpack(value)
    except (TypeError, ValueError, RuntimeError, BufferError, AttributeError):  # a dtype numpy's DLPack lacks
        return value.numpy()


class Exporter:
    """The ONNX graph under construction. ``external_min_bytes``: initializers of that many
    bytes or more are made without their data (``external``: each with its array), for
    :func:`tvm_pesto.backends.onnx_export.export.write_onnx` to write beside the graph (floating
    point tensors only: shapes, indices and single values stay in it, where the libraries' shape
    inference and :mod:`~tvm_pesto.backends.onnx_export.fuse` read them)."""

    def __init__(self, name: str, external_min_bytes: int | None = None):
        self.onnx, self.h, self.nh = _onnx()
        self.name = name
        self.nodes: list = []
        self.inits: list = []
        self.external_min_bytes = external_min_bytes
        self.external: dict = {}  # initializer name -> array, of those left out of the graph
        self.names: dict = {}  # relax Var -> str or list (tuple values)
        self.used: set[str] = set()
        self.consts: list = []  # (Constant, initializer name)
        self.produced: set[str] = set()

    # -- naming and constants ----------------------------------------------------------
    def fresh(self, base: str) -> str:
        base = "".join(c if c.isalnum() or c in "_." else "_" for c in base) or "t"
        name, k = base, 0
        while name in self.used:
            k += 1
            name = f"{base}_{k}"
        self.used.add(name)
        return name

    def init(self, arr: np.ndarray, base: str = "const") -> str:
        name = self.fresh(base)
        arr = np.asarray(arr)
        limit = self.external_min_bytes
        if limit is not None and arr.nbytes >= limit and arr.size > 1 and arr.dtype.kind == "f":  # shapes, scalars stay
            self.external[name] = arr
            self.inits.append(self.onnx.TensorProto(
                name=name, dims=arr.shape, data_type=self.h.np_dtype_to_tensor_dtype(arr.dtype)))
        else:
            self.inits.append(self.nh.from_array(arr, name))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str] | None = None, base: str | None = None,
             **attrs) -> list[str]:
        if outputs is None:
            outputs = [self.fresh(base or op.lower())]
        self.nodes.append(self.h.make_node(op, inputs, outputs, name=self.fresh(f"n_{op}"), **attrs))
        self.produced.update(outputs)
        return outputs

    def one(self, op, inputs, out=None, **attrs) -> str:
        return self.node(op, inputs, [out] if out else None, **attrs)[0]

    # -- values --------------------------------------------------------------------------
    def value(self, expr, what: str = "argument"):
        """The ONNX name (or list of names, for tuples) holding ``expr``."""
        if isinstance(expr, relax.Var):
            if expr not in self.names:
                raise OnnxExportError(f"variable {expr.name!r} is used before it is defined in the subgraph")
            return self.names[expr]
        if is_tensor_const(expr):
            # The same Constant object used twice becomes one initializer.
            for obj, nm in self.consts:
                if obj.same_as(expr):
                    return nm
            nm = self.init(constant_array(expr.value), "const")
            self.consts.append((expr, nm))
            return nm
        if isinstance(expr, relax.Tuple):
            return [self.value(f, what) for f in expr.fields]
        if isinstance(expr, relax.TupleGetItem):
            tup = self.value(expr.tuple_value, what)
            if not isinstance(tup, list):
                raise OnnxExportError("TupleGetItem on a value that is not a tuple")
            return tup[int(expr.index)]
        raise OnnxExportError(f"{what} is a {type(expr).__name__}, which the ONNX exporter does not handle")

    def tensor(self, expr, what: str = "argument") -> str:
        v = self.value(expr, what)
        if isinstance(v, list):
            raise OnnxExportError(f"{what} is a tuple where a tensor is expected")
        return v

    def scalar(self, expr, dtype: str) -> str:
        """An initializer holding the scalar ``expr`` (IntImm/FloatImm/Constant) as ``dtype``."""
        if is_tensor_const(expr):
            return self.init(expr.value.numpy().astype(dtype).reshape(()), "scalar")
        if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
            return self.init(np.array(expr.value, dtype=dtype), "scalar")
        raise OnnxExportError(f"expected a constant scalar, got {type(expr).__name__}")

    def int64s(self, vals, base: str = "shape") -> str:
        return self.init(np.array(list(vals), dtype=np.int64), base)


def registrar(table: dict):
    """A decorator factory that files a converter in ``table`` under each Relax op name given."""
    def reg(*names):
        def deco(fn):
            for n in names:
                table[n] = fn
            return fn
        return deco
    return reg


__all__ = ["registrar", "DTYPES", "Exporter", "OnnxExportError", "constant_array", "dtype_of", "elem_type", "flat_types", "ints", "is_tensor_const",
           "tensor_shape"]
