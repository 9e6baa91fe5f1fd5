"""The graph-level backend: a whole subgraph becomes one ONNX model run by ONNX Runtime.

The subgraph function is exported with :func:`tvm_pesto.backends.onnx_export.relax_to_onnx`
when that module exists and handles every op, else with the converter below (constants
become initializers, so ONNX Runtime folds and pre-packs them). At run time inputs and
the output are bound by pointer (IOBinding over DLPack views), so ORT reads TVM's tensors
and writes the DPS output tensor in place.

Examples
--------
>>> from tvm_pesto.backends.onnxruntime import relax_to_onnx_local   # doctest: +SKIP
>>> model = relax_to_onnx_local(func)                                # doctest: +SKIP
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..errors import BuildError
from .base import (
    Backend, call_attrs, device_cores, dtype_of, function_bindings, op_level_patterns, op_short_name,
    pads4, prim_value, static_shape,
)

OPSET = 20
_ONNX_DTYPE = {"float32": 1, "uint8": 2, "int8": 3, "int32": 6, "int64": 7, "bool": 9, "float16": 10, "float64": 11}
_NP_DTYPE = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "int64": np.int64,
             "int32": np.int32, "bool": np.bool_, "int8": np.int8, "uint8": np.uint8}

SUPPORTED = {
    "nn.conv2d", "nn.batch_norm", "nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d", "nn.layer_norm",
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "nn.relu", "sigmoid", "tanh", "nn.silu",
    "exp", "sqrt", "rsqrt", "erf", "negative", "abs", "log", "nn.gelu", "nn.gelu_tanh", "clip", "matmul",
    "permute_dims", "reshape", "flatten", "squeeze", "expand_dims", "broadcast_to", "nn.softmax", "mean", "sum",
    "max", "min", "concat", "split", "astype", "zeros_like",
}


class _Exporter:
    """Relax function -> ONNX graph, one or a few ONNX nodes per Relax call."""

    def __init__(self, func: relax.Function):
        import onnx
        from onnx import helper

        self.onnx, self.helper = onnx, helper
        self.nodes: list = []
        self.inits: list = []
        self.names: dict = {}  # Var -> name or list of names (tuples)
        self.count = 0
        self.inputs = []
        for k, p in enumerate(func.params):
            nm = f"in{k}"
            self.names[p] = nm
            self.inputs.append(helper.make_tensor_value_info(nm, _ONNX_DTYPE[dtype_of(p.ty)], static_shape(p.ty)))
        for b in function_bindings(func):
            self.names[b.var] = self.expr(b.value)
        body = func.body.body
        outs = self.flat(self.expr(body))
        out_tys = list(body.ty.fields) if isinstance(body.ty, (relax.TupleType, tvm.ir.TupleType)) else [body.ty]
        self.outputs = []
        for k, (nm, ty) in enumerate(zip(outs, out_tys)):
            onm = f"out{k}"
            self.node("Identity", [nm], [onm])
            self.outputs.append(helper.make_tensor_value_info(onm, _ONNX_DTYPE[dtype_of(ty)], static_shape(ty)))
        graph = helper.make_graph(self.nodes, "pesto_subgraph", self.inputs, self.outputs, self.inits)
        self.model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                       producer_name="tvm-pesto")
        self.model.ir_version = 9

    # helpers
    def fresh(self, hint="t") -> str:
        self.count += 1
        return f"{hint}{self.count}"

    def node(self, op, ins, outs=None, **attrs):
        outs = outs or [self.fresh(op.lower())]
        self.nodes.append(self.helper.make_node(op, ins, outs, **attrs))
        return outs[0] if len(outs) == 1 else outs

    def init(self, arr: np.ndarray, hint="c") -> str:
        from onnx import numpy_helper

        nm = self.fresh(hint)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), nm))
        return nm

    def ints(self, vals, hint="shape") -> str:
        return self.init(np.asarray(vals, dtype=np.int64), hint)

    @staticmethod
    def flat(v) -> list:
        if isinstance(v, list):
            out = []
            for x in v:
                out.extend(_Exporter.flat(x))
            return out
        return [v]

    def expr(self, e):
        if isinstance(e, relax.Var):
            if e not in self.names:
                raise BuildError(f"variable {e.name!r} is not defined in the subgraph")
            return self.names[e]
        if isinstance(e, tvm.ir.Constant):
            v = e.value
            return self.init(v.numpy() if hasattr(v, "numpy") else np.asarray(v))
        if isinstance(e, relax.Tuple):
            return [self.expr(f) for f in e.fields]
        if isinstance(e, relax.TupleGetItem):
            t = self.expr(e.tuple_value)
            if not isinstance(t, list):
                raise BuildError("TupleGetItem on a non-tuple value")
            return t[int(e.index)]
        if isinstance(e, relax.Call):
            name = op_short_name(e)
            fn = getattr(self, "op_" + name.replace(".", "_"), None)
            if fn is None or name not in SUPPORTED:
                raise BuildError(f"the ONNX exporter has no converter for {name or type(e.op).__name__!r}")
            return fn(e, call_attrs(e))
        raise BuildError(f"the ONNX exporter cannot translate a {type(e).__name__}")

    def arg(self, call, k):
        return self.expr(call.args[k])

    # ops
    def op_nn_conv2d(self, c, a):
        t, l, b, r = pads4(a["padding"])
        w = static_shape(c.args[1].ty)
        return self.node("Conv", [self.arg(c, 0), self.arg(c, 1)], strides=list(a["strides"]), pads=[t, l, b, r],
                         dilations=list(a["dilation"]), group=int(a["groups"]), kernel_shape=list(w[2:]))

    def op_nn_batch_norm(self, c, a):
        if a.get("training", False) or int(a.get("axis", 1)) != 1:
            raise BuildError("batch_norm in training mode or over an axis other than 1 is not exported to ONNX")
        x, g, bt, m, v = (self.arg(c, k) for k in range(5))
        y = self.node("BatchNormalization", [x, g, bt, m, v], epsilon=float(a.get("epsilon", 1e-5)))
        return [y, m, v]

    def _pool(self, op, c, a, extra):
        t, l, b, r = pads4(a["padding"])
        return self.node(op, [self.arg(c, 0)], kernel_shape=list(a["pool_size"]), strides=list(a["strides"]),
                         pads=[t, l, b, r], ceil_mode=int(bool(a.get("ceil_mode", False))), **extra)

    def op_nn_max_pool2d(self, c, a):
        return self._pool("MaxPool", c, a, {"dilations": list(a.get("dilation", (1, 1)))})

    def op_nn_avg_pool2d(self, c, a):
        return self._pool("AveragePool", c, a, {"count_include_pad": int(bool(a.get("count_include_pad", False)))})

    def op_nn_adaptive_avg_pool2d(self, c, a):
        out = static_shape(c.ty)
        if tuple(out[2:]) != (1, 1):
            raise BuildError("adaptive_avg_pool2d to a size other than 1x1 is not exported to ONNX")
        return self.node("GlobalAveragePool", [self.arg(c, 0)])

    def op_nn_layer_norm(self, c, a):
        rank = len(static_shape(c.args[0].ty))
        axis = rank - len(a["axes"])
        return self.node("LayerNormalization", [self.arg(c, 0), self.arg(c, 1), self.arg(c, 2)], axis=axis,
                         epsilon=float(a.get("epsilon", 1e-5)))

    def _bin(op):
        return lambda self, c, a: self.node(op, [self.arg(c, 0), self.arg(c, 1)])

    op_add, op_subtract, op_multiply, op_divide = _bin("Add"), _bin("Sub"), _bin("Mul"), _bin("Div")
    op_maximum, op_minimum, op_power = _bin("Max"), _bin("Min"), _bin("Pow")

    def _un(op, **kw):
        return lambda self, c, a: self.node(op, [self.arg(c, 0)], **kw)

    op_nn_relu, op_sigmoid, op_tanh, op_exp = _un("Relu"), _un("Sigmoid"), _un("Tanh"), _un("Exp")
    op_sqrt, op_erf, op_negative, op_abs, op_log = _un("Sqrt"), _un("Erf"), _un("Neg"), _un("Abs"), _un("Log")
    op_nn_gelu = _un("Gelu")
    op_nn_gelu_tanh = _un("Gelu", approximate="tanh")

    def op_nn_silu(self, c, a):
        x = self.arg(c, 0)
        return self.node("Mul", [x, self.node("Sigmoid", [x])])

    def op_rsqrt(self, c, a):
        return self.node("Reciprocal", [self.node("Sqrt", [self.arg(c, 0)])])

    def op_clip(self, c, a):
        dt = _NP_DTYPE[dtype_of(c.ty)]
        lo = self.init(np.asarray(prim_value(c.args[1]), dtype=dt))
        hi = self.init(np.asarray(prim_value(c.args[2]), dtype=dt))
        return self.node("Clip", [self.arg(c, 0), lo, hi])

    def op_matmul(self, c, a):
        return self.node("MatMul", [self.arg(c, 0), self.arg(c, 1)])

    def op_permute_dims(self, c, a):
        rank = len(static_shape(c.args[0].ty))
        axes = a.get("axes")
        perm = [int(x) for x in axes] if axes else list(reversed(range(rank)))
        return self.node("Transpose", [self.arg(c, 0)], perm=perm)

    def op_reshape(self, c, a):
        return self.node("Reshape", [self.arg(c, 0), self.ints(static_shape(c.ty))])

    op_flatten = op_squeeze = op_expand_dims = op_reshape

    def op_broadcast_to(self, c, a):
        return self.node("Expand", [self.arg(c, 0), self.ints(static_shape(c.ty))])

    def op_nn_softmax(self, c, a):
        return self.node("Softmax", [self.arg(c, 0)], axis=int(a.get("axis", -1)))

    def _reduce(op):
        def conv(self, c, a):
            rank = len(static_shape(c.args[0].ty))
            axis = a.get("axis")
            axes = [int(x) for x in axis] if axis else list(range(rank))
            keep = int(bool(a.get("keepdims", False)))
            if op in ("ReduceSum",) or OPSET >= 18:
                return self.node(op, [self.arg(c, 0), self.ints(axes, "axes")], keepdims=keep)
            return self.node(op, [self.arg(c, 0)], axes=axes, keepdims=keep)

        return conv

    op_mean, op_sum, op_max, op_min = _reduce("ReduceMean"), _reduce("ReduceSum"), _reduce("ReduceMax"), \
        _reduce("ReduceMin")

    def op_concat(self, c, a):
        xs = self.arg(c, 0)
        return self.node("Concat", list(xs), axis=int(a.get("axis", 0)))

    def op_split(self, c, a):
        axis = int(a.get("axis", 0))
        size = static_shape(c.args[0].ty)[axis]
        ios = a.get("indices_or_sections")
        if isinstance(ios, (tuple, list)):
            pts = [0] + [int(i) for i in ios] + [size]
            sizes = [pts[k + 1] - pts[k] for k in range(len(pts) - 1)]
        else:
            sizes = [size // int(ios)] * int(ios)
        outs = [self.fresh("split") for _ in sizes]
        self.node("Split", [self.arg(c, 0), self.ints(sizes, "split")], outs, axis=axis)
        return outs

    def op_astype(self, c, a):
        return self.node("Cast", [self.arg(c, 0)], to=_ONNX_DTYPE[str(a["dtype"])])

    def op_zeros_like(self, c, a):
        return self.node("Mul", [self.arg(c, 0), self.init(np.zeros((), _NP_DTYPE[dtype_of(c.ty)]))])

    del _bin, _un, _reduce


def relax_to_onnx_local(func: relax.Function):
    """Export a Relax subgraph function to an ONNX model (this module's own converter).

    Raises
    ------
    BuildError
        For an operator without a converter (the search then keeps it on another backend).

    Examples
    --------
    >>> model = relax_to_onnx_local(func)   # doctest: +SKIP
    >>> model.graph.node[0].op_type          # doctest: +SKIP
    'Conv'
    """
    return _Exporter(func).model


def export(func: relax.Function):
    """The shared exporter (``onnx_export.relax_to_onnx``) when present and able, else ours."""
    try:
        from .onnx_export import relax_to_onnx  # written by the GPU-backend helper
    except ImportError:
        relax_to_onnx = None
    if relax_to_onnx is not None:
        try:
            return relax_to_onnx(func), "onnx_export"
        except Exception:  # noqa: BLE001 - fall back to the local converter for missing ops
            pass
    return relax_to_onnx_local(func), "local"


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime (CPU execution provider), whole subgraphs at a time (graph-level).

    One session with ``intra_op_num_threads`` = the device's core count, created at build
    time. Worker spinning is off, so idle sessions do not take cores from other devices.
    """

    name = "onnxruntime"
    device_kinds = ("cpu",)
    graph_level = True
    max_ops = 4

    def patterns(self):
        return op_level_patterns("onnxruntime", SUPPORTED - {"zeros_like"}, max_depth=self.max_ops)

    def supports_op(self, call) -> bool:
        name = op_short_name(call)
        if name not in SUPPORTED:
            return False
        if name == "nn.adaptive_avg_pool2d":
            return tuple(static_shape(call.ty)[2:]) == (1, 1)
        return True

    def available(self) -> tuple[bool, str]:
        try:
            import onnx  # noqa: F401
            import onnxruntime as ort
        except Exception as e:  # noqa: BLE001
            return False, (f"onnxruntime/onnx cannot be imported ({type(e).__name__}: {e}); "
                           "install them with `pip install onnx onnxruntime`")
        if "CPUExecutionProvider" not in ort.get_available_providers():
            return False, "onnxruntime has no CPUExecutionProvider in this build"
        return True, ""

    def make_callable(self, func: relax.Function, device):
        import onnxruntime as ort

        model, _ = export(func)
        blob = model.SerializeToString()
        in_names = [i.name for i in model.graph.input]
        out_names = [o.name for o in model.graph.output]
        in_dt = [_NP_DTYPE[dtype_of(p.ty)] for p in func.params]
        body_ty = func.body.body.ty
        out_tys = list(body_ty.fields) if isinstance(body_ty, (relax.TupleType, tvm.ir.TupleType)) else [body_ty]
        out_dt = [_NP_DTYPE[dtype_of(t)] for t in out_tys]
        so = ort.SessionOptions()
        so.intra_op_num_threads = device_cores(device)
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        # No busy-waiting workers: they would steal cores from the other device (or the
        # next call) while this session is idle.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])

        def run(*args):
            io = sess.io_binding()
            n_in = len(in_names)
            for nm, a, dt in zip(in_names, args[:n_in], in_dt):
                arr = np.from_dlpack(a)
                io.bind_input(nm, "cpu", 0, dt, list(arr.shape), arr.ctypes.data)
            for nm, o, dt in zip(out_names, args[n_in:], out_dt):
                arr = np.from_dlpack(o)
                io.bind_output(nm, "cpu", 0, dt, list(arr.shape), arr.ctypes.data)
            sess.run_with_iobinding(io)

        return run
