"""Large-neighbourhood search: re-optimise windows of the best schedule with MIP sub-problems.

The coarse ILP of :mod:`tvm_pesto.solve.placement_ilp.coarsen` sees 40 supernodes, far too few for a graph
of 10,000 ops, and the whole graph is far too large for the exact MIP. A *window* is small
enough: ``size`` consecutive nodes of the current schedule in start-time order, around a
node of its critical chain (:func:`tvm_pesto.solve.placement_ilp.refine.critical_chain`). Everything
outside the window keeps its device and order. The window becomes its own placement +
scheduling MIP (:func:`tvm_pesto.solve.placement_ilp.model.build.build_ilp`) with

* **release times** ``release[v, d]``: when ``v``'s inputs from outside the window could be
  on device ``d`` (the producer's finish plus the transfer, when devices differ) and when
  ``d`` is done with the work that runs before the window there;
* **tails** ``tails[v, d]``: what must still follow ``v`` on ``d``: for an outside consumer
  ``w``, the transfer to it plus ``w``'s *remaining time* in the current schedule (its cost
  and the longest chain of dependencies, transfers and device order after it); and the
  remaining time of the first node after the window on ``d``;

so the MIP minimises an estimate of the whole schedule's makespan through the window, warm
started from the current schedule (always feasible). Its plan is spliced in (the window's
nodes take their new devices and, in the MIP's start order, the window's slots in the device
orders, which cannot deadlock: every edge still goes from an earlier slot to a later one),
the whole plan is simulated (C++ core, memory checked), and kept when the makespan drops.
:func:`lns` repeats this within a budget (seconds, or in deterministic mode work units: the
MIPs' nominal seconds and the simulations, :mod:`tvm_pesto.solve.budget`).

Examples
--------
>>> from tvm_pesto.bench.random_dag import dnn_like_problem
>>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
>>> from tvm_pesto.solve import solve
>>> better = lns(problem, solve(problem, "heft"), time_budget_s=0.5, deterministic=True)
>>> better.info["lns"]["makespan_after_s"] <= better.info["lns"]["makespan_before_s"]
True
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...errors import PestoError
from ...graph.opgraph import OpGraph, OpNode
from ...plan.plan import Plan
from ...plan.problem import Problem
from ...plan.simulate import SimResult, simulate
from ..budget import SEARCH_WORK_PER_S, SEED, Meter
from ..heuristics.common import colocation_index
from ..mip import solve_mip
from .model.build import build_ilp, extract_plan
from .refine import _Evaluator, critical_chain

_REL = 1e-9


def remaining_time(problem: Problem, plan: Plan, sim: SimResult) -> np.ndarray:
    """Per node, the longest chain of work after its start in the current schedule: its cost,
    then (the longest of) each consumer's remaining time plus the transfer to it, and the
    next node on its device."""
    n = problem.num_nodes
    a = plan.assignment
    cost = sim.finish - sim.start
    nxt = np.full(n, -1, dtype=np.int64)
    for seq in plan.order:
        if len(seq) > 1:
            nxt[np.asarray(seq[:-1])] = seq[1:]
    q = cost.copy()
    succ: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for u, v, b in zip(problem.src.tolist(), problem.dst.tolist(), problem.ebytes.tolist()):
        succ[u].append((v, b))
    pos = np.empty(n, dtype=np.int64)
    pos[problem.graph.topo_order()] = np.arange(n)
    keys = np.lexsort((pos, sim.start))[::-1]  # latest start first: successors are done
    for u in keys.tolist():
        best = 0.0
        au = a[u]
        for v, b in succ[u]:
            t = q[v] + problem.transfer_s(au, a[v], b)
            if t > best:
                best = t
        w = nxt[u]
        if w >= 0 and q[w] > best:
            best = q[w]
        q[u] = cost[u] + best
    return q


class Window:
    """The sub-problem of ``nodes`` (a run of the start-time order) of a plan: its Problem,
    release times, tails, warm start and the map back (``nodes[k]`` is sub-node ``k``)."""

    def __init__(self, problem: Problem, plan: Plan, sim: SimResult, rank: np.ndarray, lo: int, hi: int,
                 by_rank: np.ndarray, remaining: np.ndarray, coloc):
        D = problem.num_devices
        nodes = by_rank[lo:hi].tolist()
        self.nodes = nodes
        self.lo, self.hi = lo, hi
        index = {v: k for k, v in enumerate(nodes)}
        a = plan.assignment
        g = problem.graph
        lat, inv = problem.latency, problem.inv_bw
        k = len(nodes)
        # devices busy before the window; the first node after it on each device
        avail = np.zeros(D)
        after = np.full(D, -1, dtype=np.int64)
        for d, seq in enumerate(plan.order):
            r = rank[np.asarray(seq, dtype=np.int64)] if seq else np.zeros(0)
            before = np.flatnonzero(r < lo)
            if len(before):
                avail[d] = sim.finish[seq[before[-1]]]
            later = np.flatnonzero(r >= hi)
            if len(later):
                after[d] = seq[later[0]]
        release = np.tile(avail, (k, 1))
        tails = np.zeros((k, D))
        for d in range(D):
            if after[d] >= 0:
                tails[:, d] = remaining[after[d]]
        edges = []
        for i, v in enumerate(nodes):
            for u in g.preds(v):
                if u in index:
                    edges.append((index[u], i, g.edge_bytes(u, v)))
                    continue
                b = g.edge_bytes(u, v)
                arr = sim.finish[u] + lat[a[u]] + b * inv[a[u]]
                arr[a[u]] = sim.finish[u]
                np.maximum(release[i], arr, out=release[i])
            for w in g.succs(v):
                if w in index:
                    continue
                b = g.edge_bytes(v, w)
                t = remaining[w] + lat[:, a[w]] + b * inv[:, a[w]]
                t[a[w]] = remaining[w]
                np.maximum(tails[i], t, out=tails[i])
        costs = problem.costs[nodes].copy()
        # co-location with nodes outside the window pins the window's members
        group_of, groups = coloc
        local = []
        for gi in sorted({int(group_of[v]) for v in nodes if group_of[v] >= 0}):
            inside = [index[v] for v in groups[gi] if v in index]
            outside = [v for v in groups[gi] if v not in index]
            if outside:
                keep = np.zeros(D, dtype=bool)
                keep[a[outside[0]]] = True
                costs[inside] = np.where(keep, costs[inside], np.inf)
            elif len(inside) > 1:
                local.append(inside)
        self.base = float(release.min()) if k else 0.0
        self.release = release - self.base
        self.tails = tails
        graph = OpGraph([OpNode(g.nodes[v].name, g.nodes[v].op) for v in nodes], edges, name=f"{g.name}/window")
        self.problem = Problem(graph, problem.cluster.with_memory(1e30), costs, colocate=local,
                               cost_source=problem.cost_source)
        # the current schedule of the window, in the window's time frame
        sub_a = a[nodes]
        order = [[index[v] for v in seq if v in index] for seq in plan.order]
        self.warm = Plan(sub_a, order, solver=plan.solver)
        start = sim.start[nodes] - self.base
        finish = sim.finish[nodes] - self.base
        rows = []
        for u, sd, dd, s, e, b in sim.transfers.tolist():
            if int(u) in index:
                rows.append((index[int(u)], sd, dd, s - self.base, e - self.base, b))
        tx = np.asarray(rows, dtype=np.float64).reshape(-1, 6)
        span = float((finish + tails[np.arange(k), sub_a]).max()) if k else 0.0
        self.warm_sim = SimResult(start, finish, span, np.zeros(D), np.zeros(D), tx)

    def solve(self, time_limit_s: float, solver: str, deterministic: bool | None, pairs: int | None = None,
              gap: float = 1e-3):
        """``(assignment, start order)`` of the window from its MIP, or None; and the MIP's
        result. ``pairs``: ordering binaries only for nodes this close in the current order
        (:func:`~tvm_pesto.solve.placement_ilp.model.build.build_ilp`)."""
        prob, V = build_ilp(self.problem, self.warm, pairs=pairs, release=self.release, tails=self.tails,
                            warm_sim=self.warm_sim)
        res = solve_mip(prob, solver, time_limit_s=time_limit_s, gap=gap, deterministic=deterministic)
        if not res.has_solution:
            return None, res
        sub = extract_plan(self.problem, V)
        s = np.array([V.S[v].value() or 0.0 for v in range(self.problem.num_nodes)])
        return (sub.assignment, s), res


#: Work a window's MIP is charged in deterministic mode, as a fraction of its limit: windows
#: of 12 nodes mostly close well within it (on the development machine, about a third on
#: average), so charging the whole limit would stop the search three times too early.
MIP_CHARGE = 1 / 3
#: Work units charged for recomputing the schedule's ranks, critical chain and remaining
#: times after an accepted window (Python loops over the graph), in simulations.
RESCAN_SIMULATIONS = 30
#: Work units charged per window besides its MIP, in simulations: the window's bookkeeping
#: over the device orders, the ordering of the whole plan and the simulation itself take
#: about ten simulations' worth of :func:`tvm_pesto.solve.budget.simulation_work` on the
#: development machine (measured at 1k-100k ops), so nominal seconds stay close to seconds.
WINDOW_SIMULATIONS = 10


def _window_start(rank: np.ndarray, chain: list[int], tried: set[int], size: int, rng) -> int:
    """The first rank of the next window: one ending just after a critical-chain node, not
    tried yet on this schedule, else one shifted at random around a chain node."""
    n = len(rank)
    starts = sorted({int(min(max(rank[v] - (2 * size) // 3, 0), n - size)) for v in chain} - tried)
    if starts:
        return starts[int(rng.integers(0, len(starts)))]
    v = chain[int(rng.integers(0, len(chain)))]
    return int(min(max(rank[v] - int(rng.integers(0, size)), 0), n - size))


def _with_window(assignment: np.ndarray, rank: np.ndarray, pos: np.ndarray, win, out, lo: int):
    """The assignment and priorities of the schedule with the window's solution ``out``
    (its devices and start times) put in, the window's nodes ranked from ``lo`` by start."""
    sub_a, sub_s = out
    a = assignment.copy()
    a[win.nodes] = sub_a
    priority = rank.astype(np.float64)
    inner = np.lexsort((pos[win.nodes], np.round(sub_s, 9)))
    priority[np.asarray(win.nodes)[inner]] = lo + np.arange(len(inner))
    return a, priority


@dataclass(frozen=True)
class LnsSettings:
    """The large-neighbourhood search's settings: when the ``"ilp"`` solver runs it
    (:func:`tvm_pesto.solve.placement_ilp.driver.solve`) and how :func:`lns` searches.

    Attributes
    ----------
    seconds : float, optional
        Seconds of search after the MIP (deterministic mode: nominal seconds of work); None:
        the MIP's time limit on graphs of more than ``min_nodes`` nodes (and more than the
        coarsening target), else 0, which turns it off.
    starts : tuple of str
        Heuristics whose plans the search may start from instead of the MIP's plan.
    min_nodes : int
        Graph size from which the search runs by default (``seconds`` None).
    size : int
        Nodes per window.
    mip_time_s : float
        Time limit of each window's MIP (deterministic mode: its node limit's worth).
    solver : {"highs", "cbc"}
        The MIP backend (HiGHS runs in-process: no start-up per window).
    seed : int
        Seeds the choice of windows (default :data:`tvm_pesto.solve.budget.SEED`).
    pairs : int, optional
        Ordering binaries only for window nodes at most this far apart in the current order
        (farther pairs keep their order); None: all pairs (exact window MIPs, slower).
    """

    seconds: float | None = None
    starts: tuple = ("heft",)
    min_nodes: int = 1000
    size: int = 12
    mip_time_s: float = 0.3
    solver: str = "highs"
    seed: int = SEED
    pairs: int | None = 4


def lns(problem: Problem, plan: Plan, time_budget_s: float = 10.0, deterministic: bool | None = None,
        floor_s: float = 0.0, meter: Meter | None = None, settings: LnsSettings = LnsSettings()) -> Plan:
    """Improve ``plan``'s makespan by re-solving windows of ``size`` nodes (module docstring).

    Parameters
    ----------
    problem : Problem
    plan : Plan
        A valid plan (it must simulate, memory included).
    time_budget_s : float
        Seconds of search (deterministic mode: nominal seconds of work).
    floor_s : float
        A lower bound: stop once the plan is within 1e-5 of it.
    settings : LnsSettings
        The windows' ``size``, ``mip_time_s``, ``solver``, ``seed`` and ``pairs``.
    meter : Meter, optional
        A budget to draw from instead of ``time_budget_s`` and ``deterministic``.

    Returns
    -------
    Plan
        ``plan``'s solver and info plus ``info["lns"]``: windows tried, accepted, MIP
        statuses, simulations, seconds, the makespans before and after, and the budget's
        report (``budget``, ``work``, ``deterministic``). ``plan`` itself when no window
        helped.

    Raises
    ------
    PlanError, InfeasibleError
        If ``plan`` itself does not simulate.
    """
    size, mip_time_s, solver, pairs = settings.size, settings.mip_time_s, settings.solver, settings.pairs
    t0 = time.perf_counter()
    meter = meter if meter is not None else Meter(time_budget_s, deterministic, "the LNS")
    sim = simulate(problem, plan)
    n = problem.num_nodes
    info = {"windows": 0, "accepted": 0, "mip_statuses": {}, "makespan_before_s": sim.makespan,
            "window_size": size, "mip_time_s": mip_time_s, "solver": solver, "pairs": pairs}
    if n <= 1 or problem.num_devices < 2 or meter.seconds <= 0:
        info.update(makespan_after_s=sim.makespan, **meter.report(), seconds=time.perf_counter() - t0)
        return _with(plan, info)
    size = max(2, min(size, n))
    evaluate = _Evaluator(problem, plan.solver, meter)
    coloc = colocation_index(problem)
    pos = np.empty(n, dtype=np.int64)
    pos[problem.graph.topo_order()] = np.arange(n)
    rng = np.random.default_rng(settings.seed)
    best_plan, best_sim = plan, sim
    stop = floor_s * (1 + 1e-5)
    tried: set[int] = set()  # window starts tried on the current schedule
    changed = True
    while not meter.spent() and best_sim.makespan > stop:
        if changed:  # the schedule's ranks, chain and remaining times
            by_rank = np.lexsort((pos, best_sim.start))
            rank = np.empty(n, dtype=np.int64)
            rank[by_rank] = np.arange(n)
            chain = critical_chain(problem, best_plan, best_sim)
            remaining = remaining_time(problem, best_plan, best_sim)
            meter.charge(RESCAN_SIMULATIONS * evaluate.work)
            tried.clear()
            changed = False
        lo = _window_start(rank, chain, tried, size, rng)
        tried.add(lo)
        hi = lo + size
        win = Window(problem, best_plan, best_sim, rank, lo, hi, by_rank, remaining, coloc)
        meter.charge((WINDOW_SIMULATIONS - 1) * evaluate.work)  # the evaluator charges the simulation itself
        budget = min(mip_time_s, max(meter.left_s(), 0.05))
        try:
            out, res = win.solve(budget, solver, meter.deterministic, pairs=pairs)
        except PestoError as e:
            info["mip_statuses"]["error"] = info["mip_statuses"].get("error", 0) + 1
            info["last_error"] = str(e)
            continue
        finally:
            info["windows"] += 1
        meter.charge(budget * MIP_CHARGE * SEARCH_WORK_PER_S if meter.deterministic else 0.0)
        info["mip_statuses"][res.status] = info["mip_statuses"].get(res.status, 0) + 1
        if out is None:
            continue
        cand, csim = evaluate(*_with_window(best_plan.assignment, rank, pos, win, out, lo))
        if csim is not None and csim.makespan < best_sim.makespan * (1 - _REL):
            best_plan, best_sim = cand.plan(), csim
            info["accepted"] += 1
            changed = True
    info.update(makespan_after_s=best_sim.makespan, simulations=evaluate.calls, **meter.report(),
                seconds=time.perf_counter() - t0)
    return _with(best_plan, info, base=plan)


def _with(plan: Plan, lns_info: dict, base: Plan | None = None) -> Plan:
    base = base or plan
    info = dict(base.info)
    info["lns"] = lns_info
    if plan is not base:
        info.pop("estimated_makespan_s", None)
        if "makespan_s" in info:
            info["makespan_s"] = lns_info["makespan_after_s"]
    return Plan(plan.assignment, plan.order, solver=base.solver, solve_s=base.solve_s, info=info)


__all__ = ["LnsSettings", "Window", "lns", "remaining_time"]
