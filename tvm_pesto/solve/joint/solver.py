"""Backend + device + order, chosen together: the solver behind every entry point.

:func:`solve_joint` takes a :class:`~tvm_pesto.plan.JointProblem` (candidates of every
backend, their cost on every device) and returns a :class:`~tvm_pesto.plan.Plan` whose
``units`` are the chosen candidates, with the placement :class:`~tvm_pesto.plan.Problem`
of that cover (so the plan can be simulated, and the builder lowers exactly it).

1. **Cover.** When the candidates partition the ops (placement alone: TVM's fusion
   groups), the cover is fixed. Otherwise Collage's covering search
   (:func:`tvm_pesto.solve.joint.cover.best_cover`) gives the cheapest acyclic cover on each
   distinct kind of device, and, with several devices, the cheapest covers by candidates
   of at most half, a quarter, ... of the largest size (:func:`cover_caps`): one large call
   is cheapest on one device but can block the parallelism smaller calls would have.
2. **Placement.** The cover's units are placed and ordered by the named placement solver
   (``heft``, ``m-etf``, ``m-sct``, ``m-topo``, ``single``, ``ilp``); with ``solver="auto"``
   by every heuristic of :data:`AUTO_PLACERS`, keeping the best.
3. **Joint improvement.** With several devices and a choice of backends, a local search
   (:func:`tvm_pesto.solve.joint.search.improve`) moves units between devices and replaces
   a unit by another cover of the same ops (another backend, or a split / merge), keeping
   a move when the simulated makespan drops.
4. **The ILPs decide.** With ``solver="auto"`` (the default of every entry point),
   :func:`tvm_pesto.solve.joint.decide.decide` solves the relaxed joint ILP on the whole
   graph (cover and devices; its dual bound is a lower bound on every plan) and, on small
   graphs, the exact joint ILP (cover, devices and order), each warm-started from the best
   plan so far, and keeps the fastest: ``info["decided_by"]`` names the step whose plan
   was kept, ``info["status"]`` is ``optimal`` when the plan meets the proven bound,
   ``info["mip_gap"]`` its relative gap to it. With ``solver="ilp"`` only the exact joint
   ILP runs, on small graphs.

Every budget of the three steps is wall-clock by default; ``deterministic=True`` makes them
work budgets (:mod:`tvm_pesto.solve.budget`), so the same problem gives the same plan on
any machine.

Examples
--------
>>> from tvm_pesto.plan.examples import chain_with_a_library_call
>>> problem = chain_with_a_library_call()   # a -> b -> c; tvm per op, or torch for a and b
>>> plan, placed = solve_joint(problem, solver="heft")
>>> plan.backend_mix(), simulate(placed, plan).makespan   # ops per backend: torch runs a and b as one call
({'torch': 2, 'tvm': 1}, 4.0)
"""
from __future__ import annotations

import time

import numpy as np

from ...errors import InfeasibleError, PestoError, SolverError
from ...plan.plan import Plan
from ...plan.problem import JointProblem, Problem
from ...plan.simulate import simulate
from ..budget import combine, is_deterministic, mode_name
from ..registry import get_solver, solve as place_units
from .cover import CoverResult, best_cover
from .decide import decide, exact_joint
from .search import improve

#: The placement heuristics ``solver="auto"`` places every cover with (the best plan is kept).
AUTO_PLACERS = ("heft", "m-etf", "m-topo", "m-sct")
#: Evaluated plans of the joint local search (:func:`tvm_pesto.solve.joint.search.improve`),
#: shared by the searches of ``auto``'s starts.
SEARCH_EVALS = 4000
#: With wall-clock budgets the ILPs get at least this many seconds, whatever the steps before
#: them spent of ``time_limit_s``.
MIN_ILP_S = 1.0
#: Seconds (nominal seconds of work with work budgets) of the joint local search by default.
SEARCH_S = 5.0


def default_search_s(time_limit_s: float, deterministic: bool | None = None) -> float:
    """The joint local search's budget when a solve names none: :data:`SEARCH_S`, and with
    wall-clock budgets no more than ``time_limit_s`` leaves the ILPs' :data:`MIN_ILP_S` (a
    final choice's later solves get a second each: the search's 5 s made each take 4-6 s on a
    ConvNeXt-T at 224x224, and the build's 30 s of solving 44).

    Examples
    --------
    >>> default_search_s(30.0), default_search_s(3.0), default_search_s(1.0), default_search_s(1.0, deterministic=True)
    (5.0, 2.0, 0.0, 5.0)
    """
    if is_deterministic(deterministic):
        return SEARCH_S
    return max(0.0, min(SEARCH_S, float(time_limit_s) - MIN_ILP_S))


def device_kinds(problem: JointProblem) -> list[int]:
    """One device index per distinct cost column (devices with identical columns are alike)."""
    reps: list[int] = []
    for d in range(problem.num_devices):
        col = problem.costs[:, d]
        if not any(np.array_equal(col, problem.costs[:, r]) for r in reps):
            reps.append(d)
    return reps


def joint_lower_bound(problem: JointProblem) -> dict:
    """Makespan no plan of ``problem`` beats, whatever its cover: each op costs at least the
    cheapest ``cost(c) / |c|`` of the candidates containing it; ``critical_path_s`` is the
    longest path of those (transfers free), ``work_s`` their sum over the devices, ``best``
    the larger.

    Examples
    --------
    >>> import numpy as np
    >>> from tvm_pesto.candidates import Candidate
    >>> from tvm_pesto.cluster import parse_cluster
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> from tvm_pesto.plan import JointProblem
    >>> g = OpGraph([OpNode(c, "relax.add") for c in "abc"], [(0, 1, 4), (1, 2, 4)])   # a -> b -> c
    >>> cands = [Candidate("tvm", (0,)), Candidate("tvm", (1,)), Candidate("tvm", (2,)), Candidate("torch", (0, 1))]
    >>> costs = np.array([[2.0, 2.0], [2.0, 2.0], [1.0, 1.0], [3.0, 3.0]])   # seconds per candidate, device
    >>> problem = JointProblem(g, parse_cluster("2xV100-nvlink"), cands, costs)
    >>> joint_lower_bound(problem)   # a and b cost at least 3.0 / 2 each, c 1.0
    {'critical_path_s': 4.0, 'work_s': 2.0, 'best': 4.0}
    """
    n, D = problem.graph.num_nodes, problem.num_devices
    per_op = np.full(n, np.inf)
    for c, cand in enumerate(problem.candidates):
        share = problem.costs[c].min() / max(len(cand.nodes), 1)
        idx = list(cand.nodes)
        per_op[idx] = np.minimum(per_op[idx], share)
    per_op = np.where(np.isfinite(per_op), per_op, 0.0)
    finish = np.zeros(n)
    for v in problem.graph.topo_order():
        finish[v] = per_op[v] + max((finish[u] for u in problem.graph.dag.predecessors(v)), default=0.0)
    cp = float(finish.max()) if n else 0.0
    work = float(per_op.sum() / D)
    return {"critical_path_s": cp, "work_s": work, "best": max(cp, work)}


def cover_caps(sizes: np.ndarray, num_devices: int) -> list[int]:
    """Largest candidate sizes the cover search may use: no limit, and with several devices
    halvings of the largest size down to 4 ops (at most five caps)."""
    top = int(sizes.max()) if len(sizes) else 1
    caps = [top]
    if num_devices > 1:
        c = top // 2
        while c >= 4 and len(caps) < 5:
            caps.append(c)
            c //= 2
    return caps


#: facts a solver puts in ``plan.info`` about the plan it returned; recomputed for the plan
#: the joint solve returns (the search may have changed it)
_PLAN_FACTS = ("peak_memory_bytes", "estimated_makespan_s", "makespan_s", "device")


def _with_units(plan: Plan, problem: JointProblem, cover, info: dict, solver: str, placed: Problem) -> Plan:
    """The final plan: its units, the solver's name, and facts of this plan (not of an
    earlier one the search started from)."""
    sim = simulate(placed, plan)
    facts = {k: v for k, v in plan.info.items() if k not in _PLAN_FACTS}
    facts.update(info, makespan_s=float(sim.makespan), peak_memory_bytes=sim.peak_memory.tolist())
    label = "joint-ilp" if plan.solver == "joint-ilp" and solver != "auto" else solver
    return Plan(plan.assignment, plan.order, solver=label, solve_s=plan.solve_s, info=facts,
                units=[problem.candidates[c] for c in cover])


def _place(problem: JointProblem, cover, solver: str, options: dict, deterministic: bool | None
           ) -> tuple[Plan, Problem, float]:
    placed = problem.contract(cover)
    placed.check_memory_feasible()
    plan = place_units(placed, solver, deterministic=deterministic, **options)
    return plan, placed, simulate(placed, plan).makespan


def _candidate_covers(problem: JointProblem) -> dict[tuple, CoverResult]:
    """The cheapest cover on each kind of device, for each candidate size cap of
    :func:`cover_caps` (``info["cap"]``), by the sorted candidates it chooses; where no
    device can run every op (a user's pins to several devices), the cover of each candidate's
    cheapest device."""
    covers: dict[tuple, CoverResult] = {}
    node_sets = [c.nodes for c in problem.candidates]
    sizes = np.array([len(c.nodes) for c in problem.candidates])
    for d in device_kinds(problem):
        for cap in cover_caps(sizes, problem.num_devices):
            costs = np.where(sizes <= cap, problem.costs[:, d], np.inf)
            try:
                cr = best_cover(problem.graph, node_sets, costs, exact_work=0 if cap < sizes.max() else 2_000_000)
            except PestoError:
                continue
            cr.info["cap"] = int(cap)
            covers.setdefault(tuple(sorted(cr.chosen)), cr)
    if not covers:  # no device runs every op (candidates pinned to different devices): each at its cheapest
        try:
            cr = best_cover(problem.graph, node_sets, problem.costs.min(axis=1))
            cr.info["cap"] = int(sizes.max())
            covers[tuple(sorted(cr.chosen))] = cr
        except PestoError:
            pass
    return covers


def solve_joint(problem: JointProblem, solver: str = "auto", time_limit_s: float = 30.0, search_s: float | None = None,
                deterministic: bool | None = None, **solver_options) -> tuple[Plan, Problem]:
    """Choose a cover, place and order its units, and improve both together.

    Parameters
    ----------
    problem : JointProblem
    solver : str
        The placement solver for the cover's units (see :data:`tvm_pesto.solve.SOLVERS`);
        ``auto``: every heuristic, then the ILPs decide (module docstring, step 4).
    time_limit_s : float
        Budget of the ILPs (placement ILP and joint ILP), seconds; with wall-clock budgets
        the ILPs get what the steps before them left of it, so a solve ends within about
        ``time_limit_s`` (at least :data:`MIN_ILP_S` go to the ILPs).
    search_s : float, optional
        Budget of the joint local search (default: :data:`SEARCH_S`, and with wall-clock
        budgets at most what ``time_limit_s`` leaves the ILPs' :data:`MIN_ILP_S`, so the
        solve ends within about ``time_limit_s``; 0 turns it off).
    deterministic : bool, optional
        Work budgets instead of wall-clock ones in every step (MIP node limits, the joint
        search's evaluation count, weighted simulations in the local searches), fixed
        seeds; default: the ambient mode (:func:`tvm_pesto.solve.budget.is_deterministic`).
    **solver_options
        Passed to the placement solver.

    Returns
    -------
    (Plan, Problem)
        The plan (``units`` = chosen candidates; ``info["status"]`` the solver's status,
        ``info["cover"]`` how the cover was chosen, ``info["budget"]`` the mode and
        ``info["deterministic"]`` whether no clock decided the plan, else
        ``info["deterministic_reason"]``) and the placement problem of its cover.

    Raises
    ------
    InfeasibleError
        When no cover fits the devices' memory or some op cannot run anywhere.
    """
    t0 = time.perf_counter()
    auto = solver == "auto"
    placers = AUTO_PLACERS if auto else (solver,)
    get_solver(solver)  # an unknown name fails here, listing the known ones
    options = dict(solver_options)
    if solver == "ilp":
        options.setdefault("time_limit_s", time_limit_s)
    info: dict = {}
    fixed = problem.fixed_cover()
    if fixed is not None and not auto:
        plan, placed, _ = _place(problem, fixed, solver, options, deterministic)
        plan = _with_units(plan, problem, fixed, {"cover": "fixed", "budget": mode_name(deterministic),
                                                  **combine({"deterministic": True}, plan.info)}, solver, placed)
        plan.solve_s = time.perf_counter() - t0
        return plan, placed

    # 1. the cheapest cover on each kind of device, placed; with several devices also the
    #    cheapest covers by smaller candidates (a large call can block parallelism); keep the best
    #    (``auto``: each cover placed by every heuristic of AUTO_PLACERS)
    covers = {tuple(fixed): None} if fixed is not None else _candidate_covers(problem)
    reports = [{"deterministic": True}]  # each budgeted step's report: did a clock decide it?
    per_placer = _best_placed(problem, covers, placers, options, deterministic, info, reports)

    # 2. joint local search: devices and backends together ("single" is the one-device baseline),
    #    from each placer's best (``auto``: so it is never worse than any heuristic's own flow)
    budget = default_search_s(time_limit_s, deterministic) if search_s is None else float(search_s)
    plan, placed, cover, span, cr, placer, tried = _searched(problem, per_placer, budget, solver, deterministic,
                                                             info, reports)
    if cr is None:
        info["cover"] = "fixed"
    else:
        info.update(cover="dp", cover_exact=bool(cr.info.get("exact", True)), cover_cost_s=float(cr.cost),
                    cover_states=int(cr.states), cover_s=float(cr.seconds), cover_cap=cr.info.get("cap"),
                    covers_tried=len(covers))
    if auto:
        info["heuristics"] = tried

    # 3. the ILPs: ``auto`` runs the relaxed joint ILP on the whole graph (a proven bound, and
    #    its own plan) and the exact one on small graphs; ``ilp`` the exact one on small graphs
    spent = time.perf_counter() - t0
    ilp_s = time_limit_s if is_deterministic(deterministic) else max(MIN_ILP_S, time_limit_s - spent)
    plan, placed, cover, span = _ilps(problem, solver, (plan, placed, cover, span), placer, ilp_s,
                                      min(budget, 1.0), deterministic, info, reports)
    info["makespan_s"] = float(span)
    info.update(budget=mode_name(deterministic), **combine(*reports))
    plan = _with_units(plan, problem, cover, info, solver, placed)
    plan.solve_s = time.perf_counter() - t0
    return plan, placed


def _ilps(problem: JointProblem, solver: str, incumbent: tuple, placer: str, time_limit_s: float, search_s: float,
          deterministic, info: dict, reports: list) -> tuple:
    """Step 3 of :func:`solve_joint`: the ILPs from ``incumbent`` ``(plan, placed, cover,
    makespan)``; the best plan, with what the ILPs said in ``info``."""
    plan, placed, cover, span = incumbent
    if solver == "auto":
        plan, placed, cover, span, dinfo = decide(problem, plan, placed, cover, span, time_limit_s=time_limit_s,
                                                  search_s=search_s, deterministic=deterministic, decided_by=placer)
        reports.extend(r for r in (dinfo["relaxation"], dinfo.get("joint_ilp")) if r)
        info["decision"] = dinfo
        info.update(decided_by=dinfo["decided_by"], status=dinfo["status"], mip_gap=dinfo["gap"],
                    bound_s=dinfo["bound_s"])
    elif solver == "ilp":
        res = exact_joint(problem, plan, placed, cover, time_limit_s, deterministic)
        if res is not None:
            jplan, jplaced, jcover, jspan, jinfo = res
            info["joint_ilp"] = {k: jinfo.get(k) for k in ("status", "mip_gap", "objective", "source", "budget",
                                                           "node_limit", "deterministic", "deterministic_reason")
                                 if k in jinfo}
            reports.append(jinfo)
            if jspan < span * (1 - 1e-9):
                plan, placed, cover, span = jplan, jplaced, jcover, jspan
                info["joint_ilp"]["used"] = True
                plan.info.setdefault("status", jinfo.get("status"))
    return plan, placed, cover, span


def _best_placed(problem: JointProblem, covers: dict, placers, options: dict, deterministic, info: dict,
                 reports: list) -> dict:
    """Each placer's best cover: placer -> ``(plan, placed, cover, makespan, CoverResult or
    None)`` (the first cover of the smallest makespan, as the placer alone would choose).

    Raises
    ------
    InfeasibleError
        When every cover fails for the same kind of reason (memory).
    SolverError
        When no cover could be placed.
    """
    per: dict[str, tuple] = {}
    errors: list[PestoError] = []
    for key, cr in covers.items():
        chosen = list(key) if cr is None else list(cr.chosen)
        for name in placers:
            try:
                plan, placed, span = _place(problem, chosen, name, options, deterministic)
            except PestoError as e:
                errors.append(e)
                info.setdefault("cover_rejected", []).append(f"{name}: {e}" if len(placers) > 1 else str(e))
                continue
            reports.append(plan.info)  # every placement took part in choosing the cover
            if name not in per or span < per[name][3]:
                per[name] = (plan, placed, chosen, span, cr)
    if not per:
        if errors and all(isinstance(e, InfeasibleError) for e in errors):
            raise errors[0]  # e.g. memory: the same reason for every cover, said once
        raise SolverError(f"no cover of the candidates could be placed ({len(errors)} tried): "
                          + "; ".join(dict.fromkeys(str(e) for e in errors)))
    return per


def _searched(problem: JointProblem, per_placer: dict, budget: float, solver: str, deterministic, info: dict,
              reports: list) -> tuple:
    """Step 2 of :func:`solve_joint`: the joint local search from each placer's best, best
    start first, one search per distinct start, all within one search's budget (seconds and
    :data:`SEARCH_EVALS` evaluated plans, shared: a later start gets what the earlier left);
    the best result ``(plan, placed, cover, makespan, CoverResult or None, decided_by,
    {placer: makespan})``. The search's report goes to ``info["search"]``, the best start's
    makespan to ``info["placed_makespan_s"]``."""
    best = None
    tried: dict[str, float] = {}
    done: dict[tuple, tuple] = {}
    left_s, left_evals = budget, SEARCH_EVALS
    starts = sorted(per_placer.items(), key=lambda kv: kv[1][3])  # stable: placer order among ties
    info["placed_makespan_s"] = float(starts[0][1][3])
    for name, (plan, placed, cover, span, cr) in starts:
        by, sinfo = name, None
        key = (tuple(cover), tuple(plan.assignment.tolist()), tuple(tuple(o) for o in plan.order))
        if key not in done and budget > 0 and solver != "single" and left_s > 0 and left_evals > 0:
            done[key] = improve(problem, plan, placed, cover, budget_s=left_s, max_evals=left_evals,
                                refine_s=max(0.2, budget / 10), deterministic=deterministic)
            reports.append(done[key][4])
            left_evals -= done[key][4]["evaluations"]
            if not is_deterministic(deterministic):  # work budgets only: no clock may decide the plan
                left_s -= done[key][4]["seconds"]
        if key in done:
            before = span
            plan, placed, cover, span, sinfo = done[key]
            by = name + "+search" if span < before * (1 - 1e-9) else name
        tried[name] = float(span)
        if best is None or span < best[3] * (1 - 1e-12):
            best = (plan, placed, cover, span, cr, by, sinfo)
    *best, sinfo = best
    if sinfo is not None:
        info["search"] = sinfo
    return (*best, tried)


__all__ = ["AUTO_PLACERS", "SEARCH_S", "cover_caps", "default_search_s", "device_kinds", "joint_lower_bound", "solve_joint"]
