"""The ILPs' part of the joint solve: what they choose, what they prove, which plan decides.

:func:`decide` takes the best plan the covering search, the placement heuristics and the
joint local search found (the incumbent) and runs

1. the relaxed joint ILP (:func:`tvm_pesto.solve.joint.relaxation.relaxed_joint_ilp`) on
   the whole graph: cover and devices together, warm-started from the incumbent. Its dual
   bound is a lower bound on every plan's makespan; its choice, ordered and improved by the
   joint local search, is a plan of its own;
2. while a gap remains, on small graphs (:data:`EXACT_MAX_NODES`), within what the
   relaxation left of ``time_limit_s`` (wall-clock budgets), the exact joint ILP
   (:func:`tvm_pesto.solve.joint.ilp.joint_ilp`: cover, devices and order), warm-started
   from the incumbent's cover;

and keeps the fastest simulated plan, so the result is never worse than the incumbent.
``info`` says which step decided the plan (``decided_by``), the proven bound and the gap
between the plan and it (``status`` ``optimal`` when the gap is within
:data:`OPTIMAL_GAP`, else ``feasible``; ``heuristic`` when no bound was proved).

Examples
--------
>>> from tvm_pesto.plan import simulate
>>> from tvm_pesto.solve import solve
>>> from tvm_pesto.plan.examples import chain_with_a_library_call
>>> problem = chain_with_a_library_call()   # a -> b -> c; tvm per op, or torch for a and b
>>> cover = [0, 1, 2]                      # every op a tvm call of its own: 5.0 s in a row
>>> placed = problem.contract(cover)
>>> plan = solve(placed, "heft")
>>> plan, placed, cover, span, info = decide(problem, plan, placed, cover, simulate(placed, plan).makespan,
...                                          time_limit_s=10, search_s=1.0, deterministic=True)
>>> sorted(cover), span, info["decided_by"], info["status"], info["gap"]
([2, 3], 4.0, 'relaxed-ilp', 'optimal', 0.0)
"""
from __future__ import annotations

import logging
import time

import numpy as np

from ...errors import InfeasibleError, PestoError, SolverError
from ...plan.plan import Plan
from ...plan.problem import JointProblem, Problem
from ...plan.simulate import simulate
from ..budget import is_deterministic
from .cover import CoverResult
from .ilp import concurrent_pairs, joint_ilp
from .relaxation import plan_of, relaxed_joint_ilp
from .search import improve

log = logging.getLogger(__name__)

#: Graphs up to this many ops (and with few unordered pairs) also go to the exact joint ILP.
EXACT_MAX_NODES = 60
EXACT_MAX_PAIRS = 1500
#: A plan within this relative gap of the proven bound is reported ``optimal``.
OPTIMAL_GAP = 1e-4
#: At most this many seconds (deterministic mode: the matching node limit) for the exact
#: joint ILP, which runs only while the relaxation's bound leaves a gap. Where it ran on the
#: measured costs of corpus models on cpu:2 (resnet18 at size small), 10 s found the plan 1 s
#: found, and the build waited 9 s longer for it.
EXACT_S = 3.0
#: Evaluated plans of the joint local search from the relaxation's plan.
RELAXED_SEARCH_EVALS = 1000
#: Plans whose makespans differ by at most this relative amount tie; a tie goes to the ILP.
TIE = 1e-9
#: Share of a wall-clock budget kept back from the relaxation's solver for what it does around
#: the solve (building the model, reading the plan): inception_v3 at size full ended 0.04 s
#: past a 30-s budget without it.
RESERVE = 0.02


def no_slower(span: float, incumbent: float) -> bool:
    """Whether a plan of makespan ``span`` is kept over the incumbent's: faster, or tied
    within :data:`TIE` (a tie goes to the ILP, whose plan comes with the proof; two covers of
    one makespan can simulate a rounding apart).

    Examples
    --------
    >>> no_slower(0.13462282355601812, 0.1346228235560181), no_slower(1.001, 1.0)
    (True, False)
    """
    return span <= incumbent * (1 + TIE)


def _gap(span: float, bound: float | None) -> float | None:
    """The plan's relative gap to the proven bound (None without a bound)."""
    return None if bound is None or span <= 0 else max(0.0, (span - bound) / span)


def exact_joint(problem: JointProblem, plan: Plan, placed: Problem, cover, time_limit_s: float,
                deterministic: bool | None):
    """The exact joint ILP warm-started from ``cover`` on the busiest device that can run all
    of it: ``(plan, placed, cover, makespan, info)``; ``None`` when the graph is too large
    for it (:data:`EXACT_MAX_NODES`), or no device runs the whole cover and the ILP, started
    cold, finds nothing."""
    g = problem.graph
    D = problem.num_devices
    if g.num_nodes > EXACT_MAX_NODES:
        return None
    if D > 1 and len(concurrent_pairs(g)) * (D - 1) > EXACT_MAX_PAIRS:
        return None
    node_sets = [c.nodes for c in problem.candidates]
    # The warm start runs the whole cover on one device: the busiest one of those that can run
    # every unit of it; with none, the ILP starts cold and its failing keeps ``plan``.
    busy = np.bincount(plan.assignment, minlength=D)
    able = np.isfinite(problem.costs[list(cover)]).all(axis=0)
    warm = warm_dev = None
    if able.any():
        warm_dev = int(np.argmax(np.where(able, busy, -1)))
        warm = CoverResult(list(cover), float(problem.costs[list(cover), warm_dev].sum()))
    try:
        jr = joint_ilp(g, node_sets, problem.costs, problem.cluster, warm=warm, warm_device=warm_dev,
                       time_limit_s=time_limit_s, deterministic=deterministic, colocate=problem.colocate)
    except (InfeasibleError, SolverError):
        if warm is not None:
            raise
        return None
    jcover = list(jr.chosen)
    jplaced = problem.contract(jcover)
    start = np.array([jr.start[c] for c in jcover])
    jplan = Plan.from_assignment(np.array([jr.device[c] for c in jcover]), start, D, solver="joint-ilp",
                                 info=dict(jr.info))
    try:
        span = simulate(jplaced, jplan).makespan
    except PestoError:  # ties in start times can order a device against the data: topological order
        topo = jplaced.graph.topo_order()
        pos = np.empty(len(jcover), dtype=np.int64)
        pos[topo] = np.arange(len(jcover))
        jplan = Plan.from_assignment(jplan.assignment, pos, D, solver="joint-ilp", info=dict(jr.info))
        span = simulate(jplaced, jplan).makespan
    return jplan, jplaced, jcover, span, jr.info


def _relaxed_plan(problem: JointProblem, res, search_s: float, deterministic: bool | None):
    """The relaxation's cover and devices as a plan, improved by the joint local search:
    ``(plan, placed, cover, makespan)``."""
    plan, placed = plan_of(problem, res.chosen, res.device, solver="relaxed-ilp")
    span = simulate(placed, plan).makespan
    if search_s > 0:
        plan, placed, cover, span, _ = improve(problem, plan, placed, list(res.chosen), budget_s=search_s,
                                               max_evals=RELAXED_SEARCH_EVALS, deterministic=deterministic)
        return plan, placed, cover, span
    return plan, placed, list(res.chosen), span


def decide(problem: JointProblem, plan: Plan, placed: Problem, cover: list[int], span: float,
           time_limit_s: float = 30.0, search_s: float = 1.0, deterministic: bool | None = None,
           decided_by: str = "heuristic"):
    """Run the ILPs of the module docstring from the incumbent ``(plan, placed, cover, span)``.

    Returns
    -------
    (plan, placed, cover, makespan, info)
        The fastest plan; ``info``: ``decided_by`` (``decided_by`` when the incumbent stays,
        else ``relaxed-ilp`` or ``joint-ilp``; ``relaxed-ilp (= heft)`` when the ILP's plan
        ties with the incumbent, or its optimum is the incumbent's cover and devices),
        ``bound_s`` (None when none was proved), ``gap`` (relative to the plan's makespan),
        ``status``, and each ILP's report (``relaxation``, ``joint_ilp``).
    """
    t0 = time.perf_counter()
    info: dict = {"decided_by": decided_by, "incumbent_s": float(span)}
    device = {c: int(plan.assignment[k]) for k, c in enumerate(cover)}
    try:
        relax_s = time_limit_s if is_deterministic(deterministic) else \
            max(0.5, time_limit_s * (1 - RESERVE) - search_s)
        res = relaxed_joint_ilp(problem, time_limit_s=relax_s, warm=(list(cover), device),
                                deterministic=deterministic)
    except PestoError as e:  # e.g. no MIP solver installed: the incumbent stays, and says why it is unproven
        log.warning("the relaxed joint ILP failed on %s: %s", problem.graph.name, e)
        info.update(relaxation={"status": "solver_failed", "error": str(e)}, bound_s=None, gap=None,
                    makespan_s=float(span), status="heuristic")
        return plan, placed, cover, span, info
    info["relaxation"] = {"status": res.status, "bound_s": res.bound_s, "objective_s": res.objective_s,
                          "seconds": res.seconds, **{k: res.info.get(k) for k in (
                              "candidates_kept", "num_vars", "num_constraints", "mip_gap", "budget",
                              "deterministic", "deterministic_reason") if k in res.info}}
    same = sorted(res.chosen) == sorted(cover) and all(device.get(c) == d for c, d in res.device.items())
    if res.chosen and same and res.status == "optimal":  # the ILP's optimum is the incumbent's cover and devices
        info["decided_by"] = f"relaxed-ilp (= {decided_by})"
    elif res.chosen and not same:
        try:
            rplan, rplaced, rcover, rspan = _relaxed_plan(problem, res, search_s, deterministic)
        except PestoError as e:  # e.g. the chosen units depend on each other in a cycle
            info["relaxation"]["plan_error"] = str(e)
        else:
            info["relaxation"]["plan_s"] = float(rspan)
            if no_slower(rspan, span):
                tie = rspan >= span * (1 - TIE)
                plan, placed, cover, span = rplan, rplaced, rcover, rspan
                info["decided_by"] = f"relaxed-ilp (= {decided_by})" if tie else "relaxed-ilp"
    bound = res.bound_s
    if _gap(span, bound) is None or _gap(span, bound) > OPTIMAL_GAP:  # not yet proven: the exact ILP may
        try:
            left = time_limit_s if is_deterministic(deterministic) else time_limit_s - (time.perf_counter() - t0)
            ex = exact_joint(problem, plan, placed, cover, max(min(left, EXACT_S), 0.5), deterministic)
        except PestoError as e:  # the incumbent stays; the failure is reported
            log.warning("the exact joint ILP failed on %s: %s", problem.graph.name, e)
            ex, info["joint_ilp"] = None, {"status": "solver_failed", "error": str(e)}
        if ex is not None:
            jplan, jplaced, jcover, jspan, jinfo = ex
            info["joint_ilp"] = {k: jinfo.get(k) for k in ("status", "mip_gap", "objective", "bound", "source",
                                                            "budget", "node_limit", "deterministic",
                                                            "deterministic_reason") if k in jinfo}
            if no_slower(jspan, span):
                tie = jspan >= span * (1 - TIE)
                plan, placed, cover, span = jplan, jplaced, jcover, jspan
                info["decided_by"] = f"joint-ilp (= {info['decided_by']})" if tie else "joint-ilp"
    gap = _gap(span, bound)
    if bound is not None and bound > span * (1 + 1e-6):  # no claim rather than a wrong one
        info["bound_error"] = (f"the relaxed joint ILP's bound {bound:.6g} s exceeds a simulated plan "
                               f"({span:.6g} s): the relaxation misses a way the simulator saves time")
        log.warning("%s; no gap is reported for %s", info["bound_error"], problem.graph.name)
        bound = None
    info.update(bound_s=bound, gap=gap, makespan_s=float(span),
                status="heuristic" if gap is None else "optimal" if gap <= OPTIMAL_GAP else "feasible")
    return plan, placed, cover, span, info


def restate(info: dict, bound_s: float | None, span: float, decided_by: str) -> None:
    """Set ``info``'s claim (``decided_by``, ``bound_s``, ``mip_gap``, ``status``) for a plan
    of makespan ``span`` against ``bound_s``, a bound of the whole problem (e.g. when a rule
    outside the solver keeps a plan of a restricted problem)."""
    gap = _gap(span, bound_s)
    info.update(decided_by=decided_by, bound_s=bound_s, mip_gap=gap,
                status="heuristic" if gap is None else "optimal" if gap <= OPTIMAL_GAP else "feasible")


__all__ = ["EXACT_MAX_NODES", "EXACT_MAX_PAIRS", "OPTIMAL_GAP", "decide", "exact_joint", "no_slower", "restate"]
