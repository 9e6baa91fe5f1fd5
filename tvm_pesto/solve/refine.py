"""Local search on a plan's critical path: move nodes (or runs of them) to other devices.

The ILP of :mod:`tvm_pesto.solve.ilp` is solved on a coarsened graph, so its expanded plan
keeps whole supernodes together; heuristics make one greedy choice per node. Both leave
easy wins on the fine graph. :func:`refine` takes such a plan and repeats, within a time
budget:

1. simulate the plan and walk its *critical chain* back from the last node to finish: at
   each step the event that decided the node's start (the previous node on its device, a
   producer on the same device, or a transfer's arrival);
2. for every node of the chain (with its co-location group) and every maximal run of chain
   nodes on one device, try each other device it may use; the nodes keep their place in
   time (each device runs its nodes in the order of their old start times);
3. also try reordering: a node that held its device while the chain waited for it runs
   after the chain nodes it delayed;
4. keep the change with the smallest simulated makespan if it is better, else stop.

Every candidate is checked by the simulator, memory included, so the result is always a
valid plan and never worse than the input.

Examples
--------
>>> from tvm_pesto.solve import solve
>>> from tvm_pesto.solve.refine import refine
>>> # better = refine(problem, solve(problem, "heft"), time_budget_s=1.0)
"""
from __future__ import annotations

import time

import numpy as np

from ..errors import InfeasibleError, PlanError
from ..plan.plan import Plan
from ..plan.problem import Problem
from ..plan.simulate import SimResult, simulate
from .common import colocation_index

_REL = 1e-9  # a move must beat the incumbent by this relative margin


def _ordered(assignment: np.ndarray, priority: np.ndarray, num_devices: int) -> list[list[int]]:
    """Per-device orders: each device's nodes by ``(priority, id)``."""
    idx = np.lexsort((np.arange(len(priority)), priority))
    dev = assignment[idx]
    return [idx[dev == d].tolist() for d in range(num_devices)]


def critical_chain(problem: Problem, plan: Plan, sim: SimResult, tol: float = 1e-12) -> list[int]:
    """The nodes whose timing decided the makespan, last first.

    From the node that finishes last, step to whatever made it start when it did: the node
    before it on its device, or the producer whose output (on the same device, or through a
    transfer) arrived last. Stops at a node that started at time 0.

    Examples
    --------
    >>> # chain = critical_chain(problem, plan, simulate(problem, plan))
    """
    n = problem.num_nodes
    if n == 0:
        return []
    prev_on_dev = np.full(n, -1, dtype=np.int64)
    for order in plan.order:
        if len(order) > 1:
            prev_on_dev[np.asarray(order[1:])] = order[:-1]
    arrive: dict[tuple[int, int], float] = {}
    for u, _sd, dd, _s, e, _b in sim.transfers.tolist():
        arrive[(int(u), int(dd))] = e
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, v in zip(problem.src.tolist(), problem.dst.tolist()):
        preds[v].append(u)
    a = plan.assignment
    chain = []
    seen = set()
    v = int(np.argmax(sim.finish))
    while v >= 0 and v not in seen:
        chain.append(v)
        seen.add(v)
        s = sim.start[v]
        if s <= tol:
            break
        eps = tol + 1e-9 * abs(s)
        nxt, when = -1, -np.inf
        p = prev_on_dev[v]
        if p >= 0 and sim.finish[p] > when:
            nxt, when = int(p), sim.finish[p]
        for u in preds[v]:
            t = sim.finish[u] if a[u] == a[v] else arrive.get((u, int(a[v])), -np.inf)
            if t > when + eps:
                nxt, when = u, t
        if when < s - eps:  # nothing explains the start (cannot happen in a semi-active schedule)
            break
        v = nxt
    return chain


class _Evaluator:
    """Simulates assignments with a fixed time priority; counts the calls."""

    def __init__(self, problem: Problem, solver: str):
        self.problem = problem
        self.solver = solver
        self.calls = 0

    def __call__(self, assignment: np.ndarray, priority: np.ndarray):
        self.calls += 1
        plan = Plan(assignment, _ordered(assignment, priority, self.problem.num_devices), solver=self.solver)
        try:
            return plan, simulate(self.problem, plan)
        except (InfeasibleError, PlanError):
            return plan, None


def _runs(chain: list[int], assignment: np.ndarray) -> list[list[int]]:
    """Maximal runs of consecutive chain nodes on one device (length >= 2)."""
    runs, cur = [], [chain[0]] if chain else []
    for v in chain[1:]:
        if assignment[v] == assignment[cur[-1]]:
            cur.append(v)
        else:
            runs.append(cur)
            cur = [v]
    if cur:
        runs.append(cur)
    return [r for r in runs if len(r) > 1]


def refine(problem: Problem, plan: Plan, time_budget_s: float = 2.0, max_rounds: int = 200) -> Plan:
    """Improve ``plan`` by moving critical-chain nodes between devices (module docstring).

    Parameters
    ----------
    problem : Problem
    plan : Plan
        A valid plan (it must simulate without error).
    time_budget_s : float
        Stop starting new rounds after this many seconds.
    max_rounds : int
        At most this many accepted moves.

    Returns
    -------
    Plan
        The same ``solver`` name and ``info`` as ``plan`` plus ``refine``: rounds, moves
        accepted, simulations run, seconds, and the makespans before and after. The input
        plan itself when nothing better was found.

    Raises
    ------
    PlanError, InfeasibleError
        If ``plan`` itself does not simulate (deadlock, memory).

    Examples
    --------
    >>> # plan = refine(problem, solve(problem, "heft"))
    >>> # plan.info["refine"]["makespan_after_s"] <= plan.info["refine"]["makespan_before_s"]
    """
    t0 = time.perf_counter()
    sim = simulate(problem, plan)
    before = sim.makespan
    n, d = problem.num_nodes, problem.num_devices
    info = {"rounds": 0, "moves": 0, "simulations": 1, "makespan_before_s": before, "makespan_after_s": before}
    if n == 0 or d < 2 or time_budget_s <= 0:
        info["seconds"] = time.perf_counter() - t0
        return _with_info(plan, info)
    group_of, groups = colocation_index(problem)
    allowed = np.isfinite(problem.costs)
    for members in groups:
        allowed[members] = allowed[members].all(axis=0)
    evaluate = _Evaluator(problem, plan.solver)
    best_plan, best_sim = plan, sim
    while info["rounds"] < max_rounds and time.perf_counter() - t0 < time_budget_s:
        info["rounds"] += 1
        a = best_plan.assignment
        priority = best_sim.start + 1e-12 * best_sim.finish  # zero-cost nodes keep their order
        chain = critical_chain(problem, best_plan, best_sim)
        moves: list[np.ndarray] = []
        seen_units: set[tuple[int, ...]] = set()
        for unit in [[v] for v in chain] + _runs(chain, a):
            nodes = set()
            for v in unit:
                g = group_of[v]
                nodes.update(groups[g] if g >= 0 else [v])
            key = tuple(sorted(nodes))
            if key in seen_units:
                continue
            seen_units.add(key)
            moves.append(np.asarray(key, dtype=np.int64))
        found = None
        for nodes in moves:
            ok = allowed[nodes].all(axis=0)
            for k in np.flatnonzero(ok):
                if (a[nodes] == k).all():
                    continue
                cand = a.copy()
                cand[nodes] = k
                cplan, csim = evaluate(cand, priority)
                if csim is not None and csim.makespan < (found[1].makespan if found else best_sim.makespan) * (1 - _REL):
                    found = (cplan, csim)
            if time.perf_counter() - t0 >= time_budget_s:
                break
        # reorders: a node that held its device while the chain waited goes after the run of
        # chain nodes it delayed (or just after the next one)
        fwd = chain[::-1]
        for i in range(len(fwd) - 1):
            if time.perf_counter() - t0 >= time_budget_s:
                break
            blocker, v = fwd[i], fwd[i + 1]
            if a[blocker] != a[v] or problem.graph.dag.has_edge(blocker, v):
                continue
            j = i + 1
            while j + 1 < len(fwd) and a[fwd[j + 1]] == a[blocker]:
                j += 1
            for last in {v, fwd[j]}:
                pr = priority.copy()
                pr[blocker] = priority[last] + 1e-12 * max(abs(priority[last]), 1e-9)
                cplan, csim = evaluate(a, pr)  # an order against the graph deadlocks: rejected
                if csim is not None and csim.makespan < (found[1].makespan if found else best_sim.makespan) * (1 - _REL):
                    found = (cplan, csim)
        if found is None:
            break
        best_plan, best_sim = found
        info["moves"] += 1
    info["simulations"] += evaluate.calls
    info["makespan_after_s"] = best_sim.makespan
    info["seconds"] = time.perf_counter() - t0
    return _with_info(best_plan, info, base=plan, sim=best_sim if best_plan is not plan else None)


def _with_info(plan: Plan, refine_info: dict, base: Plan | None = None, sim: SimResult | None = None) -> Plan:
    """``plan`` with ``base``'s solver, time and info, plus ``refine``; facts of ``base`` that
    the moves made stale are replaced by the simulated ones (``sim``) or dropped."""
    base = base or plan
    info = dict(base.info)
    if sim is not None:
        info.pop("estimated_makespan_s", None)
        if "peak_memory_bytes" in info:
            info["peak_memory_bytes"] = sim.peak_memory.tolist()
        if "makespan_s" in info:
            info["makespan_s"] = sim.makespan
    info["refine"] = refine_info
    return Plan(plan.assignment, plan.order, solver=base.solver, solve_s=base.solve_s, info=info)
