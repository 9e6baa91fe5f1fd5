"""Relax -> ONNX converters of the ops that sort, select by index tensors or write elements at
indices: ``topk``, ``argsort``, ``median``, ``one_hot``, ``meshgrid``, ``index_tensor``,
``index_put``, ``scatter_elements``, ``scatter_nd`` and ``slice_scatter``. :mod:`.onnx_ops`
merges :data:`CONVERTERS` into the exporter's table; semantics follow TVM's legalization of
each op (sorts are stable: of equal values the lower index comes first, as ONNX's ``TopK``),
and a call with no exact ONNX form is refused with its reason in :data:`PROBLEMS`.

Examples
--------
>>> sorted(CONVERTERS)[:3]
['relax.argsort', 'relax.index_put', 'relax.index_tensor']
"""
from __future__ import annotations

import numpy as np

from .graph import Exporter, OnnxExportError, dtype_of, elem_type, ints, registrar, tensor_shape

#: Relax operator name -> its converter ``(exporter, call, out_name) -> ONNX name``.
CONVERTERS: dict = {}
#: Relax operator -> why one of its calls has no exact ONNX form (None: it has one).
PROBLEMS: dict = {}

_reg = registrar(CONVERTERS)

#: Relax operator -> why OpenVINO computes one of its calls otherwise than the ONNX model says
#: (None: as it says): its ``TopK`` orders equal values arbitrarily once ``k`` is more than a few,
#: where ONNX (and TVM's stable sort) put the lower index first.
OPENVINO_PROBLEMS: dict = {}
_UNSTABLE = "OpenVINO's TopK orders the indices of equal values arbitrarily (ONNX and TVM: lower index first)"

#: Relax scatter reductions with an ONNX opset-17 ``reduction`` (``min``/``max`` are opset 18).
_REDUCTIONS = {"update": "none", "add": "add", "mul": "mul"}


def _shape(expr, what: str) -> tuple[int, ...]:
    return tensor_shape(expr.ty, what)


def _topk(e: Exporter, x: str, k: int, axis: int, largest: bool) -> list[str]:
    return e.node("TopK", [x, e.int64s([k], "k")], [e.fresh("values"), e.fresh("indices")],
                  axis=axis, largest=int(largest), sorted=1)


@_reg("relax.topk")
def _topk_call(e: Exporter, call, out):
    at = call.attrs
    axis = int(at.axis) % len(_shape(call.args[0], "topk input"))
    vals, idx = _topk(e, e.tensor(call.args[0]), int(at.k), axis, bool(at.largest))
    idx = e.one("Cast", [idx], to=elem_type(str(at.dtype), "topk indices"))
    kind = str(at.ret_type)
    if kind == "both":
        return [e.one("Identity", [vals], e.fresh(f"{out}_0")), e.one("Identity", [idx], e.fresh(f"{out}_1"))]
    return e.one("Identity", [vals if kind == "values" else idx], out)


@_reg("relax.argsort")
def _argsort(e: Exporter, call, out):
    shp = _shape(call.args[0], "argsort input")
    axis = int(call.attrs.axis) % len(shp)
    _, idx = _topk(e, e.tensor(call.args[0]), shp[axis], axis, bool(call.attrs.descending))
    return e.one("Cast", [idx], out, to=elem_type(str(call.attrs.dtype), "argsort indices"))


def _median_axis(call) -> int | None:
    """The axis a median is taken over (None: of the flattened tensor, no index)."""
    axis = call.attrs.axis
    return ints(axis)[0] if axis is not None and ints(axis) else None


def _median_problem(call) -> str | None:
    axis = call.attrs.axis
    return None if axis is None or len(ints(axis)) <= 1 else "median over several axes (TVM uses only the first)"


@_reg("relax.median")
def _median(e: Exporter, call, out):
    """TOPI's median: the ``(n - 1) // 2``-th of the ascending stable sort along the axis (of
    the flattened tensor when none), with its index when an axis is given."""
    x, shp, axis = e.tensor(call.args[0]), _shape(call.args[0], "median input"), _median_axis(call)
    if axis is None:
        x, ax, n = e.one("Reshape", [x, e.int64s([-1])]), 0, int(np.prod(shp))
    else:
        ax = axis % len(shp)
        n = shp[ax]
    mid = (n - 1) // 2
    vals, idx = _topk(e, x, mid + 1, ax, False)
    pick = [e.int64s([mid], "starts"), e.int64s([mid + 1], "ends"), e.int64s([ax], "axes")]
    val, idx = e.one("Slice", [vals] + pick), e.one("Slice", [idx] + pick)
    if axis is None:
        return e.one("Reshape", [val, e.int64s(_shape(call, "median result"))], out)
    if not bool(call.attrs.keepdims):
        val, idx = (e.one("Squeeze", [v, e.int64s([ax], "axes")]) for v in (val, idx))
    return [e.one("Identity", [val], e.fresh(f"{out}_0")), e.one("Identity", [idx], e.fresh(f"{out}_1"))]


PROBLEMS["relax.median"] = _median_problem
OPENVINO_PROBLEMS["relax.argsort"] = lambda call: _UNSTABLE
OPENVINO_PROBLEMS["relax.topk"] = lambda call: None if str(call.attrs.ret_type) == "values" else _UNSTABLE
OPENVINO_PROBLEMS["relax.median"] = lambda call: None if _median_axis(call) is None else _UNSTABLE


@_reg("relax.one_hot")
def _one_hot(e: Exporter, call, out):
    """``on`` where the index equals the position along the new axis, else ``off`` (a negative
    index matches nothing, as in TOPI; ONNX's ``OneHot`` would wrap it)."""
    idx, dt = e.tensor(call.args[0]), dtype_of(call.ty)
    rank = len(_shape(call.args[0], "one_hot indices"))
    depth, axis = int(call.attrs.depth), int(call.attrs.axis) % (rank + 1)
    pos = np.arange(depth, dtype=dtype_of(call.args[0].ty)).reshape([depth] + [1] * (rank - axis))
    hit = e.one("Equal", [e.one("Unsqueeze", [idx, e.int64s([axis], "axes")]), e.init(pos, "positions")])
    return e.one("Where", [hit, e.scalar(call.args[1], dt), e.scalar(call.args[2], dt)], out)


def _meshgrid_problem(call) -> str | None:
    sizes = [int(np.prod(tensor_shape(f, "meshgrid input"))) for f in call.args[0].ty.fields]
    if str(call.attrs.indexing) == "xy" and len(sizes) > 1 and sizes[0] != sizes[1]:
        return ("meshgrid 'xy' of unequal first sizes: TVM types the result in the 'ij' shape and computes "
                "the 'xy' one, so no exported graph matches both")
    return None


@_reg("relax.meshgrid")
def _meshgrid(e: Exporter, call, out):
    parts = e.value(call.args[0])
    if not isinstance(parts, list):
        raise OnnxExportError("meshgrid expects a tuple of tensors")
    shp = tensor_shape(call.ty.fields[0], "meshgrid result")
    outs = []
    for i, (p, f) in enumerate(zip(parts, call.args[0].ty.fields)):
        at = {0: 1, 1: 0}.get(i, i) if str(call.attrs.indexing) == "xy" and len(parts) > 1 else i
        lay = [1] * len(shp)
        lay[at] = int(np.prod(tensor_shape(f, "meshgrid input")))
        grid = e.one("Expand", [e.one("Reshape", [p, e.int64s(lay)]), e.int64s(shp)])
        outs.append(e.one("Identity", [grid], e.fresh(f"{out}_{i}")))
    return outs


PROBLEMS["relax.meshgrid"] = _meshgrid_problem


def _stacked(e: Exporter, fields, types, shape: list[int], dims=None) -> str:
    """Index tensors broadcast to ``shape`` and stacked on a last axis (int64; with ``dims``,
    a negative index counts from the end as TOPI's ``index_put`` reads it)."""
    cols = []
    for k, (f, t) in enumerate(zip(fields, types)):
        c = e.one("Expand", [e.one("Cast", [f], to=7), e.int64s(shape)])
        if dims is not None:
            c = e.one("Where", [e.one("Less", [c, e.init(np.array(0, np.int64))]),
                                e.one("Add", [c, e.init(np.array(dims[k], np.int64))]), c])
        cols.append(e.one("Unsqueeze", [c, e.int64s([-1], "axes")]))
    return e.one("Concat", cols, axis=-1)


def _index_shape(types) -> list[int]:
    return list(np.broadcast_shapes(*[tensor_shape(t, "index") for t in types]))


@_reg("relax.index_tensor")
def _index_tensor(e: Exporter, call, out):
    """``data[I0, I1, ...]``: the index tensors broadcast, stacked, then ``GatherND``."""
    fields, types = e.value(call.args[1]), list(call.args[1].ty.fields)
    if not isinstance(fields, list):
        raise OnnxExportError("index_tensor expects a tuple of index tensors")
    idx = _stacked(e, fields, types, _index_shape(types))
    return e.one("GatherND", [e.tensor(call.args[0]), idx], out)


def _index_put_problem(call) -> str | None:
    types = list(call.args[1].ty.fields)
    n = int(np.prod(_index_shape(types)))
    if len(types) != len(_shape(call.args[0], "index_put data")):
        return "index_put with fewer index tensors than data axes"
    if int(np.prod(_shape(call.args[2], "index_put values"))) != n:
        return f"index_put of values that are not one per index ({n}): TOPI reads them flat"
    return None


@_reg("relax.index_put")
def _index_put(e: Exporter, call, out):
    why = _index_put_problem(call)
    if why:
        raise OnnxExportError(why)
    fields, types = e.value(call.args[1]), list(call.args[1].ty.fields)
    shape = _index_shape(types)
    idx = _stacked(e, fields, types, shape, dims=_shape(call.args[0], "index_put data"))
    vals = e.one("Reshape", [e.tensor(call.args[2]), e.int64s(shape)])
    return e.one("ScatterND", [e.tensor(call.args[0]), idx, vals], out,
                 reduction="add" if bool(call.attrs.accumulate) else "none")


PROBLEMS["relax.index_put"] = _index_put_problem


def _scatter_problem(call) -> str | None:
    red = str(call.attrs.reduction)
    return None if red in _REDUCTIONS else f"{call.op.name} with reduction {red!r}: not in ONNX opset 17"


@_reg("relax.scatter_elements", "relax.scatter_nd")
def _scatter(e: Exporter, call, out):
    why = _scatter_problem(call)
    if why:
        raise OnnxExportError(why)
    ins = [e.tensor(call.args[0]), e.one("Cast", [e.tensor(call.args[1])], to=7), e.tensor(call.args[2])]
    kw = {"reduction": _REDUCTIONS[str(call.attrs.reduction)]}
    if call.op.name == "relax.scatter_elements":
        kw["axis"] = int(call.attrs.axis) % len(_shape(call.args[0], "scatter_elements data"))
        return e.one("ScatterElements", ins, out, **kw)
    return e.one("ScatterND", ins, out, **kw)


PROBLEMS["relax.scatter_elements"] = PROBLEMS["relax.scatter_nd"] = _scatter_problem


@_reg("relax.slice_scatter")
def _slice_scatter(e: Exporter, call, out):
    """TOPI's form: at the positions ``start, start + step, ... < end`` of the axis, the
    source's slices in order; elsewhere the input (``Where`` over a ``Gather`` of the source)."""
    shp = _shape(call.args[0], "slice_scatter input")
    axis = int(call.attrs.axis) % len(shp)
    start, end, step = (int(getattr(a, "value", a)) for a in call.args[2:5])
    n, src_n = shp[axis], _shape(call.args[1], "slice_scatter source")[axis]
    pos = np.arange(n, dtype=np.int64)
    mask = (pos >= start) & (pos < end) & ((pos - start) % step == 0)
    take = np.clip((pos - start + step - 1) // step, 0, min(n, src_n) - 1)
    lay = [n] + [1] * (len(shp) - axis - 1)
    picked = e.one("Gather", [e.tensor(call.args[1]), e.init(take, "positions")], axis=axis)
    return e.one("Where", [e.init(mask.reshape(lay), "mask"), picked, e.tensor(call.args[0])], out)


__all__ = ["CONVERTERS", "OPENVINO_PROBLEMS", "PROBLEMS"]
