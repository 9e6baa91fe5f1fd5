"""Cut a set of bindings out of a Relax function into a function of its own.

Used to build one per-device segment (:mod:`tvm_pesto.builder.rewrite`); a candidate or fused
group is measured as :func:`tvm_pesto.candidates.candidate_function` cuts it (tensor
parameters only), and keyed by :func:`structural_key`. It sits with the graph it cuts, so
that candidates, backends and costs use it without importing the builder.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .relax_import import RelaxGraph


@mutator
class Remap(PyExprMutator):
    """Replace variables by new ones; optionally turn constants into parameters, or into
    whatever ``on_constant(const)`` returns (e.g. a copy to another device)."""

    def __init__(self, var_map, lift_constants=False, on_constant=None):
        super().__init__()
        self.var_map = var_map
        self.lift_constants = lift_constants
        self.on_constant = on_constant
        self.lifted: list = []

    def visit_var_(self, op):
        return self.var_map.get(op, op)

    def visit_dataflow_var_(self, op):
        return self.var_map.get(op, op)

    def visit_generic_const_(self, op):
        if self.on_constant is not None and isinstance(op.ty, relax.TensorType):
            return self.on_constant(op)
        if not self.lift_constants or not isinstance(op.ty, relax.TensorType):
            return op
        p = relax.Var(f"c{len(self.lifted)}", op.ty)
        self.lifted.append((p, op))
        return p


@dataclass
class Segment:
    """A function cut from ``main``: its inputs and outputs as the original variables."""

    func: relax.Function
    inputs: list  # original Vars (free variables of the cut), in parameter order
    outputs: list  # original Vars it returns, in order
    lifted_constants: list  # tvm.ir.Constant values for trailing params (lift_constants=True)


def _used_vars(expr) -> list:
    return list(relax.analysis.free_vars(expr))


def cut_function(rg: RelaxGraph, binding_ids, outputs, lift_constants: bool = False,
                 name: str = "main", vdevice=None, move_to_vdevice: bool = False) -> Segment:
    """Make a Relax function that computes ``outputs`` from the bindings ``binding_ids``.

    Bindings that only alias values (tuples, ``TupleGetItem``, variable copies, constants,
    shapes) that the cut needs are pulled in too. Free variables become parameters.
    ``vdevice`` and ``move_to_vdevice`` are :func:`emit_function`'s.
    """
    bindings = rg.bindings
    var_idx = {b.var: k for k, b in enumerate(bindings)}
    include = set(int(i) for i in binding_ids)

    def pull(variables) -> None:
        """Include the non-call bindings (aliases, tuples, constants) these variables need."""
        stack = list(variables)
        while stack:
            j = var_idx.get(stack.pop())
            if j is not None and j not in include and not isinstance(bindings[j].value, relax.Call):
                include.add(j)
                stack.extend(_used_vars(bindings[j].value))

    pull([v for k in sorted(include) for v in _used_vars(bindings[k].value)])
    pull(outputs)
    order = sorted(include)
    defined = {bindings[k].var for k in order}
    free: list = []
    seen = set()
    for k in order:
        for v in _used_vars(bindings[k].value):
            if v not in defined and v not in seen:
                seen.add(v)
                free.append(v)
    for v in outputs:
        if v not in defined and v not in seen:
            seen.add(v)
            free.append(v)
    return emit_function(bindings, order, free, outputs, lift_constants, name, vdevice, move_to_vdevice)


def with_vdevice(ty, vdevice):
    """``ty`` with every tensor in it placed on ``vdevice`` (tuples field by field)."""
    if isinstance(ty, relax.TensorType):
        return relax.TensorType(ty.shape, ty.dtype, vdevice)
    if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)):
        return relax.TupleType([with_vdevice(f, vdevice) for f in ty.fields])
    return ty


def same_vdevice(a, b) -> bool:
    """Whether two ``relax.VDevice`` (or None) name the same device (``VDevice.same_as``
    recurses forever in TVM 0.27: compare id, scope and target)."""
    if a is None or b is None:
        return a is None and b is None
    return (int(a.vdevice_id) == int(b.vdevice_id) and str(a.memory_scope) == str(b.memory_scope)
            and str(a.target) == str(b.target))


def on_vdevice(ty, vdevice) -> bool:
    """Whether every tensor in ``ty`` is declared on ``vdevice`` (tuples field by field)."""
    if isinstance(ty, relax.TensorType):
        return same_vdevice(ty.vdevice, vdevice)
    if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)):
        return all(on_vdevice(f, vdevice) for f in ty.fields)
    return True


def move_to(bb: relax.BlockBuilder, value, vdevice, name: str):
    """Emit ``R.to_vdevice(value, vdevice)``; a tuple field by field (rebuilt as a tuple)."""
    ty = value.ty
    if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)):
        fields = []
        for k in range(len(ty.fields)):
            item = bb.emit(relax.TupleGetItem(value, k), name_hint=f"{name}_{k}")
            fields.append(move_to(bb, item, vdevice, f"{name}_{k}"))
        return bb.emit(relax.Tuple(fields), name_hint=name)
    return bb.emit(relax.op.to_vdevice(value, vdevice), name_hint=name)


def _extern_on(expr, vdevice):
    """An extern call (``R.call_dps_packed``) whose outputs are declared on ``vdevice``."""
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.call_dps_packed":
        return relax.Call(expr.op, expr.args, expr.attrs, [with_vdevice(t, vdevice) for t in expr.ty_args])
    return expr


def emit_function(bindings, order, free, outputs, lift_constants: bool = False, name: str = "main",
                  vdevice=None, move_to_vdevice: bool = False) -> Segment:
    """Build the function whose parameters are ``free``, whose body re-emits
    ``bindings[k]`` for ``k`` in ``order``, and which returns ``outputs``.

    Constants are lifted first (in binding order) so the parameter list is known before
    the function scope opens. With ``vdevice`` (a ``relax.VDevice``), every parameter and
    result is annotated to live there, as ``tvm.compile`` needs for multi-device modules; a
    result computed from constants alone is put there with ``R.to_vdevice``.

    TVM's VM keeps constants on its first device and allocates every value whose type names
    no device there too. ``move_to_vdevice`` (for a segment on another device) puts every
    value the segment reads or makes on ``vdevice``: each constant is copied there once per
    call (``R.to_vdevice``) before its first use, and so is the result of an op whose type
    names no device (an op that reads no tensor: ``arange``, ``zeros``, ``full``), so every
    operand of every op lives where the op runs.
    """
    var_map = {}
    params = []
    for v in free:
        p = relax.Var(v.name, v.ty if vdevice is None else with_vdevice(v.ty, vdevice))
        var_map[v] = p
        params.append(p)
    lifter = Remap({}, lift_constants=lift_constants)
    lifted_values = [lifter.visit_expr(bindings[k].value) for k in order]
    bb = relax.BlockBuilder()
    moved: dict = {}
    here = vdevice is not None and move_to_vdevice

    def move(const):
        key = const.__chandle__()  # the same constant object, however often it is visited
        if key not in moved:
            moved[key] = bb.emit(relax.op.to_vdevice(const, vdevice), name_hint=f"const{len(moved)}")
        return moved[key]

    with bb.function(name, params + [p for p, _ in lifter.lifted]):
        with bb.dataflow():
            for k, val in zip(order, lifted_values):
                old = bindings[k].var
                new = Remap(var_map, on_constant=move if here else None).visit_expr(val)
                if vdevice is not None:
                    new = _extern_on(new, vdevice)
                nv = bb.emit(new, name_hint=old.name)
                if here and not on_vdevice(nv.ty, vdevice):
                    nv = move_to(bb, nv, vdevice, f"{old.name}_here")
                var_map[old] = nv
            outs = [var_map[v] for v in outputs]
            if vdevice is not None:
                outs = [o if on_vdevice(o.ty, vdevice) else move_to(bb, o, vdevice, f"{o.name}_here") for o in outs]
            ret = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        bb.emit_func_output(ret)
    return Segment(bb.get()[name], list(free), list(outputs), [c for _, c in lifter.lifted])


def out_ty_of(func: relax.Function):
    """The ``out_ty`` of ``R.call_dps_packed`` for ``func``: its tensor type(s), without vdevice."""
    ty = func.body.body.ty
    if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)):
        return [relax.TensorType(f.shape, f.dtype) for f in ty.fields]
    return relax.TensorType(ty.shape, ty.dtype) if isinstance(ty, relax.TensorType) else ty


def structural_key(func: relax.Function) -> str:
    """A hex key of the function's structure (shapes, ops, attributes), not its names."""
    import tvm_ffi

    return f"{tvm_ffi.structural_hash(func, map_free_vars=True) & 0xFFFFFFFFFFFFFFFF:016x}"
