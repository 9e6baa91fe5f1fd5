"""Apply a plan to a Relax module: outline per-device segments and mark device crossings.

The plan's units (the candidates the solver chose) are lowered first
(:func:`~tvm_pesto.builder.lower.lower_units`: non-TVM units become extern calls); then
each device's order of units is cut into segments. The result is an ordinary IRModule
that ``tvm.compile`` builds for several devices: one ``vdevice`` per cluster device in the
module's global infos; each segment is a private Relax function whose parameters and
results carry its device's vdevice, with attributes ``pesto.device`` (device index) and
``pesto.position`` (its slot in that device's order); ``main`` takes its inputs on device 0,
calls the segments in a valid order, moves every value that crosses devices with
``R.to_vdevice`` and returns its result on device 0.

A module with *state* (a training step: parameters and optimizer state in, their next
values out) names pairs ``(output field, input)`` where the output is the input's next
value. Each state input is declared on the device of the first segment that reads it, and
its next value is returned on that same device, so a runtime that feeds outputs back as
inputs (:meth:`tvm_pesto.run.runtime.PlacedRuntime.step`) never moves state between steps.
``main`` records the pairs in its ``pesto.state`` attribute.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import tvm
from tvm import relax

from ..errors import PlanError
from ..graph.relax_import import RelaxGraph
from ..graph.subgraph import Remap, cut_function, move_to, with_vdevice
from .lower import lower_units


@dataclass
class SegmentSpec:
    """A run of groups on one device that only waits for other devices at its start and
    only hands values to other devices at its end."""

    device: int
    position: int
    groups: list[int]
    nodes: list[int]


def plan_segments(rg: RelaxGraph, groups, plan) -> list[SegmentSpec]:
    """Cut each device's order of groups into segments.

    A segment ends before a group that needs a value from another device and after a group
    whose value another device needs, so no device waits inside a compiled function.
    """
    g = rg.graph
    group_of = {}
    for gi, grp in enumerate(groups):
        for v in grp:
            group_of[v] = gi
    gdev = plan.assignment
    if len(gdev) != len(groups):
        raise PlanError(f"the plan places {len(gdev)} units but the module has {len(groups)} fused groups")
    needs_remote = [False] * len(groups)
    feeds_remote = [False] * len(groups)
    for u, v in g.dag.edges():
        gu, gv = group_of[u], group_of[v]
        if gu != gv and gdev[gu] != gdev[gv]:
            needs_remote[gv] = True
            feeds_remote[gu] = True
    segs: list[SegmentSpec] = []
    for d, seq in enumerate(plan.order):
        cur: list[int] = []
        pos = 0
        for gi in seq:
            if cur and needs_remote[gi]:
                segs.append(SegmentSpec(d, pos, cur, []))
                pos, cur = pos + 1, []
            cur.append(gi)
            if feeds_remote[gi]:
                segs.append(SegmentSpec(d, pos, cur, []))
                pos, cur = pos + 1, []
        if cur:
            segs.append(SegmentSpec(d, pos, cur, []))
    order = {v: k for k, v in enumerate(g.topo_order())}
    for s in segs:
        s.nodes = sorted((v for gi in s.groups for v in groups[gi]), key=order.__getitem__)
    return segs


def segment_name(s: SegmentSpec) -> str:
    """The name of a segment's function in the placed module (and in the executor's trace)."""
    return f"dev{s.device}_seg{s.position}"


def unit_segments(rg: RelaxGraph, plan) -> dict[str, tuple[int, ...]]:
    """Segment name (``dev<d>_seg<k>``) -> the units of ``plan`` it runs, as :func:`apply_plan`
    cuts ``rg`` (the module's graph before lowering: the units' edges are the same)."""
    return {segment_name(s): tuple(s.groups) for s in plan_segments(rg, [u.nodes for u in plan.units], plan)}


def cluster_vdevices(cluster) -> list:
    """One ``relax.VDevice`` per cluster device: its target, ``vdevice_id`` = its index."""
    return [relax.VDevice(tvm.target.Target(dev.target), i, "global") for i, dev in enumerate(cluster.devices)]


def apply_plan(rg: RelaxGraph, plan, cluster, state=None, vdevices=None) -> tvm.IRModule:
    """Rewrite ``rg``'s module so that every op runs inside a per-device segment function.

    Parameters
    ----------
    rg : RelaxGraph
        The module's graph (:func:`tvm_pesto.graph.relax_import.from_relax`).
    plan : Plan
        A plan with ``units`` (one per plan node: backend and op nodes), as every solver
        of the flow returns it.
    cluster : Cluster
    state : list of (int, int), optional
        ``(output field, input index)`` pairs: the output is the next value of that input
        of ``main`` (which must return a tuple). Both live on the device of the input's
        first reader (see the module docstring).
    vdevices : list of relax.VDevice, optional
        The vdevices the module's types name, one per cluster device (default:
        :func:`cluster_vdevices`). TVM tells vdevices apart by identity, so functions placed
        by several calls can share one module only when the calls share this list.

    Raises
    ------
    PlanError
        When the plan has no units, its units do not cover ``rg`` exactly once, its
        orders deadlock, ``state`` names fields or inputs ``main`` does not have, or
        ``vdevices`` does not hold one per cluster device.
    """
    if plan.units is None:
        raise PlanError("the plan has no units (which ops each plan node runs, on which backend); "
                        "plans for a module come from tvm_pesto.place / tvm_pesto.solve_joint")
    if len(plan.units) != len(plan.assignment):
        raise PlanError(f"the plan has {len(plan.units)} units but assigns {len(plan.assignment)} nodes")
    if plan.num_devices != cluster.num_devices:
        raise PlanError(f"the plan has orders for {plan.num_devices} devices; {cluster.name} has "
                        f"{cluster.num_devices}: apply it on the cluster it was placed for (a built module's "
                        f"placed.cluster: the final choice may keep a plan on another core shape)")
    low = lower_units(rg, plan.units, [cluster.devices[int(d)] for d in plan.assignment])
    rg, groups = low.rg, low.unit_nodes
    segs = plan_segments(rg, groups, plan)
    var_binding = {b.var: k for k, b in enumerate(rg.bindings)}
    seg_of_binding = {}
    for si, s in enumerate(segs):
        for v in s.nodes:
            seg_of_binding[rg.node_binding[v]] = si
    used_outside, seg_inputs = _segment_io(rg, segs, var_binding, seg_of_binding)
    call_order = _call_order(segs, seg_inputs, var_binding, seg_of_binding)

    vdevs = list(vdevices) if vdevices is not None else cluster_vdevices(cluster)
    if len(vdevs) != cluster.num_devices:
        raise PlanError(f"{len(vdevs)} vdevices given for {cluster.name}'s {cluster.num_devices} devices; "
                        "pass one per device (tvm_pesto.builder.rewrite.cluster_vdevices)")
    seg_funcs = []
    for si, s in enumerate(segs):
        outs = sorted(used_outside[si], key=lambda x: var_binding[x])
        if not outs:  # a segment nobody reads: keep its last value so it still runs
            outs = [rg.bindings[rg.node_binding[s.nodes[-1]]].var]
        cut = cut_function(rg, [rg.node_binding[v] for v in s.nodes], outs, lift_constants=False,
                           name=segment_name(s), vdevice=vdevs[s.device],
                           move_to_vdevice=s.device != 0)
        fn = cut.func.without_attr("global_symbol")  # private: only main calls it
        fn = fn.with_attr("pesto.device", s.device).with_attr("pesto.position", s.position)
        seg_funcs.append((fn, cut))
    bb = relax.BlockBuilder()
    gvs = {si: bb.add_func(fn, segment_name(segs[si])) for si, (fn, _) in enumerate(seg_funcs)}
    state = [(int(o), int(i)) for o, i in (state or [])]
    in_dev = _state_devices(rg, state, [seg_funcs[si][1] for si in call_order], [segs[si].device for si in call_order])
    calls = [(si, segs[si], seg_funcs[si], gvs[si]) for si in call_order]
    _emit_main(bb, rg, calls, state, in_dev, vdevs, var_binding)
    out_mod = bb.get()
    out_mod.update_global_info("vdevice", vdevs)
    return out_mod


def _segment_io(rg: RelaxGraph, segs, var_binding: dict, seg_of_binding: dict) -> tuple[dict, list]:
    """Per segment, the call results it must return (used by another segment or by the
    function's result, in first-use order) and the call results of other segments it reads."""
    bindings = rg.bindings
    used_outside: dict[int, list] = {si: [] for si in range(len(segs))}
    final_free = set(relax.analysis.free_vars(rg.output)) if not isinstance(rg.output, relax.Var) else {rg.output}

    def call_sources(var, acc):
        k = var_binding.get(var)
        if k is None:
            return
        if k in seg_of_binding:
            acc.add(var)
            return
        for u in relax.analysis.free_vars(bindings[k].value):
            call_sources(u, acc)

    seg_inputs: list[set] = [set() for _ in segs]
    for si, s in enumerate(segs):
        for v in s.nodes:
            val = bindings[rg.node_binding[v]].value
            for u in relax.analysis.free_vars(val):
                acc: set = set()
                call_sources(u, acc)
                for w in acc:
                    sj = seg_of_binding[var_binding[w]]
                    if sj != si:
                        seg_inputs[si].add(w)
                        if w not in used_outside[sj]:
                            used_outside[sj].append(w)
    acc = set()
    for u in final_free:
        call_sources(u, acc)
    for w in sorted(acc, key=lambda x: var_binding[x]):
        sj = seg_of_binding[var_binding[w]]
        if w not in used_outside[sj]:
            used_outside[sj].append(w)
    return used_outside, seg_inputs


def _call_order(segs, seg_inputs: list, var_binding: dict, seg_of_binding: dict) -> list[int]:
    """The segments in an order that respects their data and each device's order.

    Raises
    ------
    PlanError
        When the per-device orders contradict the data dependencies.
    """
    sdag = nx.DiGraph()
    sdag.add_nodes_from(range(len(segs)))
    for si in range(len(segs)):
        for w in seg_inputs[si]:
            sdag.add_edge(seg_of_binding[var_binding[w]], si)
    by_dev: dict[int, list[int]] = {}
    for si, s in enumerate(segs):
        by_dev.setdefault(s.device, []).append(si)
    for d, lst in by_dev.items():
        for a, b in zip(lst, lst[1:]):
            sdag.add_edge(a, b)
    if not nx.is_directed_acyclic_graph(sdag):
        raise PlanError("the plan's per-device orders contradict the data dependencies (segments deadlock); "
                        "simulate the plan to find the blocked ops")
    return list(nx.lexicographical_topological_sort(sdag, key=lambda si: (segs[si].position, segs[si].device)))


def _emit_main(bb, rg: RelaxGraph, calls, state, in_dev, vdevs, var_binding) -> None:
    """The new ``main`` into ``bb``: the original inputs (on device 0, state on its reader's
    device), then the segment calls ``calls`` (``(index, segment, (function, cut), global
    var)`` in call order), each argument moved to the segment's
    device once, then the result rebuilt from the original output expression on device 0 (the
    next value of a state input on that input's device)."""
    bindings = rg.bindings
    params = [relax.Var(p.name, with_vdevice(p.ty, vdevs[in_dev.get(k, 0)])) for k, p in enumerate(rg.func.params)]
    pmap = dict(zip(rg.func.params, params))
    attrs = {"pesto.placed": True, "num_input": len(rg.inputs)} if rg.weight_params else {"pesto.placed": True}
    if state:
        attrs["pesto.state"] = [v for pair in state for v in pair]
    with bb.function("main", params, attrs=attrs):
        with bb.dataflow():
            on_dev: dict = {}  # (original var, device) -> new var on that device
            home: dict = {}  # original var -> (new var, device)
            for k, (p_old, p_new) in enumerate(pmap.items()):
                home[p_old] = (p_new, in_dev.get(k, 0))
            for si, s, (_fn, cut), gv in calls:
                args = []
                for v in cut.inputs:
                    nv, dv = home[v]
                    if dv != s.device:
                        key = (v, s.device)
                        if key not in on_dev:
                            on_dev[key] = move_to(bb, nv, vdevs[s.device], f"{v.name}_d{s.device}")
                        nv = on_dev[key]
                    args.append(nv)
                res = bb.emit(relax.Call(gv, args), name_hint=f"s{si}")
                if len(cut.outputs) == 1:
                    home[cut.outputs[0]] = (res, s.device)
                else:
                    for k, v in enumerate(cut.outputs):
                        home[v] = (bb.emit(relax.TupleGetItem(res, k), name_hint=v.name), s.device)
            out_dev = {o: in_dev[i] for o, i in state}
            if state:
                out = bb.emit_output(relax.Tuple([
                    _materialize(bb, f, home, bindings, var_binding, vdevs, out_dev.get(k, 0))
                    for k, f in enumerate(rg.output.fields)]))
            else:
                final_map = {}
                for v in relax.analysis.free_vars(rg.output) if not isinstance(rg.output, relax.Var) else [rg.output]:
                    final_map[v] = _materialize(bb, v, home, bindings, var_binding, vdevs)
                out = bb.emit_output(Remap(final_map).visit_expr(rg.output))
        bb.emit_func_output(out)


def _state_devices(rg: RelaxGraph, state, cuts, devices) -> dict[int, int]:
    """Input index -> device for the state inputs: the device of the first segment (in call
    order) that reads the input (0 when none does)."""
    params = list(rg.func.params)
    fields = rg.output.fields if isinstance(rg.output, relax.Tuple) else None
    if state and fields is None:
        raise PlanError("a module with state must return a tuple (its outputs include the next values of its "
                        "state inputs)")
    out = {}
    for o, i in state:
        if not (0 <= i < len(params) and 0 <= o < len(fields)):
            raise PlanError(f"state pair (output {o}, input {i}) is out of range: main has {len(params)} inputs "
                            f"and returns {len(fields)} values")
        out[i] = next((d for cut, d in zip(cuts, devices) if params[i] in cut.inputs), 0)
    return out


def _materialize(bb, v, home, bindings, var_binding, vdevs, dev: int = 0):
    """The new variable for original ``v`` on device ``dev`` (recomputing aliases as needed)."""
    if v in home:
        nv, dv = home[v]
        if dv != dev:
            nv = move_to(bb, nv, vdevs[dev], f"{v.name}_d{dev}")
            if dev == 0:
                home[v] = (nv, 0)
        return nv
    k = var_binding[v]
    val = bindings[k].value
    sub = {u: _materialize(bb, u, home, bindings, var_binding, vdevs, dev) for u in relax.analysis.free_vars(val)}
    nv = bb.emit(Remap(sub).visit_expr(val), name_hint=v.name)
    home[v] = (nv, dev)
    return nv
