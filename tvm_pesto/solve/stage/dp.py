"""The ``stage-dp`` solver: stage plans from the contiguous-split DP of :mod:`tvm_pesto.solve.stage.ideal_dp`.

The DP gives a device per kept node; :func:`stage_plan` puts the nodes the DP dropped back next
to a neighbour and runs each device's nodes in topological order, and :func:`solve` (registered
as ``stage-dp``) judges the plan in full in the stage model (:mod:`tvm_pesto.plan.stage`).

Where the graph has too many ideals (wide graphs: Inception has 36,596) the exact DP is
skipped; :func:`linearized_split` runs the same DP over the prefixes of a topological order
(one ideal per position: the PipeDream-style split of a linearised graph), which always
gives contiguous, acyclic stages, and is how the placement heuristics' plans are turned into
stage plans (:func:`as_stage_plan`, along their schedule order).

Examples
--------
>>> from tvm_pesto.bench.random_dag import dnn_like_problem
>>> from tvm_pesto.plan.objective import evaluate
>>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
>>> evaluate(problem, solve(problem), "stage", "throughput").valid
True
"""
from __future__ import annotations

import copy
import time

import networkx as nx
import numpy as np

from ...errors import InfeasibleError, PestoError, SolverError
from ...plan.objective import evaluate
from ...plan.plan import Plan
from ...plan.problem import Problem
from ...plan.simulate import simulate
from ..heuristics.common import colocation_index
from .ideal_dp import MAX_IDEALS, DpResult, Units, dp_splits, dp_units


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
    runs = {tuple(unit): [d for d in range(problem.num_devices) if np.isfinite(problem.costs[unit, d]).all()]
            for unit in todo}
    for unit in todo:  # first guess: the device of a placed neighbour that runs the unit
        near = [int(a[w]) for v in unit for w in g.preds(v) + g.succs(v) if placed[w]]
        ok = [d for d in near if d in runs[tuple(unit)]] or runs[tuple(unit)] or [0]
        a[unit] = ok[0]
    for _ in range(4):  # then the best neighbour's device, until nothing changes
        changed = False
        for unit in todo:
            near = {int(a[w]) for v in unit for w in g.preds(v) + g.succs(v)} | {int(a[unit[0]])}
            # a unit no neighbour's device runs may go to any device that runs it
            cands = sorted(near & set(runs[tuple(unit)])) or runs[tuple(unit)]
            was, best, best_key = int(a[unit[0]]), None, None
            for dev in cands:
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
        orders = [problem.graph.topo_order(), problem.graph.depth_first_order()]
    best, best_key, facts = None, None, []
    for order in orders:
        seq, seen = [], set()
        for v in order:
            k = int(units.unit_of[v])
            if k >= 0 and k not in seen:
                seen.add(k)
                seq.append(k)
        seq = _topological_units(units.dag, seq)
        for r in dp_splits(problem, _combines(objective, microbatches), "prefix", order=seq, units=units):
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
        combines = _combines(objective, microbatches)
        for combine, r in zip(combines, dp_splits(problem, combines, "all", max_ideals=max_ideals, units=units)):
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


__all__ = ["as_stage_plan", "device_orders", "heuristic_stage_plan", "linearized_split", "solve", "stage_plan"]
