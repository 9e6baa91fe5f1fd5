"""cuBLAS backend: matmul / batch matmul with bias, ReLU and GELU epilogues via cuBLASLt.

A matched subgraph (TVM's ``cublas.*`` patterns: ``[permute_dims] -> matmul -> [add bias]
-> [relu | gelu]``) is turned into one :class:`GemmPlan`: the cuBLASLt call that computes
it on row-major tensors. Row-major ``C[M,N] = A[M,K] @ B[K,N]`` is the column-major
product ``C^T = B^T A^T``, so cuBLAS sees ``m = N``, ``n = M`` and the operands swapped.
A transposed weight (``permute_dims(W)`` with ``W`` of shape ``(N, K)``) becomes
``transa = T`` instead of a copy. The plan is pure Python; :func:`emulate_gemm` runs it in
NumPy with cuBLAS's column-major, leading-dimension and batch-stride semantics, which is
how the CPU tests check the mapping. The library itself is loaded lazily with ctypes
(``libcublasLt.so``) and runs on TVM's current CUDA stream.

cuBLASLt's GELU epilogue is the tanh approximation (as in TVM's own cuBLAS BYOC); against
Relax's erf GELU the difference is below 1e-3 for activations of order 1.

Examples
--------
>>> from tvm_pesto.backends.gpu.cublas import CublasBackend
>>> CublasBackend().name
'cublas'
"""
from __future__ import annotations

import ctypes
import math
import threading
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from ...errors import BuildError
from ..base import Backend, function_bindings
from ...cluster import gpu_probe as probe
from .patterns import backend_patterns

# cuBLAS / cuBLASLt enums (cublasLt.h, library_types.h)
_OP = {"N": 0, "T": 1}
_CUDA_DTYPE = {"float32": 0, "float16": 2, "bfloat16": 14}
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER = 3, 4, 7, 8
_LAYOUT_BATCH_COUNT, _LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
_PREF_MAX_WORKSPACE_BYTES = 1
EPILOGUES = {"none": 1, "relu": 2, "bias": 4, "relu_bias": 6, "gelu": 32, "gelu_bias": 36}


@dataclass
class Operand:
    """Where an operand comes from: parameter ``index`` of the function (field ``item`` of
    it when that parameter is a tuple), or a constant."""

    index: int | None = None
    const: np.ndarray | None = None
    item: int | None = None

    def value(self, args):
        if self.index is None:
            return self.const
        v = args[self.index]
        return v if self.item is None else v[self.item]


@dataclass
class GemmPlan:
    """One cuBLASLt call in column-major terms (see the module docstring).

    ``a`` is cuBLAS's first operand (the Relax rhs), ``b`` its second (the Relax lhs).
    """

    m: int
    n: int
    k: int
    batch: int
    transa: str
    transb: str
    lda: int
    ldb: int
    ldc: int
    stride_a: int
    stride_b: int
    stride_c: int
    epilogue: str
    dtype: str
    out_shape: tuple[int, ...]
    a: Operand = field(default_factory=Operand)
    b: Operand = field(default_factory=Operand)
    bias: Operand | None = None


def _shape(ty) -> tuple[int, ...]:
    return tuple(int(s) for s in ty.shape.values)


def _source(expr, params, what, values=None, lib="cuBLAS") -> Operand:
    """The operand ``expr`` as a parameter (or a field of a tuple parameter) or a constant."""
    values = values or {}
    while isinstance(expr, relax.Var) and expr not in params and isinstance(values.get(expr), relax.Var):
        expr = values[expr]
    if isinstance(expr, relax.Var) and expr in params:
        return Operand(index=params.index(expr))
    bound = values.get(expr) if isinstance(expr, relax.Var) else None
    if isinstance(bound, relax.TupleGetItem) and isinstance(bound.tuple_value, relax.Var) \
            and bound.tuple_value in params:
        return Operand(index=params.index(bound.tuple_value), item=int(bound.index))
    if isinstance(expr, tvm.ir.Constant) and hasattr(expr.value, "numpy"):
        return Operand(const=expr.value.numpy())
    raise BuildError(f"{lib}: the {what} must be a parameter or a constant of the subgraph, "
                     f"not a {type(expr).__name__}")


def plan_gemm(func: relax.Function) -> GemmPlan:
    """The cuBLASLt call that computes a ``cublas.*``-matched subgraph function.

    Parameters
    ----------
    func : relax.Function
        ``[W_t = permute_dims(W)] ; y = matmul(x, W or W_t) ; [y = add(y, bias)] ;
        [y = relu(y) | gelu(y)]`` with static shapes.

    Raises
    ------
    BuildError
        When the function is not of that form, or its shapes/dtypes are not supported.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relax
    >>> x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    >>> bb = relax.BlockBuilder()
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         y = bb.emit(relax.op.matmul(x, relax.const(np.ones((8, 3), "float32"))))
    ...         y = bb.emit(relax.op.add(y, relax.const(np.ones(3, "float32"))))
    ...         out = bb.emit_output(relax.op.nn.relu(y))
    ...     _ = bb.emit_func_output(out)
    >>> plan = plan_gemm(bb.get()["main"])
    >>> (plan.m, plan.n, plan.k), plan.epilogue, plan.out_shape   # column-major: m, n swapped
    ((3, 4, 8), 'relu_bias', (4, 3))
    """
    params = list(func.params)
    binds = function_bindings(func)
    calls = [(b.var, b.value) for b in binds if isinstance(b.value, relax.Call)]
    values = {b.var: b.value for b in binds}
    mm = _single_matmul(calls)
    lhs, rhs = mm.args
    dtype = str(mm.ty.dtype)
    if dtype not in _CUDA_DTYPE or str(lhs.ty.dtype) != dtype or str(rhs.ty.dtype) != dtype:
        raise BuildError(f"cuBLAS backend supports float32/float16/bfloat16 matmuls, not "
                         f"{lhs.ty.dtype} x {rhs.ty.dtype} -> {dtype}")
    transposed, rhs = _untransposed(rhs, values)
    Mf, N, K, batch = _gemm_sizes(lhs, rhs, transposed)
    out_shape = _shape(mm.ty)
    epi, bias = _epilogue(calls, mm, N, params, values)
    return GemmPlan(
        m=N, n=Mf, k=K, batch=batch, transa="T" if transposed else "N", transb="N",
        lda=K if transposed else N, ldb=K, ldc=N,
        stride_a=N * K if batch > 1 else 0, stride_b=Mf * K if batch > 1 else 0,
        stride_c=Mf * N if batch > 1 else 0, epilogue=epi, dtype=dtype, out_shape=out_shape,
        a=_source(rhs, params, "weight (matmul rhs)", values), b=_source(lhs, params, "matmul lhs", values),
        bias=bias,
    )


def _single_matmul(calls: list) -> relax.Call:
    """The one matmul among the subgraph's ``(var, call)`` bindings; a BuildError when there
    is not exactly one, or an op cuBLAS cannot run as its epilogue."""
    ops = [c.op.name if isinstance(c.op, tvm.ir.Op) else "?" for _, c in calls]
    mm = [c for _, c in calls if isinstance(c.op, tvm.ir.Op) and c.op.name == "relax.matmul"]
    if len(mm) != 1:
        raise BuildError(f"cuBLAS takes one matmul with epilogues; this subgraph has ops {ops}")
    allowed = {"relax.matmul", "relax.permute_dims", "relax.add", "relax.nn.relu", "relax.nn.gelu"}
    if any(o not in allowed for o in ops):
        raise BuildError(f"cuBLAS cannot run ops {sorted(set(ops) - allowed)} in this subgraph")
    return mm[0]


def _untransposed(rhs, values: dict) -> tuple[bool, relax.Expr]:
    """``(True, W)`` when the matmul's rhs is ``permute_dims(W)`` that swaps the last two
    axes (cuBLAS reads ``W`` transposed: ``transa = T``), else ``(False, rhs)``."""
    rhs_val = values.get(rhs)
    if isinstance(rhs_val, relax.Call) and isinstance(rhs_val.op, tvm.ir.Op) and rhs_val.op.name == "relax.permute_dims":
        src = rhs_val.args[0]
        rank = len(_shape(src.ty))
        axes = rhs_val.attrs.axes
        perm = [int(a) % rank for a in axes] if axes is not None else list(reversed(range(rank)))
        if perm == list(range(rank - 2)) + [rank - 1, rank - 2]:
            return True, src
        raise BuildError(f"cuBLAS: permute_dims{perm} is not a transpose of the last two axes")
    return False, rhs


def _gemm_sizes(lhs, rhs, transposed: bool) -> tuple[int, int, int, int]:
    """``(M, N, K, batch)`` of the row-major product ``lhs @ rhs`` (``rhs`` read transposed
    when ``transposed``), an lhs batch folded into ``M`` when the rhs is shared by every batch."""
    ls, rs = _shape(lhs.ty), _shape(rhs.ty)
    if len(ls) < 2 or len(rs) < 2:
        raise BuildError("cuBLAS: 1-d matmul operands are not supported")
    M, K = ls[-2], ls[-1]
    N = rs[-2] if transposed else rs[-1]
    if (rs[-1] if transposed else rs[-2]) != K:
        raise BuildError(f"cuBLAS: reduction sizes differ ({ls} x {rs})")
    lb, rb = int(np.prod(ls[:-2], dtype=np.int64)), int(np.prod(rs[:-2], dtype=np.int64))
    if rb == 1:
        # rhs shared by every batch: fold the lhs batch into M (one plain GEMM)
        return M * lb, N, K, 1
    if lb == rb:
        return M, N, K, lb
    raise BuildError(f"cuBLAS: batch sizes {lb} and {rb} differ (broadcast batch matmul is not supported)")


def _epilogue(calls: list, mm: relax.Call, N: int, params: list, values: dict) -> tuple[str, Operand | None]:
    """The cuBLASLt epilogue of the calls after the matmul (a key of :data:`EPILOGUES`) and
    its bias operand (a vector of ``N`` values), None without a bias."""
    epi, bias = "none", None
    cur = None
    for var, c in calls:
        if c.same_as(mm):
            cur = var
            continue
        if cur is None or not isinstance(c.op, tvm.ir.Op):
            continue
        name = c.op.name
        if name == "relax.add" and any(a.same_as(cur) for a in c.args) and epi == "none":
            other = c.args[1] if c.args[0].same_as(cur) else c.args[0]
            bshape = _shape(other.ty)
            if int(np.prod(bshape[:-1], dtype=np.int64)) != 1 or bshape[-1] != N:
                raise BuildError(f"cuBLAS bias must be a vector of {N} values, got shape {bshape}")
            bias = _source(other, params, "bias", values)
            if bias.const is not None:
                bias.const = np.ascontiguousarray(bias.const.reshape(N))
            epi, cur = "bias", var
        elif name in ("relax.nn.relu", "relax.nn.gelu") and c.args[0].same_as(cur):
            act = "relu" if name.endswith("relu") else "gelu"
            epi = act if epi == "none" else f"{act}_bias"
            cur = var
    if epi in ("relu", "gelu"):
        raise BuildError("cuBLAS: an activation without bias is not one of TVM's cublas patterns")
    return epi, bias


def _col_major(flat: np.ndarray, offset: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """The rows x cols column-major matrix at ``flat[offset:]`` with leading dimension ld."""
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat[offset:], shape=(rows, cols), strides=(item, ld * item))


def emulate_gemm(plan: GemmPlan, args: list[np.ndarray]) -> np.ndarray:
    """Run ``plan`` in NumPy exactly as cuBLASLt reads and writes memory.

    Parameters
    ----------
    plan : GemmPlan
    args : list of numpy.ndarray
        The function's parameters, in order.

    Returns
    -------
    numpy.ndarray of shape ``plan.out_shape``.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm import relax
    >>> w = np.arange(24, dtype="float32").reshape(8, 3)
    >>> x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    >>> bb = relax.BlockBuilder()
    >>> with bb.function("main", [x]):
    ...     with bb.dataflow():
    ...         out = bb.emit_output(relax.op.matmul(x, relax.const(w)))
    ...     _ = bb.emit_func_output(out)
    >>> a = np.ones((4, 8), "float32")
    >>> out = emulate_gemm(plan_gemm(bb.get()["main"]), [a])
    >>> out.shape, np.allclose(out, a @ w)
    ((4, 3), True)
    """
    A = np.ascontiguousarray(plan.a.value(args)).reshape(-1).astype(np.float64)
    B = np.ascontiguousarray(plan.b.value(args)).reshape(-1).astype(np.float64)
    C = np.zeros(plan.m * plan.n * plan.batch, dtype=np.float64)
    a_rows, a_cols = (plan.m, plan.k) if plan.transa == "N" else (plan.k, plan.m)
    b_rows, b_cols = (plan.k, plan.n) if plan.transb == "N" else (plan.n, plan.k)
    bias = None
    if plan.bias is not None:
        bias = np.asarray(plan.bias.value(args), dtype=np.float64).reshape(plan.m)
    for i in range(plan.batch):
        a = _col_major(A, i * plan.stride_a, a_rows, a_cols, plan.lda)
        b = _col_major(B, i * plan.stride_b, b_rows, b_cols, plan.ldb)
        opa = a if plan.transa == "N" else a.T
        opb = b if plan.transb == "N" else b.T
        d = opa @ opb
        if bias is not None:
            d = d + bias[:, None]
        if plan.epilogue.startswith("relu"):
            d = np.maximum(d, 0.0)
        elif plan.epilogue.startswith("gelu"):
            d = 0.5 * d * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (d + 0.044715 * d ** 3)))
        c = _col_major(C, i * plan.stride_c, plan.m, plan.n, plan.ldc)
        c[...] = d
    return C.astype(plan.dtype if plan.dtype != "bfloat16" else "float32").reshape(plan.out_shape)


# -- the library -------------------------------------------------------------------------
class _Lt:
    """Lazily loaded cuBLASLt with one handle per device."""

    _inst = None
    _lock = threading.Lock()

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.handles: dict[int, ctypes.c_void_p] = {}
        c_vp, c_sz = ctypes.c_void_p, ctypes.c_size_t
        self.lib.cublasLtMatmul.argtypes = [c_vp, c_vp, c_vp, c_vp, c_vp, c_vp, c_vp, c_vp, c_vp, c_vp,
                                            c_vp, c_vp, c_vp, c_vp, c_sz, c_vp]
        self.lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(c_vp), ctypes.c_int, ctypes.c_uint64,
                                                        ctypes.c_uint64, ctypes.c_int64]
        self.lib.cublasLtMatmulDescSetAttribute.argtypes = [c_vp, ctypes.c_int, c_vp, c_sz]
        self.lib.cublasLtMatrixLayoutSetAttribute.argtypes = [c_vp, ctypes.c_int, c_vp, c_sz]

    @classmethod
    def get(cls) -> "_Lt":
        with cls._lock:
            if cls._inst is None:
                path, why = probe.find_library("cublasLt")
                if path is None:
                    raise BuildError(why)
                cls._inst = cls(path)
            return cls._inst

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise BuildError(f"cuBLASLt {what} failed with status {rc}")

    def handle(self, device_index: int) -> ctypes.c_void_p:
        if device_index not in self.handles:
            tvm.cuda(device_index).sync()  # makes the device current for this thread
            h = ctypes.c_void_p()
            self.check(self.lib.cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
            self.handles[device_index] = h
        return self.handles[device_index]

    def layout(self, dtype: int, rows: int, cols: int, ld: int, batch: int, stride: int) -> ctypes.c_void_p:
        lay = ctypes.c_void_p()
        self.check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype, rows, cols, ld), "layout")
        if batch > 1:
            cnt, st = ctypes.c_int32(batch), ctypes.c_int64(stride)
            self.check(self.lib.cublasLtMatrixLayoutSetAttribute(lay, _LAYOUT_BATCH_COUNT, ctypes.byref(cnt), 4),
                       "batch count")
            self.check(self.lib.cublasLtMatrixLayoutSetAttribute(
                lay, _LAYOUT_STRIDED_BATCH_OFFSET, ctypes.byref(st), 8), "batch stride")
        return lay


def _as_int(handle) -> int:
    """A raw pointer returned by a TVM global (int, ctypes pointer or None) as an int."""
    if handle is None:
        return 0
    v = getattr(handle, "value", handle)
    return int(v or 0)


def _ptr(t) -> int:
    return int(t.data_ptr()) if callable(getattr(t, "data_ptr", None)) else int(t.data_ptr)


class CublasBackend(Backend):
    """cuBLASLt GEMMs for TVM's ``cublas.*`` patterns, on a CUDA device."""

    name = "cublas"
    device_kinds = ("gpu",)
    graph_level = False
    max_ops = 4
    #: allow TF32 tensor cores for float32 (faster, ~1e-3 relative error)
    allow_tf32 = False
    workspace_bytes = 32 << 20

    def patterns(self) -> list:
        return backend_patterns("cublas")

    def supports_op(self, call) -> bool:
        return isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name in (
            "relax.matmul", "relax.permute_dims", "relax.add", "relax.nn.relu", "relax.nn.gelu")

    def available(self) -> tuple[bool, str]:
        return probe.combine(probe.tvm_cuda_runtime(), probe.library("cublasLt"))

    def global_name(self, key: str, device) -> str:
        return f"pesto.{self.name}.{key}.gpu{getattr(device, 'index', 0)}"

    def make_callable(self, func: relax.Function, device) -> Callable:
        plan = plan_gemm(func)
        lt = _Lt.get()
        idx = int(getattr(device, "index", 0))
        dev = tvm.cuda(idx)
        handle = lt.handle(idx)
        consts = {}
        for name in ("a", "b", "bias"):
            op = getattr(plan, name)
            if op is not None and op.const is not None:
                consts[name] = tvm.runtime.tensor(np.ascontiguousarray(op.const), device=dev)
        dt = _CUDA_DTYPE[plan.dtype]
        compute = _COMPUTE_32F_FAST_TF32 if (self.allow_tf32 and plan.dtype == "float32") else _COMPUTE_32F
        desc = ctypes.c_void_p()
        lt.check(lt.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), compute, 0), "matmul desc")
        for attr, val in ((_DESC_TRANSA, _OP[plan.transa]), (_DESC_TRANSB, _OP[plan.transb]),
                          (_DESC_EPILOGUE, EPILOGUES[plan.epilogue])):
            v = ctypes.c_int32(val)
            lt.check(lt.lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(v), 4), "desc attribute")
        a_rows, a_cols = (plan.m, plan.k) if plan.transa == "N" else (plan.k, plan.m)
        la = lt.layout(dt, a_rows, a_cols, plan.lda, plan.batch, plan.stride_a)
        lb = lt.layout(dt, plan.k, plan.n, plan.ldb, plan.batch, plan.stride_b)
        lc = lt.layout(dt, plan.m, plan.n, plan.ldc, plan.batch, plan.stride_c)
        workspace = tvm.runtime.empty((self.workspace_bytes,), "uint8", dev)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        get_stream = tvm.get_global_func("runtime.get_cuda_stream")
        n_in = len(func.params)
        keep = (desc, la, lb, lc, workspace, consts)  # alive as long as the callable

        def run(*args):
            inputs, out = args[:n_in], args[n_in]
            a = consts["a"] if "a" in consts else plan.a.value(inputs)
            b = consts["b"] if "b" in consts else plan.b.value(inputs)
            if plan.bias is not None:
                bias = consts["bias"] if "bias" in consts else plan.bias.value(inputs)
                p = ctypes.c_void_p(_ptr(bias))
                lt.check(lt.lib.cublasLtMatmulDescSetAttribute(desc, _DESC_BIAS_POINTER, ctypes.byref(p), 8),
                         "bias pointer")
            stream = _as_int(get_stream())
            lt.check(lt.lib.cublasLtMatmul(
                handle, desc, ctypes.byref(alpha), _ptr(a), la, _ptr(b), lb, ctypes.byref(beta),
                _ptr(out), lc, _ptr(out), lc, None, _ptr(workspace), self.workspace_bytes,
                ctypes.c_void_p(stream)), "cublasLtMatmul")
            _ = keep  # the closure holds the descriptors and buffers


        return run
