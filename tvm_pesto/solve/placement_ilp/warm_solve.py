"""Solve the placement ILP (:mod:`tvm_pesto.solve.placement_ilp.model.build`) from a warm start and return a plan
that is never worse, when simulated, than that warm start.

The warm start is the best placement heuristic's plan (:mod:`tvm_pesto.solve.heuristics.portfolio`) unless
the caller gives one; :func:`solve_ilp` reports the solver's real outcome in the plan's ``info``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...errors import InfeasibleError, PlanError, SolverError
from ...plan import Plan, Problem, SimResult, simulate
from ..budget import mode_name
from ..heuristics.portfolio import run_heuristics
from ..mip import solve_mip
from ..settings import MipSettings
from .model.build import IlpVars, _warm_time_per_sample, build_ilp, extract_plan


def solve_ilp(problem: Problem, warm_start: Plan | None = None, pairs: int | None = None,
              objective: str = "latency", microbatches: int | None = None, floor_s: float | None = None,
              **settings) -> Plan:
    """Solve the placement + scheduling ILP and return the best plan found.

    Parameters
    ----------
    problem : Problem
    warm_start : Plan, optional
        Start point and upper bound. Default: the best heuristic's plan for ``objective``
        (:func:`tvm_pesto.solve.heuristics.portfolio.run_heuristics`).
    pairs : int, optional
        Ordering-binary window, see :func:`build_ilp` (``optimal`` then means optimal for
        the restricted model).
    objective, microbatches
        What to minimise, see :func:`build_ilp`; plans are compared on it (op model), and
        ``info["objective_value_s"]`` is the returned plan's.
    floor_s : float, optional
        A lower bound on the objective that the caller knows (seconds). When the warm start
        is within ``gap`` of it, the MIP is not built: the warm start is returned with
        ``status`` ``optimal`` and ``proven_by`` ``"lower bound"``.
    **settings
        The fields of :class:`~tvm_pesto.solve.settings.MipSettings`: ``time_limit_s`` (the
        MIP solver's own limit; model building is extra), ``solver`` (``cbc`` through PuLP, a
        system ``cbc`` if present, or ``highs`` through highspy), ``gap``, ``msg``,
        ``threads``, ``deterministic`` (a node limit, one thread and a fixed seed instead of
        the time limit, so the plan is the same on any machine; default: the ambient mode).

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
        :func:`tvm_pesto.solve.heuristics.portfolio.run_heuristics`).

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
    mip = MipSettings(**settings)
    time_limit_s, deterministic = mip.time_limit_s, mip.deterministic
    t0 = time.perf_counter()
    score = _scorer(problem, objective, microbatches)
    heuristics = {}
    if warm_start is None:
        warm_start, heuristics = _heuristic_start(problem, score, objective)
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
    warm = None if warm_start is None else _Warm(warm_start, warm_sim, score(warm_sim))
    if warm is not None and floor_s and mip.gap and warm.value <= floor_s * (1 + mip.gap):
        # the MIP could prove no more than the bound does (its root alone can take many seconds)
        info = {"status": "optimal", "proven_by": "lower bound", "lower_bound_s": float(floor_s), "timed_out": False,
                "mip_gap": float(warm.value / floor_s - 1), "source": "warm_start",
                "makespan_s": warm.sim.makespan, "objective_value_s": warm.value,
                "warm_start_makespan_s": warm.sim.makespan, "warm_start_solver": warm.plan.solver,
                "time_limit_s": time_limit_s, "optimised": objective, "budget": mode_name(deterministic),
                "deterministic": True, **heuristics}
        return warm.copy(solve_s=time.perf_counter() - t0, info=info)
    facts = {**heuristics, **({"warm_start_rejected": warm_rejected} if warm_rejected else {})}
    return _solve_from(problem, warm, score, facts, t0, mip, pairs=pairs, objective=objective,
                       microbatches=microbatches)


def _heuristic_start(problem: Problem, score, objective: str) -> tuple[Plan | None, dict]:
    """The best heuristic plan for ``objective`` and the heuristics' facts for ``info``."""
    runs = run_heuristics(problem)
    facts = {k: v for k, v in (("heuristic_makespans_s", runs.makespans), ("heuristic_errors", runs.errors)) if v}
    best = runs.best()
    if objective != "latency":  # the best start for this objective, not for the makespan
        best = runs.best(score) or best
    return best, facts


def _solve_from(problem: Problem, warm: _Warm | None, score, facts: dict, t0: float, mip: MipSettings, pairs,
                objective: str, microbatches) -> Plan:
    """Build and solve the MIP from ``warm`` (None: no usable warm start) and return the
    better of its plan and the warm start, as :func:`solve_ilp` describes; ``facts`` (what
    the heuristics and a rejected warm start said) go into the plan's ``info``."""
    prob, V = build_ilp(problem, None if warm is None else warm.plan, pairs=pairs, objective=objective,
                        microbatches=microbatches)
    t_build = time.perf_counter() - t0
    res = solve_mip(prob, mip.solver, **mip.solve_options())
    info = {"num_vars": len(prob.variables()), "num_constraints": prob.numConstraints(),
            "num_order_binaries": len(V.y), "fixed_pairs": V.fixed_pairs, "build_s": t_build,
            "time_limit_s": mip.time_limit_s, "upper_bound_s": V.ub_s, **res.info(V.time_scale), **facts}
    if res.status == "solver_failed":
        note = f"the ILP solvers failed ({'; '.join(res.failures)})"
        if warm is None:
            raise SolverError(f"{note}; use a heuristic solver or pass warm_start") from None
        info.update(source="warm_start", note=f"{note}; returning the warm start", makespan_s=warm.sim.makespan,
                    warm_start_makespan_s=warm.sim.makespan, warm_start_solver=warm.plan.solver)
        return warm.copy(solve_s=time.perf_counter() - t0, info=info)
    if res.status == "infeasible" and warm is None:
        raise InfeasibleError(f"{problem.graph.name}: the ILP has no feasible placement; most likely the "
                              "devices lack memory for the weights and received tensors, or co-location "
                              "groups cannot fit on one device; add devices or memory")
    plan = _solution_plan(problem, V, res, score, info)
    if warm is not None:
        plan = _no_worse_than(warm, plan, info, objective)
    elif plan is None:
        raise SolverError(f"{problem.graph.name}: the ILP found no solution within its {mip.time_limit_s} s budget "
                          f"(status {res.status}) and there is no warm start; raise time_limit_s or pass "
                          "warm_start=<a heuristic plan>")
    plan.solve_s = time.perf_counter() - t0
    info["optimised"] = objective
    plan.info = info
    return plan


@dataclass
class _Warm:
    """The warm start, its simulated schedule and its value for the objective (seconds)."""

    plan: Plan
    sim: SimResult
    value: float

    def copy(self, **fields) -> Plan:
        """The warm start's placement and order as a plan of the ILP solver."""
        return Plan(self.plan.assignment.copy(), [list(o) for o in self.plan.order], solver="ilp", **fields)


def _solution_plan(problem: Problem, V: IlpVars, res, score, info: dict) -> Plan | None:
    """The plan the MIP's solution holds, its simulated values written into ``info``; None
    when there is no solution or it does not simulate (tolerance artefacts)."""
    if not res.has_solution:
        return None
    plan = extract_plan(problem, V)
    try:
        sim = simulate(problem, plan)
    except (PlanError, InfeasibleError) as e:
        info["extract_error"] = str(e)
        return None
    info["makespan_s"] = sim.makespan
    info["objective_value_s"] = score(sim)
    info["source"] = "ilp"
    return plan


def _no_worse_than(warm: _Warm, plan: Plan | None, info: dict, objective: str) -> Plan:
    """``plan``, or the warm start when ``plan`` is None or worse; ``info`` says which."""
    if plan is None:
        info["source"] = "warm_start"
        info["note"] = "the ILP found no usable solution; returning the warm start"
    elif info["objective_value_s"] > warm.value * (1 + 1e-9):
        info["source"] = "warm_start"
        info["note"] = (f"the ILP's plan simulates to {info['objective_value_s']:.6g} s ({objective}), worse "
                        f"than the warm start's {warm.value:.6g} s; returning the warm start")
        plan = None
    if plan is None:
        plan = warm.copy()
        info["makespan_s"] = warm.sim.makespan
        info["objective_value_s"] = warm.value
    info["warm_start_makespan_s"] = warm.sim.makespan
    info["warm_start_solver"] = warm.plan.solver
    return plan


def _scorer(problem: Problem, objective: str, microbatches):
    """A simulated plan's value for ``objective`` in the op model."""
    if objective == "latency":
        return lambda sim: float(sim.makespan)
    return lambda sim: _warm_time_per_sample(problem, sim, microbatches)


__all__ = ["solve_ilp"]
