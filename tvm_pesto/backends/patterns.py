"""Patterns and their checks: :class:`MatchContext` (what a pattern's check function sees),
what a check raises when it cannot read a call (:data:`CHECK_READ_ERRORS`, a no), the standard checks (:func:`default_check`; :func:`region_check` for graph-level regions)
and the op-level fused chains the op-level backends share (:func:`op_level_patterns`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import tvm
from tvm import relax

from ..errors import BuildError
from .relax_calls import call_attrs, dtype_of, op_short_name, static_shape

#: What a check raises when it cannot read a call it was not written for: an attribute or
#: annotation the call lacks (AttributeError, KeyError), a symbolic value where a number is
#: read (TypeError, ValueError), fewer arguments than expected (IndexError), a dynamic shape
#: (:class:`~tvm_pesto.errors.BuildError` from ``static_shape``). The check says no.
CHECK_READ_ERRORS = (AttributeError, KeyError, IndexError, TypeError, ValueError, BuildError)


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


CheckFn = Callable[[MatchContext], bool]
PatternEntry = tuple  # (pattern_name: str, pattern: DFPattern, check: CheckFn | None)


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
#: select, and the selecting reductions max and min): what an importer writes around a gather
#: (``where(idx < 0, idx + n, idx)``), and torch's safe softmax in every timm attention as TVM's
#: importer decomposes it (``any`` of a mask as ``max`` over int8); division is left out (ONNX
#: truncates, TVM floors)
INDEX_ARITHMETIC = frozenset({"add", "subtract", "multiply", "maximum", "minimum", "equal", "not_equal", "less",
                              "less_equal", "greater", "greater_equal", "where", "logical_and", "logical_or",
                              "logical_not", "max", "min"})


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
