"""The Relax op -> ONNX converters of :func:`tvm_pesto.backends.onnx_export.export.relax_to_onnx`, one
function per op family, and :func:`supports_call`, whether a call has one (and its layout fits).

Semantics follow TVM's legalization of each op, so the ONNX model computes what the TVM
build of the same function computes.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from .graph import (DTYPES, Exporter, OnnxExportError, dtype_of, elem_type, flat_types, ints, is_tensor_const,
                         registrar, tensor_shape)
from .index_ops import CONVERTERS as INDEX_CONVERTERS, PROBLEMS as INDEX_PROBLEMS
from .math_ops import CONVERTERS as MATH_CONVERTERS, PROBLEMS as MATH_PROBLEMS
from .nn_ops import CONVERTERS as NN_CONVERTERS, OPENVINO_PROBLEMS as NN_OV, PROBLEMS as NN_PROBLEMS
from .scatter_ops import (CONVERTERS as SCATTER_CONVERTERS, OPENVINO_PROBLEMS as SCATTER_OV,
                               PROBLEMS as SCATTER_PROBLEMS)

#: A converter gets (exporter, call, out_name) and returns the ONNX name(s) of its result.
Converter = Callable[[Exporter, relax.Call, str], object]
#: Relax operator name -> its converter.
CONVERTERS: dict[str, Converter] = {}


_reg = registrar(CONVERTERS)


_BINARY = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div", "power": "Pow",
           "maximum": "Max", "minimum": "Min", "equal": "Equal", "greater": "Greater",
           "less": "Less", "greater_equal": "GreaterOrEqual", "less_equal": "LessOrEqual",
           "logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}
_UNARY = {"nn.relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "log": "Log",
          "sqrt": "Sqrt", "abs": "Abs", "negative": "Neg", "erf": "Erf", "sin": "Sin", "cos": "Cos",
          "floor": "Floor", "ceil": "Ceil", "round": "Round", "logical_not": "Not", "sign": "Sign",
          "tan": "Tan", "asin": "Asin", "acos": "Acos", "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh",
          "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh", "isnan": "IsNaN", "isinf": "IsInf"}


def _binary(e: Exporter, call, out):
    op = _BINARY[call.op.name[len("relax."):]]
    return e.one(op, [e.tensor(call.args[0]), e.tensor(call.args[1])], out)


def _unary(e: Exporter, call, out):
    op = _UNARY[call.op.name[len("relax."):]]
    return e.one(op, [e.tensor(call.args[0])], out)


for _n in _BINARY:
    CONVERTERS[f"relax.{_n}"] = _binary
for _n in _UNARY:
    CONVERTERS[f"relax.{_n}"] = _unary


def _x_dtype(call) -> str:
    return dtype_of(call.args[0].ty)


@_reg("relax.rsqrt")
def _rsqrt(e, call, out):
    return e.one("Reciprocal", [e.one("Sqrt", [e.tensor(call.args[0])])], out)


@_reg("relax.nn.silu")
def _silu(e, call, out):
    x = e.tensor(call.args[0])
    return e.one("Mul", [x, e.one("Sigmoid", [x])], out)


@_reg("relax.nn.gelu")
def _gelu(e, call, out):
    # (x * (1 + erf(x / sqrt(2)))) * 0.5: the form ONNX Runtime and OpenVINO fuse into one Gelu
    x = e.tensor(call.args[0])
    dt = _x_dtype(call)
    t = e.one("Erf", [e.one("Div", [x, e.init(np.array(math.sqrt(2), dt))])])
    t = e.one("Add", [t, e.init(np.array(1.0, dt))])
    return e.one("Mul", [e.one("Mul", [x, t]), e.init(np.array(0.5, dt))], out)


@_reg("relax.nn.gelu_tanh")
def _gelu_tanh(e, call, out):
    # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    x = e.tensor(call.args[0])
    dt = _x_dtype(call)
    x3 = e.one("Mul", [e.one("Mul", [x, x]), x])
    inner = e.one("Add", [x, e.one("Mul", [x3, e.init(np.array(0.044715, dt))])])
    t = e.one("Tanh", [e.one("Mul", [inner, e.init(np.array(math.sqrt(2 / math.pi), dt))])])
    t = e.one("Add", [t, e.init(np.array(1.0, dt))])
    return e.one("Mul", [e.one("Mul", [x, e.init(np.array(0.5, dt))]), t], out)


@_reg("relax.nn.leakyrelu")
def _leaky(e, call, out):
    return e.one("LeakyRelu", [e.tensor(call.args[0])], out, alpha=float(call.attrs.alpha))


@_reg("relax.nn.softmax", "relax.nn.log_softmax")
def _softmax(e, call, out):
    op = "Softmax" if call.op.name.endswith(".softmax") else "LogSoftmax"
    return e.one(op, [e.tensor(call.args[0])], out, axis=int(call.attrs.axis))


@_reg("relax.astype")
def _astype(e, call, out):
    dt = str(call.attrs.dtype)
    return e.one("Cast", [e.tensor(call.args[0])], out, to=elem_type(dt, "astype target"))


@_reg("relax.clip")
def _clip(e, call, out):
    dt = _x_dtype(call)
    return e.one("Clip", [e.tensor(call.args[0]), e.scalar(call.args[1], dt), e.scalar(call.args[2], dt)], out)


@_reg("relax.where")
def _where(e, call, out):
    return e.one("Where", [e.tensor(a) for a in call.args], out)


@_reg("relax.matmul")
def _matmul(e, call, out):
    a, b = call.args
    res_dt = dtype_of(call.ty)
    if dtype_of(a.ty) != res_dt:
        # out_dtype differs (e.g. fp16 x fp16 -> fp32): compute in the input type, then cast.
        mm = e.one("MatMul", [e.tensor(a), e.tensor(b)])
        return e.one("Cast", [mm], out, to=elem_type(res_dt, "matmul result"))
    return e.one("MatMul", [e.tensor(a), e.tensor(b)], out)


@_reg("relax.nn.attention", "relax.nn.attention_bias")
def _attention(e, call, out):
    # TVM's legalization: q, k, v [B, S, H, D] -> softmax(q k^T * scale (+ bias), causal) v, [B, S, H, Dv]
    at = call.attrs
    if getattr(at, "window_size", None) is not None:
        raise OnnxExportError("sliding-window attention cannot be exported")
    q, k, v = (e.tensor(a) for a in call.args[:3])
    b, sq, _, d = tensor_shape(call.args[0].ty, "attention query")
    skv = tensor_shape(call.args[1].ty, "attention key")[1]
    dt = _x_dtype(call)
    scores = e.one("MatMul", [e.one("Transpose", [q], perm=[0, 2, 1, 3]), e.one("Transpose", [k], perm=[0, 2, 3, 1])])
    scale = float(at.scale.value) if getattr(at, "scale", None) is not None else 1.0 / math.sqrt(d)
    scores = e.one("Mul", [scores, e.init(np.array(scale, dt))])
    if len(call.args) > 3:
        scores = e.one("Add", [scores, e.tensor(call.args[3])])
    mask = getattr(at, "causal_mask", None)
    if mask is not None:
        offset = {"TopLeft": 0, "BottomRight": abs(sq - skv)}.get(str(mask))
        if offset is None:
            raise OnnxExportError(f"attention with causal_mask={mask!r} cannot be exported")
        keep = np.tril(np.ones((sq, skv), bool), k=offset)
        scores = e.one("Add", [scores, e.init(np.where(keep, 0.0, np.finfo(dt).min).astype(dt), "causal_mask")])
    probs = e.one("Softmax", [scores], axis=-1)
    return e.one("Transpose", [e.one("MatMul", [probs, e.one("Transpose", [v], perm=[0, 2, 1, 3])])], out,
                 perm=[0, 2, 1, 3])


#: Relax ``resize2d`` methods, coordinate modes and rounding methods with an exact ONNX
#: ``Resize`` (opset 13-17) counterpart.
_RESIZE_MODE = {"nearest_neighbor": "nearest", "linear": "linear", "cubic": "cubic"}
_RESIZE_COORD = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
_RESIZE_ROUND = ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil")


def _resize_problem(call) -> str | None:
    """Why a ``relax.image.resize2d``/``resize3d`` call has no ONNX ``Resize`` that computes the
    same (None: it has one)."""
    at, op = call.attrs, call.op.name.removeprefix("relax.image.")
    layout = "NCHW" if op == "resize2d" else "NCDHW"
    if str(at.layout) != layout:
        return f"{op} with layout {at.layout} cannot be exported; only {layout}"
    if str(at.method) not in _RESIZE_MODE or (op == "resize3d" and str(at.method) == "cubic"):
        return f"{op} method {at.method!r} has no ONNX Resize mode (tricubic: none in ONNX Runtime)"
    if str(at.coordinate_transformation_mode) not in _RESIZE_COORD:
        return (f"{op} coordinate_transformation_mode {at.coordinate_transformation_mode!r} cannot be exported; "
                f"one of {', '.join(_RESIZE_COORD)}")
    if str(at.method) == "nearest_neighbor" and str(at.rounding_method) not in _RESIZE_ROUND \
            and not _round_without_ties(call):
        return (f"{op} rounding_method {at.rounding_method!r} cannot be exported where a source coordinate falls "
                f"halfway; one of {', '.join(_RESIZE_ROUND)}")
    if at.out_dtype is not None and str(at.out_dtype) not in ("", dtype_of(call.args[0].ty)):
        return f"{op} with an out_dtype other than its input's cannot be exported"
    if not isinstance(call.args[1], relax.ShapeExpr):
        return f"{op} with a size that is not a constant shape cannot be exported"
    return None


def _round_without_ties(call) -> bool:
    """Whether a nearest ``resize`` with ``rounding_method="round"`` (PyTorch's importer writes it
    for ``F.interpolate``) never meets a source coordinate halfway between two pixels, so that
    ONNX's ``round_prefer_floor`` computes the same (any whole upscale factor, e.g. 14 -> 28)."""
    at = call.attrs
    if str(at.rounding_method) != "round" or not isinstance(call.args[1], relax.ShapeExpr):
        return False
    mode = str(at.coordinate_transformation_mode)
    if mode not in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        return False
    ins = tensor_shape(call.args[0].ty, "resize input")[2:]
    outs = [int(v) for v in call.args[1].values]
    for n_in, n_out in zip(ins, outs):
        # source coordinate of output x as p / q in integers; it is halfway when 2p = q (mod 2q)
        if mode == "pytorch_half_pixel" and n_out == 1:
            return False  # its single coordinate is a special case of each library's own
        if mode == "align_corners":
            coords = ((x * (n_in - 1), max(n_out - 1, 1)) for x in range(n_out))
        elif mode == "asymmetric":
            coords = ((x * n_in, n_out) for x in range(n_out))
        else:
            coords = (((2 * x + 1) * n_in - n_out, 2 * n_out) for x in range(n_out))
        if any((2 * p - q) % (2 * q) == 0 for p, q in coords):
            return False
    return True


@_reg("relax.image.resize2d", "relax.image.resize3d")
def _resize(e, call, out):
    why = _resize_problem(call)
    if why:
        raise OnnxExportError(why)
    at = call.attrs
    mode = _RESIZE_MODE[str(at.method)]
    kw = dict(mode=mode, coordinate_transformation_mode=str(at.coordinate_transformation_mode),
              cubic_coeff_a=float(at.cubic_alpha), exclude_outside=int(at.cubic_exclude),
              extrapolation_value=float(at.extrapolation_value))
    if mode == "nearest":  # "round" only where no coordinate ties (_round_without_ties): either way is exact
        kw["nearest_mode"] = "round_prefer_floor" if str(at.rounding_method) == "round" else str(at.rounding_method)
    sizes = e.int64s(tensor_shape(call.ty, "resize result"), "sizes")
    return e.one("Resize", [e.tensor(call.args[0]), "", "", sizes], out, **kw)


_REDUCE = {"mean": "ReduceMean", "sum": "ReduceSum", "max": "ReduceMax", "min": "ReduceMin", "prod": "ReduceProd"}


@_reg(*[f"relax.{k}" for k in _REDUCE])
def _reduce(e, call, out):
    op = _REDUCE[call.op.name[len("relax."):]]
    x = e.tensor(call.args[0])
    axis = call.attrs.axis
    keep = int(bool(call.attrs.keepdims))
    if op == "ReduceSum":  # axes are an input from opset 13
        ins = [x] + ([e.int64s(ints(axis), "axes")] if axis is not None else [])
        return e.one(op, ins, out, keepdims=keep)
    kw = {"axes": ints(axis)} if axis is not None else {}
    return e.one(op, [x], out, keepdims=keep, **kw)


@_reg("relax.nn.layer_norm")
def _layer_norm(e, call, out):
    rank = len(tensor_shape(call.args[0].ty, "layer_norm input"))
    axes = sorted(a % rank for a in ints(call.attrs.axes))
    if axes != list(range(axes[0], rank)):
        raise OnnxExportError(f"layer_norm over axes {axes} (not the trailing axes) cannot be exported")
    return e.one("LayerNormalization", [e.tensor(a) for a in call.args[:3]], out,
                 axis=axes[0], epsilon=float(call.attrs.epsilon))


@_reg("relax.nn.batch_norm")
def _batch_norm(e, call, out):
    at = call.attrs
    x, gamma, beta, mm, mv = (e.tensor(a) for a in call.args)
    xs = tensor_shape(call.args[0].ty, "batch_norm input")
    axis = int(at.axis) % len(xs)
    dt = _x_dtype(call)
    eps = float(at.epsilon)
    bshape = [1] * len(xs)
    bshape[axis] = xs[axis]
    if not bool(at.training) and bool(at.center) and bool(at.scale):
        y = e.one("BatchNormalization", [x, gamma, beta, mm, mv], e.fresh(f"{out}_0"), epsilon=eps)
        return [y, e.one("Identity", [mm], e.fresh(f"{out}_1")), e.one("Identity", [mv], e.fresh(f"{out}_2"))]
    rs = e.int64s(bshape)
    if bool(at.training):
        red = [k for k in range(len(xs)) if k != axis]
        mean = e.one("ReduceMean", [x], axes=red, keepdims=1)
        d = e.one("Sub", [x, mean])
        var = e.one("ReduceMean", [e.one("Mul", [d, d])], axes=red, keepdims=1)
    else:
        mean = e.one("Reshape", [mm, rs])
        var = e.one("Reshape", [mv, rs])
        d = e.one("Sub", [x, mean])
    y = e.one("Div", [d, e.one("Sqrt", [e.one("Add", [var, e.init(np.array(eps, dt))])])])
    if bool(at.scale):
        y = e.one("Mul", [y, e.one("Reshape", [gamma, rs])])
    if bool(at.center):
        y = e.one("Add", [y, e.one("Reshape", [beta, rs])])
    y = e.one("Identity", [y], e.fresh(f"{out}_0"))
    if bool(at.training):
        m = float(at.momentum)
        flat = e.int64s([xs[axis]])
        new_mean = e.one("Add", [e.one("Mul", [mm, e.init(np.array(1 - m, dt))]),
                                 e.one("Mul", [e.one("Reshape", [mean, flat]), e.init(np.array(m, dt))])], e.fresh(f"{out}_1"))
        new_var = e.one("Add", [e.one("Mul", [mv, e.init(np.array(1 - m, dt))]),
                                e.one("Mul", [e.one("Reshape", [var, flat]), e.init(np.array(m, dt))])], e.fresh(f"{out}_2"))
        return [y, new_mean, new_var]
    return [y, e.one("Identity", [mm], e.fresh(f"{out}_1")), e.one("Identity", [mv], e.fresh(f"{out}_2"))]


@_reg("relax.concat")
def _concat(e, call, out):
    parts = e.value(call.args[0])
    if not isinstance(parts, list):
        raise OnnxExportError("concat expects a tuple of tensors")
    return e.one("Concat", parts, out, axis=int(call.attrs.axis))


@_reg("relax.split")
def _split(e, call, out):
    xs = tensor_shape(call.args[0].ty, "split input")
    axis = int(call.attrs.axis) % len(xs)
    ios = call.attrs.indices_or_sections
    n = xs[axis]
    if isinstance(ios, (int, tvm.tirx.IntImm)):  # k sections: as the result's types say (TVM makes
        sizes = [tensor_shape(f, "split result")[axis] for f in call.ty.fields]  # ceil(n / k), last shorter)
    else:
        idx = [0] + ints(ios) + [n]
        sizes = [max(0, min(b, n) - min(a, n)) for a, b in zip(idx[:-1], idx[1:])]
    outs = [e.fresh(f"{out}_{i}") for i in range(len(sizes))]
    return e.node("Split", [e.tensor(call.args[0]), e.int64s(sizes, "split")], outs, axis=axis)


def _to_out_shape(e, call, out):
    shp = tensor_shape(call.ty, f"{call.op.name} result")
    return e.one("Reshape", [e.tensor(call.args[0]), e.int64s(shp)], out)


for _n in ("relax.reshape", "relax.flatten", "relax.nn.batch_flatten"):
    CONVERTERS[_n] = _to_out_shape


@_reg("relax.broadcast_to")
def _broadcast(e, call, out):
    shp = tensor_shape(call.ty, "broadcast_to result")
    return e.one("Expand", [e.tensor(call.args[0]), e.int64s(shp)], out)


@_reg("relax.permute_dims")
def _permute(e, call, out):
    rank = len(tensor_shape(call.args[0].ty, "permute_dims input"))
    axes = call.attrs.axes
    perm = [a % rank for a in ints(axes)] if axes is not None else list(reversed(range(rank)))
    return e.one("Transpose", [e.tensor(call.args[0])], out, perm=perm)


@_reg("relax.expand_dims")
def _expand_dims(e, call, out):
    return e.one("Unsqueeze", [e.tensor(call.args[0]), e.int64s(ints(call.attrs.axis), "axes")], out)


@_reg("relax.squeeze")
def _squeeze(e, call, out):
    ins = [e.tensor(call.args[0])]
    if call.attrs.axis is not None:
        ins.append(e.int64s(ints(call.attrs.axis), "axes"))
    return e.one("Squeeze", ins, out)


@_reg("relax.strided_slice")
def _strided_slice(e, call, out):
    args = list(call.args)
    axes, begin, end = (ints(a.fields) for a in args[1:4])
    strides = ints(args[4].fields) if len(args) > 4 else [1] * len(axes)
    return e.one("Slice", [e.tensor(args[0]), e.int64s(begin, "starts"), e.int64s(end, "ends"),
                           e.int64s(axes, "axes"), e.int64s(strides, "steps")], out)


@_reg("relax.take")
def _take(e, call, out):
    axis = call.attrs.axis
    x = e.tensor(call.args[0])
    if axis is None:  # take from the flattened tensor
        x = e.one("Reshape", [x, e.int64s([-1])])
        axis = 0
    return e.one("Gather", [x, e.tensor(call.args[1])], out, axis=int(axis))


#: Relax ``nn.pad`` mode -> ONNX ``Pad`` mode (``circular`` needs opset 19's ``wrap``: not exported).
_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}


def _pad_problem(call) -> str | None:
    """Why an ``nn.pad`` call cannot be exported (None: it can)."""
    if str(call.attrs.pad_mode) not in _PAD_MODES:
        return f"pad mode {str(call.attrs.pad_mode)!r} has no ONNX Pad mode at opset 17"
    return "negative pad widths (a crop)" if min(ints(call.attrs.pad_width)) < 0 else None


@_reg("relax.nn.pad")
def _pad(e, call, out):
    if _pad_problem(call):
        raise OnnxExportError(f"nn.pad cannot be exported: {_pad_problem(call)}")
    widths = ints(call.attrs.pad_width)  # (before, after) per axis; ONNX: every before, then every after
    mode = _PAD_MODES[str(call.attrs.pad_mode)]
    value = [e.init(np.array(float(call.attrs.pad_value), _x_dtype(call)), "pad_value")] if mode == "constant" else []
    return e.one("Pad", [e.tensor(call.args[0]), e.int64s(widths[::2] + widths[1::2], "pads")] + value, out, mode=mode)


@_reg("relax.zeros_like", "relax.ones_like", "relax.zeros", "relax.ones", "relax.full", "relax.full_like")
def _filled(e, call, out):
    shp = tensor_shape(call.ty, f"{call.op.name} result")
    dt = dtype_of(call.ty)
    name = call.op.name
    if "zeros" in name:
        val = 0
    elif "ones" in name:
        val = 1
    else:
        fill = call.args[1]
        if not is_tensor_const(fill):
            raise OnnxExportError(f"{name} with a non-constant fill value cannot be exported")
        val = fill.value.numpy().item()
    return e.one("Identity", [e.init(np.full(shp, val, dtype=dt), "filled")], out)


CONVERTERS.update({**INDEX_CONVERTERS, **NN_CONVERTERS, **MATH_CONVERTERS, **SCATTER_CONVERTERS})
#: Relax operator -> why one of its calls has no exact ONNX form (None: it has one).
_PROBLEMS = {"relax.image.resize2d": _resize_problem, "relax.image.resize3d": _resize_problem,
             "relax.nn.pad": _pad_problem, **INDEX_PROBLEMS, **NN_PROBLEMS, **MATH_PROBLEMS, **SCATTER_PROBLEMS}
#: Relax operator names the exporter converts.
SUPPORTED_OPS: frozenset[str] = frozenset(CONVERTERS)


def call_problem(call) -> str | None:
    """Why one Relax call (a binding's value) cannot be exported, so TVM keeps it: no converter
    for its op, or one of :data:`_PROBLEMS` (a layout, an attribute value ONNX lacks), or a
    dtype with no ONNX type. None: it exports.

    Examples
    --------
    >>> from tvm import relax
    >>> x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    >>> bb = relax.BlockBuilder()
    >>> call_problem(bb.normalize(relax.op.nn.relu(x))), call_problem(bb.normalize(relax.op.cumprod(x, axis=0)))
    (None, 'relax.cumprod has no ONNX converter')
    """
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return "not a call of a Relax operator"
    name = call.op.name
    if name not in CONVERTERS:
        return f"{name} has no ONNX converter"
    why = _PROBLEMS[name](call) if name in _PROBLEMS else None
    if why is not None:
        return why
    for a in call.args:
        if is_tensor_const(a) and str(a.ty.dtype) not in DTYPES:
            return f"{name} of a {a.ty.dtype} constant, which has no ONNX type"
    for t in flat_types(call.ty):
        if not isinstance(t, relax.TensorType) or str(t.dtype) not in DTYPES:
            return f"{name} with a result of type {t}, not an ONNX tensor"
    return None


#: Relax operator -> why OpenVINO computes one of its calls otherwise than the exported model says.
_OPENVINO_PROBLEMS = {**NN_OV, **SCATTER_OV}


def openvino_problem(call) -> str | None:
    """Why OpenVINO would not compute what the exported model of one call says (None: it would),
    on top of :func:`call_problem`: where it departs from ONNX's definition of an operator."""
    why = call_problem(call)
    if why is None and call.op.name in _OPENVINO_PROBLEMS:
        why = _OPENVINO_PROBLEMS[call.op.name](call)
    return why


def supports_call(call) -> bool:
    """Whether one Relax call (a binding's value) can be exported: :func:`call_problem` finds
    nothing in the way.

    Examples
    --------
    >>> from tvm import relax
    >>> x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    >>> bb = relax.BlockBuilder()
    >>> supports_call(bb.normalize(relax.op.nn.relu(x))), supports_call(bb.normalize(relax.op.cumprod(x, axis=0)))
    (True, False)
    """
    return call_problem(call) is None


__all__ = ["CONVERTERS", "SUPPORTED_OPS", "call_problem", "openvino_problem", "supports_call"]
