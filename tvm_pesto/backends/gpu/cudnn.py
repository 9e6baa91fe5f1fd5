"""cuDNN backend: conv2d (+ bias, + ReLU) through the cuDNN frontend's Python graph API.

A matched subgraph (TVM's ``cudnn.conv2d.*`` patterns: ``conv2d -> [add bias] -> [relu]``,
NCHW/OIHW or NHWC/OHWI, float32/float16) becomes a :class:`ConvPlan`; on a GPU the plan is
built into one fused cuDNN graph (``conv_fprop`` -> ``bias`` -> ``relu``), planned once with
the heuristics and executed on TVM's current CUDA stream with DLPack tensors.

TVM's ``cudnn.attention.*`` patterns (stacked-QKV float16 attention) are matched for
coverage; running them needs cuDNN's SDPA graph and is reported unsupported here (no zoo
model is float16).

Examples
--------
>>> from tvm_pesto.backends.gpu.cudnn import CudnnBackend
>>> CudnnBackend().name
'cudnn'
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from ...errors import BuildError
from ..base import Backend, function_bindings
from ...cluster import gpu_probe as probe
from .cublas import Operand, _as_int, _ptr, _source
from .patterns import backend_patterns


@dataclass
class ConvPlan:
    """One fused cuDNN convolution graph in NCHW-or-NHWC terms.

    ``x_dims``/``w_dims``/``y_dims`` are in cuDNN's logical N, C, H, W order with
    ``*_strides`` describing the memory layout; padding is (top, left) / (bottom, right).
    """

    x_dims: tuple[int, ...]
    x_strides: tuple[int, ...]
    w_dims: tuple[int, ...]
    w_strides: tuple[int, ...]
    y_dims: tuple[int, ...]
    y_strides: tuple[int, ...]
    pre_padding: tuple[int, int]
    post_padding: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    relu: bool
    dtype: str
    layout: str
    x: Operand
    w: Operand
    bias: Operand | None = None
    bias_dims: tuple[int, ...] = ()
    bias_strides: tuple[int, ...] = ()


def _shape(ty) -> tuple[int, ...]:
    return tuple(int(s) for s in ty.shape.values)


def _logical(shape, layout: str):
    """(dims in N,C,H,W order, strides in that order) of a packed tensor in ``layout``."""
    packed = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        packed[i] = packed[i + 1] * shape[i + 1]
    pos = {c: i for i, c in enumerate(layout)}
    order = [pos[c] for c in "NCHW"] if "N" in layout else [pos[c] for c in "OIHW"]
    return tuple(shape[i] for i in order), tuple(packed[i] for i in order)


def conv_output_hw(h, w, kh, kw, pads, stride, dilation) -> tuple[int, int]:
    """Output height/width of a 2-d convolution (what TVM and cuDNN compute)."""
    t, l, b, r = pads
    oh = (h + t + b - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + l + r - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    return oh, ow


def plan_conv(func: relax.Function) -> ConvPlan:
    """The cuDNN graph that computes a ``cudnn.conv2d.*``-matched subgraph function.

    Raises
    ------
    BuildError
        When the function is not ``conv2d [+ bias] [+ relu]`` or uses an unsupported
        layout or dtype.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relax
    >>> x = relax.Var("x", relax.TensorType((1, 8, 8, 3), "float32"))
    >>> w = relax.const(np.ones((4, 3, 3, 3), "float32"))
    >>> bb = relax.BlockBuilder()
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         y = bb.emit(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI"))
    ...         out = bb.emit_output(relax.op.nn.relu(y))
    ...     _ = bb.emit_func_output(out)
    >>> plan = plan_conv(bb.get()["main"])
    >>> plan.y_dims, plan.layout, plan.relu       # dims in N, C, H, W order
    ((1, 4, 8, 8), 'NHWC', True)
    """
    params = list(func.params)
    binds = function_bindings(func)
    values = {b.var: b.value for b in binds}
    calls = [(b.var, b.value) for b in binds if isinstance(b.value, relax.Call)]
    ops = [c.op.name if isinstance(c.op, tvm.ir.Op) else "?" for _, c in calls]
    convs = [(v, c) for v, c in calls if isinstance(c.op, tvm.ir.Op) and c.op.name == "relax.nn.conv2d"]
    allowed = {"relax.nn.conv2d", "relax.add", "relax.nn.relu", "relax.reshape"}
    if len(convs) != 1 or any(o not in allowed for o in ops) or ops.count("relax.reshape") > 1:
        raise BuildError(f"cuDNN takes one conv2d with bias/relu; this subgraph has ops {ops}")
    cvar, conv = convs[0]
    at = conv.attrs
    layouts = (str(at.data_layout), str(at.kernel_layout))
    if layouts not in (("NCHW", "OIHW"), ("NHWC", "OHWI")) or str(at.out_layout) != layouts[0]:
        raise BuildError(f"cuDNN backend supports NCHW/OIHW and NHWC/OHWI convolutions, not {layouts}")
    dtype = str(conv.ty.dtype)
    if dtype not in ("float32", "float16") or str(conv.args[0].ty.dtype) != dtype:
        raise BuildError(f"cuDNN backend supports float32/float16 convolutions, not {conv.args[0].ty.dtype}")
    x_dims, x_strides = _logical(_shape(conv.args[0].ty), layouts[0])
    w_dims, w_strides = _logical(_shape(conv.args[1].ty), layouts[1])
    y_dims, y_strides = _logical(_shape(conv.ty), layouts[0])
    t, l, b, r = (int(v) for v in at.padding) if len(at.padding) == 4 else (int(at.padding[0]),) * 4
    stride = tuple(int(v) for v in at.strides)
    dilation = tuple(int(v) for v in at.dilation)
    oh, ow = conv_output_hw(x_dims[2], x_dims[3], w_dims[2], w_dims[3], (t, l, b, r), stride, dilation)
    if (oh, ow) != tuple(y_dims[2:]):
        raise BuildError(f"cuDNN plan: computed output {oh}x{ow} differs from Relax's {y_dims[2:]}")
    groups = int(at.groups)
    if x_dims[1] != w_dims[1] * groups:
        raise BuildError(f"cuDNN plan: {x_dims[1]} input channels vs {w_dims[1]} x {groups} groups")
    plan = ConvPlan(x_dims, x_strides, w_dims, w_strides, y_dims, y_strides, (t, l), (b, r), stride, dilation,
                    groups, False, dtype, layouts[0], _source(conv.args[0], params, "conv input", values, "cuDNN"),
                    _source(conv.args[1], params, "conv weight", values, "cuDNN"))
    cur = cvar
    bias_reshape = None
    for var, c in calls:
        if var.same_as(cvar) or not isinstance(c.op, tvm.ir.Op):
            continue
        if c.op.name == "relax.reshape":
            bias_reshape = var  # checked below: it must be the bias of the add
            continue
        if c.op.name == "relax.add" and any(a.same_as(cur) for a in c.args) and plan.bias is None:
            other = c.args[1] if c.args[0].same_as(cur) else c.args[0]
            bshape = _shape(other.ty)
            if bias_reshape is not None and other.same_as(bias_reshape):
                other = values[bias_reshape].args[0]  # same values, cuDNN takes its own shape
                bias_reshape = "used"
            k = y_dims[1]
            full = (1,) * (4 - len(bshape)) + bshape
            bd, bs = _logical(full, layouts[0])
            if int(np.prod(bshape)) != k or bd[1] != k:
                raise BuildError(f"cuDNN bias must hold one value per output channel ({k}), got shape {bshape}")
            plan.bias = _source(other, params, "bias", values, "cuDNN")
            plan.bias_dims, plan.bias_strides = (1, k, 1, 1), (k, 1, 1, 1)
            cur = var
        elif c.op.name == "relax.nn.relu" and c.args[0].same_as(cur):
            plan.relu = True
            cur = var
        else:
            raise BuildError(f"cuDNN plan: {c.op.name} is not a bias add or relu of the convolution")
    if bias_reshape not in (None, "used"):
        raise BuildError("cuDNN plan: a reshape that is not the bias of the convolution")
    return plan


def emulate_conv(plan: ConvPlan, args: list[np.ndarray]) -> np.ndarray:
    """The plan computed with NumPy (NCHW), for checking plans without a GPU."""
    x = np.asarray(plan.x.value(args), dtype=np.float64)
    w = np.asarray(plan.w.value(args), dtype=np.float64)
    if plan.layout == "NHWC":
        x, w = x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2)
    (t, l), (b, r) = plan.pre_padding, plan.post_padding
    x = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
    n, c, _, _ = x.shape
    k, cg, kh, kw = w.shape
    oh, ow = plan.y_dims[2], plan.y_dims[3]
    g = plan.groups
    y = np.zeros((n, k, oh, ow))
    for i in range(kh):
        for j in range(kw):
            hs, ws = i * plan.dilation[0], j * plan.dilation[1]
            patch = x[:, :, hs:hs + plan.stride[0] * oh:plan.stride[0], ws:ws + plan.stride[1] * ow:plan.stride[1]]
            for gi in range(g):
                xs = patch[:, gi * cg:(gi + 1) * cg]
                ws_ = w[gi * (k // g):(gi + 1) * (k // g), :, i, j]
                y[:, gi * (k // g):(gi + 1) * (k // g)] += np.einsum("nchw,kc->nkhw", xs, ws_)
    if plan.bias is not None:
        y += np.asarray(plan.bias.value(args), dtype=np.float64).reshape(1, k, 1, 1)
    if plan.relu:
        y = np.maximum(y, 0)
    if plan.layout == "NHWC":
        y = y.transpose(0, 2, 3, 1)
    return y.astype(plan.dtype)


class _Handles:
    _lock = threading.Lock()
    per_device: dict = {}

    @classmethod
    def get(cls, cudnn, index: int):
        with cls._lock:
            if index not in cls.per_device:
                tvm.cuda(index).sync()
                cls.per_device[index] = cudnn.create_handle()
            return cls.per_device[index]


def build_cudnn_graph(plan: ConvPlan, handle, allow_tf32: bool = False):
    """Build (validate, plan, compile) the cuDNN frontend graph of ``plan``.

    Float32 convolutions run without tensor cores unless ``allow_tf32``: on Hopper cuDNN's
    heuristics otherwise pick TF32 engines (about 1e-3 relative error, measured on an H200).

    Returns
    -------
    (graph, tensors dict name -> cudnn tensor, workspace bytes)
    """
    import cudnn

    dt = cudnn.data_type.FLOAT if plan.dtype == "float32" else cudnn.data_type.HALF
    g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    X = g.tensor(name="X", dim=list(plan.x_dims), stride=list(plan.x_strides), data_type=dt)
    W = g.tensor(name="W", dim=list(plan.w_dims), stride=list(plan.w_strides), data_type=dt)
    Y = g.conv_fprop(image=X, weight=W, pre_padding=list(plan.pre_padding), post_padding=list(plan.post_padding),
                     stride=list(plan.stride), dilation=list(plan.dilation), compute_data_type=cudnn.data_type.FLOAT,
                     name="conv")
    tensors = {"X": X, "W": W}
    if plan.bias is not None:
        B = g.tensor(name="B", dim=list(plan.bias_dims), stride=list(plan.bias_strides), data_type=dt)
        Y = g.bias(name="bias", input=Y, bias=B)
        tensors["B"] = B
    if plan.relu:
        Y = g.relu(name="relu", input=Y)
    Y.set_output(True).set_data_type(dt).set_dim(list(plan.y_dims)).set_stride(list(plan.y_strides))
    tensors["Y"] = Y
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    exact = plan.dtype == "float32" and not allow_tf32
    if exact:
        g.deselect_numeric_notes([cudnn.numerical_note.TENSOR_CORE, cudnn.numerical_note.DOWN_CONVERT_INPUTS])
    try:
        g.check_support()
        g.build_plans()
    except Exception as e:
        if not exact:
            raise
        raise BuildError(f"cuDNN has no float32 engine without tensor cores for this convolution ({e}); "
                           "allow TF32 with CudnnBackend.allow_tf32 = True") from e
    return g, tensors, int(g.get_workspace_size())


class CudnnBackend(Backend):
    """cuDNN convolutions (+ bias, + ReLU) for TVM's ``cudnn.conv2d.*`` patterns."""

    name = "cudnn"
    device_kinds = ("gpu",)
    graph_level = False
    max_ops = 3
    #: allow TF32 tensor cores for float32 (faster, ~1e-3 relative error)
    allow_tf32 = False

    def patterns(self) -> list:
        return [p for p in backend_patterns("cudnn") if ".conv2d." in p[0]]

    def supports_op(self, call) -> bool:
        return isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name in (
            "relax.nn.conv2d", "relax.add", "relax.nn.relu", "relax.reshape")

    def available(self) -> tuple[bool, str]:
        return probe.combine(probe.tvm_cuda_runtime(), probe.library("cudnn"), probe.python_package("cudnn"))

    def global_name(self, key: str, device) -> str:
        return f"pesto.{self.name}.{key}.gpu{getattr(device, 'index', 0)}"

    def make_callable(self, func: relax.Function, device) -> Callable:
        import cudnn

        plan = plan_conv(func)
        idx = int(getattr(device, "index", 0))
        dev = tvm.cuda(idx)
        handle = _Handles.get(cudnn, idx)
        graph, tensors, ws_bytes = build_cudnn_graph(plan, handle, self.allow_tf32)
        workspace = tvm.runtime.empty((max(1, ws_bytes),), "uint8", dev)
        consts = {}
        for name, op in (("X", plan.x), ("W", plan.w), ("B", plan.bias)):
            if op is not None and op.const is not None:
                consts[name] = tvm.runtime.tensor(np.ascontiguousarray(op.const), device=dev)
        get_stream = tvm.get_global_func("runtime.get_cuda_stream")
        n_in = len(func.params)
        lock = threading.Lock()

        fixed = {tensors[name]: _ptr(t) for name, t in consts.items()}
        operands = [(tensors[name], op) for name, op in (("X", plan.x), ("W", plan.w), ("B", plan.bias))
                    if op is not None and name not in consts]
        ws_ptr = _ptr(workspace)

        def run(*args):
            # raw device pointers: TVM tensors in the variant pack cost the frontend 100-170 us
            # a call on an H200, pointers 24-45 us (tests/gpu/gpu_peers.py, docs/gpu.md)
            inputs, out = args[:n_in], args[n_in]
            pack = dict(fixed)
            pack[tensors["Y"]] = _ptr(out)
            for t, op in operands:
                pack[t] = _ptr(op.value(inputs))
            with lock:  # a cuDNN handle is used by one thread at a time
                cudnn.set_stream(handle=handle, stream=_as_int(get_stream()))
                graph.execute(pack, ws_ptr, handle=handle)
            _ = (consts, workspace)  # the closure keeps the buffers the pointers point into

        return run
