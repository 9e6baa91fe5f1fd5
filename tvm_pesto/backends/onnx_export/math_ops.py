"""Relax -> ONNX converters of the elementwise arithmetic and statistics opset 17 has no one
operator for: ``floor_divide``, ``floor_mod``, ``mod``, ``trunc``, ``isfinite``,
``bitwise_and``/``bitwise_not``, ``outer``, ``variance``/``std`` and ``bucketize``, each
composed of ONNX operators that compute what TOPI computes. :mod:`.onnx_ops` merges
:data:`CONVERTERS` into the exporter's table; a call with no exact form is refused with its
reason in :data:`PROBLEMS`, so TVM keeps it.

Examples
--------
>>> sorted(CONVERTERS)[:3]
['relax.bitwise_and', 'relax.bitwise_not', 'relax.bucketize']
"""
from __future__ import annotations

import numpy as np

from .graph import Exporter, OnnxExportError, dtype_of, ints, registrar

#: Relax operator name -> its converter ``(exporter, call, out_name) -> ONNX name``.
CONVERTERS: dict = {}
#: Relax operator -> why one of its calls has no exact ONNX form (None: it has one).
PROBLEMS: dict = {}

_reg = registrar(CONVERTERS)


def _is_float(dt: str) -> bool:
    return dt.startswith(("float", "bfloat"))


def _args(e: Exporter, call):
    return [e.tensor(a) for a in call.args], dtype_of(call.args[0].ty)


@_reg("relax.floor_divide")
def _floor_divide(e: Exporter, call, out):
    """Floats: ``floor(a / b)``. Integers: ``(a - floormod(a, b)) / b``, a division ONNX's
    truncating ``Div`` makes exactly (the numerator is a multiple of ``b``)."""
    (a, b), dt = _args(e, call)
    if _is_float(dt):
        return e.one("Floor", [e.one("Div", [a, b])], out)
    return e.one("Div", [e.one("Sub", [a, e.one("Mod", [a, b], fmod=0)]), b], out)


@_reg("relax.floor_mod")
def _floor_mod(e: Exporter, call, out):
    """Integers: ONNX ``Mod`` (the divisor's sign). Floats: TOPI's ``a - floor(a / b) * b``."""
    (a, b), dt = _args(e, call)
    if _is_float(dt):
        return e.one("Sub", [a, e.one("Mul", [e.one("Floor", [e.one("Div", [a, b])]), b])], out)
    return e.one("Mod", [a, b], out, fmod=0)


@_reg("relax.mod")
def _mod(e: Exporter, call, out):
    """TOPI's ``mod`` is the truncated remainder (the dividend's sign): ONNX ``Mod`` with ``fmod=1``."""
    (a, b), _ = _args(e, call)
    return e.one("Mod", [a, b], out, fmod=1)


@_reg("relax.trunc")
def _trunc(e: Exporter, call, out):
    (x,), dt = _args(e, call)
    if not _is_float(dt):
        return e.one("Identity", [x], out)
    zero = e.init(np.array(0, dt), "zero")
    return e.one("Where", [e.one("Less", [x, zero]), e.one("Ceil", [x]), e.one("Floor", [x])], out)


@_reg("relax.isfinite")
def _isfinite(e: Exporter, call, out):
    (x,), dt = _args(e, call)
    if not _is_float(dt):  # every integer is finite
        return e.one("Equal", [x, x], out)
    return e.one("Not", [e.one("Or", [e.one("IsNaN", [x]), e.one("IsInf", [x])])], out)


def _bitwise_problem(call) -> str | None:
    dt = dtype_of(call.args[0].ty)
    if call.op.name == "relax.bitwise_and" and dt != "bool":
        return f"bitwise_and of {dt}: ONNX BitwiseAnd is opset 18 (bool masks export as And)"
    return None


@_reg("relax.bitwise_and")
def _bitwise_and(e: Exporter, call, out):
    why = _bitwise_problem(call)
    if why:
        raise OnnxExportError(why)
    return e.one("And", [e.tensor(a) for a in call.args], out)


@_reg("relax.bitwise_not")
def _bitwise_not(e: Exporter, call, out):
    """``~x`` is ``Not`` of a bool, ``-1 - x`` of a signed and ``max - x`` of an unsigned integer."""
    (x,), dt = _args(e, call)
    if dt == "bool":
        return e.one("Not", [x], out)
    top = np.iinfo(dt).max if dt.startswith("uint") else -1
    return e.one("Sub", [e.init(np.array(top, dt), "all_ones"), x], out)


PROBLEMS["relax.bitwise_and"] = PROBLEMS["relax.bitwise_not"] = _bitwise_problem


@_reg("relax.outer")
def _outer(e: Exporter, call, out):
    (a, b), _ = _args(e, call)
    return e.one("Mul", [e.one("Unsqueeze", [a, e.int64s([1], "axes")]), b], out)


def _moment_problem(call) -> str | None:
    dt = dtype_of(call.args[0].ty)
    return None if _is_float(dt) else f"{call.op.name} of {dt} (an integer mean)"


@_reg("relax.variance", "relax.std")
def _variance(e: Exporter, call, out):
    """TOPI's ``mean((x - mean(x))^2)`` over the axes (every axis when none), ``sqrt`` of it for ``std``."""
    x = e.tensor(call.args[0])
    kw = {"axes": ints(call.attrs.axis)} if call.attrs.axis is not None else {}
    dev = e.one("Sub", [x, e.one("ReduceMean", [x], keepdims=1, **kw)])
    if call.op.name == "relax.std":
        var = e.one("ReduceMean", [e.one("Mul", [dev, dev])], keepdims=int(bool(call.attrs.keepdims)), **kw)
        return e.one("Sqrt", [var], out)
    return e.one("ReduceMean", [e.one("Mul", [dev, dev])], out, keepdims=int(bool(call.attrs.keepdims)), **kw)


PROBLEMS["relax.variance"] = PROBLEMS["relax.std"] = _moment_problem


@_reg("relax.bucketize")
def _bucketize(e: Exporter, call, out):
    """TOPI's ``searchsorted`` of each value in the sorted boundaries: how many boundaries are
    below it (``right``: at most it), counted over a trailing axis."""
    x, bounds = e.tensor(call.args[0]), e.tensor(call.args[1])
    below = e.one("LessOrEqual" if bool(call.attrs.right) else "Less",
                  [bounds, e.one("Unsqueeze", [x, e.int64s([-1], "axes")])])
    count = e.one("ReduceSum", [e.one("Cast", [below], to=7), e.int64s([-1], "axes")], keepdims=0)
    return e.one("Cast", [count], out, to=6 if bool(call.attrs.out_int32) else 7)


__all__ = ["CONVERTERS", "PROBLEMS"]
