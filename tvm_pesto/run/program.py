"""Read a placed module's ``main`` as a program of steps the executor can run.

Steps: ``call`` (run a segment function on its device), ``copy`` (``R.to_vdevice``),
``item`` (``TupleGetItem``), ``tuple`` (build a tuple) and ``alias`` (a plain variable copy).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from ..errors import BuildError


@dataclass
class Step:
    kind: str  # call | copy | item | tuple | alias
    out: str
    args: list[str]
    device: int = 0
    func: str = ""
    index: int = 0
    deps: list[str] = field(default_factory=list)


@dataclass
class Program:
    inputs: list[str]
    steps: list[Step]
    output: object  # str key, or nested tuple of keys
    num_devices: int


def read_program(placed_mod: tvm.IRModule) -> Program:
    main = placed_mod["main"]
    vdevs = placed_mod.global_infos["vdevice"] if "vdevice" in placed_mod.global_infos else []
    vdev_index = {}
    for k, vd in enumerate(vdevs):
        vdev_index[(str(vd.target), int(vd.vdevice_id))] = k
    funcs = {gv.name_hint: placed_mod[gv] for gv in placed_mod.get_global_vars()}
    key = {}
    inputs = []
    for p in main.params:
        key[p] = f"in:{p.name}"
        inputs.append(key[p])
    steps: list[Step] = []
    for block in main.body.blocks:
        for b in block.bindings:
            val = b.value
            out = f"v{len(key)}:{b.var.name}"
            if isinstance(val, relax.Call) and isinstance(val.op, relax.GlobalVar):
                fn = funcs[val.op.name_hint]
                dev = int(fn.attrs["pesto.device"])
                steps.append(Step("call", out, [key[a] for a in val.args], device=dev, func=val.op.name_hint))
            elif isinstance(val, relax.Call) and isinstance(val.op, tvm.ir.Op) and val.op.name == "relax.to_vdevice":
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
    ret = main.body.body
    output = _out_key(ret, key)
    return Program(inputs, steps, output, len(vdevs) or 1)


def _out_key(expr, key):
    if isinstance(expr, relax.Tuple):
        return tuple(_out_key(f, key) for f in expr.fields)
    return key[expr]


def split_by_device(placed_mod: tvm.IRModule) -> dict[int, tvm.IRModule]:
    """One IRModule per device holding that device's segment functions."""
    per: dict[int, dict] = {}
    for gv in placed_mod.get_global_vars():
        fn = placed_mod[gv]
        if gv.name_hint == "main" or fn.attrs is None or "pesto.device" not in fn.attrs:
            continue
        per.setdefault(int(fn.attrs["pesto.device"]), {})[gv.name_hint] = fn
    return {d: tvm.IRModule(fs) for d, fs in sorted(per.items())}
