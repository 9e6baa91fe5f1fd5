"""Lower a plan's units into the module: each non-TVM unit becomes ONE extern call.

A plan's units are the candidates the solver chose (:class:`~tvm_pesto.candidates.Candidate`:
a backend and the op-graph nodes it runs). A unit of the native ``tvm`` backend stays as
Relax ops. Any other unit is built by its backend into a tvm-ffi global function (weights
captured) for the device the plan puts it on, and its bindings are replaced by
``R.call_dps_packed("pesto.<backend>.<key>", inputs, out_ty)``.

The result is a :class:`Lowered` graph plus, for every unit, its node ids in that graph,
in the plan's unit order, so the rewrite outlines exactly the units the solver placed (no
re-analysis, no re-grouping).

Examples
--------
>>> low = lower_units(rg, plan.units, devices)     # doctest: +SKIP
>>> low.rg.graph.num_nodes, low.unit_nodes[0]       # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import tvm
from tvm import relax

from ..backends import get_backend
from ..backends.base import BackendUnavailableError, instance_key
from ..candidates.generate import candidate_function
from ..costs.measure.build_time import record as record_build
from ..errors import PlanError
from ..graph.relax_import import RelaxGraph, from_relax
from ..graph.subgraph import Remap, out_ty_of


@dataclass
class Lowered:
    """A module whose non-TVM units are extern calls.

    Attributes
    ----------
    rg : RelaxGraph
        The lowered ``main`` as a graph (one node per op call or extern call).
    unit_nodes : list of list of int
        Node ids in ``rg.graph`` of each unit, in the plan's unit order.
    externs : dict
        Extern global function name -> unit index.
    """

    rg: RelaxGraph
    unit_nodes: list[list[int]]
    externs: dict[str, int] = field(default_factory=dict)

    @property
    def mod(self) -> tvm.IRModule:
        return self.rg.mod


def _check_units(rg: RelaxGraph, units) -> None:
    n = rg.graph.num_nodes
    fix = "place this module (tvm_pesto.place / build without plan=) or pass the plan made for it"
    covered = sum(len(u.nodes) for u in units)
    seen = {}
    for k, u in enumerate(units):
        for v in u.nodes:
            if not 0 <= v < n:
                raise PlanError(f"unit {k} ({u.backend}) names op {v}, but this module has {n} ops (the plan's "
                                f"units cover {covered}): the plan is for another module; {fix}")
            if v in seen:
                raise PlanError(f"node {v} ({rg.graph.nodes[v].name}) is in units {seen[v]} and {k}; a plan must "
                                "cover every op exactly once: solve again, or report the plan")
            seen[v] = k
    if len(seen) != n:
        missing = sorted(set(range(n)) - set(seen))
        if sorted(seen) == list(range(len(seen))):  # a prefix: a plan of a smaller module
            raise PlanError(f"the plan's units cover {len(seen)} ops, but this module has {n} (ops "
                            f"{[rg.graph.nodes[v].name for v in missing[:4]]} are in no unit): the plan is for "
                            f"another module; {fix}")
        raise PlanError(f"nodes {missing[:8]} ({[rg.graph.nodes[v].name for v in missing[:4]]}) are in no unit; "
                        f"a plan must cover every op exactly once: {fix}")


def lower_units(rg: RelaxGraph, units, devices, build: bool = True) -> Lowered:
    """Rewrite ``rg``'s ``main`` so that every non-native unit is one extern call.

    Parameters
    ----------
    rg : RelaxGraph
    units : sequence of Candidate
        Disjoint, covering every node of ``rg.graph`` (a plan's ``units``).
    devices : sequence of Device
        The device of each unit (a backend builds its callable for that device).
    build : bool
        False for a module that runs on another machine: each extern call gets the name its
        backend would register (:meth:`~tvm_pesto.backends.base.Backend.global_name` of
        :func:`~tvm_pesto.backends.base.instance_key`), and nothing is built or registered
        here, so a backend that cannot run here can be lowered; the machine that runs the
        module registers its units under those names (``Lowered.externs``).

    Returns
    -------
    Lowered

    Raises
    ------
    PlanError
        When the units overlap or leave an op uncovered.
    BuildError
        When a backend cannot build a unit (the message names the backend and why).
    BackendUnavailableError
        When ``build`` and a unit's backend cannot load here (for a device not on this machine,
        the message says to build there or lower with ``build=False``).
    """
    _check_units(rg, units)
    ext = []  # (unit index, segment, global name)
    for k, u in enumerate(units):
        bk = get_backend(u.backend)
        if getattr(bk, "native", False):
            continue
        seg = candidate_function(rg, u.nodes, lift_constants=False)
        if build:
            gname = _build(bk, seg.func, devices[k])
            record_build(bk.built(gname), len(u.nodes))
        else:
            gname = bk.global_name(instance_key(seg.func), devices[k])
        ext.append((k, seg, gname))
    if not ext:  # placement only: the graph is the module as it is
        return Lowered(rg, [sorted(u.nodes) for u in units], {})
    order, dead = _item_order(rg, units, ext)
    mod, unit_of_var, externs = _emit_main(rg, units, ext, [item for item in order if item not in dead])
    if rg.mod is not None:
        for gv in rg.mod.get_global_vars():
            if gv.name_hint != "main":
                mod[gv.name_hint] = rg.mod[gv]
    low = from_relax(mod, canonical=False)  # the units' calls as they were outlined
    unit_nodes: list[list[int]] = [[] for _ in units]
    for v, nd in enumerate(low.graph.nodes):
        unit_nodes[unit_of_var[nd.extra["var"]]].append(v)
    return Lowered(low, unit_nodes, externs)


def _build(bk, func, device) -> str:
    """``bk.build``; a backend that cannot load here, for a device that is not here, is the
    plan of another machine: the error says so and how to build it there."""
    try:
        return bk.build(func, device)
    except BackendUnavailableError as e:
        if getattr(device, "present", True):
            raise
        raise BackendUnavailableError(
            f"{e}. The plan puts units on {bk.name!r} for {getattr(device, 'name', device)!r}, a device this machine "
            "does not have: build it on the machine that has it (tvm_pesto.build there), or lower it here for that "
            "machine with lower_units(..., build=False), whose extern calls that machine registers") from e


def _item_order(rg: RelaxGraph, units, ext) -> tuple[list, set]:
    """The items of the new ``main`` in emission order: ``("b", k)`` an original binding kept,
    ``("u", e)`` the extern call of ``ext[e]``; and the alias bindings that are dead after
    lowering (they read a removed value that no unit outputs).

    Raises
    ------
    PlanError
        When the outlined units form a cycle.
    """
    bindings = rg.bindings
    var_binding = {b.var: k for k, b in enumerate(bindings)}
    removed = {rg.node_binding[v] for k, _, _ in ext for v in units[k].nodes}
    ext_of_binding = {rg.node_binding[v]: e for e, (k, _, _) in enumerate(ext) for v in units[k].nodes}
    # dependencies by variables
    producer: dict = {}
    for k, b in enumerate(bindings):
        producer[b.var] = ("u", ext_of_binding[k]) if k in removed else ("b", k)
    out_alias = {}  # an extern unit's output var (possibly an alias binding) -> that unit
    for e, (_, seg, _) in enumerate(ext):
        for v in seg.outputs:
            out_alias[v] = e
            producer[v] = ("u", e)
    dag = nx.DiGraph()
    pos = {}
    for k, b in enumerate(bindings):
        if k in removed or b.var in out_alias:
            continue
        dag.add_node(("b", k))
        pos[("b", k)] = k
        for u in relax.analysis.free_vars(b.value):
            p = producer.get(u)
            if p is not None and p != ("b", k):
                dag.add_edge(p, ("b", k))
    for e, (k, seg, _) in enumerate(ext):
        dag.add_node(("u", e))
        pos[("u", e)] = max(rg.node_binding[v] for v in units[k].nodes)
        for u in seg.inputs:
            p = producer.get(u)
            if p is not None:
                dag.add_edge(p, ("u", e))
    if not nx.is_directed_acyclic_graph(dag):
        raise PlanError("the plan's units form a cycle when outlined (each cover must be acyclic); "
                        "solve the problem again or report the plan")
    # Alias bindings that read a removed, non-output value are dead after lowering.
    dead = set()
    for item in nx.topological_sort(dag):
        if item[0] != "b" or isinstance(bindings[item[1]].value, relax.Call):
            continue
        for u in relax.analysis.free_vars(bindings[item[1]].value):
            p = producer.get(u)
            if p in dead or (p is not None and p[0] == "u" and u not in out_alias and u in var_binding
                             and var_binding[u] in removed):
                dead.add(item)
                break
    return list(nx.lexicographical_topological_sort(dag, key=lambda it: (pos[it], it[0]))), dead


def _emit_main(rg: RelaxGraph, units, ext, items: list):
    """The new ``main`` with ``items`` (:func:`_item_order`, dead ones left out) emitted in
    order: ``(module, call binding name -> unit index, extern global name -> unit index)``."""
    bindings = rg.bindings
    node_of_binding = {k: v for v, k in enumerate(rg.node_binding)}
    unit_of_node = {v: k for k, u in enumerate(units) for v in u.nodes}
    params = [relax.Var(p.name, p.ty) for p in rg.func.params]
    var_map = dict(zip(rg.func.params, params))
    unit_of_var: dict[str, int] = {}  # call binding name in the new main -> unit index
    externs: dict[str, int] = {}
    used_names: set[str] = {p.name for p in params}

    def fresh(name: str) -> str:
        base, i = name, 0
        while name in used_names:
            i += 1
            name = f"{base}_{i}"
        used_names.add(name)
        return name

    bb = relax.BlockBuilder()
    attrs = dict(rg.func.attrs) if rg.func.attrs is not None else {}
    with bb.function("main", params, attrs=attrs or None):
        with bb.dataflow():
            for item in items:
                if item[0] == "b":
                    b = bindings[item[1]]
                    nm = fresh(b.var.name)
                    var_map[b.var] = bb.emit(Remap(var_map).visit_expr(b.value), name_hint=nm)
                    if item[1] in node_of_binding:
                        unit_of_var[nm] = unit_of_node[node_of_binding[item[1]]]
                    continue
                k, seg, gname = ext[item[1]]
                args = [var_map[u] for u in seg.inputs]
                nm = fresh(f"{units[k].backend.replace('-', '_')}_{k}")
                call = bb.emit(relax.call_dps_packed(gname, args, out_ty_of(seg.func)), name_hint=nm)
                unit_of_var[nm] = k
                externs[gname] = k
                if len(seg.outputs) == 1:
                    var_map[seg.outputs[0]] = call
                else:
                    for j, ov in enumerate(seg.outputs):
                        var_map[ov] = bb.emit(relax.TupleGetItem(call, j), name_hint=fresh(ov.name))
            out = bb.emit_output(Remap(var_map).visit_expr(rg.output))
        bb.emit_func_output(out)
    return bb.get(), unit_of_var, externs


__all__ = ["Lowered", "lower_units"]
