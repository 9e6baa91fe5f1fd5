"""Read a placed module (the rewrite's output) as per-device modules and a program.

:func:`split_by_device` gives one IRModule per device holding its segment functions,
public and without vdevice annotations, ready for ``tvm.compile`` with that device's
target; :func:`read_program` turns ``main`` into the executor's steps.
"""
from __future__ import annotations

import tvm
from tvm import relax

from ..errors import BuildError
from ..graph.subgraph import Remap, on_vdevice, with_vdevice
from ..run.program import Program, Step


def _plain(ty):
    """``ty`` with vdevice annotations removed."""
    if isinstance(ty, relax.TensorType):
        return relax.TensorType(ty.shape, ty.dtype)
    if isinstance(ty, (relax.TupleType, tvm.ir.TupleType)):
        return relax.TupleType([_plain(f) for f in ty.fields])
    return ty


def _is_op(expr, name: str) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def single_device_function(func: relax.Function, name: str) -> relax.Function:
    """A segment function for a one-device module: plain types, ``global_symbol`` ``name``.

    Same-device ``R.to_vdevice`` (a result placed on its own device) becomes an alias, and
    extern calls declare plain output types.
    """
    params = [relax.Var(p.name, _plain(p.ty)) for p in func.params]
    var_map = dict(zip(func.params, params))
    bb = relax.BlockBuilder()
    with bb.function(name, params):
        with bb.dataflow():
            for block in func.body.blocks:
                for b in block.bindings:
                    val = Remap(var_map).visit_expr(b.value)
                    if _is_op(val, "relax.to_vdevice"):
                        var_map[b.var] = val.args[0]
                        continue
                    if (_is_op(val, "relax.call_dps_packed") or _is_op(val, "relax.call_tir")) and val.ty_args:
                        val = relax.Call(val.op, val.args, val.attrs, [_plain(t) for t in val.ty_args])
                    var_map[b.var] = bb.emit(val, name_hint=b.var.name)
            ret = bb.emit_output(Remap(var_map).visit_expr(func.body.body))
        bb.emit_func_output(ret)
    out = bb.get()[name]
    for k, v in (func.attrs or {}).items():
        if k != "global_symbol":
            out = out.with_attr(k, v)
    return out


def split_by_device(placed_mod: tvm.IRModule) -> dict[int, tvm.IRModule]:
    """One IRModule per device holding that device's segment functions (callable by name)
    and the TIR functions they call (when the module is already legalized)."""
    per: dict[int, dict] = {}
    tir = {}
    for gv in placed_mod.get_global_vars():
        fn = placed_mod[gv]
        if not isinstance(fn, relax.Function):
            tir[gv] = fn
            continue
        if gv.name_hint == "main" or fn.attrs is None or "pesto.device" not in fn.attrs:
            continue
        per.setdefault(int(fn.attrs["pesto.device"]), {})[gv] = single_device_function(fn, gv.name_hint)
    return {d: tvm.IRModule({**tir, **fs}) for d, fs in sorted(per.items())}


def read_program(placed_mod: tvm.IRModule) -> Program:
    """The executor's steps for a placed module's ``main``.

    Raises
    ------
    BuildError
        When ``main`` binds something other than segment calls, device moves, tuples and
        tuple items (the module was not placed by tvm-pesto).
    """
    main = placed_mod["main"]
    vdevs = placed_mod.global_infos["vdevice"] if "vdevice" in placed_mod.global_infos else []
    vdev_index = {(str(vd.target), int(vd.vdevice_id)): k for k, vd in enumerate(vdevs)}
    funcs = {gv.name_hint: placed_mod[gv] for gv in placed_mod.get_global_vars()}
    key = {}
    inputs, input_devices = [], []
    for p in main.params:
        key[p] = f"in:{p.name}"
        inputs.append(key[p])
        vd = getattr(p.ty, "vdevice", None)
        input_devices.append(vdev_index.get((str(vd.target), int(vd.vdevice_id)), 0) if vd is not None else 0)
    steps: list[Step] = []
    for block in main.body.blocks:
        for b in block.bindings:
            val = b.value
            out = f"v{len(key)}:{b.var.name}"
            if isinstance(val, relax.Call) and isinstance(val.op, relax.GlobalVar):
                fn = funcs[val.op.name_hint]
                dev = int(fn.attrs["pesto.device"])
                steps.append(Step("call", out, [key[a] for a in val.args], device=dev, func=val.op.name_hint,
                                  extern=_one_extern(fn)))
            elif _is_op(val, "relax.to_vdevice"):
                vd = val.attrs.dst_vdevice
                dev = vdev_index.get((str(vd.target), int(vd.vdevice_id)), int(vd.vdevice_id))
                steps.append(Step("copy", out, [key[val.args[0]]], device=dev))
            elif isinstance(val, relax.TupleGetItem):
                steps.append(Step("item", out, [key[val.tuple_value]], index=int(val.index)))
            elif isinstance(val, relax.Tuple):
                steps.append(Step("tuple", out, [key[f] for f in val.fields]))
            elif isinstance(val, relax.Var):
                steps.append(Step("alias", out, [key[val]]))
            else:
                raise BuildError(f"placed main binds {b.var.name!r} to {type(val).__name__}; only segment calls, "
                                 "to_vdevice, tuples and tuple items are expected (was the module placed by tvm-pesto?)")
            key[b.var] = out
    flat = [int(v) for v in main.attrs["pesto.state"]] if main.attrs is not None and "pesto.state" in main.attrs else []
    state = [(flat[k], flat[k + 1]) for k in range(0, len(flat), 2)]
    return Program(inputs, steps, _out_key(main.body.body, key), len(vdevs) or 1, input_devices, state)


def _one_extern(fn: relax.Function) -> str:
    """The global name of the one ``R.call_dps_packed`` that is all of segment ``fn`` (its
    parameters in order in, its result out), else ``""``."""
    body = fn.body
    binds = [b for block in body.blocks for b in block.bindings]
    if not binds or not _is_op(binds[0].value, "relax.call_dps_packed"):
        return ""
    last = binds[0].var
    for b in binds[1:]:  # aliases of the result only
        if not (isinstance(b.value, relax.Var) and b.value.same_as(last)):
            return ""
        last = b.var
    if not body.body.same_as(last):
        return ""
    call = binds[0].value
    args = list(call.args[1].fields) if isinstance(call.args[1], relax.Tuple) else [call.args[1]]
    if len(args) != len(fn.params) or not all(a.same_as(p) for a, p in zip(args, fn.params)):
        return ""
    return str(call.args[0].global_symbol)


def _out_key(expr, key):
    if isinstance(expr, relax.Tuple):
        return tuple(_out_key(f, key) for f in expr.fields)
    return key[expr]





def legalize_on_devices(placed_mod: tvm.IRModule) -> tvm.IRModule:
    """``placed_mod`` with its ops legalized to TIR calls whose outputs stay on each
    segment's device, ready for ``tvm.compile`` + ``relax.VirtualMachine`` with several devices.

    TVM 0.27's legalization of some ops (``conv2d`` among them) drops the vdevice of the
    result, so the VM would allocate it on device 0 and a segment on another device would
    mix devices in one kernel call. Legalizing here and putting every TIR call's outputs on
    the segment's vdevice keeps each segment on its device. Legalization also folds an op
    that reads no tensor (``arange``) into a constant, which the VM keeps on device 0: such
    a constant is copied to the segment's device, and a copy of a value already there
    (the rewrite's ``R.to_vdevice`` after such an op) becomes an alias.
    """
    vdevs = list(placed_mod.global_infos["vdevice"]) if "vdevice" in placed_mod.global_infos else []
    mod = relax.transform.LegalizeOps()(placed_mod)
    out = {}
    for gv in mod.get_global_vars():
        fn = mod[gv]
        if not isinstance(fn, relax.Function) or fn.attrs is None or "pesto.device" not in fn.attrs:
            out[gv] = fn
            continue
        d = int(fn.attrs["pesto.device"])
        # device 0 is the VM's default: outputs without a vdevice are allocated there already
        out[gv] = _outputs_on(fn, vdevs[d], gv.name_hint) if d != 0 else fn
    new = tvm.IRModule(out, attrs=placed_mod.attrs)
    new.update_global_info("vdevice", vdevs)
    return new


def _outputs_on(func: relax.Function, vdevice, name: str) -> relax.Function:
    params = [relax.Var(p.name, p.ty) for p in func.params]
    var_map = dict(zip(func.params, params))
    bb = relax.BlockBuilder()
    with bb.function(name, params, private=True):
        with bb.dataflow():
            for block in func.body.blocks:
                for b in block.bindings:
                    val = Remap(var_map).visit_expr(b.value)
                    if _is_op(val, "relax.to_vdevice") and on_vdevice(val.args[0].ty, vdevice):
                        var_map[b.var] = val.args[0]
                        continue
                    if isinstance(val, tvm.ir.Constant) and isinstance(val.ty, relax.TensorType):
                        val = relax.op.to_vdevice(val, vdevice)
                    if _is_op(val, "relax.call_tir") and val.ty_args:
                        val = relax.Call(val.op, val.args, val.attrs, [with_vdevice(t, vdevice) for t in val.ty_args])
                    var_map[b.var] = bb.emit(val, name_hint=b.var.name)
            ret = bb.emit_output(Remap(var_map).visit_expr(func.body.body))
        bb.emit_func_output(ret)
    out = bb.get()[name]
    for k, v in (func.attrs or {}).items():
        out = out.with_attr(k, v)
    return out


__all__ = ["legalize_on_devices", "read_program", "single_device_function", "split_by_device"]
