"""Relax -> ONNX converters of the ops that reorder, select or accumulate elements (``flip``,
``tile``, ``stack``, ``cumsum``, ``tril``/``triu``, ``argmax``/``argmin``, ``gather_elements``,
``gather_nd``, ``einsum``) and of the normalizations and activations that carry a per-channel
tensor (``nn.prelu``, ``nn.instance_norm``, ``nn.group_norm``, ``nn.pixel_shuffle``). :mod:`.onnx_ops` merges
:data:`CONVERTERS` into the exporter's table; semantics follow TVM's legalization of each op.

Examples
--------
>>> sorted(CONVERTERS)[:3]
['relax.argmax', 'relax.argmin', 'relax.cumsum']
"""
from __future__ import annotations

import numpy as np

from .graph import Exporter, OnnxExportError, ints, registrar, tensor_shape

#: Relax operator name -> its converter ``(exporter, call, out_name) -> ONNX name``.
CONVERTERS: dict = {}
#: Relax operator -> why one of its calls has no exact ONNX form (None: it has one).
PROBLEMS: dict = {}


_reg = registrar(CONVERTERS)


def _rank(call, what: str) -> int:
    return len(tensor_shape(call.args[0].ty, what))


@_reg("relax.flip")
def _flip(e: Exporter, call, out):
    axis = int(call.attrs.axis) % _rank(call, "flip input")
    big = np.iinfo(np.int64).max
    return e.one("Slice", [e.tensor(call.args[0]), e.int64s([-1], "starts"), e.int64s([-big], "ends"),
                           e.int64s([axis], "axes"), e.int64s([-1], "steps")], out)


@_reg("relax.tile")
def _tile(e: Exporter, call, out):
    rank, reps = _rank(call, "tile input"), ints(call.attrs.repeats)
    x = e.tensor(call.args[0])
    if len(reps) > rank:  # numpy's rule: the input gains leading axes of one
        shp = [1] * (len(reps) - rank) + list(tensor_shape(call.args[0].ty, "tile input"))
        x = e.one("Reshape", [x, e.int64s(shp)])
    reps = [1] * (max(rank, len(reps)) - len(reps)) + reps
    return e.one("Tile", [x, e.int64s(reps, "repeats")], out)


@_reg("relax.stack")
def _stack(e: Exporter, call, out):
    parts = e.value(call.args[0])
    if not isinstance(parts, list):
        raise OnnxExportError("stack expects a tuple of tensors")
    rank = len(tensor_shape(call.ty, "stack result"))
    axis = int(call.attrs.axis) % rank
    ups = [e.one("Unsqueeze", [p, e.int64s([axis], "axes")]) for p in parts]
    return e.one("Concat", ups, out, axis=axis)


def _cumsum_problem(call) -> str | None:
    if call.attrs.dtype is not None and str(call.attrs.dtype) not in ("", str(call.args[0].ty.dtype)):
        return "cumsum into another dtype"
    return None


@_reg("relax.cumsum")
def _cumsum(e: Exporter, call, out):
    x = e.tensor(call.args[0])
    axis = call.attrs.axis
    if axis is None:  # over the flattened tensor
        x, axis = e.one("Reshape", [x, e.int64s([-1])]), 0
    return e.one("CumSum", [x, e.init(np.array(int(axis), np.int64), "axis")], out,
                 exclusive=int(bool(call.attrs.exclusive)))


PROBLEMS["relax.cumsum"] = _cumsum_problem


def _trilu(upper: bool):
    def convert(e: Exporter, call, out):
        k = getattr(call.args[1], "value", None)
        if not isinstance(k, int):
            raise OnnxExportError(f"{call.op.name} with a diagonal that is not a number cannot be exported")
        return e.one("Trilu", [e.tensor(call.args[0]), e.init(np.array(k, np.int64), "k")], out, upper=int(upper))
    return convert


CONVERTERS["relax.tril"] = _trilu(False)
CONVERTERS["relax.triu"] = _trilu(True)


def _arg_problem(call) -> str | None:
    return None if call.attrs.axis is not None else "argmax/argmin over every axis"


@_reg("relax.argmax", "relax.argmin")
def _argext(e: Exporter, call, out):
    op = "ArgMax" if call.op.name.endswith("argmax") else "ArgMin"
    axis = int(call.attrs.axis) % _rank(call, f"{op} input")
    return e.one(op, [e.tensor(call.args[0])], out, axis=axis, keepdims=int(bool(call.attrs.keepdims)))


PROBLEMS["relax.argmax"] = PROBLEMS["relax.argmin"] = _arg_problem


@_reg("relax.gather_elements")
def _gather_elements(e: Exporter, call, out):
    return e.one("GatherElements", [e.tensor(call.args[0]), e.tensor(call.args[1])], out,
                 axis=int(call.attrs.axis) % _rank(call, "gather_elements input"))


@_reg("relax.gather_nd")
def _gather_nd(e: Exporter, call, out):
    return e.one("GatherND", [e.tensor(call.args[0]), e.tensor(call.args[1])], out,
                 batch_dims=int(call.attrs.batch_dims))


@_reg("relax.einsum")
def _einsum(e: Exporter, call, out):
    parts = e.value(call.args[0])
    if not isinstance(parts, list):
        raise OnnxExportError("einsum expects a tuple of tensors")
    return e.one("Einsum", parts, out, equation=str(call.attrs.subscripts))


@_reg("relax.nn.prelu")
def _prelu(e: Exporter, call, out):
    rank = _rank(call, "prelu input")
    axis = int(call.attrs.axis) % rank
    slope = e.one("Reshape", [e.tensor(call.args[1]), e.int64s([-1] + [1] * (rank - axis - 1))])
    return e.one("PRelu", [e.tensor(call.args[0]), slope], out)


def _spatial_norm_problem(call) -> str | None:
    """Why an ``instance_norm`` or ``group_norm`` call has no exact ONNX form: normalized over
    other axes than the spatial ones of ``NC...``, or without its scale or shift."""
    op = call.op.name.removeprefix("relax.nn.")
    rank, at = _rank(call, f"{op} input"), call.attrs
    if int(at.channel_axis) % rank != 1 or sorted(a % rank for a in ints(at.axes)) != list(range(2, rank)):
        return f"{op} over axes other than the spatial ones of NC..."
    if not (bool(at.center) and bool(at.scale)):
        return f"{op} without its scale or shift"
    return None


@_reg("relax.nn.instance_norm")
def _instance_norm(e: Exporter, call, out):
    return e.one("InstanceNormalization", [e.tensor(call.args[0]), e.tensor(call.args[1]), e.tensor(call.args[2])],
                 out, epsilon=float(call.attrs.epsilon))


PROBLEMS["relax.nn.instance_norm"] = _spatial_norm_problem


@_reg("relax.nn.group_norm")
def _group_norm(e: Exporter, call, out):
    """Opset 17 has no GroupNormalization: each group of channels normalized as one instance
    (``InstanceNormalization`` over ``(N, G, rest)``), then the per-channel scale and shift."""
    shp = tensor_shape(call.args[0].ty, "group_norm input")
    g = int(call.attrs.num_groups)
    grouped = e.one("Reshape", [e.tensor(call.args[0]), e.int64s([shp[0], g, -1])])
    ones, zeros = e.init(np.ones(g, np.float32), "ones"), e.init(np.zeros(g, np.float32), "zeros")
    normed = e.one("InstanceNormalization", [grouped, ones, zeros], epsilon=float(call.attrs.epsilon))
    back = e.one("Reshape", [normed, e.int64s(list(shp))])
    per_channel = e.int64s([-1] + [1] * (len(shp) - 2))
    scale = e.one("Reshape", [e.tensor(call.args[1]), per_channel])
    shift = e.one("Reshape", [e.tensor(call.args[2]), per_channel])
    return e.one("Add", [e.one("Mul", [back, scale]), shift], out)


PROBLEMS["relax.nn.group_norm"] = _spatial_norm_problem


@_reg("relax.nn.pixel_shuffle")
def _pixel_shuffle(e: Exporter, call, out):
    if _rank(call, "pixel_shuffle input") != 4:
        raise OnnxExportError("pixel_shuffle of a tensor that is not NCHW cannot be exported")
    return e.one("DepthToSpace", [e.tensor(call.args[0])], out, blocksize=int(call.attrs.upscale_factor), mode="CRD")


__all__ = ["CONVERTERS", "PROBLEMS"]
