"""The stage model's MIP, solved from the best stage plan there is to start from (the model
itself, after the dnn-partitioning paper's throughput and latency IPs, is
:func:`tvm_pesto.solve.stage.model.build_stage_ilp`).

Objective: ``B`` (steady state), ``T`` (latency) or ``(T + (K - 1) B) / K``. The plans it
returns are judged exactly by :func:`tvm_pesto.plan.objective.evaluate`; the MIP is warm
started from the best of the contiguous-split DP (:mod:`tvm_pesto.solve.stage.dp`) and every
heuristic's stage plan (:func:`stage_starts`) and never returns anything worse. Where it is
not built (too large, and the piece MIP of :mod:`tvm_pesto.solve.stage.piece_mip` does not
apply) or finds nothing, the result says so: ``status`` ``heuristic``, with ``reason`` and
``start`` (whose plan it is).

Examples
--------
>>> from tvm_pesto.bench.random_dag import dnn_like_problem
>>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
>>> plan = solve(problem, objective="throughput", time_limit_s=10, deterministic=True)
>>> plan.info["status"], plan.info["objective_value_s"] > 0
('optimal', True)
"""
from __future__ import annotations

import time

from ...errors import InfeasibleError, PestoError, error_line
from ...plan.objective import check_choice, evaluate
from ...plan.plan import Plan
from ...plan.problem import Problem
from ...plan.stage import node_passes
from ..bounds.objective import objective_lower_bound
from ..budget import combine, mode_name
from ..heuristics.portfolio import HEURISTIC_SOLVERS
from ..mip import solve_mip
from ..settings import MipSettings
from .dp import device_orders, heuristic_stage_plan
from .dp import solve as dp_solve
from .model import ModelTooLarge, build_stage_ilp, extract_assignment, relaxed_applies
from .piece_mip import applies, solve_pieces

MAX_ROWS = 15_000
#: Rows the relaxed stage MIP (no acyclicity rows, compact IO) may have where the full one has
#: more than ``max_rows`` (:func:`tvm_pesto.solve.stage.model.build_stage_ilp`); its latency
#: model (timing rows too) may have :data:`RELAXED_LATENCY_MAX_ROWS`.
RELAXED_MAX_ROWS = 40_000
RELAXED_LATENCY_MAX_ROWS = 60_000
#: Relative MIP gap at which the stage MIP stops; a start this close to the lower bound is
#: returned without a MIP.
GAP = 1e-4
_SAFETY = 1e-6  # relative margin on the MIP's dual bound, as the other bounds keep


#: The plans the MIP starts from: the contiguous-split DP and every heuristic, each made a
#: stage plan as the registry makes it (:func:`tvm_pesto.solve.stage.dp.heuristic_stage_plan`).
START_SOLVERS = ("stage-dp",) + tuple(HEURISTIC_SOLVERS)


def stage_starts(problem: Problem, objective: str = "throughput", microbatches=None,
                 warm_start: Plan | None = None) -> tuple[list[tuple[float, str, Plan]], dict[str, str]]:
    """Every start of :data:`START_SOLVERS` (and ``warm_start``) that is a valid stage plan,
    as ``(objective value, name, plan)``, best first (the earlier name on a tie), and the
    error of each solver that gave no plan (``Type: message``)."""
    scored, errors = [], {}
    cands = [(name, None) for name in START_SOLVERS] + ([("warm_start", warm_start)] if warm_start is not None else [])
    for rank, (name, plan) in enumerate(cands):
        if plan is None:
            try:
                plan = dp_solve(problem, objective=objective, microbatches=microbatches) if name == "stage-dp" else \
                    heuristic_stage_plan(problem, HEURISTIC_SOLVERS[name], objective, microbatches)
            except PestoError as e:  # no plan within the memory, no LP solver for m-sct: said in info
                errors[name] = error_line(e)
                continue
        ev = evaluate(problem, plan, "stage", objective, microbatches)
        if ev.valid:
            scored.append((ev.objective_value, rank, name, plan))
        else:
            errors[name] = f"invalid stage plan ({ev.violations[0]['kind']}): {ev.violations[0]['message']}"
    scored.sort(key=lambda t: (t[0], t[1]))
    return [(v, name, plan) for v, _r, name, plan in scored], errors


def mip_bound_is_valid(problem: Problem, objective: str, microbatches, relaxed: bool = False) -> bool:
    """Whether the MIP's optimum (so its dual bound) is a lower bound in the stage model: its
    loads are the model's exactly, and so are its block times when no edge runs between the
    passes (otherwise it charges a received tensor once per pass that needs it, where the
    model charges it once per device); the relaxed MIP's wherever it is built (``relaxed``:
    it charges once per device, :func:`~tvm_pesto.solve.stage.model.relaxed_applies`)."""
    if problem.pooled("stage", objective, microbatches):
        return False  # the host pool runs CPU nodes side by side; the MIP gives each CPU one block
    if (objective == "throughput" and microbatches is None) or relaxed:
        return True
    passes = node_passes(problem.graph)
    return bool((passes[problem.src] == passes[problem.dst]).all()) if len(problem.src) else True


def solve(problem: Problem, objective: str = "throughput", microbatches=None, time_limit_s: float = 10.0,
          solver: str = "highs", deterministic: bool | None = None, msg: bool = False, warm_start: Plan | None = None,
          max_rows: int = MAX_ROWS, **_ignored) -> Plan:
    """The ``ilp`` solver in the stage model: the MIP of the module docstring, warm started
    from the best valid stage plan among :func:`stage_starts` (the DP, every heuristic and
    ``warm_start``, judged by ``objective``), so never worse than any of them.

    No MIP is solved when the start meets the lower bound (``status`` ``optimal``,
    ``proven_by``). Where the MIP has more than ``max_rows`` constraints (HiGHS's root LP
    alone then outlasts any sensible budget), one sample's latency of an inference graph on
    accelerators and CPUs is solved by the piece MIP instead
    (:mod:`tvm_pesto.solve.stage.piece_mip`: ``mip`` ``pieces``, ``full_mip`` why not the
    other; ``status`` ``feasible`` where it is optimal in its own model but the gap to the
    bound remains); otherwise the start is returned with ``status`` ``heuristic`` and
    ``reason``. The same when the MIP ran but gave nothing usable (``mip_status`` says what
    it ended with). Where the full MIP is too large for the steady state or one sample's
    latency (a training file's two passes), its relaxation (``mip`` ``relaxed``:
    :func:`~tvm_pesto.solve.stage.model.build_stage_ilp`) gives the bound
    and, where its solution is a valid plan, the plan: ``status`` ``optimal`` where the plan
    meets the bound, else ``feasible`` (``mip_status`` the MIP's outcome). Where the
    problem's host pool holds (the benchmark's latency rule,
    :class:`tvm_pesto.plan.problem.HostPool`, stated in ``rules``), the piece MIP is that
    rule's model and runs at once where it applies.

    ``info``: ``status`` (``optimal``, ``time_limit``, ``node_limit``: the MIP's real outcome,
    :mod:`tvm_pesto.solve.mip`; ``heuristic``: no MIP result), ``reason`` (why not, where
    none), ``start`` (the start's solver) and ``start_values_s`` (every start's value),
    ``start_errors`` (starts that gave no valid plan), ``source`` (``ilp`` when the MIP found
    a better plan, else the start's name), ``objective_value_s``, ``lower_bound_s`` (the
    cheap bound, or the MIP's dual bound where that is larger and valid:
    :func:`mip_bound_is_valid`), ``gap`` (value / bound - 1), ``num_vars``,
    ``num_constraints``, ``budget``, ``deterministic``.

    Raises
    ------
    InfeasibleError
        When no start is a valid stage plan (no contiguous split fits the memory).
    """
    model, objective, microbatches = check_choice("stage", objective, microbatches)
    t0 = time.perf_counter()
    scored, errors = stage_starts(problem, objective, microbatches, warm_start)
    if not scored:
        raise InfeasibleError(f"{problem.graph.name}: no valid stage plan to start the stage MIP from (no contiguous "
                              f"split fits the memory of {problem.cluster.name}); use devices with more memory")
    warm_value, warm_name, warm = scored[0]
    lb = objective_lower_bound(problem, "stage", objective, microbatches, lp=False)["best"]
    info = {"start": warm_name, "warm_start_value_s": warm_value, "warm_start_solver": warm_name,
            "start_values_s": {name: v for v, name, _ in scored}, "start_errors": errors, "lower_bound_s": lb,
            "model": "stage", "objective": objective, "microbatches": microbatches, "budget": mode_name(deterministic)}
    pooled = problem.pooled("stage", objective, microbatches)
    if pooled:
        info["rules"] = problem.host_pool.to_json()

    def done(plan: Plan, source: str, value: float, **facts) -> Plan:
        if "objective" in facts:  # the MIP's own value; ``objective`` names what is minimised
            facts["mip_objective"] = facts.pop("objective")
        info.update(facts, source=source, objective_value_s=value)
        info["gap"] = value / info["lower_bound_s"] - 1.0 if info["lower_bound_s"] > 0 else None
        return Plan(plan.assignment, plan.order, solver="ilp", solve_s=time.perf_counter() - t0, info=info)

    # The start meets the lower bound within the MIP's own gap: the MIP could only prove what
    # the bound does (the bounds sit 1e-6 below their value against solver tolerances).
    if warm_value <= lb * (1 + GAP):
        return done(warm, warm_name, warm_value, status="optimal", proven_by="lower bound", deterministic=True)
    why_not = applies(problem, objective, microbatches)
    mip = MipSettings(time_limit_s=time_limit_s, solver=solver, gap=GAP, msg=msg, deterministic=deterministic)
    if pooled and why_not is None:  # the host pool's latency is the piece MIP's model itself
        return _pieces(problem, info, (warm_value, warm_name, warm), done, mip,
                       full_mip="skipped: the host pool's latency is the piece MIP's model")
    try:
        prob, V = build_stage_ilp(problem, objective, microbatches, warm, max_rows=max_rows)
    except ModelTooLarge as e:  # its root LP alone outlasts any sensible budget
        if why_not is None:  # the piece MIP: its size grows with the graph times the accelerators
            return _pieces(problem, info, (warm_value, warm_name, warm), done, mip, full_mip=f"skipped: {e}")
        prob, V, too_large = _relaxed(problem, objective, microbatches, warm, str(e))
        if prob is None:
            return done(warm, warm_name, warm_value, status="heuristic", deterministic=True, mip=f"skipped: {e}",
                        reason=f"the stage MIP was not built: {e}, and neither the piece MIP ({why_not}) nor the "
                               f"relaxed MIP ({too_large}) applies; the plan is {warm_name}'s, the best start")
        info.update(mip="relaxed", full_mip=f"skipped: {e}")
    info.update(num_vars=len(prob.variables()), num_constraints=prob.numConstraints(), time_limit_s=time_limit_s)
    res = solve_mip(prob, solver, time_limit_s=time_limit_s, gap=GAP, msg=msg, deterministic=deterministic)
    facts = res.info(V["ts"])
    facts["mip_status"] = facts["status"]
    if res.bound is not None and mip_bound_is_valid(problem, objective, microbatches, bool(V.get("relaxed"))):
        mb = max(0.0, facts["bound"] * (1 - _SAFETY) - 1e-12)
        facts["mip_bound_s"] = mb
        info["lower_bound_s"] = max(lb, mb)
    best, source, value = _judged(problem, objective, microbatches, res, V, (warm_value, warm_name, warm), facts)
    if V.get("relaxed") and "mip_bound_s" in facts:  # the relaxation's bound holds whatever its solution
        proven = value <= info["lower_bound_s"] * (1 + GAP) * (1 + 1e-6)
        facts["status"] = "optimal" if proven else "feasible"
        facts.pop("reason", None)
    facts.update(combine(res.determinism))
    return done(best, source, value, **facts)


def _judged(problem: Problem, objective: str, microbatches, res, V: dict, start: tuple, facts: dict) -> tuple:
    """``(plan, source, value)``: the stage MIP's solution where it is a valid plan better than
    ``start`` (value, solver name, plan), else the start; ``facts`` say why not."""
    warm_value, warm_name, warm = start
    if res.has_solution:
        a = extract_assignment(problem, V)
        cand = Plan(a, device_orders(problem, a), solver="ilp")
        ev = evaluate(problem, cand, "stage", objective, microbatches)
        if ev.valid and ev.objective_value < warm_value * (1 - 1e-9):
            return cand, "ilp", ev.objective_value
        if not ev.valid:
            facts.update(extract_error=ev.violations[0]["message"], status="heuristic",
                         reason=f"the stage MIP's solution is not a valid stage plan; the plan is {warm_name}'s, "
                                "the best start")
    elif res.status != "optimal":
        facts.update(status="heuristic", reason=f"the stage MIP ended without a solution ({res.status}); the plan is "
                                                f"{warm_name}'s, the best start")
    return warm, warm_name, warm_value


def _relaxed(problem: Problem, objective: str, microbatches, warm: Plan, too_large: str):
    """``(prob, vars, None)``: the relaxed stage MIP of the steady state or one sample's
    latency (:func:`~tvm_pesto.solve.stage.model.build_stage_ilp` with ``relaxed=True``) where
    the full one is too large, or ``(None, None, why not)``."""
    why_not = relaxed_applies(problem, objective, microbatches)
    if why_not is None and problem.pooled("stage", objective, microbatches):
        why_not = "the host pool runs CPU nodes side by side, where the relaxed MIP gives each CPU one block"
    if why_not is not None:
        return None, None, why_not
    rows = RELAXED_MAX_ROWS if objective == "throughput" else RELAXED_LATENCY_MAX_ROWS
    try:
        prob, V = build_stage_ilp(problem, objective, microbatches, warm, max_rows=rows, relaxed=True)
    except ModelTooLarge as e:
        return None, None, str(e)
    return prob, V, None


def _pieces(problem: Problem, info: dict, start: tuple, done, mip: MipSettings, full_mip: str) -> Plan:
    """The piece MIP (:mod:`tvm_pesto.solve.stage.piece_mip`) where the full stage MIP is too
    large or the host pool holds (``full_mip`` says which), from ``start`` (value, solver
    name, plan): its plan where valid and better than the start, its dual bound as the lower
    bound."""
    warm_value, warm_name, warm = start
    found, res, facts = solve_pieces(problem, warm, warm_value, mip)
    facts["full_mip"] = full_mip
    if "mip_bound_s" in facts:
        info["lower_bound_s"] = max(info["lower_bound_s"], facts["mip_bound_s"])
    best, source, value = warm, warm_name, warm_value
    for a in found:
        cand = Plan(a, device_orders(problem, a), solver="ilp")
        ev = evaluate(problem, cand, "stage", "latency", None)
        if ev.valid and ev.objective_value < value * (1 - 1e-9):
            best, source, value = cand, "ilp", ev.objective_value
        elif not ev.valid:
            facts["extract_error"] = ev.violations[0]["message"]
    if not res.has_solution and res.status != "optimal":
        facts.update(status="heuristic", reason=f"the piece MIP ended without a solution ({res.status}); the plan "
                                                f"is {warm_name}'s, the best start")
    elif res.status == "optimal" and value > info["lower_bound_s"] * (1 + GAP) * (1 + 1e-6):
        facts["status"] = "feasible"  # optimal in the piece model, not proven in the stage model
    facts.update(combine(res.determinism))
    return done(best, source, value, **facts)


__all__ = ["GAP", "MAX_ROWS", "RELAXED_LATENCY_MAX_ROWS", "RELAXED_MAX_ROWS", "START_SOLVERS", "mip_bound_is_valid", "solve", "stage_starts"]
