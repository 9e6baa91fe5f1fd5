"""Contiguous splits by dynamic programming over ideals (Tarnawski et al., NeurIPS 2020).

In the stage model (:mod:`tvm_pesto.plan.stage`) every stage is contiguous and the stage
graph is acyclic, so the forward stages, taken in a topological order of the stage graph,
grow a chain of *ideals* (down-closed node sets) ``{} = I_0 < I_1 < ... < I_m = V``: stage
``k`` is ``I_k - I_{k-1}`` and, for a training graph, the backward nodes co-located with it.
Conversely every such chain is a split into contiguous stages. The device load of a stage
(work plus communication, :func:`tvm_pesto.plan.stage.io_rates`) depends only on the set
and on the device's class, so

    dp[s][I] = min over ideals I' <= I of max(dp[s - one device of class c][I'], load_c(I - I'))

over the multiset ``s`` of devices used so far gives the smallest max-load (the steady-state
time per sample) over all contiguous splits, memory included: :func:`dp_split`. Devices of
one class (same costs, memory and IO rate) are interchangeable, so the DP counts them.

The DP works on *units*: the forward members of a co-location class contracted to one node
(classes on a cycle of the contracted graph must share a stage, so they are merged), with the
class's backward members riding along. Two reductions keep it small: classes whose every
member costs nothing and whose forward part is a source or a sink are dropped (GNMT's
zero-cost inputs and dangling outputs), and nothing else; dropping nodes only removes work,
transfers and memory, so the optimum on what is left is a **lower bound** for the full graph
(:func:`dp_bound`), exact when nothing was dropped. As a solver (:func:`solve`, registered as
``stage-dp``) the dropped nodes go back next to a neighbour, and the plan is judged in full.

Where the graph has too many ideals (wide graphs: Inception has 36,596) the exact DP is
skipped; :func:`linearized_split` runs the same DP over the prefixes of a topological order
(one ideal per position: the PipeDream-style split of a linearised graph), which always
gives contiguous, acyclic stages, and is how the placement heuristics' plans are turned into
stage plans (:func:`as_stage_plan`, along their schedule order).

Examples
--------
>>> from tvm_pesto.cluster import parse_cluster
>>> from tvm_pesto.graph.opgraph import OpGraph, OpNode
>>> from tvm_pesto.plan import Problem
>>> g = OpGraph([OpNode(f"n{i}", "op") for i in range(4)], [(0, 1, 0), (1, 2, 0), (2, 3, 0)])
>>> p = Problem(g, parse_cluster("cpu:1").with_memory(1e9), np.array([[1.0], [2.0], [3.0], [4.0]]))
>>> dp_split(p).value_s
10.0
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from ..errors import InfeasibleError, PestoError, SolverError
from ..plan.objective import evaluate
from ..plan.plan import Plan
from ..plan.problem import Problem
from ..plan.stage import BACKWARD, FORWARD, io_rates, node_passes
from .common import colocation_index

MAX_IDEALS = 4000
MAX_PAIRS = 3_000_000
_CHUNK = 4096
_TOL = 1e-9


@dataclass
class Units:
    """The graph the DP runs on: ``units[k]`` lists the kept nodes of unit ``k`` (forward and
    backward members of its co-location classes), ``dag`` the forward edges between units,
    ``dropped`` the nodes left out (a relaxation), ``exact`` whether nothing was dropped."""

    units: list
    unit_of: np.ndarray
    dag: nx.DiGraph
    dropped: list = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.dropped


def dp_units(problem: Problem, passes: np.ndarray | None = None, drop_free: bool = True,
             all_passes: bool = False) -> Units:
    """The units of the module docstring. ``all_passes``: units over the whole graph (every
    edge, both passes), for the prefix DP, where an interval of a topological order is
    contiguous in each pass whatever the co-location.

    Raises
    ------
    SolverError
        When a backward node has no co-located forward node and not ``all_passes`` (then a
        device's backward stage is not tied to its forward one, and the DP over forward
        ideals does not cover the stage model).
    """
    n = problem.num_nodes
    passes = node_passes(problem.graph) if passes is None else np.asarray(passes)
    group_of, groups = colocation_index(problem)
    cls = np.where(group_of >= 0, group_of, len(groups) + np.arange(n))
    members: dict[int, list[int]] = {}
    for v in range(n):
        members.setdefault(int(cls[v]), []).append(v)
    if all_passes:
        passes = np.full(n, FORWARD)
    for c, mem in members.items():
        if all(passes[v] == BACKWARD for v in mem):
            v = mem[0]
            raise SolverError(f"backward node {problem.graph.nodes[v].name} has no co-located forward node, so its "
                              "stage is not tied to a forward stage; the contiguous-split DP needs every backward "
                              "node co-located with a forward one (use --solver ilp or a heuristic)")
    free = np.where(np.isfinite(problem.costs), problem.costs, 0.0).max(axis=1) <= 0
    fwd = nx.DiGraph()
    fwd.add_nodes_from(members)
    for u, v in zip(problem.src.tolist(), problem.dst.tolist()):
        if passes[u] == FORWARD and passes[v] == FORWARD and cls[u] != cls[v]:
            fwd.add_edge(int(cls[u]), int(cls[v]))
    dropped: list[int] = []
    if drop_free:
        for _ in range(3):
            gone = [c for c in fwd if all(free[v] for v in members[c])
                    and (fwd.in_degree(c) == 0 or fwd.out_degree(c) == 0) and len(fwd) > 1]
            if not gone:
                break
            fwd.remove_nodes_from(gone)
            for c in gone:
                dropped.extend(members[c])
    cond = nx.condensation(fwd)  # classes on a cycle of the class graph share a stage
    order = list(nx.lexicographical_topological_sort(cond, key=lambda k: min(min(members[c]) for c in
                                                                          cond.nodes[k]["members"])))
    index = {k: i for i, k in enumerate(order)}
    unit_of = np.full(n, -1, dtype=np.int64)
    units: list[list[int]] = [[] for _ in order]
    for k in order:
        for c in cond.nodes[k]["members"]:
            for v in members[c]:
                unit_of[v] = index[k]
    for v in range(n):
        if unit_of[v] >= 0:
            units[unit_of[v]].append(v)
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(units)))
    dag.add_edges_from((index[a], index[b]) for a, b in cond.edges)
    return Units(units, unit_of, dag, sorted(dropped))


def all_ideals(dag: nx.DiGraph, limit: int = MAX_IDEALS) -> list[int] | None:
    """Every ideal of ``dag`` as a bit mask over its nodes (``0`` the empty one), smallest
    first; None when there are more than ``limit``."""
    anc = {}
    for k in nx.topological_sort(dag):
        m = 1 << k
        for p in dag.predecessors(k):
            m |= anc[p]
        anc[k] = m
    out = set()
    for chain in nx.antichains(dag):
        m = 0
        for k in chain:
            m |= anc[k]
        out.add(m)
        if len(out) > limit:
            return None
    return sorted(out, key=lambda m: (m.bit_count(), m))


def prefix_ideals(order: list[int]) -> list[int]:
    """The prefixes of ``order`` (a topological order of the units) as bit masks."""
    out, m = [0], 0
    for k in order:
        m |= 1 << k
        out.append(m)
    return out


@dataclass
class DpResult:
    """The DP's answer: ``value_s`` the smallest max-load over the splits it considered (inf
    when none fits), ``assignment`` a device per node (dropped nodes: -1) achieving it."""

    value_s: float
    assignment: np.ndarray
    exact: bool
    ideals: int
    pairs: int
    seconds: float
    family: str

    def info(self) -> dict:
        return {"dp_value_s": self.value_s, "dp_exact": self.exact, "dp_ideals": self.ideals, "dp_pairs": self.pairs,
                "dp_seconds": self.seconds, "dp_ideal_family": self.family}


def device_classes(problem: Problem) -> list[list[int]]:
    """Devices that are interchangeable in the stage model: same costs, memory and IO rate."""
    lat, inv = io_rates(problem.cluster)
    out: dict[tuple, list[int]] = {}
    for k in range(problem.num_devices):
        key = (problem.costs[:, k].tobytes(), float(problem.capacity[k]), float(lat[k]), float(inv[k]))
        out.setdefault(key, []).append(k)
    return list(out.values())


def _pairs(masks: list[int], mem_of_ideal: np.ndarray, max_mem: float, max_pairs: int):
    """Index arrays ``(P, Q)`` of the pairs ``masks[Q] < masks[P]`` whose difference could fit
    some device; raises SolverError past ``max_pairs``."""
    P, Q = [], []
    for i, m in enumerate(masks):
        lim = mem_of_ideal[i] - max_mem * (1 + _TOL)
        for j in range(i):
            q = masks[j]
            if q & ~m == 0 and mem_of_ideal[j] >= lim:
                P.append(i)
                Q.append(j)
        if len(P) > max_pairs:
            raise SolverError(f"the contiguous-split DP would need more than {max_pairs} pairs of ideals; the graph is "
                              "too wide for it (use the linearised DP, the ILP or a heuristic)")
    return np.asarray(P, dtype=np.int64), np.asarray(Q, dtype=np.int64)


def dp_split(problem: Problem, family: str = "all", order: list[int] | None = None, passes=None,
             drop_free: bool = True, max_ideals: int = MAX_IDEALS, max_pairs: int = MAX_PAIRS,
             units: Units | None = None, combine: str = "max") -> DpResult:
    """The DP of the module docstring over every ideal (``family="all"``) or over the
    prefixes of ``order`` (``"prefix"``; a topological order of the units, default the
    units' own order).

    ``combine="max"`` minimises the largest device load (the steady-state time per sample:
    exact, and a bound); ``"sum"`` the sum of the blocks, which is the latency when the
    stages run one after another and an upper bound on it otherwise: a heuristic for the
    latency objective that avoids cuts where transfers are dear.

    Raises
    ------
    SolverError
        When the graph has more than ``max_ideals`` ideals or ``max_pairs`` pairs, or a
        backward node has no co-located forward node (see :func:`dp_units`).

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> r = dp_split(problem)
    >>> r.value_s > 0, r.exact
    (True, True)
    """
    t0 = time.perf_counter()
    units = units if units is not None else dp_units(problem, passes, drop_free)
    nu = len(units.units)
    if family == "all":
        masks = all_ideals(units.dag, max_ideals)
        if masks is None:
            raise SolverError(f"{problem.graph.name} has more than {max_ideals} ideals (ways to cut it contiguously); "
                              "the exact DP is skipped for graphs that wide")
    elif family == "prefix":
        order = list(range(nu)) if order is None else list(order)
        masks = prefix_ideals(order)
    else:
        raise PestoError(f"unknown ideal family {family!r}; use 'all' or 'prefix'")
    n = problem.num_nodes
    kept = np.flatnonzero(units.unit_of >= 0)
    classes = device_classes(problem)
    cap = np.array([problem.capacity[c[0]] for c in classes])
    lat_d, inv_d = io_rates(problem.cluster)
    lat = np.array([lat_d[c[0]] for c in classes])
    inv = np.array([inv_d[c[0]] for c in classes])
    # per unit: work per class (inf: cannot run), memory
    costs = problem.costs[:, [c[0] for c in classes]]
    unit_work = np.zeros((nu, len(classes)))
    unit_bad = np.zeros((nu, len(classes)))
    unit_mem = np.zeros(nu)
    for k, mem in enumerate(units.units):
        c = costs[mem]
        unit_bad[k] = (~np.isfinite(c)).sum(axis=0)
        unit_work[k] = np.where(np.isfinite(c), c, 0.0).sum(axis=0)
        unit_mem[k] = problem.mem[mem].sum()
    member = np.array([[(m >> k) & 1 for k in range(nu)] for m in masks], dtype=np.float64).reshape(len(masks), nu)
    w_ideal, bad_ideal, m_ideal = member @ unit_work, member @ unit_bad, member @ unit_mem
    P, Q = _pairs(masks, m_ideal, float(cap.max()), max_pairs)
    # node membership of each ideal, over the kept nodes (for the transfers)
    pos = -np.ones(n, dtype=np.int64)
    pos[kept] = np.arange(len(kept))
    node_in = member[:, units.unit_of[kept]].astype(bool)  # (ideals, kept)
    src, dst, eb = problem.src, problem.dst, problem.ebytes
    keep_e = (units.unit_of[src] >= 0) & (units.unit_of[dst] >= 0)
    es, ed, eb = pos[src[keep_e]], pos[dst[keep_e]], eb[keep_e]
    by_src = np.argsort(es, kind="stable")
    es, ed, eb = es[by_src], ed[by_src], eb[by_src]
    starts = np.flatnonzero(np.r_[True, es[1:] != es[:-1]]) if len(es) else np.zeros(0, dtype=np.int64)
    npairs = len(P)
    io_count = np.zeros(npairs)
    io_bytes = np.zeros(npairs)
    for lo in range(0, npairs, _CHUNK):
        hi = min(lo + _CHUNK, npairs)
        S = node_in[P[lo:hi]] & ~node_in[Q[lo:hi]]
        if not len(es):
            continue
        s_src, s_dst = S[:, es], S[:, ed]
        for cut in (s_src & ~s_dst, ~s_src & s_dst):  # out of the set, into the set: per producer
            best = np.maximum.reduceat(np.where(cut, eb, -1.0), starts, axis=1)
            io_count[lo:hi] += (best >= 0).sum(axis=1)
            io_bytes[lo:hi] += np.clip(best, 0.0, None).sum(axis=1)
    load = (w_ideal[P] - w_ideal[Q]) + io_count[:, None] * lat + io_bytes[:, None] * inv
    fits = ((bad_ideal[P] - bad_ideal[Q]) == 0) & ((m_ideal[P] - m_ideal[Q])[:, None] <= cap * (1 + _TOL))
    load = np.where(fits, load, np.inf)
    # DP over the multiset of devices used (counts per class)
    if combine not in ("max", "sum"):
        raise PestoError(f"unknown DP combine {combine!r}; use 'max' (time per sample) or 'sum' (latency)")
    join = np.maximum if combine == "max" else np.add
    counts = [len(c) for c in classes]
    shape = tuple(k + 1 for k in counts)
    full = len(masks) - 1
    dp = {}
    start = np.full(len(masks), np.inf)
    start[0] = 0.0
    for state in np.ndindex(*shape):
        if sum(state) == 0:
            dp[state] = start
            continue
        best = np.full(len(masks), np.inf)
        for c in range(len(classes)):
            if state[c] == 0:
                continue
            prev = dp[tuple(s - (i == c) for i, s in enumerate(state))]
            np.minimum(best, prev, out=best)
            cand = join(prev[Q], load[:, c])
            np.minimum.at(best, P, cand)
        dp[state] = best
    top = tuple(shape[i] - 1 for i in range(len(classes)))
    value = float(dp[top][full])
    assignment = -np.ones(n, dtype=np.int64)
    if np.isfinite(value):
        used = [0] * len(classes)
        state, i = top, full
        while i != 0:
            moved = False
            for c in range(len(classes)):
                if state[c] == 0:
                    continue
                ps = tuple(s - (j == c) for j, s in enumerate(state))
                prev = dp[ps]
                if prev[i] <= dp[state][i] * (1 + 1e-12) + 1e-18:
                    state, moved = ps, True
                    break
                sel = np.flatnonzero(P == i)
                cand = join(prev[Q[sel]], load[sel, c])
                j = int(np.argmin(cand))
                if cand[j] <= dp[state][i] * (1 + 1e-12) + 1e-18:
                    dev = classes[c][used[c]]
                    used[c] += 1
                    diff = masks[i] & ~masks[Q[sel[j]]]
                    for k in range(nu):
                        if diff >> k & 1:
                            assignment[units.units[k]] = dev
                    state, i, moved = ps, int(Q[sel[j]]), True
                    break
            if not moved:  # cannot happen: the values came from these transitions
                raise SolverError("internal: the contiguous-split DP could not trace back its optimum")
    return DpResult(value, assignment, units.exact, len(masks), npairs, time.perf_counter() - t0,
                    family if combine == "max" else f"{family}, sum")


def _with_dropped(problem: Problem, assignment: np.ndarray, dropped: list[int], objective: str,
                  microbatches) -> np.ndarray:
    """Put each dropped node on a neighbour's device (the best by the stage model's objective)."""
    a = assignment.copy()
    if not dropped:
        return a
    g = problem.graph
    group_of, groups = colocation_index(problem)
    todo = []
    seen = set()
    for v in dropped:
        unit = groups[group_of[v]] if group_of[v] >= 0 else [v]
        key = tuple(unit)
        if key not in seen:
            seen.add(key)
            todo.append(list(unit))
    placed = a >= 0
    for unit in todo:  # first guess: the device of a placed neighbour
        near = [a[w] for v in unit for w in g.preds(v) + g.succs(v) if placed[w]]
        a[unit] = near[0] if near else 0
    for _ in range(4):  # then the best neighbour's device, until nothing changes
        changed = False
        for unit in todo:
            cands = sorted({int(a[w]) for v in unit for w in g.preds(v) + g.succs(v)} | {int(a[unit[0]])})
            was, best, best_key = int(a[unit[0]]), None, None
            for dev in cands:
                if not np.isfinite(problem.costs[unit, dev]).all():
                    continue
                a[unit] = dev
                ev = evaluate(problem, Plan(a, device_orders(problem, a)), "stage", objective, microbatches)
                key = (len(ev.violations), ev.objective_value)
                if best_key is None or key < best_key:
                    best, best_key = dev, key
            a[unit] = was if best is None else best
            changed |= best is not None and best != was
        if not changed:
            break
    return a


def device_orders(problem: Problem, assignment: np.ndarray) -> list[list[int]]:
    """Each device's nodes in the graph's topological order (what a stage plan runs)."""
    pos = np.empty(problem.num_nodes, dtype=np.int64)
    pos[problem.graph.topo_order()] = np.arange(problem.num_nodes)
    return Plan.from_assignment(assignment, pos, problem.num_devices).order


def stage_plan(problem: Problem, r: DpResult, units: Units, solver: str, objective: str = "throughput",
               microbatches=None) -> Plan:
    """The plan of a DP result: dropped nodes put back, each device in topological order."""
    if not np.isfinite(r.value_s):
        raise InfeasibleError(f"{problem.graph.name}: no split into contiguous stages fits the memory of "
                              f"{problem.cluster.name} ({r.family} ideals); use devices with more memory")
    a = _with_dropped(problem, r.assignment, units.dropped, objective, microbatches)
    return Plan(a.astype(np.int32), device_orders(problem, a), solver=solver, info=r.info())


def dp_bound(problem: Problem, max_ideals: int = MAX_IDEALS) -> dict:
    """The DP optimum over every ideal as a lower bound on the stage model's device load.

    Returns
    -------
    dict
        ``bound_s`` (None when the DP does not apply: too many ideals, or a backward node
        without a forward twin; ``reason`` says which) and the DP's facts.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> from tvm_pesto.plan.objective import evaluate
    >>> plan = solve(problem)   # this module's: the stage model, throughput
    >>> dp_bound(problem)["bound_s"] <= evaluate(problem, plan, "stage", "throughput").objective_value
    True
    """
    try:
        r = dp_split(problem, "all", max_ideals=max_ideals)
    except SolverError as e:
        return {"bound_s": None, "reason": str(e)}
    value = r.value_s if np.isfinite(r.value_s) else None
    return {"bound_s": None if value is None else value * (1 - 1e-9), **r.info(),
            **({"reason": "no contiguous split fits the memory"} if value is None else {})}


def linearized_split(problem: Problem, orders: list[list[int]] | None = None, units: Units | None = None,
                     objective: str = "throughput", microbatches=None, solver: str = "stage-dp") -> Plan:
    """The best stage plan over the prefix-ideal DP of each order in ``orders`` (topological
    orders of the nodes; default: the graph's own order and a depth-first one), judged by the
    stage model's ``objective``.

    Raises
    ------
    InfeasibleError
        When no order gives a split that fits the devices' memory.
    """
    if units is None:
        try:  # forward units with their backward twins riding along, as in the exact DP
            units = dp_units(problem, drop_free=False)
        except SolverError:  # a backward node without a forward twin: intervals of the whole graph
            units = dp_units(problem, drop_free=False, all_passes=True)
    if orders is None:
        orders = [problem.graph.topo_order(), _dfs_order(problem)]
    best, best_key, facts = None, None, []
    for order in orders:
        seq, seen = [], set()
        for v in order:
            k = int(units.unit_of[v])
            if k >= 0 and k not in seen:
                seen.add(k)
                seq.append(k)
        seq = _topological_units(units.dag, seq)
        for combine in _combines(objective, microbatches):
            r = dp_split(problem, "prefix", order=seq, units=units, combine=combine)
            facts.append(r.value_s)
            if not np.isfinite(r.value_s):
                continue
            plan = stage_plan(problem, r, units, solver, objective, microbatches)
            ev = evaluate(problem, plan, "stage", objective, microbatches)
            key = (not ev.valid, ev.objective_value)
            if best_key is None or key < best_key:
                best, best_key = plan, key
    if best is None:
        raise InfeasibleError(f"{problem.graph.name}: no split of a topological order into contiguous stages fits "
                              f"the memory of {problem.cluster.name}; use devices with more memory")
    best.info["linearized_values_s"] = facts
    return best


def _value(problem: Problem, plan: Plan, objective: str, microbatches) -> float:
    return evaluate(problem, plan, "stage", objective, microbatches).objective_value


def _combines(objective: str, microbatches) -> tuple[str, ...]:
    """The DP versions worth trying for an objective: the max-load one always (it is the
    steady state's optimum and fills devices evenly), the sum one when latency counts."""
    return ("max",) if objective == "throughput" and microbatches is None else ("max", "sum")


def _dfs_order(problem: Problem) -> list[int]:
    """A depth-first topological order (each branch kept together)."""
    dag = problem.graph.dag
    indeg = {v: dag.in_degree(v) for v in dag}
    stack = sorted((v for v in dag if indeg[v] == 0), reverse=True)
    out = []
    while stack:
        v = stack.pop()
        out.append(v)
        ready = []
        for w in dag.successors(v):
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
        stack.extend(sorted(ready, reverse=True))
    return out


def _topological_units(dag: nx.DiGraph, seq: list[int]) -> list[int]:
    """``seq`` made topological for the unit graph (merged classes can arrive out of order):
    a unit waits until its predecessors are out, then keeps its place."""
    rank = {k: i for i, k in enumerate(seq)}
    return list(nx.lexicographical_topological_sort(dag, key=lambda k: rank.get(k, len(rank))))


def as_stage_plan(problem: Problem, plan: Plan, objective: str = "throughput", microbatches=None) -> Plan:
    """``plan`` (any placement) turned into a stage plan: its schedule order (op-model start
    times) split into contiguous stages by the prefix DP; the name and info stay, with
    ``info["stage_repair"]`` saying what was done. A plan that is already a valid stage plan
    is kept when the split is not better.
    """
    from ..plan.simulate import simulate

    try:
        sim = simulate(problem, plan, check_memory=False)
        order = [int(v) for v in np.lexsort((np.arange(problem.num_nodes), sim.start))]
    except PestoError:
        order = problem.graph.topo_order()
    split = linearized_split(problem, [order], objective=objective, microbatches=microbatches, solver=plan.solver)
    before = evaluate(problem, plan, "stage", objective, microbatches)
    after = evaluate(problem, split, "stage", objective, microbatches)
    info = dict(plan.info)
    if before.valid and before.objective_value <= after.objective_value:
        info["stage_repair"] = "none: already a valid stage plan"
        return Plan(plan.assignment, plan.order, solver=plan.solver, solve_s=plan.solve_s, info=info)
    info["stage_repair"] = (f"{plan.solver}'s schedule order split into contiguous stages by the prefix DP "
                            f"(as placed: {'valid' if before.valid else 'invalid: ' + before.violations[0]['kind']})")
    return Plan(split.assignment, split.order, solver=plan.solver, solve_s=plan.solve_s, info=info)


def heuristic_stage_plan(problem: Problem, heuristic, objective: str = "throughput", microbatches=None,
                         **options) -> Plan:
    """The plan of ``heuristic`` (a placement heuristic's solve function) as a stage plan: it
    places with the memory unchecked, since the split checks memory the stage model's way,
    and :func:`as_stage_plan` splits its schedule order into contiguous stages."""
    free = copy.copy(problem)
    free.capacity = np.full(problem.num_devices, 1e30)
    return as_stage_plan(problem, heuristic(free, **options), objective, microbatches)


def solve(problem: Problem, objective: str = "throughput", microbatches=None, max_ideals: int = MAX_IDEALS,
          deterministic: bool | None = None, time_limit_s: float | None = None, **_ignored) -> Plan:
    """Registry entry ``stage-dp``: the exact DP when the graph has at most ``max_ideals``
    ideals, else the linearised DP; the plan is valid in the stage model (co-located backward
    nodes follow their forward twins). Deterministic by construction (``deterministic`` and
    ``time_limit_s`` are accepted for a uniform interface).

    ``info``: the DP's facts (``dp_value_s``, ``dp_exact``, ``dp_ideals``, ``dp_pairs``,
    ``dp_ideal_family``), ``deterministic: True``.

    Raises
    ------
    InfeasibleError
        When no contiguous split fits the devices' memory.
    """
    del deterministic, time_limit_s
    t0 = time.perf_counter()
    try:
        units = dp_units(problem)
        plan, best_key = None, None
        for combine in _combines(objective, microbatches):
            r = dp_split(problem, "all", max_ideals=max_ideals, units=units, combine=combine)
            cand = stage_plan(problem, r, units, "stage-dp", objective, microbatches)
            ev = evaluate(problem, cand, "stage", objective, microbatches)
            if combine == "max" and objective == "throughput" and microbatches is None and ev.valid \
                    and ev.objective_value <= r.value_s * (1 + 1e-9):
                cand.info["status"] = "optimal"  # the DP's optimum bounds every stage plan, and it is met
            key = (not ev.valid, ev.objective_value)
            if best_key is None or key < best_key:
                plan, best_key = cand, key
        if not (objective == "throughput" and microbatches is None):  # the exact DP is a heuristic here
            try:
                lin = linearized_split(problem, objective=objective, microbatches=microbatches)
            except InfeasibleError:
                lin = None
            if lin is not None and (not evaluate(problem, lin, "stage", objective, microbatches).valid,
                                    _value(problem, lin, objective, microbatches)) < best_key:
                plan = lin
    except SolverError as e:
        plan = linearized_split(problem, objective=objective, microbatches=microbatches)
        plan.info["exact_dp_skipped"] = str(e)
    plan.info.update(source="stage-dp", deterministic=True)
    plan.solve_s = time.perf_counter() - t0
    return plan


__all__ = ["DpResult", "MAX_IDEALS", "MAX_PAIRS", "Units", "all_ideals", "as_stage_plan", "device_classes",
           "device_orders", "dp_bound", "dp_split", "dp_units", "heuristic_stage_plan", "linearized_split",
           "prefix_ideals", "solve", "stage_plan"]
