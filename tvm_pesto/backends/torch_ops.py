"""The op-level backend: each subgraph runs as PyTorch library calls (oneDNN/MKL on CPU).

A subgraph function is translated once into a list of torch calls; parts that only depend
on constants (a transposed weight, a reshaped bias) are computed at build time. At run time
the inputs are viewed as torch tensors through DLPack (zero copy) and the result is copied
into the preallocated output tensor.

Examples
--------
>>> import tvm
>>> from tvm_pesto.backends.torch_ops import TorchBackend
>>> from tvm_pesto.candidates.examples import tiny_mlp
>>> from tvm_pesto.cluster import parse_cluster
>>> mod, (x,) = tiny_mlp()
>>> fn = TorchBackend().make_callable(mod["main"], parse_cluster("cpu:1").devices[0])
>>> out = tvm.runtime.empty((8, 16), "float32", tvm.cpu())
>>> fn(tvm.runtime.tensor(x), out)    # writes the result into out
>>> out.numpy().shape
(8, 16)
"""
from __future__ import annotations

import functools
import os
from typing import Callable

import tvm
from tvm import relax

from ..errors import BuildError, error_line
from ..run.libraries.loaders import flatten, torch_runner
from .base import (
    Backend, call_attrs, device_cores, function_bindings, op_level_patterns, op_short_name, pads4,
    prim_value, shape_value, static_shape,
)

_TORCH_DTYPES = {"float32": "float32", "float16": "float16", "float64": "float64", "int64": "int64",
                 "int32": "int32", "bool": "bool", "int8": "int8", "uint8": "uint8"}


def _tdtype(name: str):
    import torch

    try:
        return getattr(torch, _TORCH_DTYPES[str(name)])
    except KeyError:
        raise BuildError(f"dtype {name!r} has no torch equivalent here") from None


# -- one converter per op: (call, attrs) -> (fn, arg exprs) ------------------------------------
def _conv2d(call, a):
    import torch.nn.functional as F

    t, l, b, r = pads4(a["padding"])
    stride, dil, groups = tuple(a["strides"]), tuple(a["dilation"]), int(a["groups"])
    if t == b and l == r:
        return (lambda x, w: F.conv2d(x, w, None, stride, (t, l), dil, groups)), call.args[:2]
    return (lambda x, w: F.conv2d(F.pad(x, (l, r, t, b)), w, None, stride, 0, dil, groups)), call.args[:2]


def _batch_norm(call, a):
    import torch.nn.functional as F

    eps = float(a.get("epsilon", 1e-5))
    center, scale = a.get("center", True), a.get("scale", True)
    if a.get("training", False) or int(a.get("axis", 1)) != 1:
        raise BuildError("batch_norm in training mode or over an axis other than 1 is not supported by the torch "
                         "backend (inference-mode NCHW only)")

    def fn(x, g, bta, mean, var):
        y = F.batch_norm(x, mean, var, g if scale else None, bta if center else None, False, 0.0, eps)
        return (y, mean, var)

    return fn, call.args[:5]


def _pool(kind):
    def conv(call, a):
        import torch.nn.functional as F

        t, l, b, r = pads4(a["padding"])
        k, s, dil = tuple(a["pool_size"]), tuple(a["strides"]), tuple(a.get("dilation", (1, 1)))
        ceil = bool(a.get("ceil_mode", False))
        if kind == "max":
            if t == b and l == r:
                return (lambda x: F.max_pool2d(x, k, s, (t, l), dil, ceil)), call.args[:1]
            return (lambda x: F.max_pool2d(F.pad(x, (l, r, t, b), value=float("-inf")), k, s, 0, dil, ceil)), \
                call.args[:1]
        cip = bool(a.get("count_include_pad", False))
        if tuple(dil) != (1, 1) or t != b or l != r:
            raise BuildError("avg_pool2d with dilation or asymmetric padding is not supported by the torch backend")
        return (lambda x: F.avg_pool2d(x, k, s, (t, l), ceil, cip)), call.args[:1]

    return conv


def _adaptive_avg_pool2d(call, a):
    import torch.nn.functional as F

    size = tuple(a.get("output_size") or static_shape(call.ty)[2:])
    return (lambda x: F.adaptive_avg_pool2d(x, size)), call.args[:1]


def _layer_norm(call, a):
    import torch.nn.functional as F

    shape = static_shape(call.args[0].ty)
    n = len(a["axes"])
    norm = tuple(shape[len(shape) - n:])
    eps = float(a.get("epsilon", 1e-5))
    center, scale = a.get("center", True), a.get("scale", True)
    return (lambda x, g, b: F.layer_norm(x, norm, g if scale else None, b if center else None, eps)), call.args[:3]


def _binary(fname):
    def conv(call, a):
        import torch

        fn = getattr(torch, fname)
        return fn, call.args[:2]

    return conv


def _unary(fn_path):
    def conv(call, a):
        import torch
        import torch.nn.functional as F

        table = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": F.silu, "exp": torch.exp,
                 "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "erf": torch.erf, "negative": torch.neg, "abs": torch.abs,
                 "log": torch.log, "gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
                 "zeros_like": torch.zeros_like}
        return table[fn_path], call.args[:1]

    return conv


def _clip(call, a):
    import torch

    lo, hi = prim_value(call.args[1]), prim_value(call.args[2])
    return (lambda x: torch.clamp(x, lo, hi)), call.args[:1]


def _matmul(call, a):
    import torch

    return torch.matmul, call.args[:2]


def _permute_dims(call, a):
    axes = a.get("axes")
    rank = len(static_shape(call.args[0].ty))
    axes = tuple(int(x) for x in axes) if axes else tuple(reversed(range(rank)))
    return (lambda x: x.permute(axes)), call.args[:1]


def _to_shape(call, a):
    shape = static_shape(call.ty)
    return (lambda x: x.reshape(shape)), call.args[:1]


def _broadcast_to(call, a):
    shape = static_shape(call.ty)
    return (lambda x: x.expand(shape)), call.args[:1]


def _softmax(call, a):
    import torch

    axis = int(a.get("axis", -1))
    return (lambda x: torch.softmax(x, axis)), call.args[:1]


def _reduce(fname):
    def conv(call, a):
        import torch

        rank = len(static_shape(call.args[0].ty))
        axis = a.get("axis")
        dims = tuple(int(x) for x in axis) if axis else tuple(range(rank))
        keep = bool(a.get("keepdims", False))
        f = getattr(torch, fname)
        if fname in ("amax", "amin"):
            return (lambda x: f(x, dims, keep)), call.args[:1]
        return (lambda x: f(x, dims, keep)), call.args[:1]

    return conv


def _concat(call, a):
    import torch

    axis = int(a.get("axis", 0))
    return (lambda xs: torch.cat(tuple(xs), axis)), call.args[:1]


def _split(call, a):
    import torch

    axis = int(a.get("axis", 0))
    ios = a.get("indices_or_sections")
    size = static_shape(call.args[0].ty)[axis]
    if isinstance(ios, (tuple, list)):
        points = [0] + [int(i) for i in ios] + [size]
        sizes = [points[k + 1] - points[k] for k in range(len(points) - 1)]
    else:
        n = int(ios)
        sizes = [size // n] * n
    return (lambda x: tuple(torch.split(x, sizes, axis))), call.args[:1]


def _astype(call, a):
    dt = _tdtype(a["dtype"])
    return (lambda x: x.to(dt)), call.args[:1]


def _expand_dims(call, a):
    shape = static_shape(call.ty)
    return (lambda x: x.reshape(shape)), call.args[:1]


CONVERTERS: dict[str, Callable] = {
    "nn.conv2d": _conv2d, "nn.batch_norm": _batch_norm, "nn.max_pool2d": _pool("max"),
    "nn.avg_pool2d": _pool("avg"), "nn.adaptive_avg_pool2d": _adaptive_avg_pool2d, "nn.layer_norm": _layer_norm,
    "add": _binary("add"), "subtract": _binary("sub"), "multiply": _binary("mul"), "divide": _binary("div"),
    "maximum": _binary("maximum"), "minimum": _binary("minimum"), "power": _binary("pow"),
    "nn.relu": _unary("relu"), "sigmoid": _unary("sigmoid"), "tanh": _unary("tanh"), "nn.silu": _unary("silu"),
    "exp": _unary("exp"), "sqrt": _unary("sqrt"), "rsqrt": _unary("rsqrt"), "erf": _unary("erf"),
    "negative": _unary("negative"), "abs": _unary("abs"), "log": _unary("log"), "nn.gelu": _unary("gelu"),
    "nn.gelu_tanh": _unary("gelu_tanh"), "zeros_like": _unary("zeros_like"), "clip": _clip, "matmul": _matmul,
    "permute_dims": _permute_dims, "reshape": _to_shape, "flatten": _to_shape, "squeeze": _to_shape,
    "expand_dims": _expand_dims, "broadcast_to": _broadcast_to, "nn.softmax": _softmax, "mean": _reduce("mean"),
    "sum": _reduce("sum"), "max": _reduce("amax"), "min": _reduce("amin"), "concat": _concat, "split": _split,
    "astype": _astype,
}


class TorchProgram:
    """A Relax function translated into torch calls over numbered slots.

    Every value (parameter, constant, intermediate, literal) lives in a slot; a step is
    ``(fn, arg slots, out slot)``. Steps whose arguments are all constants run at build time.
    """

    def __init__(self, func: relax.Function):
        import torch

        self.torch = torch
        self.const: list = []  # slot -> value known at build time (None for runtime slots)
        self.is_const: list[bool] = []
        self.steps: list[tuple] = []
        env: dict = {}
        self.param_slots = [self._new(None, False) for _ in func.params]
        for p, s in zip(func.params, self.param_slots):
            env[p] = s
        self.env = env
        with torch.no_grad():
            for b in function_bindings(func):
                env[b.var] = self._expr(b.value)
            body = func.body.body
            self.outputs = [self._expr(f) for f in (body.fields if isinstance(body, relax.Tuple) else [body])]

    def _new(self, value, known: bool) -> int:
        self.const.append(value)
        self.is_const.append(known)
        return len(self.const) - 1

    def _emit(self, fn, args: list[int]) -> int:
        if all(self.is_const[a] for a in args):
            return self._new(fn(*[self.const[a] for a in args]), True)
        out = self._new(None, False)
        self.steps.append((fn, tuple(args), out))
        return out

    def _expr(self, e) -> int:
        torch = self.torch
        if isinstance(e, relax.Var):
            if e not in self.env:
                raise BuildError(f"variable {e.name!r} is not defined in the subgraph")
            return self.env[e]
        if isinstance(e, tvm.ir.Constant):
            v = e.value
            arr = v.numpy() if hasattr(v, "numpy") else v
            return self._new(torch.from_numpy(arr.copy()) if hasattr(arr, "shape") else torch.tensor(arr), True)
        if isinstance(e, relax.Tuple):
            return self._emit(lambda *xs: tuple(xs), [self._expr(f) for f in e.fields])
        if isinstance(e, relax.TupleGetItem):
            k = int(e.index)
            return self._emit(lambda t: t[k], [self._expr(e.tuple_value)])
        if isinstance(e, relax.Call):
            name = op_short_name(e)
            conv = CONVERTERS.get(name)
            if conv is None:
                raise BuildError(f"the torch backend has no converter for {name or type(e.op).__name__!r}")
            fn, args = conv(e, call_attrs(e))
            return self._emit(fn, [self._expr(a) for a in args])
        if prim_value(e) is not None or shape_value(e) is not None:
            return self._new(prim_value(e) if prim_value(e) is not None else shape_value(e), True)
        raise BuildError(f"the torch backend cannot translate a {type(e).__name__}")

    def __call__(self, inputs: list) -> list:
        slots = list(self.const)
        for s, x in zip(self.param_slots, inputs):
            slots[s] = x
        for fn, args, out in self.steps:
            slots[out] = fn(*[slots[a] for a in args])
        return [slots[o] for o in self.outputs]


class TorchBackend(Backend):
    """PyTorch library calls, one subgraph at a time (op-level backend, CPU).

    Thread count: the core count of the device the subgraph was built for (the placed
    module's device threads are pinned to those cores), set before each call if it changed.
    """

    name = "torch"
    build_s_guess = (0.0, 4e-5)  # a call list, no compiling
    device_kinds = ("cpu",)
    graph_level = False
    max_ops = 4

    def patterns(self):
        return op_level_patterns(self.name, set(CONVERTERS) - {"zeros_like"}, max_depth=self.max_ops)

    def supports_op(self, call) -> bool:
        return op_short_name(call) in CONVERTERS

    def available(self) -> tuple[bool, str]:
        try:
            import torch  # noqa: F401
        except Exception as e:  # noqa: BLE001 - any import failure means unavailable
            return False, f"PyTorch cannot be imported ({type(e).__name__}: {e}); install it with `pip install torch`"
        return True, ""

    def make_callable(self, func: relax.Function, device):
        prog = TorchProgram(func)
        return torch_runner(lambda *xs: prog(list(xs)), len(func.params), device_cores(device))

    def export_artifact(self, func: relax.Function, device, out_dir: str, stem: str) -> dict:
        """The subgraph as a ``torch.export`` program (``.pt2``): the same torch calls, with
        the build-time constants as the program's constants (:func:`exported_subgraph`)."""
        import torch  # lazy: PyTorch is optional

        fname = f"{stem}.pt2"
        torch.export.save(exported_subgraph(func), os.path.join(out_dir, fname))
        return {"kind": "torch-export", "files": [fname]}


def exported_subgraph(func: relax.Function):
    """``func`` as a ``torch.export`` program of the ``torch`` backend's calls, traced on
    zeros of the parameters' static shapes (the build-time constants become the program's).

    Raises
    ------
    BuildError
        When a parameter has no static shape or ``torch.export`` cannot trace the calls.
    """
    import torch  # lazy: PyTorch is optional

    prog = TorchProgram(func)

    class Subgraph(torch.nn.Module):
        def forward(self, *xs):
            return tuple(_flat(prog(list(xs))))

    args = tuple(torch.zeros(static_shape(p.ty), dtype=_tdtype(p.ty.dtype)) for p in func.params)
    try:
        with torch.no_grad():
            return torch.export.export(Subgraph(), args)
    except Exception as e:  # noqa: BLE001 - torch.export's own error, explained
        raise BuildError(f"torch.export could not trace the subgraph: {error_line(e)}") from e


def _flat(vals) -> list:
    return flatten(vals)
