"""Build an :class:`OpGraph` from a Relax function.

One node per operator call bound in ``main`` (high-level ops, ``call_tir``,
``call_dps_packed``, calls to other functions); tuples, ``TupleGetItem`` and variable
aliases are not nodes, their dependencies are followed through. Constants and bound
parameters count as the consuming node's weights (a weight parameter of ``main``, after
its ``num_input`` data inputs, once: at its first reader). Graph inputs are not nodes.

Calls on constants alone (a weight's transpose, a bias reshaped, a packed weight split and
its parts transposed) are folded first, as TVM's build pipeline folds them (and, for the
split's parts, further): they cost nothing when the model runs, so they are not work to
place or to measure.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from ..errors import GraphError, UnsupportedModuleError, error_line
from .canonical import canonicalize
from .flops import op_flops
from .fold import fold_layout_constants
from .opgraph import OpGraph, OpNode, TensorSpec


def _static_shape(ty, what: str) -> tuple[int, ...]:
    shape = ty.shape
    if shape is None:
        raise UnsupportedModuleError(f"{what} has unknown rank/shape; tvm-pesto needs static shapes "
                                     "(export the model with fixed input sizes)")
    vals = []
    for s in shape.values:
        if not isinstance(s, tvm.tirx.IntImm):
            raise UnsupportedModuleError(
                f"{what} has a dynamic dimension {s}; tvm-pesto places static graphs only — "
                "export the model with concrete input shapes (no torch.export Dim / symbolic vars), or give "
                "them when loading it (tvm_pesto.models.load_model(path, input_shapes=...), --input-shape "
                "NAME=D1,D2,...)")
        vals.append(int(s))
    return tuple(vals)


def tensor_specs(ty, what: str) -> list[TensorSpec]:
    """Flatten a Relax type into tensor specs (tuples give several)."""
    if isinstance(ty, relax.TensorType):
        return [TensorSpec(_static_shape(ty, what), str(ty.dtype))]
    if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)):
        out = []
        for k, f in enumerate(ty.fields):
            out.extend(tensor_specs(f, f"{what}[{k}]"))
        return out
    return []


def attrs_dict(attrs) -> dict:
    """Relax op attributes as a plain dict of Python values."""
    if attrs is None:
        return {}
    info = getattr(type(attrs), "__tvm_ffi_type_info__", None)
    out = {}
    for f in (info.fields if info is not None else []):
        v = getattr(attrs, f.name)
        if isinstance(v, (tuple, list, tvm.ir.Array)) or type(v).__name__ == "Array":
            try:
                v = tuple(int(x) for x in v)
            except (TypeError, ValueError):
                v = tuple(str(x) for x in v)
        elif v is not None and not isinstance(v, (int, float, str, bool)):
            v = str(v)
        out[f.name] = v
    return out


def _op_name(call: relax.Call) -> str:
    op = call.op
    if isinstance(op, tvm.ir.Op):
        if op.name == "relax.call_tir" and isinstance(call.args[0], relax.GlobalVar):
            return f"call_tir:{call.args[0].name_hint}"
        if op.name == "relax.call_dps_packed":
            return f"extern:{getattr(call.args[0], 'global_symbol', call.args[0])}"
        return op.name
    if isinstance(op, relax.GlobalVar):
        return f"call:{op.name_hint}"
    if isinstance(op, relax.ExternFunc):
        return f"extern:{op.global_symbol}"
    return "call:?"


@dataclass
class RelaxGraph:
    """An op graph with the Relax bindings it came from.

    ``bindings`` lists every binding of ``main`` in program order; ``node_binding[i]`` is
    the index of node ``i``'s binding. ``inputs`` are the data parameters of ``main``.
    """

    graph: OpGraph
    func: relax.Function
    bindings: list
    node_binding: list[int]
    inputs: list
    weight_params: list = field(default_factory=list)
    output: object = None
    mod: object = None


def _bindings(mod: tvm.IRModule) -> int:
    """How many bindings the module's Relax functions hold (a fold removes the ones it folds)."""
    return sum(len(b.bindings) for f in mod.functions.values() if isinstance(f, relax.Function)
               and isinstance(f.body, relax.SeqExpr) for b in f.body.blocks)


def fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every call on constants alone replaced by its value (Relax ``FoldConstant``,
    the pass TVM's default build pipeline runs), layout ops and splits first in NumPy
    (:func:`~tvm_pesto.graph.fold.fold_layout_constants`: ``FoldConstant``'s module without
    compiling a kernel per weight transpose, and with a split weight's transposed parts folded
    too, which ``FoldConstant`` leaves to run at every inference).

    Raises
    ------
    GraphError
        When TVM cannot evaluate such a call (the message carries TVM's first line).
    """
    try:
        folded = relax.transform.FoldConstant()(fold_layout_constants(mod))
        # FoldConstant makes new constants (a mask from zeros) that NumPy folds further (its running
        # sum); once more only where that changed something
        again = fold_layout_constants(folded)
        return relax.transform.FoldConstant()(again) if _bindings(again) < _bindings(folded) else folded
    except Exception as e:  # TVM raises many types from deep inside; explain at our boundary
        raise GraphError(f"TVM could not fold the module's constant expressions ({error_line(e)}); check that the "
                         "module builds with tvm.compile, or pass the weights as parameters (num_input)") from e


def from_relax(mod: tvm.IRModule, func_name: str = "main", canonical: bool = True) -> RelaxGraph:
    """Extract the operator graph of ``mod[func_name]``, its constants folded
    (:func:`fold_constants`) and, with ``canonical``, in canonical form
    (:func:`~tvm_pesto.graph.canonical.canonicalize`: what an importer spelled out in many
    calls, said in one).

    Raises
    ------
    UnsupportedModuleError
        For dynamic shapes, control flow or ``match_cast`` in the function.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> rg = from_relax(tiny_mlp()[0])
    >>> rg.graph.num_nodes, rg.graph.nodes[0].op
    (12, 'relax.nn.layer_norm')
    """
    _check_module(mod, func_name)
    mod = fold_constants(mod)
    if canonical:
        mod = canonicalize(mod, func_name)
    func = mod[func_name]
    num_input = func.attrs["num_input"] if func.attrs is not None and "num_input" in func.attrs else None
    params = list(func.params)
    n_in = int(num_input) if num_input is not None else len(params)
    inputs, weight_params = params[:n_in], params[n_in:]
    for p in params:
        tensor_specs(p.ty, f"parameter {p.name!r}")  # raises on dynamic shapes
    weight_set = set(weight_params)
    body = func.body
    bindings = _plain_bindings(body, func_name)

    nodes: list[OpNode] = []
    node_binding: list[int] = []
    var_node: dict = {}  # Var -> node id (call bindings)
    alias: dict = {}  # Var -> bound value (Tuple / TupleGetItem / Var)
    edges: list[tuple[int, int, int]] = []
    weights_seen: set = set()

    def producers(expr, nbytes_hint=None):
        """[(node, bytes)] that ``expr`` depends on."""
        if isinstance(expr, relax.Var):
            if expr in var_node:
                nid = var_node[expr]
                return [(nid, nbytes_hint if nbytes_hint is not None else nodes[nid].bytes_written)]
            if expr in alias:
                return producers(alias[expr], nbytes_hint)
            return []
        if isinstance(expr, relax.Tuple):
            out = []
            for f in expr.fields:
                out.extend(producers(f))
            return out
        if isinstance(expr, relax.TupleGetItem):
            tup = expr.tuple_value
            nb = sum(t.nbytes for t in tensor_specs(expr.ty, "tuple item"))
            if isinstance(tup, relax.Var) and tup in alias and isinstance(alias[tup], relax.Tuple):
                return producers(alias[tup].fields[expr.index])
            return producers(tup, nb)
        return []

    for bi, b in enumerate(bindings):
        val = b.value
        if not isinstance(val, relax.Call):
            if isinstance(val, (relax.Tuple, relax.TupleGetItem, relax.Var)):
                alias[b.var] = val
            # constants, shapes and prim values bound to vars need no node
            continue
        nid = len(nodes)
        nodes.append(_op_node(b, weight_set, weights_seen))
        node_binding.append(bi)
        for a in val.args:
            for src, nb in producers(a):
                edges.append((src, nid, int(nb)))
        var_node[b.var] = nid
    if not nodes:
        raise UnsupportedModuleError(f"{func_name} has no operator calls; nothing to place")
    graph = OpGraph(nodes, edges, name=str(func_name))
    return RelaxGraph(graph, func, bindings, node_binding, inputs, weight_params, body.body, mod)


def _check_module(mod, func_name: str) -> None:
    """Raise a :class:`GraphError` unless ``mod[func_name]`` is a Relax function."""
    if not isinstance(mod, tvm.IRModule):
        raise GraphError(f"expected a tvm.IRModule, got {type(mod).__name__}; import a model with "
                         "tvm_pesto.frontend.from_torch or from_onnx first")
    names = [gv.name_hint for gv in mod.get_global_vars()]
    if not names:
        raise GraphError(f"the module is empty: it has no function {func_name!r} to place; give a module whose "
                         f"{func_name!r} is a Relax function (e.g. from tvm_pesto.frontend.from_torch or from_onnx)")
    if func_name not in names:
        others = sorted(names)
        raise GraphError(f"module has no function {func_name!r} (it has {others}); rename the function to place "
                         f"to {func_name!r} (tvm_pesto.analyze also takes func_name={others[0]!r})")
    if not isinstance(mod[func_name], relax.Function):
        raise GraphError(f"{func_name!r} is a {type(mod[func_name]).__name__}, not a Relax function; place a module "
                         f"whose {func_name!r} is a Relax function (a TIR PrimFunc is already lowered)")


def _plain_bindings(body, func_name: str) -> list:
    """The bindings of ``body``'s blocks, in order.

    Raises
    ------
    UnsupportedModuleError
        When the body has no blocks, or a binding is a ``match_cast`` or an ``If``.
    """
    if not isinstance(body, relax.SeqExpr):
        raise UnsupportedModuleError(f"{func_name} has no binding blocks; nothing to place")
    bindings = []
    for block in body.blocks:
        for b in block.bindings:
            if not isinstance(b, relax.VarBinding):
                raise UnsupportedModuleError(
                    f"binding of {b.var.name!r} is a {type(b).__name__}; tvm-pesto handles plain "
                    "bindings only (match_cast usually means dynamic shapes: export with static shapes)")
            if isinstance(b.value, relax.If):
                raise UnsupportedModuleError(f"{b.var.name!r} is bound to an If; control flow cannot be placed")
            bindings.append(b)
    return bindings


def _op_node(b, weight_set: set, weights_seen: set) -> OpNode:
    """The node of the call binding ``b``; a weight parameter counts in ``param_bytes`` of its
    first reader only (``weights_seen`` is updated)."""
    val = b.value
    op = _op_name(val)
    ins, params_bytes = [], 0
    arg_exprs = list(val.args)
    if op.startswith("call_tir:") or op.startswith("extern:"):
        arg_exprs = list(val.args[1].fields) if isinstance(val.args[1], relax.Tuple) else [val.args[1]]
    flat = []
    for a in arg_exprs:
        flat.extend(a.fields if isinstance(a, relax.Tuple) else [a])
    for a in flat:
        specs = tensor_specs(a.ty, f"argument of {b.var.name!r}") if hasattr(a, "ty") else []
        ins.extend(specs)
        weight = isinstance(a, relax.Var) and a in weight_set and a not in weights_seen
        if isinstance(a, tvm.ir.Constant) or weight:
            params_bytes += sum(t.nbytes for t in specs)
            if weight:
                weights_seen.add(a)  # a weight parameter counts once, at its first reader
    outs = tensor_specs(b.var.ty, f"result {b.var.name!r}")
    attrs = attrs_dict(val.attrs) if isinstance(val.op, tvm.ir.Op) else {}
    return OpNode(
        name=f"{b.var.name}:{op.split('.')[-1]}", op=op, attrs=attrs, inputs=tuple(ins),
        outputs=tuple(outs), flops=op_flops(op, attrs, ins, outs),
        bytes_read=int(sum(t.nbytes for t in ins)), bytes_written=int(sum(t.nbytes for t in outs)),
        param_bytes=int(params_bytes), extra={"var": b.var.name},
    )
