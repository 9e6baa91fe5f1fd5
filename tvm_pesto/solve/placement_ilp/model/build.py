"""Pesto's placement + scheduling ILP, generalised to N devices: one problem -> one MIP -> a Plan.

:func:`build_ilp` builds the model (its constraint families in :mod:`.constraints`, a warm
start's values from :mod:`.warm`) and :func:`extract_plan` reads a plan from its solution;
:func:`tvm_pesto.solve.placement_ilp.warm_solve.solve_ilp` does both around
:func:`tvm_pesto.solve.mip.solve_mip`. Coarsening and local search around it live in
:mod:`tvm_pesto.solve.placement_ilp.driver` (the registry's ``"ilp"``).

The model is exact for the semantics of :mod:`tvm_pesto.plan.reference`: for a fixed
placement and per-device orders, the simulator's schedule is the earliest schedule the
constraints allow, so the ILP optimum equals the best simulated makespan over all
placements and orders (when solved to a zero gap).

Variables (times are scaled so the upper bound ``UB`` is :data:`tvm_pesto.solve.mip.MIP_TIME_SCALE`, bytes by
the largest tensor):

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
from dataclasses import dataclass, field

import numpy as np
import pulp

from ....errors import InfeasibleError, SolverError
from ....plan import Plan, Problem, simulate
from ....plan.objective import op_loads, time_per_sample
from ...mip import MIP_TIME_SCALE, add_var, lin
from .constraints import (ModelParts, add_bottleneck, add_makespan_cuts, add_memory, add_orders,
                              add_placement, add_precedence, add_transfers, add_window)
from .warm import set_warm_values


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
        window of a larger schedule (:mod:`tvm_pesto.solve.placement_ilp.lns`).
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
    succ, pred, eb = _adjacency(problem)
    feas = _feasible_sets(problem)
    topo = problem.graph.topo_order()
    topo_pos = np.empty(n, dtype=np.int64)
    topo_pos[topo] = np.arange(n)
    sim = warm_sim
    if warm_start is not None and sim is None:
        sim = simulate(problem, warm_start)
    if objective not in ("latency", "throughput"):
        raise SolverError(f"unknown ILP objective {objective!r}; use 'latency' or 'throughput'")
    if upper_bound_s is None:
        upper_bound_s = _default_upper_bound(problem, sim, objective, microbatches)
    ub_s = float(upper_bound_s) * (1 + 1e-7) + 1e-15
    ts = MIP_TIME_SCALE / ub_s if ub_s > 0 else 1.0
    UB = ub_s * ts
    maxb = float(problem.ebytes.max()) if len(problem.ebytes) else 1.0
    bs = 1.0 / maxb if maxb > 0 else 1.0

    prob = pulp.LpProblem(f"pesto_{re.sub(r'[^A-Za-z0-9_]', '_', problem.graph.name)}", pulp.LpMinimize)
    x = {(v, d): add_var(prob, f"x_{v}_{d}", cat=pulp.LpBinary) for v in range(n) for d in range(D)}
    head = _earliest_starts(problem, topo, pred, feas, ts)
    S = [add_var(prob, f"S_{v}", min(float(head[v]) * (1 - 1e-9), UB), UB) for v in range(n)]
    C = [add_var(prob, f"C_{v}", 0, UB) for v in range(n)]
    M = add_var(prob, "M", 0, UB)
    V = IlpVars(x=x, S=S, C=C, M=M, time_scale=ts, byte_scale=bs, ub_s=ub_s, topo_pos=topo_pos)
    prob += lin([(M, 1.0)]), "makespan"

    m = ModelParts(problem, prob, V, feas, succ, eb, UB)
    add_placement(m)
    add_transfers(m)
    add_precedence(m)
    add_orders(m, _ranks(topo_pos, sim), pairs)
    add_memory(m)
    add_makespan_cuts(m, topo)
    add_window(m, release, tails)
    if objective == "throughput":
        add_bottleneck(m, microbatches)
    if sim is not None:
        set_warm_values(problem, warm_start, sim, V, m.dest)
    return prob, V


def _earliest_starts(problem: Problem, topo: list[int], pred, feas, ts: float) -> np.ndarray:
    """Each node's earliest start in model time: the cheapest path of predecessors (a valid
    bound that tightens the LP)."""
    head = np.zeros(problem.num_nodes)
    for v in topo:
        for u in pred[v]:
            head[v] = max(head[v], head[u] + min(problem.costs[u, d] for d in feas[u]) * ts)
    return head


def _ranks(topo_pos: np.ndarray, sim) -> np.ndarray:
    """Each node's rank: by the warm start's start time (ties: topological), else topological."""
    if sim is None:
        return topo_pos
    rank = np.empty(len(topo_pos), dtype=np.int64)
    rank[np.lexsort((topo_pos, sim.start))] = np.arange(len(topo_pos))
    return rank


def _default_upper_bound(problem: Problem, sim, objective: str, microbatches) -> float:
    """The makespan bound (seconds) :func:`build_ilp` uses when none is given."""
    if objective == "throughput":
        upper_bound_s = generic_upper_bound(problem)
        if sim is not None and microbatches:
            upper_bound_s = min(upper_bound_s, float(microbatches) * _warm_time_per_sample(problem, sim,
                                                                                           microbatches))
    else:
        upper_bound_s = sim.makespan if sim is not None else generic_upper_bound(problem)
    if sim is not None:
        upper_bound_s = max(upper_bound_s, sim.makespan)
    return upper_bound_s


def _warm_time_per_sample(problem: Problem, sim, microbatches) -> float:
    """A simulated plan's time per sample in the op model."""
    busy, links = op_loads(problem, sim)
    return time_per_sample(sim.makespan, max(busy.max(initial=0.0), links.max(initial=0.0)), microbatches)


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


__all__ = ["IlpVars", "build_ilp", "extract_plan", "generic_upper_bound"]
