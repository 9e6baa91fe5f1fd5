"""Collage-style candidates: for each backend, every valid subgraph it could run.

* Pattern backends (``torch``, and ``onnxruntime`` for op-level chains): every match of
  every pattern at every node (overlaps allowed; fused chains up to the backend's depth).
* Graph-level backends (``onnxruntime``): every maximal convex region of supported ops,
  plus windows of it between single-tensor cut points (up to ``max_region`` ops).
* TVM (native): its fusion groups, their contiguous sub-chains and every single op, so
  every node can always be covered.

A candidate is valid when outlining it cannot create a cycle (it is convex: no path leaves
it and comes back), it is weakly connected, and (for non-native backends) every operator in it is
supported and passes the pattern's check.

A check that cannot read a call (:data:`~tvm_pesto.backends.patterns.CHECK_READ_ERRORS`: an attribute or
annotation the call lacks, a symbolic or dynamic shape) says no for that call and is counted. Any other
exception is a failure of the backend: it is left out of the graph's candidates, named in
``CandidateSet.unavailable`` with the exception and its count, and a ``RuntimeWarning`` says so (once per
backend per process). So is a backend whose checks could read no call at all (a TVM API it reads has changed).
:attr:`CandidateSet.check_errors` keeps the counts.

Examples
--------
>>> from tvm_pesto.backends import get_backend
>>> from tvm_pesto.candidates import generate_candidates
>>> from tvm_pesto.candidates.examples import tiny_mlp
>>> from tvm_pesto.graph.relax_import import from_relax
>>> rg = from_relax(tiny_mlp()[0])
>>> cs = generate_candidates(rg, [get_backend("torch")])
>>> len(cs), cs.by_backend()
(32, {'tvm': 17, 'torch': 15})
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import tvm
from tvm import relax

from ..backends.base import MatchContext, op_short_name, region_check
from ..graph.fusion import fusion_groups
from ..graph.regions import convex_regions
from ..graph.relax_import import RelaxGraph
from ..graph.subgraph import emit_function, structural_key
from .checks import BackendChecks, report_failure
from .convex import Reach, is_valid
from .regions import region_windows


@dataclass(frozen=True)
class Candidate:
    """A subgraph (node ids of the op graph) that one backend would run as one call."""

    backend: str
    nodes: tuple[int, ...]
    pattern: str = ""

    @property
    def size(self) -> int:
        return len(self.nodes)

    def label(self) -> str:
        return f"{self.backend}:{self.pattern}[{','.join(map(str, self.nodes))}]"


@dataclass
class CandidateSet:
    """All candidates of a graph, and what was rejected and why.

    Attributes
    ----------
    rejected : dict
        Why matches were not kept: ``"check"`` (a check said no, or could not read the
        call), ``"invalid"`` (not single-exit, convex and connected).
    unavailable : dict
        Backend name -> why it has no candidates here (it cannot run on this machine, or
        its checks failed on this graph).
    check_errors : dict
        Backend name -> :meth:`~tvm_pesto.candidates.checks.BackendChecks.record` per backend whose checks raised.
    """

    rg: RelaxGraph
    candidates: list[Candidate]
    rejected: dict[str, int] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    check_errors: dict[str, dict] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.candidates)

    def __iter__(self):
        return iter(self.candidates)

    def __getitem__(self, i) -> Candidate:
        return self.candidates[i]

    def by_backend(self) -> dict[str, int]:
        return dict(Counter(c.backend for c in self.candidates))

    def whole_model(self) -> list[int]:
        """The candidates that cover every op of the graph (a library's whole model as one call)."""
        return [i for i, c in enumerate(self.candidates) if len(c.nodes) == len(self.rg.graph.nodes)]

    def subset(self, keep) -> "CandidateSet":
        """A new set with the candidates for which ``keep(candidate)`` is true."""
        return CandidateSet(self.rg, [c for c in self.candidates if keep(c)], dict(self.rejected),
                            dict(self.unavailable), dict(self.check_errors))


def _call_name(call) -> str:
    op = getattr(call, "op", None)
    return op.name if isinstance(op, tvm.ir.Op) else type(call).__name__


# -- generation -------------------------------------------------------------------------------
def _single_exit(graph, nodes) -> bool:
    """Only the last node (in topological order) has consumers outside the set."""
    s = set(nodes)
    last = max(nodes)
    return all(v == last or all(w in s for w in graph.dag.successors(v)) for v in nodes)


def _call_bindings(rg: RelaxGraph) -> dict:
    """relax.Call object -> node id (the call bound by that node's binding)."""
    out = {}
    for v, k in enumerate(rg.node_binding):
        out[rg.bindings[k].value] = v
    return out


def _root_key(expr) -> str | None:
    """What a pattern's root must be to match ``expr``: its op's name, or ``TupleGetItem``."""
    if isinstance(expr, relax.TupleGetItem):
        return "TupleGetItem"
    op = getattr(expr, "op", None)
    return op.name if isinstance(op, tvm.ir.Op) else None


def _pattern_roots(pat) -> set | None:
    """The root keys (:func:`_root_key`) ``pat`` can match, or None when it could match any."""
    from tvm.relax.dpl import pattern as dpl

    if isinstance(pat, dpl.CallPattern) and isinstance(pat.op, dpl.ExprPattern) \
            and isinstance(pat.op.expr, tvm.ir.Op):
        return {pat.op.expr.name}
    if isinstance(pat, dpl.TupleGetItemPattern):
        return {"TupleGetItem"}
    if isinstance(pat, dpl.OrPattern):
        left, right = _pattern_roots(pat.left), _pattern_roots(pat.right)
        return None if left is None or right is None else left | right
    return None


def _patterns_by_root(pats) -> dict:
    """Root key -> the entries of ``pats`` that can match there, in their order; under None the
    entries that can match anything (or at a root no pattern names). Matching every pattern
    at every node would make one ``match`` call per (pattern, node) pair: hundreds of
    thousands on a 2,000-op transformer."""
    keys = {}
    for entry in pats:
        keys[id(entry)] = _pattern_roots(entry[1])
    named = {k for ks in keys.values() if ks for k in ks}
    out = {k: [e for e in pats if keys[id(e)] is None or k in keys[id(e)]] for k in named}
    out[None] = [e for e in pats if keys[id(e)] is None]
    return out


def pattern_candidates(rg: RelaxGraph, backend, reach: Reach, rejected: dict,
                       checks: BackendChecks | None = None) -> list[Candidate]:
    """Every match of every pattern of ``backend`` rooted at every node.

    ``checks`` counts what the checks raise (see :class:`~tvm_pesto.candidates.checks.BackendChecks`); without it, the
    first unexpected exception of a check is raised once every match has been tried.
    """
    from tvm.relax.dpl.pattern import CallPattern

    own_checks = checks is None
    if own_checks:
        checks = BackendChecks(backend.name)

    graph = rg.graph
    var2val = relax.analysis.get_var2val(rg.func)
    call_node = _call_bindings(rg)
    pats = backend.patterns()
    out, seen = [], set()
    node_of_var = {rg.bindings[k].var: v for v, k in enumerate(rg.node_binding)}
    roots = []  # (root node, expression to match): op calls, and t[i] of an op's tuple result
    for k, b in enumerate(rg.bindings):
        val = b.value
        if isinstance(val, relax.Call) and b.var in node_of_var and op_short_name(val):
            roots.append((node_of_var[b.var], val))
        elif isinstance(val, relax.TupleGetItem) and isinstance(val.tuple_value, relax.Var) \
                and val.tuple_value in node_of_var:
            roots.append((node_of_var[val.tuple_value], val))
    by_root = _patterns_by_root(pats)
    for root, expr in roots:
        call = rg.bindings[rg.node_binding[root]].value
        for name, pat, check in by_root.get(_root_key(expr), by_root[None]):
            if not pat.match(expr, var2val):
                continue
            matched = pat.extract_matched_expr(expr, var2val)
            calls, nodes = [], set()
            for p, e in matched.items():
                if isinstance(p, CallPattern) and isinstance(e, relax.Call) and e in call_node:
                    nodes.add(call_node[e])
                    calls.append(e)
            if root not in nodes:
                continue
            key = tuple(sorted(nodes))
            if key in seen:
                continue
            calls.sort(key=lambda c: call_node[c])
            ann = {}
            for c in calls:
                ann.setdefault(op_short_name(c), c)
            ctx = MatchContext(root=call, calls=calls, annotated_expr=ann, matched=dict(matched))
            ok = checks.ask(lambda: (check is None or check(ctx)) and all(backend.supports_op(c) for c in calls),
                            f"{name} on node {root} ({_call_name(call)})")
            if not ok:
                rejected["check"] = rejected.get("check", 0) + 1
                continue
            if not _single_exit(graph, key) or not is_valid(graph, key, reach):
                rejected["invalid"] = rejected.get("invalid", 0) + 1
                continue
            seen.add(key)
            out.append(Candidate(backend.name, key, name))
    if own_checks and checks.failure_exc is not None:
        raise checks.failure_exc
    return out


def _supported_nodes(rg: RelaxGraph, backend, checks: BackendChecks) -> set[int]:
    """The nodes whose call ``backend.supports_op`` and the region checks accept."""
    ok = set()
    for v in range(rg.graph.num_nodes):
        call = rg.bindings[rg.node_binding[v]].value
        if not isinstance(call, relax.Call) or not op_short_name(call):
            continue
        ctx = MatchContext(root=call, calls=[call], annotated_expr={op_short_name(call): call})
        if checks.ask(lambda: backend.supports_op(call) and region_check(ctx), f"node {v} ({_call_name(call)})"):
            ok.add(v)
    return ok


def tvm_candidates(graph, reach: Reach, name: str = "tvm", max_chain: int = 8) -> list[Candidate]:
    """TVM fusion groups, their contiguous sub-chains (up to ``max_chain`` ops), single ops."""
    out, seen = [], set()

    def add(nodes, pat):
        key = tuple(sorted(nodes))
        if key in seen or not is_valid(graph, key, reach):
            return
        seen.add(key)
        out.append(Candidate(name, key, pat))

    for grp in fusion_groups(graph):
        add(grp, "fusion_group")
        if len(grp) > 1:
            for i in range(len(grp)):
                for j in range(i + 2, min(len(grp), i + max_chain) + 1):
                    if j - i < len(grp):
                        add(grp[i:j], "fusion_chain")
    for v in range(graph.num_nodes):
        add([v], "single")
    return out


def placement_candidates(rg: RelaxGraph, groups: list[list[int]] | None = None) -> "CandidateSet":
    """One ``tvm`` candidate per fusion group: the problem of placement alone (no backend
    choice), where the only cover is the fusion groups.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_cnn
    >>> from tvm_pesto.graph.relax_import import from_relax
    >>> cs = placement_candidates(from_relax(tiny_cnn()[0]))
    >>> cs.by_backend()
    {'tvm': 10}
    """
    groups = groups if groups is not None else fusion_groups(rg.graph)
    return CandidateSet(rg, [Candidate("tvm", tuple(sorted(g)), "fusion_group") for g in groups])


def generate_candidates(rg: RelaxGraph, backends, max_region: int = 40) -> "CandidateSet":
    """All candidates of ``rg`` for the given backends (instances of :class:`Backend`).

    ``tvm`` candidates are always included (as the native fallback), whether or not the
    ``tvm`` backend is in ``backends``. A backend whose checks fail on this graph
    (:meth:`~tvm_pesto.candidates.checks.BackendChecks.failure`) gets no candidate: it is named in ``unavailable`` with
    the exception and a ``RuntimeWarning`` says so, once per backend per process.

    Examples
    --------
    >>> from tvm_pesto.backends import available_backends
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> from tvm_pesto.graph.relax_import import from_relax
    >>> bks, why = available_backends(["tvm", "torch", "onnxruntime"])
    >>> cs = generate_candidates(from_relax(tiny_mlp()[0]), bks)
    >>> cs.by_backend()
    {'tvm': 17, 'onnxruntime': 25, 'torch': 15}
    """
    graph = rg.graph
    reach = Reach(graph.dag, graph.num_nodes)
    rejected: dict[str, int] = {}
    unavailable: dict[str, str] = {}
    check_errors: dict[str, dict] = {}
    cands = tvm_candidates(graph, reach)
    for bk in backends:
        if getattr(bk, "native", False):
            continue
        if getattr(bk, "tvm_groups", False):
            cands.extend(Candidate(bk.name, c.nodes, c.pattern) for c in tvm_candidates(graph, reach, bk.name))
            continue
        checks = BackendChecks(bk.name)
        own = pattern_candidates(rg, bk, reach, rejected, checks)
        if bk.graph_level:
            seen = {c.nodes for c in own}
            sup = _supported_nodes(rg, bk, checks)
            groups = fusion_groups(graph)
            for region in convex_regions(graph, sup):
                for w in region_windows(graph, region, reach, max_region, groups):
                    t = tuple(w)
                    if t not in seen:
                        seen.add(t)
                        own.append(Candidate(bk.name, t, "region" if len(w) == len(region) else "window"))
        if checks.unreadable or checks.failed:
            check_errors[bk.name] = checks.record()
        why = checks.failure()
        if why is not None:
            unavailable[bk.name] = f"candidate generation failed: {why}"
            report_failure(bk.name, why)
            continue
        cands.extend(own)
    return CandidateSet(rg, cands, rejected, unavailable, check_errors)


# -- outputs of a candidate --------------------------------------------------------------------
class GraphIndex:
    """Per-graph lookups that candidate outputs need (built once per RelaxGraph), and the
    measurement keys made so far (:func:`candidate_key`)."""

    def __init__(self, rg: RelaxGraph):
        self.keys: dict[frozenset, str] = {}
        self.var_binding = {b.var: k for k, b in enumerate(rg.bindings)}
        self.uses = {k: list(relax.analysis.free_vars(rg.bindings[k].value)) for k in rg.node_binding}
        self.final = [rg.output] if isinstance(rg.output, relax.Var) else list(relax.analysis.free_vars(rg.output))


_INDEX: dict[int, tuple] = {}


def graph_index(rg: RelaxGraph) -> GraphIndex:
    hit = _INDEX.get(id(rg))
    if hit is not None and hit[0] is rg:
        return hit[1]
    if len(_INDEX) > 16:
        _INDEX.clear()
    idx = GraphIndex(rg)
    _INDEX[id(rg)] = (rg, idx)
    return idx


def candidate_outputs(rg: RelaxGraph, nodes) -> list:
    """The variables a candidate must return: values of its nodes used outside it.

    Uses through ``TupleGetItem``/tuple aliases are followed: when the rest of the graph
    reads ``t[0]`` of a tuple the candidate computes, the output is the alias ``t[0]``.
    A candidate nobody reads returns its last node's value.
    """
    gi = graph_index(rg)
    members = {rg.node_binding[v] for v in nodes}
    bindings = rg.bindings
    var_binding = gi.var_binding
    inside = {bindings[k].var for k in members}
    outs: list = []

    def add(v):
        if v not in outs:
            outs.append(v)

    def resolve(var):
        if var in inside:
            add(var)
            return
        k = var_binding.get(var)
        if k is None:
            return
        val = bindings[k].value
        if isinstance(val, relax.Call):
            return
        if isinstance(val, relax.Var):
            resolve(val)
        elif isinstance(val, relax.TupleGetItem):
            t = val.tuple_value
            if isinstance(t, relax.Var) and t in inside:
                add(var)  # output the alias t[i], not the whole tuple
            elif isinstance(t, relax.Var) and var_binding.get(t) is not None and \
                    isinstance(bindings[var_binding[t]].value, relax.Tuple):
                f = bindings[var_binding[t]].value.fields[int(val.index)]
                if isinstance(f, relax.Var):
                    resolve(f)
            elif isinstance(t, relax.Var):
                resolve(t)
        elif isinstance(val, relax.Tuple):
            for f in val.fields:
                if isinstance(f, relax.Var):
                    resolve(f)

    for k, used in gi.uses.items():
        if k in members:
            continue
        for u in used:
            resolve(u)
    for u in gi.final:
        resolve(u)
    if not outs:
        outs = [bindings[max(members)].var]
    outs.sort(key=lambda x: var_binding.get(x, -1))
    return outs


def candidate_function(rg: RelaxGraph, nodes, lift_constants: bool = False, name: str = "main"):
    """The candidate as a function (a :class:`~tvm_pesto.graph.subgraph.Segment`).

    Unlike :func:`~tvm_pesto.graph.subgraph.cut_function`, a ``t[i]`` read of a tuple
    computed outside the candidate becomes a tensor parameter (not a tuple parameter), so
    every parameter is a tensor that a library can take through DLPack. Alias bindings
    are pulled in only when they build tuples/aliases or read tuples computed inside.
    """
    gi = graph_index(rg)
    bindings = rg.bindings
    var_binding = gi.var_binding
    outputs = candidate_outputs(rg, nodes)
    include = {rg.node_binding[v] for v in nodes}
    produced = {bindings[k].var for k in include}

    def pull(var) -> bool:
        """Include the alias binding of ``var`` when it must be computed inside."""
        k = var_binding.get(var)
        if k is None or k in include:
            return k is not None and k in include
        val = bindings[k].value
        if isinstance(val, relax.Call):
            return False
        if isinstance(val, relax.TupleGetItem):
            t = val.tuple_value
            if isinstance(t, relax.Var) and (t in produced or pull(t)):
                include.add(k)
                produced.add(var)
                return True
            return False  # a tensor read from an outside tuple: a parameter
        if isinstance(val, (relax.Tuple, relax.Var)):
            for u in relax.analysis.free_vars(val):
                pull(u)
            include.add(k)
            produced.add(var)
            return True
        include.add(k)  # constants, shapes bound to vars
        produced.add(var)
        return True

    for k in sorted(include):
        for u in relax.analysis.free_vars(bindings[k].value):
            pull(u)
    for v in outputs:
        pull(v)
    order = sorted(include)
    free: list = []
    seen = set()
    for k in order:
        for u in relax.analysis.free_vars(bindings[k].value):
            if u not in produced and u not in seen:
                seen.add(u)
                free.append(u)
    return emit_function(bindings, order, free, outputs, lift_constants, name)


def candidate_key(rg: RelaxGraph, nodes) -> str:
    """What a measurement of the candidate is stored under: the structural key of its function
    with the weights lifted to parameters, so repeated layers share one measurement. Made once
    per node set of a graph (a few ms each: the function is built), however many cost tables
    of the model look it up (one per device size, the final choice's solves).

    Examples
    --------
    >>> import tvm_pesto
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> rg = tvm_pesto.analyze(tiny_mlp()[0]).rg
    >>> candidate_key(rg, [0, 1]) == candidate_key(rg, (1, 0)) != candidate_key(rg, [0])
    True
    """
    keys = graph_index(rg).keys
    nodes = frozenset(int(v) for v in nodes)
    if nodes not in keys:
        keys[nodes] = structural_key(candidate_function(rg, nodes, lift_constants=True).func)
    return keys[nodes]


__all__ = ["Candidate", "CandidateSet", "candidate_function", "candidate_key", "candidate_outputs",
           "generate_candidates", "pattern_candidates", "placement_candidates", "tvm_candidates"]
