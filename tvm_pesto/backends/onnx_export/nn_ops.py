"""Relax -> ONNX converters of the neural-network layers over channel-first tensors:
convolutions (``nn.conv1d``/``conv2d``/``conv3d`` and the transposed ``nn.conv1d_transpose``/
``conv2d_transpose``), pooling (``nn.max_pool*``, ``nn.avg_pool*``, ``nn.adaptive_avg_pool*``,
1-D to 3-D), ``nn.rms_norm`` and ``nn.softplus``. :mod:`.onnx_ops` merges :data:`CONVERTERS`
into the exporter's table; semantics follow TVM's legalization of each op, and a call ONNX
cannot compute exactly (another layout, an integer convolution, a dilated average pool) is
refused with its reason in :data:`PROBLEMS`, so TVM keeps it. An adaptive average pool whose
output size does not divide its input (uneven windows, e.g. AlexNet's 6x6 pool of a small
image) is a product with constant averaging matrices, one per spatial axis.

Examples
--------
>>> "relax.nn.conv3d" in CONVERTERS, "relax.nn.avg_pool3d" in PROBLEMS
(True, True)
"""
from __future__ import annotations

import numpy as np

from .graph import Exporter, OnnxExportError, dtype_of, elem_type, ints, registrar, tensor_shape

#: Relax operator name -> its converter ``(exporter, call, out_name) -> ONNX name``.
CONVERTERS: dict = {}
#: Relax operator -> why one of its calls has no exact ONNX form (None: it has one).
PROBLEMS: dict = {}

_reg = registrar(CONVERTERS)

#: Channel-first layouts by number of spatial axes: data, convolution kernel, transposed kernel.
_LAYOUTS = {1: ("NCW", "OIW", "IOW"), 2: ("NCHW", "OIHW", "IOHW"), 3: ("NCDHW", "OIDHW", "IODHW")}
_FLOATS = ("float16", "float32", "float64", "bfloat16")


def _spatial(call) -> int:
    """How many spatial axes the op works over (its name ends in ``1d``/``2d``/``3d``)."""
    return int(call.op.name.removesuffix("_transpose")[-2])


def _conv_problem(call) -> str | None:
    """Why a convolution call has no exact ONNX ``Conv``/``ConvTranspose``."""
    op, at, k = call.op.name, call.attrs, _spatial(call)
    data, kernel, tkernel = _LAYOUTS[k]
    want = (data, tkernel if op.endswith("_transpose") else kernel, data)
    got = (str(at.data_layout), str(at.kernel_layout), str(at.out_layout))
    if got != want:
        return f"{op} with layouts {got}: only {want} (convert the model to channel-first first)"
    dt = dtype_of(call.args[0].ty)
    if dt not in _FLOATS:
        return f"{op} of {dt}: ONNX convolutions take float tensors only"
    if at.out_dtype is not None and str(at.out_dtype) not in ("", dt):
        return f"{op} into {at.out_dtype} from {dt}"
    return None


def _pads(vals: list[int], k: int) -> list[int]:
    """Relax padding (one value, one per axis, or every before then every after) as ONNX ``pads``."""
    if len(vals) == 1:
        return vals * (2 * k)
    return vals * 2 if len(vals) == k else vals


@_reg("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")
def _conv(e: Exporter, call, out):
    at, k = call.attrs, _spatial(call)
    w_shape = tensor_shape(call.args[1].ty, "conv weight")
    return e.one("Conv", [e.tensor(call.args[0]), e.tensor(call.args[1])], out,
                 kernel_shape=list(w_shape[2:]), strides=ints(at.strides), pads=_pads(ints(at.padding), k),
                 dilations=ints(at.dilation), group=int(at.groups))


@_reg("relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose")
def _conv_transpose(e: Exporter, call, out):
    """TVM's output size, ``(in - 1) * stride - pads + dilation * (kernel - 1) + output_padding + 1``,
    is ONNX's when ``output_shape`` is not given."""
    at, k = call.attrs, _spatial(call)
    w_shape = tensor_shape(call.args[1].ty, "conv_transpose weight")
    return e.one("ConvTranspose", [e.tensor(call.args[0]), e.tensor(call.args[1])], out,
                 kernel_shape=list(w_shape[2:]), strides=ints(at.strides), pads=_pads(ints(at.padding), k),
                 dilations=ints(at.dilation), group=int(at.groups), output_padding=ints(at.output_padding))


for _n in ("conv1d", "conv2d", "conv3d", "conv1d_transpose", "conv2d_transpose"):
    PROBLEMS[f"relax.nn.{_n}"] = _conv_problem


def _pool_problem(call) -> str | None:
    """Why a pooling call has no exact ONNX pool: another layout, or (average) a dilation,
    which ONNX's ``AveragePool`` takes from opset 19 only."""
    op, at = call.op.name, call.attrs
    data = _LAYOUTS[_spatial(call)][0]
    if str(at.layout) != data or str(getattr(at, "out_layout", data)) != data:
        return f"{op} with layout {at.layout}: only {data}"
    if "avg_pool" in op and not op.startswith("relax.nn.adaptive") and any(d != 1 for d in ints(at.dilation)):
        return f"{op} with dilation {ints(at.dilation)}: ONNX AveragePool has no dilation at opset 17"
    if op.startswith("relax.nn.adaptive"):
        in_s = tensor_shape(call.args[0].ty, f"{op} input")[2:]
        out_s = tensor_shape(call.ty, f"{op} result")[2:]
        if not all(in_s) or not all(out_s):
            return f"{op} from {in_s} to {out_s}: an empty axis"
        if str(call.args[0].ty.dtype) not in ("float16", "float32", "float64"):
            return f"{op} of {call.args[0].ty.dtype}: only floating-point averages"
    return None


def _pool_kw(call) -> dict:
    at, k = call.attrs, _spatial(call)
    return dict(kernel_shape=ints(at.pool_size), strides=ints(at.strides), pads=_pads(ints(at.padding), k),
                ceil_mode=int(bool(at.ceil_mode)))


@_reg("relax.nn.max_pool1d", "relax.nn.max_pool2d", "relax.nn.max_pool3d")
def _max_pool(e: Exporter, call, out):
    return e.one("MaxPool", [e.tensor(call.args[0])], out, dilations=ints(call.attrs.dilation), **_pool_kw(call))


@_reg("relax.nn.avg_pool1d", "relax.nn.avg_pool2d", "relax.nn.avg_pool3d")
def _avg_pool(e: Exporter, call, out):
    return e.one("AveragePool", [e.tensor(call.args[0])], out,
                 count_include_pad=int(bool(call.attrs.count_include_pad)), **_pool_kw(call))


def _openvino_avg_pool_problem(call) -> str | None:
    """OpenVINO divides a last window that ``ceil_mode`` adds past the padding by another count
    than ONNX (and TVM) when the padding counts."""
    at = call.attrs
    if not (bool(at.ceil_mode) and bool(at.count_include_pad)):
        return None
    shp, kw = tensor_shape(call.args[0].ty, "avg_pool input")[2:], _pool_kw(call)
    k = len(shp)
    for n, size, stride, lo, hi in zip(shp, kw["kernel_shape"], kw["strides"], kw["pads"][:k], kw["pads"][k:]):
        if (n + lo + hi - size) % stride:
            return ("avg_pool with ceil_mode and count_include_pad over a last window past the padding: "
                    "OpenVINO counts it otherwise")
    return None


#: Relax operator -> why OpenVINO computes one of its calls otherwise than the ONNX model says.
OPENVINO_PROBLEMS = {f"relax.nn.avg_pool{k}d": _openvino_avg_pool_problem for k in (1, 2, 3)}


@_reg("relax.nn.adaptive_avg_pool1d", "relax.nn.adaptive_avg_pool2d", "relax.nn.adaptive_avg_pool3d")
def _adaptive_avg(e: Exporter, call, out):
    """Where the output size divides the input, every window is ``input / output`` wide and
    apart: a plain ``AveragePool`` (``GlobalAveragePool`` for an output of ones)."""
    why = _pool_problem(call)
    if why:
        raise OnnxExportError(why)
    in_s = tensor_shape(call.args[0].ty, "adaptive_avg_pool input")[2:]
    out_s = tensor_shape(call.ty, "adaptive_avg_pool result")[2:]
    x = e.tensor(call.args[0])
    if all(o == 1 for o in out_s):
        return e.one("GlobalAveragePool", [x], out)
    if out_s == in_s:
        return e.one("Identity", [x], out)
    if all(i % o == 0 for i, o in zip(in_s, out_s)):
        k = [i // o for i, o in zip(in_s, out_s)]
        return e.one("AveragePool", [x], out, kernel_shape=k, strides=k)
    return _uneven_adaptive_avg(e, x, in_s, out_s, str(call.args[0].ty.dtype), out)


def adaptive_windows(n_in: int, n_out: int) -> np.ndarray:
    """The ``(n_out, n_in)`` averaging matrix of an adaptive average pool along one axis: row
    ``i`` averages ``floor(i * n_in / n_out)`` up to ``ceil((i + 1) * n_in / n_out)`` (the
    windows of TVM's and PyTorch's adaptive pools).

    Examples
    --------
    >>> adaptive_windows(5, 3)
    array([[0.5       , 0.5       , 0.        , 0.        , 0.        ],
           [0.        , 0.33333333, 0.33333333, 0.33333333, 0.        ],
           [0.        , 0.        , 0.        , 0.5       , 0.5       ]])
    """
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        lo, hi = (i * n_in) // n_out, -((-(i + 1) * n_in) // n_out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m


def _uneven_adaptive_avg(e: Exporter, x: str, in_s: list, out_s: list, dtype: str, out):
    """``x`` (N, C, *in_s) pooled to (N, C, *out_s) by one ``MatMul`` per spatial axis with its
    :func:`adaptive_windows` matrix: the last axis from the right (``x @ P^T``), the one
    before it from the left (``P @ x``), a third after folding the last two into one."""
    k, cur = len(in_s), x
    cur = e.one("MatMul", [cur, e.init(adaptive_windows(in_s[-1], out_s[-1]).T.astype(dtype), "pool_w")],
                out if k == 1 else None)
    if k >= 2:
        cur = e.one("MatMul", [e.init(adaptive_windows(in_s[-2], out_s[-2]).astype(dtype), "pool_h"), cur],
                    out if k == 2 else None)
    if k == 3:
        folded = e.one("Reshape", [cur, e.int64s([0, 0, in_s[0], out_s[1] * out_s[2]])])
        cur = e.one("MatMul", [e.init(adaptive_windows(in_s[0], out_s[0]).astype(dtype), "pool_d"), folded])
        cur = e.one("Reshape", [cur, e.int64s([0, 0, *out_s])], out)
    return cur


for _k in (1, 2, 3):
    for _n in ("max_pool", "avg_pool", "adaptive_avg_pool"):
        PROBLEMS[f"relax.nn.{_n}{_k}d"] = _pool_problem


def _rms_norm_problem(call) -> str | None:
    rank = len(tensor_shape(call.args[0].ty, "rms_norm input"))
    axes = [a % rank for a in ints(call.attrs.axes)]
    if axes != list(range(rank - len(axes), rank)):
        return f"rms_norm over axes {ints(call.attrs.axes)}, not the trailing ones in order (TOPI's weight indexing)"
    if dtype_of(call.args[0].ty) not in _FLOATS:
        return f"rms_norm of {dtype_of(call.args[0].ty)}"
    return None


@_reg("relax.nn.rms_norm")
def _rms_norm(e: Exporter, call, out):
    """TOPI's ``rms_norm``: ``x * rsqrt(mean(x^2, axes) + eps) * weight`` over trailing axes (the
    weight's), in float32 (cast back)."""
    shp = tensor_shape(call.args[0].ty, "rms_norm input")
    axes = [a % len(shp) for a in ints(call.attrs.axes)]
    dt = dtype_of(call.args[0].ty)
    x, w = e.tensor(call.args[0]), e.tensor(call.args[1])
    if dt != "float32":
        x, w = e.one("Cast", [x], to=1), e.one("Cast", [w], to=1)
    ms = e.one("ReduceMean", [e.one("Mul", [x, x])], axes=axes, keepdims=1)
    eps = e.init(np.array(float(call.attrs.epsilon), "float32"), "epsilon")
    inv = e.one("Reciprocal", [e.one("Sqrt", [e.one("Add", [ms, eps])])])
    y = e.one("Mul", [e.one("Mul", [x, inv]), w])
    if dt != "float32":
        return e.one("Cast", [y], out, to=elem_type(dt, "rms_norm result"))
    return e.one("Identity", [y], out)


PROBLEMS["relax.nn.rms_norm"] = _rms_norm_problem


@_reg("relax.nn.softplus")
def _softplus(e: Exporter, call, out):
    """TOPI's ``softplus``: ``x`` where ``beta * x > threshold``, else ``log(1 + exp(beta * x)) / beta``."""
    x, dt = e.tensor(call.args[0]), dtype_of(call.args[0].ty)
    beta, thr = float(call.attrs.beta), float(call.attrs.threshold)
    bx = e.one("Mul", [x, e.init(np.array(beta, dt), "beta")])
    soft = e.one("Log", [e.one("Add", [e.init(np.array(1.0, dt), "one"), e.one("Exp", [bx])])])
    soft = e.one("Mul", [soft, e.init(np.array(1.0 / beta, dt), "inv_beta")])
    return e.one("Where", [e.one("Greater", [bx, e.init(np.array(thr, dt), "threshold")]), x, soft], out)


__all__ = ["CONVERTERS", "OPENVINO_PROBLEMS", "PROBLEMS"]
