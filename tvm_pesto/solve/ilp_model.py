"""Pesto's placement + scheduling ILP, generalised to N devices: one problem -> one MIP -> a Plan.

:func:`build_ilp` builds the model, :func:`extract_plan` reads a plan from its solution and
:func:`solve_ilp` does both around :func:`tvm_pesto.solve.mip.solve_mip`. Coarsening and
local search around it live in :mod:`tvm_pesto.solve.ilp` (the registry's ``"ilp"``).

The model is exact for the semantics of :mod:`tvm_pesto.plan.reference`: for a fixed
placement and per-device orders, the simulator's schedule is the earliest schedule the
constraints allow, so the ILP optimum equals the best simulated makespan over all
placements and orders (when solved to a zero gap).

Variables (times are scaled so the upper bound ``UB`` is 1000, bytes by the largest tensor):

* ``x[v,d]`` binary, node ``v`` runs on device ``d``;
* ``S[v]``, ``C[v]`` start and completion of ``v``; ``M`` the makespan (objective);
* per producer ``u`` and possible destination device ``e`` (a device some consumer of ``u``
  can run on): ``T[u,e]`` start of the transfer of ``u``'s output to ``e``, ``dur[u,e]`` its
  duration, ``act[u,e]`` whether it happens and ``r[u,e]`` the bytes it carries (the largest
  edge from ``u`` to a consumer on ``e``, as the simulator sends one transfer per producer and
  destination device). When every out-edge of ``u`` has the same size, ``r = bytes * act``.
* ``y[u,w]`` binary, ``u`` runs before ``w`` if they share a device, created only for pairs
  with no path between them (``networkx.transitive_closure_dag``); ``same[u,w]`` is 1 when
  they share a device (continuous, bounded below by ``x[u,a] + x[w,a] - 1``).

Constraints (each named): ``assign`` one device per node; ``noplace`` no device where the
cost is infinite; ``finish`` C = S + sum_d cost x; ``prec`` S[v] >= C[u] on every edge;
``txready`` a transfer starts after its producer; ``act``/``recv`` a transfer is needed when a
consumer is on another device (linearised as ``act[u,e] >= x[v,e] - x[u,e]``); ``dur`` its
duration is ``latency + bytes / bandwidth`` of the link from the producer's device;
``arrive`` a consumer on ``e`` starts after the transfer to ``e`` ends; ``order`` two nodes on
one device do not overlap (disjunctive, big-M = UB); ``fifo`` two transfers on one directed
link do not overlap and go in the order their producers ran (the simulator's FIFO link:
producers on one device finish in that device's order); ``mem`` per-device memory, received
tensors included; ``coloc`` co-location groups; ``span`` M >= C[v] + the cheapest path after
``v``; ``load`` M >= the busy time of each device (a valid cut); ``S[v]`` is bounded below by
the cheapest path of predecessors.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import pulp

from ..errors import InfeasibleError, PlanError, SolverError
from ..plan import Plan, Problem, simulate
from .budget import mode_name
from .mip import add_var, lin, solve_mip
from .portfolio import run_heuristics

_SCALE = 1000.0  # UB in model time units


@dataclass
class IlpVars:
    """The variables of a built ILP and the scales that map them back to seconds/bytes."""

    x: dict
    S: list
    C: list
    M: pulp.LpVariable
    T: dict = field(default_factory=dict)
    dur: dict = field(default_factory=dict)
    act: dict = field(default_factory=dict)
    r: dict = field(default_factory=dict)
    y: dict = field(default_factory=dict)
    same: dict = field(default_factory=dict)
    time_scale: float = 1.0
    byte_scale: float = 1.0
    ub_s: float = 0.0
    topo_pos: np.ndarray | None = None
    fixed_pairs: int = 0
    B: pulp.LpVariable | None = None
    w: dict = field(default_factory=dict)


def _adjacency(problem: Problem):
    n = problem.num_nodes
    succ: list[list[int]] = [[] for _ in range(n)]
    pred: list[list[int]] = [[] for _ in range(n)]
    eb: dict[tuple[int, int], float] = {}
    for u, v, b in zip(problem.src.tolist(), problem.dst.tolist(), problem.ebytes.tolist()):
        succ[u].append(v)
        pred[v].append(u)
        eb[(u, v)] = b
    return succ, pred, eb


def _feasible_sets(problem: Problem) -> list[set[int]]:
    """Devices each node may use: finite cost, intersected over its co-location groups."""
    fin = np.isfinite(problem.costs)
    feas = [set(np.flatnonzero(fin[v]).tolist()) for v in range(problem.num_nodes)]
    for grp in problem.colocate:
        common = set.intersection(*(feas[v] for v in grp)) if grp else set()
        if grp and not common:
            raise InfeasibleError(f"co-location group {list(grp)} has no device every member can run on; "
                                  "give its members a common device with finite cost")
        for v in grp:
            feas[v] = set(common)
    return feas


def generic_upper_bound(problem: Problem) -> float:
    """A makespan no semi-active schedule exceeds: all node costs plus all transfers in series.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(8, cluster="2xV100-nvlink")   # 8 ops, 2 GPUs
    >>> generic_upper_bound(problem) > 0
    True
    """
    c = np.where(np.isfinite(problem.costs), problem.costs, 0.0).max(axis=1)
    total = float(c.sum())
    d = problem.num_devices
    if d > 1 and len(problem.src):
        off = ~np.eye(d, dtype=bool)
        lat = float(problem.latency[off].max())
        ib = float(problem.inv_bw[off].max())
        maxb = np.zeros(problem.num_nodes)
        np.maximum.at(maxb, problem.src, problem.ebytes)
        producers = maxb[np.bincount(problem.src, minlength=problem.num_nodes) > 0]
        total += float(((lat + producers * ib) * (d - 1)).sum())
    return total


def _transfer_values(problem: Problem, plan: Plan, sim, producers_dest: dict[int, list[int]]):
    """Warm values (seconds/bytes) of T, dur, act, r from a simulated plan."""
    tx = {(int(row[0]), int(row[2])): (row[3], row[4], row[5]) for row in sim.transfers}
    vals = {}
    for a, seq in enumerate(plan.order):
        for e in range(problem.num_devices):
            running = 0.0
            for u in seq:
                if e not in producers_dest.get(u, ()):
                    continue
                if (u, e) in tx:
                    s, _end, b = tx[(u, e)]
                    dur = problem.latency[a, e] + b * problem.inv_bw[a, e]
                    vals[(u, e)] = (float(s), float(dur), 1.0, float(b))
                    running = max(running, s + dur)
                else:
                    vals[(u, e)] = (max(float(sim.finish[u]), running), 0.0, 0.0, 0.0)
    return vals


def build_ilp(problem: Problem, warm_start: Plan | None = None, pairs: int | None = None,
              upper_bound_s: float | None = None, objective: str = "latency", microbatches: int | None = None,
              release: np.ndarray | None = None, tails: np.ndarray | None = None, warm_sim=None):
    """Build the placement + scheduling ILP for ``problem``.

    Parameters
    ----------
    problem : Problem
        Graph, cluster and cost table.
    warm_start : Plan, optional
        A memory-feasible plan; its simulated makespan becomes the big-M/upper bound and
        every variable gets its value (``setInitialValue``) so the solver starts from it.
    pairs : int, optional
        ``None`` (default): every pair of nodes with no path between them gets an ordering
        binary (exact model). An int ``k``: only pairs whose ranks differ by at most ``k``
        get one; farther pairs keep the rank order (warm-start start times, else topological
        order) when they share a device. That restricts the search, so the model stays
        sound (every solution is a real schedule) but may miss the optimum.
    upper_bound_s : float, optional
        Makespan bound in seconds; default: the warm start's makespan, else
        :func:`generic_upper_bound` (for ``objective="throughput"``: the generic bound, or
        ``K`` times the warm start's time per sample when smaller).
    objective : {"latency", "throughput"}
        ``latency`` minimises the makespan ``M``. ``throughput`` minimises the time per
        sample ``(M + (K - 1) * B) / K`` (:func:`tvm_pesto.plan.objective.time_per_sample`,
        ``K = microbatches``; steady state ``B + 1e-3 M`` when None), where the bottleneck
        ``B`` is at least every device's busy time and every directed link's transfer time
        (``w[u,a,e]``: the time of ``u``'s transfer to ``e`` when ``u`` is on ``a``).
    release : array, shape (num_nodes, num_devices), optional
        Earliest start of each node on each device in seconds (``S[v] >= release[v, d]``
        when ``v`` runs on ``d``): inputs and devices still busy outside the model, as in a
        window of a larger schedule (:mod:`tvm_pesto.solve.lns`).
    tails : array, shape (num_nodes, num_devices), optional
        Time that must still follow each node on each device (``M >= C[v] + tails[v, d]``).
    warm_sim : SimResult, optional
        The warm start's schedule when it is not what simulating ``warm_start`` on
        ``problem`` gives (a window cut out of a larger schedule, in that schedule's times).

    Returns
    -------
    (pulp.LpProblem, IlpVars)

    Raises
    ------
    PlanError, InfeasibleError
        If the warm start is not a valid plan for ``problem``.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(8, cluster="2xV100-nvlink")   # 8 ops, 2 GPUs
    >>> prob, v = build_ilp(problem)
    >>> prob.numConstraints() > 0
    True
    """
    n, D = problem.num_nodes, problem.num_devices
    costs = problem.costs
    succ, pred, eb = _adjacency(problem)
    feas = _feasible_sets(problem)
    topo = problem.graph.topo_order()
    topo_pos = np.empty(n, dtype=np.int64)
    topo_pos[topo] = np.arange(n)

    sim = warm_sim
    if warm_start is not None and sim is None:
        sim = simulate(problem, warm_start)
    throughput = objective == "throughput"
    if objective not in ("latency", "throughput"):
        raise SolverError(f"unknown ILP objective {objective!r}; use 'latency' or 'throughput'")
    if upper_bound_s is None:
        if throughput:
            upper_bound_s = generic_upper_bound(problem)
            if sim is not None and microbatches:
                upper_bound_s = min(upper_bound_s, float(microbatches) * _warm_time_per_sample(problem, sim,
                                                                                               microbatches))
        else:
            upper_bound_s = sim.makespan if sim is not None else generic_upper_bound(problem)
        if sim is not None:
            upper_bound_s = max(upper_bound_s, sim.makespan)
    ub_s = float(upper_bound_s) * (1 + 1e-7) + 1e-15
    ts = _SCALE / ub_s if ub_s > 0 else 1.0
    UB = ub_s * ts
    maxb = float(problem.ebytes.max()) if len(problem.ebytes) else 1.0
    bs = 1.0 / maxb if maxb > 0 else 1.0

    prob = pulp.LpProblem(f"pesto_{re.sub(r'[^A-Za-z0-9_]', '_', problem.graph.name)}", pulp.LpMinimize)
    x = {(v, d): add_var(prob, f"x_{v}_{d}", cat=pulp.LpBinary) for v in range(n) for d in range(D)}
    # earliest start: the cheapest path of predecessors (a valid bound that tightens the LP)
    head = np.zeros(n)
    for v in topo:
        for u in pred[v]:
            head[v] = max(head[v], head[u] + min(costs[u, d] for d in feas[u]) * ts)
    S = [add_var(prob, f"S_{v}", min(float(head[v]) * (1 - 1e-9), UB), UB) for v in range(n)]
    C = [add_var(prob, f"C_{v}", 0, UB) for v in range(n)]
    M = add_var(prob, "M", 0, UB)
    V = IlpVars(x=x, S=S, C=C, M=M, time_scale=ts, byte_scale=bs, ub_s=ub_s, topo_pos=topo_pos)
    prob += lin([(M, 1.0)]), "makespan"

    # placement
    for v in range(n):
        prob += pulp.LpConstraint(lin([(x[v, d], 1.0) for d in range(D)]), pulp.LpConstraintEQ,
                                  rhs=1.0), f"assign_{v}"
        for d in range(D):
            if d not in feas[v]:
                prob += pulp.LpConstraint(lin([(x[v, d], 1.0)]), pulp.LpConstraintEQ, rhs=0.0), f"noplace_{v}_{d}"
        terms = [(C[v], 1.0), (S[v], -1.0)] + [(x[v, d], -costs[v, d] * ts) for d in sorted(feas[v])]
        prob += pulp.LpConstraint(lin(terms), pulp.LpConstraintEQ, rhs=0.0), f"finish_{v}"
    for g, grp in enumerate(problem.colocate):
        grp = list(grp)
        for v in grp[1:]:
            for d in sorted(feas[grp[0]]):
                prob += pulp.LpConstraint(lin([(x[v, d], 1.0), (x[grp[0], d], -1.0)]), pulp.LpConstraintEQ,
                                          rhs=0.0), f"coloc_{g}_{v}_{d}"

    # transfers: one per (producer, destination device)
    dest: dict[int, list[int]] = {}
    uniform: dict[int, float] = {}
    for u in range(n):
        if not succ[u]:
            continue
        dest[u] = sorted(set().union(*(feas[v] for v in succ[u])))
        bset = {eb[(u, v)] for v in succ[u]}
        bmax = max(bset)
        if len(bset) == 1:
            uniform[u] = bmax
        for e in dest[u]:
            T = V.T[u, e] = add_var(prob, f"T_{u}_{e}", 0, UB)
            dur = V.dur[u, e] = add_var(prob, f"dur_{u}_{e}", 0, UB)
            act = V.act[u, e] = add_var(prob, f"act_{u}_{e}", 0, 1)
            if u not in uniform:
                V.r[u, e] = add_var(prob, f"r_{u}_{e}", 0, bmax * bs)
            prob += pulp.LpConstraint(lin([(T, 1.0), (C[u], -1.0)]), pulp.LpConstraintGE, rhs=0.0), f"txready_{u}_{e}"
            prob += pulp.LpConstraint(lin([(T, 1.0), (dur, 1.0)]), pulp.LpConstraintLE, rhs=UB), f"arrive_ub_{u}_{e}"
            for v in succ[u]:
                if e not in feas[v]:
                    continue
                prob += pulp.LpConstraint(lin([(act, 1.0), (x[v, e], -1.0), (x[u, e], 1.0)]),
                                          pulp.LpConstraintGE, rhs=0.0), f"act_{u}_{v}_{e}"
                if u not in uniform:
                    b = eb[(u, v)] * bs
                    prob += pulp.LpConstraint(lin([(V.r[u, e], 1.0), (x[v, e], -b), (x[u, e], b)]),
                                              pulp.LpConstraintGE, rhs=0.0), f"recv_{u}_{v}_{e}"
            for a in sorted(feas[u]):
                if a == e:
                    continue
                lat = problem.latency[a, e] * ts
                k = problem.inv_bw[a, e] * ts / bs  # model time per scaled byte
                big = lat + k * bmax * bs
                if u in uniform:
                    terms = [(dur, 1.0), (act, -big), (x[u, a], -big)]
                else:
                    terms = [(dur, 1.0), (act, -lat), (V.r[u, e], -k), (x[u, a], -big)]
                prob += pulp.LpConstraint(lin(terms), pulp.LpConstraintGE, rhs=-big), f"dur_{u}_{e}_{a}"

    def recv_expr(u, e):
        if u in uniform:
            return [(V.act[u, e], uniform[u] * bs)]
        return [(V.r[u, e], 1.0)]

    # precedence
    for u, v in zip(problem.src.tolist(), problem.dst.tolist()):
        prob += pulp.LpConstraint(lin([(S[v], 1.0), (C[u], -1.0)]), pulp.LpConstraintGE, rhs=0.0), f"prec_{u}_{v}"
        for e in sorted(feas[v]):
            prob += pulp.LpConstraint(
                lin([(S[v], 1.0), (V.T[u, e], -1.0), (V.dur[u, e], -1.0), (x[v, e], -UB)]),
                pulp.LpConstraintGE, rhs=-UB), f"arrive_{u}_{v}_{e}"

    # ordering of pairs that may share a device
    closure = nx.transitive_closure_dag(problem.graph.dag)
    if sim is not None:
        rank_key = np.lexsort((topo_pos, sim.start))
        rank = np.empty(n, dtype=np.int64)
        rank[rank_key] = np.arange(n)
    else:
        rank = topo_pos
    is_prod = [bool(succ[v]) for v in range(n)]
    for u in range(n):
        for w in range(u + 1, n):
            common = feas[u] & feas[w]
            if not common:
                continue
            if closure.has_edge(u, w):
                first, second, free = u, w, False
            elif closure.has_edge(w, u):
                first, second, free = w, u, False
            else:
                first, second = (u, w) if rank[u] < rank[w] else (w, u)
                free = pairs is None or abs(int(rank[u]) - int(rank[w])) <= pairs
                if not free:
                    V.fixed_pairs += 1
            if not free and closure.has_edge(first, second) and not (is_prod[u] and is_prod[w]):
                continue  # a path orders them and no shared link can matter
            same = V.same[u, w] = add_var(prob, f"same_{u}_{w}", 0, 1)
            for a in sorted(common):
                prob += pulp.LpConstraint(lin([(same, 1.0), (x[u, a], -1.0), (x[w, a], -1.0)]),
                                          pulp.LpConstraintGE, rhs=-1.0), f"same_{u}_{w}_{a}"
            if free:
                y = V.y[first, second] = add_var(prob, f"y_{first}_{second}", cat=pulp.LpBinary)
                # first before second (y = 1): relaxed by UB * (2 - y - same);
                # second before first (y = 0): relaxed by UB * (1 + y - same)
                orders = [(first, second, [(y, -UB)], 2 * UB), (second, first, [(y, UB)], UB)]
            else:
                orders = [(first, second, [], UB)]
            for p, q, yterm, rhs_relax in orders:
                if not closure.has_edge(p, q):
                    prob += pulp.LpConstraint(lin([(S[q], 1.0), (C[p], -1.0), (same, -UB)] + yterm),
                                              pulp.LpConstraintGE, rhs=-rhs_relax), f"order_{p}_{q}"
                if is_prod[p] and is_prod[q]:
                    for e in sorted(set(dest[p]) & set(dest[q])):
                        prob += pulp.LpConstraint(
                            lin([(V.T[q, e], 1.0), (V.T[p, e], -1.0), (V.dur[p, e], -1.0), (same, -UB)] + yterm),
                            pulp.LpConstraintGE, rhs=-rhs_relax), f"fifo_{p}_{q}_{e}"

    # memory
    mem = problem.mem
    for d in range(D):
        terms = [(x[v, d], mem[v] * bs) for v in range(n) if d in feas[v] and mem[v] > 0]
        for u in dest:
            if d in dest[u]:
                terms += recv_expr(u, d)
        if terms:
            prob += pulp.LpConstraint(lin(terms), pulp.LpConstraintLE, rhs=problem.capacity[d] * bs), f"mem_{d}"

    # makespan: M >= C[v] + (cheapest remaining path after v); for sinks that is M >= C[v]
    minc = np.array([min(costs[v, d] for d in feas[v]) for v in range(n)]) * ts
    tail = np.zeros(n)
    for v in reversed(topo):
        if succ[v]:
            tail[v] = max(minc[w] + tail[w] for w in succ[v])
    for v in range(n):
        prob += pulp.LpConstraint(lin([(M, 1.0), (C[v], -1.0)]), pulp.LpConstraintGE, rhs=float(tail[v])), f"span_{v}"
    # valid cuts that tighten the LP bound: a device runs its nodes one at a time
    for d in range(D):
        terms = [(x[v, d], -costs[v, d] * ts) for v in range(n) if d in feas[v]]
        if terms:
            prob += pulp.LpConstraint(lin([(M, 1.0)] + terms), pulp.LpConstraintGE, rhs=0.0), f"load_{d}"

    if release is not None:
        rel = np.asarray(release, dtype=np.float64) * ts
        for v in range(n):
            terms = [(x[v, d], -float(rel[v, d])) for d in sorted(feas[v]) if rel[v, d] > 0]
            if terms:
                prob += pulp.LpConstraint(lin([(S[v], 1.0)] + terms), pulp.LpConstraintGE, rhs=0.0), f"release_{v}"
    if tails is not None:
        tl = np.asarray(tails, dtype=np.float64) * ts
        for v in range(n):
            terms = [(x[v, d], -float(tl[v, d])) for d in sorted(feas[v]) if tl[v, d] > 0]
            if terms:
                prob += pulp.LpConstraint(lin([(M, 1.0), (C[v], -1.0)] + terms), pulp.LpConstraintGE,
                                          rhs=0.0), f"tail_{v}"
    if throughput:
        _add_bottleneck(problem, prob, V, feas, dest, UB, microbatches)

    if sim is not None:
        _set_warm_values(problem, warm_start, sim, V, dest, uniform)
    return prob, V


def _warm_time_per_sample(problem: Problem, sim, microbatches) -> float:
    from ..plan.objective import op_loads, time_per_sample

    busy, links = op_loads(problem, sim)
    return time_per_sample(sim.makespan, max(busy.max(initial=0.0), links.max(initial=0.0)), microbatches)


def _add_bottleneck(problem: Problem, prob, V: IlpVars, feas, dest, UB: float, microbatches) -> None:
    """The throughput objective: ``B`` >= each device's busy time and each link's transfers."""
    n, D = problem.num_nodes, problem.num_devices
    ts = V.time_scale
    V.B = B = add_var(prob, "B", 0, UB)
    for d in range(D):
        terms = [(V.x[v, d], -problem.costs[v, d] * ts) for v in range(n) if d in feas[v]]
        if terms:
            prob += pulp.LpConstraint(lin([(B, 1.0)] + terms), pulp.LpConstraintGE, rhs=0.0), f"busy_{d}"
    links: dict[tuple[int, int], list] = {}
    for u, es in dest.items():
        for e in es:
            for a in sorted(feas[u]):
                if a == e:
                    continue
                w = V.w[u, a, e] = add_var(prob, f"w_{u}_{a}_{e}", 0, UB)
                prob += pulp.LpConstraint(lin([(w, 1.0), (V.dur[u, e], -1.0), (V.x[u, a], -UB)]),
                                          pulp.LpConstraintGE, rhs=-UB), f"w_{u}_{a}_{e}"
                links.setdefault((a, e), []).append(w)
    for (a, e), ws in links.items():
        prob += pulp.LpConstraint(lin([(B, 1.0)] + [(w, -1.0) for w in ws]), pulp.LpConstraintGE,
                                  rhs=0.0), f"link_{a}_{e}"
    k = float(microbatches) if microbatches else None
    prob.setObjective(lin([(V.M, 1.0 / k), (B, 1.0 - 1.0 / k)]) if k else lin([(B, 1.0), (V.M, 1e-3)]))


def _init(var: pulp.LpVariable, value: float) -> None:
    """setInitialValue, clipped into the variable's bounds (float noise of the simulator)."""
    if var.lowBound is not None:
        value = max(value, var.lowBound)
    if var.upBound is not None:
        value = min(value, var.upBound)
    var.setInitialValue(value)


def _set_warm_values(problem, plan, sim, V: IlpVars, dest, uniform):
    ts, bs = V.time_scale, V.byte_scale
    n, D = problem.num_nodes, problem.num_devices
    a = plan.assignment
    for v in range(n):
        for d in range(D):
            _init(V.x[v, d], 1.0 if a[v] == d else 0.0)
        _init(V.S[v], float(sim.start[v]) * ts)
        _init(V.C[v], float(sim.finish[v]) * ts)
    _init(V.M, float(sim.makespan) * ts)
    pos = np.zeros(n, dtype=np.int64)
    for seq in plan.order:
        for k, v in enumerate(seq):
            pos[v] = k
    for (u, e), (s, dur, act, b) in _transfer_values(problem, plan, sim, dest).items():
        _init(V.T[u, e], s * ts)
        _init(V.dur[u, e], dur * ts)
        _init(V.act[u, e], act)
        if (u, e) in V.r:
            _init(V.r[u, e], b * bs)
    for (u, w), var in V.same.items():
        _init(var, 1.0 if a[u] == a[w] else 0.0)
    for (p, q), var in V.y.items():
        before = pos[p] < pos[q] if a[p] == a[q] else sim.start[p] <= sim.start[q]
        _init(var, 1.0 if before else 0.0)
    if V.B is not None:
        tv = _transfer_values(problem, plan, sim, dest)
        busy = np.zeros(D)
        np.add.at(busy, a, problem.costs[np.arange(n), a])
        link = np.zeros((D, D))
        for (u, a_, e), var in V.w.items():
            dur = tv.get((u, e), (0.0, 0.0, 0.0, 0.0))[1] if a[u] == a_ else 0.0
            _init(var, dur * ts)
            link[a_, e] += dur
        _init(V.B, max(busy.max(initial=0.0), link.max(initial=0.0)) * ts)


def extract_plan(problem: Problem, V: IlpVars) -> Plan:
    """Read a plan from solved variables: device = largest ``x``, order = by start time.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(8, cluster="2xV100-nvlink")   # 8 ops, 2 GPUs
    >>> from tvm_pesto.solve.mip import solve_mip
    >>> prob, V = build_ilp(problem)
    >>> solve_mip(prob, "cbc", time_limit_s=10).status
    'optimal'
    >>> plan = extract_plan(problem, V)
    >>> len(plan.assignment), sum(len(o) for o in plan.order)
    (8, 8)
    """
    n, D = problem.num_nodes, problem.num_devices
    xv = np.array([[V.x[v, d].value() or 0.0 for d in range(D)] for v in range(n)]).reshape(n, D)
    assignment = xv.argmax(axis=1) if n else np.zeros(0, dtype=np.int64)
    s = np.array([V.S[v].value() or 0.0 for v in range(n)])
    c = np.array([V.C[v].value() or 0.0 for v in range(n)])
    order = [sorted(np.flatnonzero(assignment == d).tolist(), key=lambda v: (round(s[v], 6), round(c[v], 6),
                                                                              V.topo_pos[v]))
             for d in range(D)]
    return Plan(assignment, order, solver="ilp")




def solve_ilp(problem: Problem, time_limit_s: float = 30.0, solver: str = "cbc", warm_start: Plan | None = None,
              gap: float | None = 1e-4, pairs: int | None = None, msg: bool = False,
              threads: int | None = None, deterministic: bool | None = None, objective: str = "latency",
              microbatches: int | None = None, floor_s: float | None = None) -> Plan:
    """Solve the placement + scheduling ILP and return the best plan found.

    Parameters
    ----------
    problem : Problem
    time_limit_s : float
        Limit for the MIP solver itself (model building is extra).
    solver : {"cbc", "highs"}
        CBC through PuLP (a system ``cbc`` if present, else PuLP's bundled one) or HiGHS
        through highspy. When it crashes, the other one is tried.
    warm_start : Plan, optional
        Start point and upper bound. Default: the best heuristic's plan for ``objective``
        (:func:`tvm_pesto.solve.portfolio.run_heuristics`).
    gap : float, optional
        Relative MIP gap at which to stop (``0`` proves optimality).
    pairs : int, optional
        Ordering-binary window, see :func:`build_ilp` (``optimal`` then means optimal for
        the restricted model).
    deterministic : bool, optional
        A node limit (from ``time_limit_s``), one thread and a fixed seed instead of the time
        limit, so the plan is the same on any machine (:mod:`tvm_pesto.solve.budget`);
        default: the ambient mode.
    objective, microbatches
        What to minimise, see :func:`build_ilp`; plans are compared on it (op model), and
        ``info["objective_value_s"]`` is the returned plan's.
    floor_s : float, optional
        A lower bound on the objective that the caller knows (seconds). When the warm start
        is within ``gap`` of it, the MIP is not built: the warm start is returned with
        ``status`` ``optimal`` and ``proven_by`` ``"lower bound"``.

    Returns
    -------
    Plan
        ``solver="ilp"``. ``info["status"]`` is the solver's real outcome
        (:data:`tvm_pesto.solve.mip.STATUSES`): ``optimal`` only when the solver proved it
        within ``gap``; ``time_limit`` when it stopped at ``time_limit_s`` (``objective`` is
        then the incumbent's, ``mip_gap`` its gap to ``bound``); ``node_limit`` when it
        stopped at its node limit (deterministic mode); ``infeasible`` when the
        model has no solution below the warm start's makespan; ``solver_failed`` when every
        solver crashed. Also ``timed_out``, ``mip_gap``, ``objective`` and ``bound``
        (seconds, when the solver reports them), ``solver_status`` (the solver's own words),
        ``pulp_status``, ``solver_backend``, ``budget`` (``"work"`` or ``"wall-clock"``),
        ``node_limit``, ``deterministic`` (no clock decided the result; else
        ``deterministic_reason``), ``num_vars``, ``num_constraints``,
        ``makespan_s`` (simulated) and ``source`` (``"ilp"``, or ``"warm_start"`` when the
        ILP found nothing better). The plan is never worse (simulated) than the warm start.
        When the warm start is chosen here: ``heuristic_makespans_s`` and, for each heuristic
        that failed, ``heuristic_errors`` (name -> ``"Type: message"``,
        :func:`tvm_pesto.solve.portfolio.run_heuristics`).

    Raises
    ------
    SolverError
        If the solver is missing, or it found no solution and there is no warm start.
    InfeasibleError
        If the model is infeasible and there is no warm start (usually memory: no
        heuristic found a plan that fits either).

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(8, cluster="2xV100-nvlink")   # 8 ops, 2 GPUs
    >>> plan = solve_ilp(problem, time_limit_s=10)
    >>> plan.info["status"]
    'optimal'
    """
    t0 = time.perf_counter()
    heur_spans, heur_errors = {}, {}
    if warm_start is None:
        runs = run_heuristics(problem)
        heur_spans, heur_errors = runs.makespans, runs.errors
        warm_start = runs.best()
        if objective != "latency":  # the best start for this objective, not for the makespan
            warm_start = runs.best(_scorer(problem, objective, microbatches)) or warm_start
    warm_sim, warm_rejected = None, None
    if warm_start is not None:
        try:
            warm_sim = simulate(problem, warm_start)
        except (InfeasibleError, PlanError) as e:
            warm_start, warm_rejected = None, str(e)
    if problem.num_nodes == 0:
        return Plan(np.zeros(0), [[] for _ in range(problem.num_devices)], solver="ilp",
                    info={"status": "optimal", "timed_out": False, "mip_gap": 0.0, "objective": 0.0, "bound": 0.0,
                          "makespan_s": 0.0, "source": "ilp", "note": "empty graph",
                          "budget": mode_name(deterministic), "deterministic": True})
    score = _scorer(problem, objective, microbatches)
    warm_value = score(warm_sim) if warm_sim is not None else None
    if warm_value is not None and floor_s and gap and warm_value <= floor_s * (1 + gap):
        # the MIP could prove no more than the bound does (its root alone can take many seconds)
        info = {"status": "optimal", "proven_by": "lower bound", "lower_bound_s": float(floor_s), "timed_out": False,
                "mip_gap": float(warm_value / floor_s - 1), "source": "warm_start",
                "makespan_s": warm_sim.makespan, "objective_value_s": warm_value,
                "warm_start_makespan_s": warm_sim.makespan, "warm_start_solver": warm_start.solver,
                "time_limit_s": time_limit_s, "optimised": objective, "budget": mode_name(deterministic),
                "deterministic": True}
        if heur_spans:
            info["heuristic_makespans_s"] = heur_spans
        if heur_errors:
            info["heuristic_errors"] = heur_errors
        return Plan(warm_start.assignment.copy(), [list(o) for o in warm_start.order], solver="ilp",
                    solve_s=time.perf_counter() - t0, info=info)
    prob, V = build_ilp(problem, warm_start, pairs=pairs, objective=objective, microbatches=microbatches)
    t_build = time.perf_counter() - t0
    res = solve_mip(prob, solver, time_limit_s=time_limit_s, gap=gap, msg=msg, threads=threads,
                    deterministic=deterministic)
    info = {"num_vars": len(prob.variables()), "num_constraints": prob.numConstraints(),
            "num_order_binaries": len(V.y), "fixed_pairs": V.fixed_pairs, "build_s": t_build,
            "time_limit_s": time_limit_s, "upper_bound_s": V.ub_s, **res.info(V.time_scale)}
    if heur_spans:
        info["heuristic_makespans_s"] = heur_spans
    if heur_errors:
        info["heuristic_errors"] = heur_errors
    if warm_rejected:
        info["warm_start_rejected"] = warm_rejected
    if res.status == "solver_failed":
        note = f"the ILP solvers failed ({'; '.join(res.failures)})"
        if warm_start is None:
            raise SolverError(f"{note}; use a heuristic solver or pass warm_start") from None
        info.update(source="warm_start", note=f"{note}; returning the warm start", makespan_s=warm_sim.makespan,
                    warm_start_makespan_s=warm_sim.makespan, warm_start_solver=warm_start.solver)
        return Plan(warm_start.assignment.copy(), [list(o) for o in warm_start.order], solver="ilp",
                    solve_s=time.perf_counter() - t0, info=info)
    if res.status == "infeasible" and warm_start is None:
        raise InfeasibleError(f"{problem.graph.name}: the ILP has no feasible placement; most likely the "
                              "devices lack memory for the weights and received tensors, or co-location "
                              "groups cannot fit on one device; add devices or memory")
    plan = None
    if res.has_solution:
        plan = extract_plan(problem, V)
        try:
            sim = simulate(problem, plan)
            info["makespan_s"] = sim.makespan
            info["objective_value_s"] = score(sim)
            info["source"] = "ilp"
        except (PlanError, InfeasibleError) as e:  # tolerance artefacts: fall back below
            info["extract_error"] = str(e)
            plan = None
    if warm_start is not None:
        if plan is None:
            info["source"] = "warm_start"
            info["note"] = "the ILP found no usable solution; returning the warm start"
        elif info["objective_value_s"] > warm_value * (1 + 1e-9):
            info["source"] = "warm_start"
            info["note"] = (f"the ILP's plan simulates to {info['objective_value_s']:.6g} s ({objective}), worse "
                            f"than the warm start's {warm_value:.6g} s; returning the warm start")
            plan = None
        if plan is None:
            plan = Plan(warm_start.assignment.copy(), [list(o) for o in warm_start.order], solver="ilp")
            info["makespan_s"] = warm_sim.makespan
            info["objective_value_s"] = warm_value
        info["warm_start_makespan_s"] = warm_sim.makespan
        info["warm_start_solver"] = warm_start.solver
    elif plan is None:
        raise SolverError(f"{problem.graph.name}: the ILP found no solution within its {time_limit_s} s budget "
                          f"(status {res.status}) and there is no warm start; raise time_limit_s or pass "
                          "warm_start=<a heuristic plan>")
    plan.solve_s = time.perf_counter() - t0
    info["optimised"] = objective
    plan.info = info
    return plan


def _scorer(problem: Problem, objective: str, microbatches):
    """A simulated plan's value for ``objective`` in the op model."""
    if objective == "latency":
        return lambda sim: float(sim.makespan)
    return lambda sim: _warm_time_per_sample(problem, sim, microbatches)


__all__ = ["IlpVars", "build_ilp", "extract_plan", "generic_upper_bound", "solve_ilp"]
