"""Reading the Relax functions and calls a backend is given: a function's bindings and
result types, a call's op name and attributes, a tensor type's static shape and dtype, and
scalar, shape and padding arguments as Python values.
"""
from __future__ import annotations

import tvm
from tvm import relax

from ..errors import BuildError
from ..graph.relax_import import attrs_dict


def function_bindings(func: relax.Function) -> list:
    """The bindings of a function's body, in order (all blocks)."""
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return []
    return [b for blk in body.blocks for b in blk.bindings]


def output_types(func: relax.Function) -> list:
    """The tensor types a function returns, flattened."""
    ty = func.body.ty if hasattr(func.body, "ty") else func.ret_ty
    if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)):
        return list(ty.fields)
    return [ty]


def op_short_name(call) -> str:
    """``"nn.conv2d"`` for a call of ``relax.nn.conv2d``; ``""`` for anything else."""
    if isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op):
        name = call.op.name
        return name[len("relax."):] if name.startswith("relax.") else name
    return ""


def call_attrs(call) -> dict:
    """The call's attributes as plain Python values."""
    return attrs_dict(call.attrs) if isinstance(call.op, tvm.ir.Op) else {}


def static_shape(ty) -> tuple[int, ...]:
    """Static shape of a tensor type (raises BuildError when dynamic)."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise BuildError(f"type {ty} is not a tensor of known shape")
    try:
        return tuple(int(s) for s in ty.shape.values)
    except TypeError as e:
        raise BuildError(f"type {ty} has a dynamic shape; backends take static shapes only") from e


def dtype_of(ty) -> str:
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else ""


def prim_value(expr):
    """The Python number of a scalar argument (``FloatImm``/``IntImm`` in TVM 0.27, a
    ``PrimValue`` in older releases), or ``None``."""
    prim_cls = getattr(relax, "PrimValue", None)
    if prim_cls is not None and isinstance(expr, prim_cls):
        v = expr.value
        return v.value if hasattr(v, "value") else v
    v = getattr(expr, "value", None)
    if isinstance(v, (int, float, bool)) and not isinstance(expr, relax.Var):
        return v
    return None


def shape_value(expr) -> tuple[int, ...] | None:
    if isinstance(expr, relax.ShapeExpr):
        return tuple(int(v) for v in expr.values)
    return None


def pads4(padding) -> tuple[int, int, int, int]:
    """Relax 2-d padding (1, 2 or 4 values) as (top, left, bottom, right)."""
    p = tuple(int(v) for v in padding)
    if len(p) == 1:
        return (p[0],) * 4
    if len(p) == 2:
        return (p[0], p[1], p[0], p[1])
    return p  # type: ignore[return-value]
