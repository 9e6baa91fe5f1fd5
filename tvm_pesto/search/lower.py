"""Lower a backend choice into the module: each chosen non-TVM candidate becomes ONE binding.

``R.call_dps_packed("pesto.<backend>.<key>", inputs, out_ty)`` replaces the candidate's
bindings; the global function is built by the backend (weights captured) and registered in
this process. TVM-native candidates stay as Relax ops. The result is an ordinary Relax
module, so the spine's analyze -> place -> build -> run works on it unchanged (every extern
call is a node of its own).

Examples
--------
>>> low = lower(rg, cs, chosen, device)         # doctest: +SKIP
>>> low.mod["main"]                              # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import tvm
from tvm import relax

from ..backends import get_backend
from ..builder.subgraph import _Remap
from ..candidates.generate import CandidateSet, candidate_function
from ..candidates.measure import out_ty_of
from ..errors import BuildError, PestoError


@dataclass
class Lowered:
    """A lowered module and how its bindings map back to the original graph.

    ``var_nodes`` maps a call binding's variable name in the new ``main`` to the original
    node ids it computes (one node for TVM ops, the whole candidate for an extern call).
    ``externs`` maps each extern global name to its candidate index.
    """

    mod: tvm.IRModule
    var_nodes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    externs: dict[str, int] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)


def lower(rg, cs: CandidateSet, chosen, device, strict: bool = True) -> Lowered:
    """Rewrite ``rg``'s module so the chosen non-native candidates are extern calls.

    Parameters
    ----------
    rg : RelaxGraph
    cs : CandidateSet
    chosen : iterable of int
        Candidate indices (a disjoint set; TVM-native ones are left as they are).
    device : Device or dict
        Passed to each backend's ``build`` (CPU callables size their threads per call); a
        dict maps a candidate index to the device it runs on (GPU backends build per device).
    strict : bool
        Raise BuildError when a backend cannot build a chosen candidate; otherwise leave
        that candidate's ops to TVM and record it in ``failed``.

    Returns
    -------
    Lowered
    """
    bindings = rg.bindings
    var_binding = {b.var: k for k, b in enumerate(bindings)}
    node_of_binding = {k: v for v, k in enumerate(rg.node_binding)}
    units = []  # (cand index, segment, global name)
    failed: dict[int, str] = {}
    taken: set[int] = set()
    for ci in chosen:
        c = cs[ci]
        bk = get_backend(c.backend)
        if getattr(bk, "native", False):
            continue
        if taken & set(c.nodes):
            raise BuildError(f"candidates overlap at nodes {sorted(taken & set(c.nodes))}; a backend choice must "
                             "cover every node once")
        seg = candidate_function(rg, c.nodes, lift_constants=False)
        dev = device.get(ci) if isinstance(device, dict) else device
        try:
            gname = bk.build(seg.func, dev)
        except PestoError as e:
            if strict:
                raise
            failed[ci] = str(e)
            continue
        taken |= set(c.nodes)
        units.append((ci, seg, gname))

    removed = {rg.node_binding[v] for v in taken}
    unit_of_binding = {}
    for ui, (ci, seg, _) in enumerate(units):
        for v in cs[ci].nodes:
            unit_of_binding[rg.node_binding[v]] = ui
    # items: ("b", k) original binding kept; ("u", ui) extern unit. Dependencies by variables.
    producer: dict = {}
    for k, b in enumerate(bindings):
        if k in removed:
            producer[b.var] = ("u", unit_of_binding[k])
        else:
            producer[b.var] = ("b", k)
    out_alias = {}  # output var that is an alias binding -> unit producing it
    for ui, (ci, seg, _) in enumerate(units):
        for v in seg.outputs:
            out_alias[v] = ui
            producer[v] = ("u", ui)
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
    for ui, (ci, seg, _) in enumerate(units):
        dag.add_node(("u", ui))
        pos[("u", ui)] = max(rg.node_binding[v] for v in cs[ci].nodes)
        for u in seg.inputs:
            p = producer.get(u)
            if p is not None:
                dag.add_edge(p, ("u", ui))
    if not nx.is_directed_acyclic_graph(dag):
        raise BuildError("the chosen candidates form a cycle when outlined; this is a bug in the search "
                         "(each cover must be acyclic)")
    # Drop alias bindings that read a removed, non-output value (dead after lowering).
    dead = set()
    for item in nx.topological_sort(dag):
        if item[0] != "b":
            continue
        k = item[1]
        b = bindings[k]
        if isinstance(b.value, relax.Call):
            continue
        for u in relax.analysis.free_vars(b.value):
            p = producer.get(u)
            if p in dead or (p is not None and p[0] == "u" and u not in out_alias and u in var_binding
                             and var_binding[u] in removed):
                dead.add(item)
                break
    order = list(nx.lexicographical_topological_sort(dag, key=lambda it: (pos[it], it[0])))

    params = [relax.Var(p.name, p.ty) for p in rg.func.params]
    var_map = dict(zip(rg.func.params, params))
    var_nodes: dict[str, tuple[int, ...]] = {}
    externs: dict[str, int] = {}
    used_names: set[str] = {p.name for p in params}

    def fresh(name: str) -> str:
        base, k = name, 0
        while name in used_names:
            k += 1
            name = f"{base}_{k}"
        used_names.add(name)
        return name

    bb = relax.BlockBuilder()
    attrs = dict(rg.func.attrs) if rg.func.attrs is not None else {}
    with bb.function("main", params, attrs=attrs or None):
        with bb.dataflow():
            for item in order:
                if item in dead:
                    continue
                if item[0] == "b":
                    b = bindings[item[1]]
                    nm = fresh(b.var.name)
                    new = bb.emit(_Remap(var_map).visit_expr(b.value), name_hint=nm)
                    var_map[b.var] = new
                    if item[1] in node_of_binding:
                        var_nodes[nm] = (node_of_binding[item[1]],)
                    continue
                ci, seg, gname = units[item[1]]
                args = [var_map[u] for u in seg.inputs]
                nm = fresh(f"{cs[ci].backend.replace('-', '_')}_{ci}")
                call = bb.emit(relax.call_dps_packed(gname, args, out_ty_of(seg.func)), name_hint=nm)
                var_nodes[nm] = tuple(cs[ci].nodes)
                externs[gname] = ci
                if len(seg.outputs) == 1:
                    var_map[seg.outputs[0]] = call
                else:
                    for j, ov in enumerate(seg.outputs):
                        var_map[ov] = bb.emit(relax.TupleGetItem(call, j), name_hint=fresh(ov.name))
            out = bb.emit_output(_Remap(var_map).visit_expr(rg.output))
        bb.emit_func_output(out)
    mod = bb.get()
    if rg.mod is not None:
        for gv in rg.mod.get_global_vars():
            if gv.name_hint != "main":
                mod[gv.name_hint] = rg.mod[gv]
    return Lowered(mod, var_nodes, externs, failed)


__all__ = ["Lowered", "lower"]
