"""The interface every backend implements.

A backend runs some subgraphs of a Relax ``main`` function. It says which ones through
Relax dataflow patterns (``tvm.relax.dpl``) with optional ``_check_*`` predicates (as in
TVM's ``relax/backend/cuda/cudnn.py``), and builds a subgraph function into a tvm-ffi
global function that the lowered module calls with ``R.call_dps_packed``.

Calling convention of a built global function ``pesto.<backend>.<key>``::

    f(*inputs, *outputs) -> None

``inputs`` are the subgraph function's parameters in order (``tvm.runtime.Tensor``);
``outputs`` are preallocated tensors, one per tensor the function returns (a tuple result
is flattened), and ``f`` writes into them (DLPack, zero copy). Constants inside the
subgraph are captured by the built callable (weights, ONNX initializers), so equal-shaped
subgraphs with different weights get different global names.
"""
from __future__ import annotations

import abc
import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from ..errors import BuildError, PestoError
from ..graph.relax_import import attrs_dict
from ..run.loaders import direct_call, register_unit

#: Prefix of every global function a backend registers.
GLOBAL_PREFIX = "pesto"


class BackendUnavailableError(PestoError):
    """A backend's library is missing or unusable on this machine."""


@dataclass
class MatchContext:
    """What a pattern's check function sees (a small analogue of TVM's PatternCheckContext).

    Attributes
    ----------
    root : relax.Call
        The matched root call (the last op of the matched chain).
    calls : list of relax.Call
        Every matched operator call, producers before consumers.
    annotated_expr : dict
        Short op name (``"conv2d"``, ``"matmul"``, ``"add"``...) -> the first matched call
        of that op, so predicates read ``ctx.annotated_expr["conv2d"].attrs``.
    matched : dict
        The raw ``DFPattern -> Expr`` map from :func:`tvm.relax.dpl.DFPattern.extract_matched_expr`.
    """

    root: relax.Call
    calls: list
    annotated_expr: dict
    matched: dict = field(default_factory=dict)


@dataclass(frozen=True)
class BuiltUnit:
    """One subgraph a backend built: what :meth:`Backend.build` registered, and from what.

    Holding it keeps the callable (its library session, weights and threads) alive, and
    :meth:`Backend.artifact` exports it, after :meth:`Backend.release` (or
    :func:`~tvm_pesto.backends.release_all`) has dropped the backend's own reference and
    unregistered the name: a placed model keeps the units it was built with this way.

    Attributes
    ----------
    name : str
        The global function's name (``pesto.<backend>.<key>.c<cores>``).
    backend : str
        The backend's name.
    func : relax.Function
        The subgraph function it was built from.
    device : Device
        The device it was built for.
    fn : callable
        The callable registered under ``name``.
    build_s : float
        Seconds the backend took to make ``fn`` (compiling the subgraph in its library).
    """

    name: str
    backend: str
    func: relax.Function
    device: object
    fn: Callable
    build_s: float = 0.0


CheckFn = Callable[[MatchContext], bool]
PatternEntry = tuple  # (pattern_name: str, pattern: DFPattern, check: CheckFn | None)


class Backend(abc.ABC):
    """A library that can run subgraphs of a Relax function.

    Subclasses set ``name`` and ``device_kinds`` and implement :meth:`patterns`,
    :meth:`available` and :meth:`make_callable` (:meth:`build` registers it).
    ``graph_level`` backends (ONNX Runtime) are also offered every convex region of ops
    they support (:meth:`supports_op`) and windows of it; ``tvm_groups`` backends are
    offered TVM's fusion groups; ``max_ops`` bounds the depth of fused pattern chains.

    Examples
    --------
    >>> from tvm_pesto.backends import get_backend
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> from tvm_pesto.cluster import parse_cluster
    >>> func, device = tiny_mlp()[0]["main"], parse_cluster("cpu:1").devices[0]
    >>> bk = get_backend("torch")
    >>> ok, why = bk.available()
    >>> gname = bk.build(func, device)
    >>> ok, gname
    (True, 'pesto.torch...')
    >>> # then: relax.call_dps_packed(gname, args, out_ty)
    """

    name: str = ""
    device_kinds: tuple[str, ...] = ("cpu",)
    graph_level: bool = False
    max_ops: int = 4
    #: candidates stay as Relax ops in the placed module (only the ``tvm`` backend)
    native: bool = False
    #: candidates are TVM's fusion groups, their sub-chains and single ops (TVM variants)
    tvm_groups: bool = False
    #: bump when the backend's converters change: cached "cannot build" marks of another
    #: version are retried
    version: str = "2"
    #: a backend the cost model stands in for this one until it is trained on it (the ``xgb``
    #: source predicts its candidates as that backend's; None: the roofline estimate)
    cost_proxy: str | None = None
    #: its units have a call on numpy arrays (:meth:`direct_call`), which a program that is one
    #: unit of it runs instead of the VM; a candidate of the whole model is timed as that call
    direct: bool = False

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._built: dict[str, BuiltUnit] = {}  # global name -> what was built under it

    # -- what it accepts -------------------------------------------------------------
    @abc.abstractmethod
    def patterns(self) -> list[PatternEntry]:
        """``[(pattern_name, dpl pattern, check fn or None), ...]``, longest first."""

    def supports_op(self, call: relax.Call) -> bool:
        """Whether a single call can be part of a graph-level subgraph (graph_level only)."""
        return False

    def supports_device(self, device) -> bool:
        return getattr(device, "kind", "cpu") in self.device_kinds

    # -- can it run here --------------------------------------------------------------
    @abc.abstractmethod
    def available(self) -> tuple[bool, str]:
        """``(True, "")`` or ``(False, reason)``; never raises."""

    def require(self) -> None:
        ok, why = self.available()
        if not ok:
            raise BackendUnavailableError(f"backend {self.name!r} is unavailable: {why}")

    # -- build ------------------------------------------------------------------------
    def global_name(self, key: str, device) -> str:
        """The registered name for instance ``key`` built for ``device``. CPU callables use
        the device's core count (not its core ids), so the name carries ``c<cores>`` and CPU
        devices of one size share a build; GPU backends should add the device index."""
        return f"{GLOBAL_PREFIX}.{self.name}.{key}.c{device_cores(device)}"

    @abc.abstractmethod
    def make_callable(self, func: relax.Function, device) -> Callable:
        """A Python callable ``f(*inputs, *outputs)`` that computes ``func`` into ``outputs``."""

    def build(self, func: relax.Function, device, key: str | None = None) -> str:
        """Register ``func`` as a tvm-ffi global function and return its name.

        ``key`` names the instance (default: a hash of the function including constant
        values). Building the same key twice returns the existing name.

        Raises
        ------
        BuildError
            When the backend cannot build this subgraph (the search marks it infeasible).
        """
        self.require()
        if not self.supports_device(device):
            raise BuildError(f"backend {self.name!r} runs on {', '.join(self.device_kinds)} devices, not on "
                             f"{getattr(device, 'name', device)!r}; choose another backend for it")
        if key is None:
            key = instance_key(func)
        gname = self.global_name(key, device)
        with self._lock:
            if gname in self._built:
                return gname
        t0 = time.perf_counter()
        try:
            fn = self.make_callable(func, device)
        except BuildError as e:
            raise BuildError(f"backend {self.name!r} cannot build this subgraph: {e}; it stays on another "
                             "backend") from e
        except PestoError:
            raise
        except Exception as e:  # noqa: BLE001 - any library error means "cannot build this one"
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise BuildError(f"backend {self.name!r} cannot build this subgraph: {type(e).__name__}: "
                             f"{msg[:300]}; it stays on another backend") from e
        register_unit(gname, fn)
        with self._lock:
            self._built[gname] = BuiltUnit(gname, self.name, func, device, fn, time.perf_counter() - t0)
        return gname

    def built(self, gname: str) -> BuiltUnit:
        """What this backend built as ``gname`` (and has not released since).

        Raises
        ------
        BuildError
            When it did not build ``gname`` in this process, or released it since.
        """
        with self._lock:
            hit = self._built.get(gname)
        if hit is None:
            raise BuildError(f"backend {self.name!r} did not build {gname!r} in this process (or released it "
                             "since: release_all()); build the placed model again")
        return hit

    def direct_call(self, gname: str):
        """Unit ``gname``'s call on numpy arrays, ``f(*arrays) -> list of arrays``, which a
        program that is this one unit runs instead of the VM; None when its library has none."""
        return direct_call(gname)

    # -- deploy -----------------------------------------------------------------------
    def export_artifact(self, func: relax.Function, device, out_dir: str, stem: str) -> dict:
        """Write what runs ``func`` without TVM's compiler into ``out_dir`` (files named
        ``stem.*``) and return its description: ``{"kind": ..., "files": [...], ...}``.

        ``kind`` names the loader in :mod:`tvm_pesto.run.loaders` that turns the files
        back into the calling convention above. The default says the backend cannot.

        Raises
        ------
        BuildError
            When the backend has no deployable form.
        """
        raise BuildError(f"backend {self.name!r} cannot export its subgraphs for deployment yet; build the "
                         "model with backends that can (tvm, onnxruntime, torch, tvm-ms)")

    def artifact(self, unit: BuiltUnit | str, out_dir: str, stem: str) -> dict:
        """:meth:`export_artifact` for a unit this backend built: a :class:`BuiltUnit` (kept
        by its holder, whatever was released since), or its global name (looked up with
        :meth:`built`).

        Raises
        ------
        BuildError
            When ``unit`` is a name this backend does not hold, or another backend's unit.
        """
        if isinstance(unit, str):
            unit = self.built(unit)
        if unit.backend != self.name:
            raise BuildError(f"{unit.name!r} was built by backend {unit.backend!r}, not {self.name!r}; export it "
                             f"with get_backend({unit.backend!r})")
        meta = self.export_artifact(unit.func, unit.device, out_dir, stem)
        meta.update(name=unit.name, backend=self.name, num_inputs=len(unit.func.params),
                    num_outputs=len(output_types(unit.func)), cores=device_cores(unit.device))
        return meta

    def release(self) -> int:
        """Unregister every global function this backend built and drop its references to
        them (their sessions, weights and worker threads are freed once no one else holds
        them: a placed model keeps the :class:`BuiltUnit` of each of its units). Returns how
        many were removed."""
        import tvm_ffi

        with self._lock:
            names = list(self._built)
            self._built.clear()
        for n in names:
            try:
                tvm_ffi.remove_global_func(n)
            except Exception:  # noqa: BLE001 - already gone
                pass
        return len(names)


def instance_key(func: relax.Function) -> str:
    """A hex key of ``func`` including its constants' values (so weights are told apart)."""
    import tvm_ffi

    h = tvm_ffi.structural_hash(func, map_free_vars=True) & 0xFFFFFFFFFFFFFFFF
    consts = []

    def visit(e):
        if isinstance(e, tvm.ir.Constant):
            consts.append(e)

    relax.analysis.post_order_visit(func.body, visit)
    if consts:  # structural hashing does not look at tensor contents: fold them in
        m = hashlib.blake2b(digest_size=8)
        m.update(h.to_bytes(8, "little"))
        for c in consts:
            v = c.value
            m.update(np.ascontiguousarray(v.numpy()).tobytes() if hasattr(v, "numpy") else repr(v).encode())
        return m.hexdigest()
    return f"{h:016x}"


def device_cores(device) -> int:
    """Threads a CPU library call should use on ``device``: its core count (at least 1);
    the calling thread's affinity when the device does not say."""
    cores = getattr(device, "cores", None)
    return max(1, int(cores)) if cores else calling_thread_cores()


def calling_thread_cores() -> int:
    """How many cores the calling thread may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


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


# -- reading Relax calls ------------------------------------------------------------------
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


# -- patterns shared by op-level backends --------------------------------------------------
ACTIVATIONS = ("nn.relu", "nn.gelu", "nn.gelu_tanh", "sigmoid", "tanh", "nn.silu", "clip")
ELEMENTWISE_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power")
ELEMENTWISE_UNARY = ("nn.relu", "nn.gelu", "nn.gelu_tanh", "sigmoid", "tanh", "nn.silu", "clip", "exp", "sqrt",
                     "rsqrt", "erf", "negative", "abs", "log")


def _check_float32(ctx: MatchContext) -> bool:
    """Every matched call computes float32 tensors."""
    return all(dtype_of(t) == "float32" for c in ctx.calls for t in _result_types(c))


def _check_conv2d(ctx: MatchContext) -> bool:
    """NCHW/OIHW 2-d convolution with float32 output."""
    c = ctx.annotated_expr.get("nn.conv2d")
    if c is None:
        return True
    a = call_attrs(c)
    return (a.get("data_layout") == "NCHW" and a.get("kernel_layout") == "OIHW"
            and a.get("out_layout") in ("NCHW", "", None) and len(static_shape(c.args[0].ty)) == 4)


def _check_pool(ctx: MatchContext) -> bool:
    for name in ("nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d"):
        c = ctx.annotated_expr.get(name)
        if c is not None:
            a = call_attrs(c)
            if a.get("layout", "NCHW") != "NCHW" or a.get("out_layout", "NCHW") not in ("NCHW", "", None):
                return False
    return True


def _check_layer_norm(ctx: MatchContext) -> bool:
    """Normalised axes are the trailing ones (what torch/ONNX layer norm computes)."""
    c = ctx.annotated_expr.get("nn.layer_norm")
    if c is None:
        return True
    rank = len(static_shape(c.args[0].ty))
    axes = sorted(int(a) % rank for a in call_attrs(c).get("axes", ()))
    return bool(axes) and axes == list(range(rank - len(axes), rank))


def _check_batch_norm(ctx: MatchContext) -> bool:
    c = ctx.annotated_expr.get("nn.batch_norm")
    return c is None or (int(call_attrs(c).get("axis", 1)) == 1 and not call_attrs(c).get("training", False))


def _check_layouts(ctx: MatchContext) -> bool:
    return _check_conv2d(ctx) and _check_pool(ctx) and _check_layer_norm(ctx) and _check_batch_norm(ctx)


def default_check(ctx: MatchContext) -> bool:
    """All standard predicates together."""
    return _check_float32(ctx) and _check_layouts(ctx)


#: ops that only move, select or convert values: a graph-level library runs them on any tensor
#: type its converter accepts (token ids), not only float32
DATA_MOVEMENT = frozenset({"astype", "reshape", "permute_dims", "expand_dims", "squeeze", "flatten",
                           "strided_slice", "concat", "broadcast_to", "take", "split"})
#: index arithmetic whose integer result is the same in every library (wrap-around add, compare,
#: select): what an importer writes around a gather (``where(idx < 0, idx + n, idx)``); division
#: is left out (ONNX truncates, TVM floors)
INDEX_ARITHMETIC = frozenset({"add", "subtract", "multiply", "maximum", "minimum", "equal", "not_equal", "less",
                              "less_equal", "greater", "greater_equal", "where", "logical_and", "logical_or",
                              "logical_not"})


def region_check(ctx: MatchContext) -> bool:
    """The standard predicates for one call of a graph-level region (``ctx.calls`` is that call).

    Floating-point arithmetic must be float32, as in :func:`default_check`; a
    :data:`DATA_MOVEMENT` op may carry any dtype, and :data:`INDEX_ARITHMETIC` integer or
    boolean ones, which the backend's ``supports_op`` has accepted. A model on integer inputs
    (token ids normalized, cast and reshaped before an embedding) can so run as one region.
    """
    for c in ctx.calls:
        name = op_short_name(c)
        dtypes = {dtype_of(t) for t in _result_types(c)}
        if dtypes == {"float32"} or name in DATA_MOVEMENT:
            continue
        if name in INDEX_ARITHMETIC and all(d == "bool" or d.startswith(("int", "uint")) for d in dtypes):
            continue
        return False
    return _check_layouts(ctx)


def _result_types(call) -> list:
    ty = call.ty
    return list(ty.fields) if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)) else [ty]


def op_level_patterns(prefix: str, ops: set[str], max_depth: int = 4) -> list[PatternEntry]:
    """Op-level fused chains (conv2d/matmul with bias, batch norm, residual add and an
    activation, up to ``max_depth`` ops) and one single-op pattern per supported op.

    Longest patterns first. Only ops in ``ops`` (short names) are used.
    """
    from tvm.relax.dpl import is_const, is_op, is_tuple_get_item, wildcard

    def op(name, *args, varg=False):
        return is_op(f"relax.{name}")(*args, varg_default_wildcard=varg)

    def const_like():
        return is_const() | op("reshape", is_const(), wildcard()) | op("permute_dims", is_const())

    def add_either(x, other):
        return op("add", x, other) | op("add", other, x)

    acts = [a for a in ACTIVATIONS if a in ops]
    out: list[tuple[int, str, object]] = []

    def act_of(name, x):
        if name == "clip":
            return op("clip", x, wildcard(), wildcard())
        return op(name, x)

    def chains(anchor_name, anchor):
        # stages: bias add (const), batch norm, residual add (any tensor), activation
        res = [(1, anchor_name, anchor)]
        frontier = [(1, anchor_name, anchor, 0)]
        for stage in range(4):
            new = []
            for depth, name, pat, last in frontier:
                if depth >= max_depth:
                    continue
                if stage == 0 and "add" in ops:
                    new.append((depth + 1, name + "_bias", add_either(pat, const_like()), 0))
                if stage == 1 and "nn.batch_norm" in ops and anchor_name == "conv2d":
                    bn = op("nn.batch_norm", pat, is_const(), is_const(), is_const(), is_const())
                    new.append((depth + 1, name + "_bn", is_tuple_get_item(bn, 0), 1))
                if stage == 2 and "add" in ops and anchor_name == "conv2d":
                    new.append((depth + 1, name + "_add", add_either(pat, wildcard()), 2))
                if stage == 3:
                    for a in acts:
                        new.append((depth + 1, f"{name}_{a.split('.')[-1]}", act_of(a, pat), 3))
            res.extend((d, n, p) for d, n, p, _ in new)
            frontier = frontier + new
        return res

    if "nn.conv2d" in ops:
        out.extend(chains("conv2d", op("nn.conv2d", wildcard(), wildcard())))
    if "matmul" in ops:
        out.extend(chains("matmul", op("matmul", wildcard(), wildcard())))
    singles = sorted(o for o in ops if o not in ("nn.conv2d", "matmul"))
    for name in singles:
        if name == "nn.batch_norm":
            bn = op("nn.batch_norm", wildcard(), is_const(), is_const(), is_const(), is_const())
            out.append((2, "batch_norm", is_tuple_get_item(bn, 0)))
            for a in acts:
                out.append((3, f"batch_norm_{a.split('.')[-1]}", act_of(a, is_tuple_get_item(bn, 0))))
            continue
        if name in ELEMENTWISE_BINARY:
            out.append((1, name, op(name, wildcard(), wildcard())))
            if name == "add":
                for a in acts:
                    out.append((2, f"add_{a.split('.')[-1]}", act_of(a, op("add", wildcard(), wildcard()))))
            continue
        out.append((1, name.split(".")[-1], op(name, wildcard(), varg=True)))
    out = [o for o in out if o[0] <= max_depth]
    out.sort(key=lambda t: -t[0])
    seen = set()
    entries = []
    for _, name, pat in out:
        if name in seen:
            continue
        seen.add(name)
        entries.append((f"{prefix}.{name}", pat, default_check))
    return entries
