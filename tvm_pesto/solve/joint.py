"""Backend + device + order, chosen together: the solver behind every entry point.

:func:`solve_joint` takes a :class:`~tvm_pesto.plan.JointProblem` (candidates of every
backend, their cost on every device) and returns a :class:`~tvm_pesto.plan.Plan` whose
``units`` are the chosen candidates, with the placement :class:`~tvm_pesto.plan.Problem`
of that cover (so the plan can be simulated, and the builder lowers exactly it).

1. **Cover.** When the candidates partition the ops (placement alone: TVM's fusion
   groups), the cover is fixed. Otherwise Collage's covering search
   (:func:`tvm_pesto.solve.cover.best_cover`) gives the cheapest acyclic cover on each
   distinct kind of device, and, with several devices, the cheapest covers by candidates
   of at most half, a quarter, ... of the largest size (:func:`cover_caps`): one large call
   is cheapest on one device but can block the parallelism smaller calls would have.
2. **Placement.** The cover's units are placed and ordered by the named placement solver
   (``heft``, ``m-etf``, ``m-sct``, ``m-topo``, ``single``, ``ilp``).
3. **Joint improvement.** With several devices and a choice of backends, a local search
   (:func:`tvm_pesto.solve.joint_search.improve`) moves units between devices and replaces
   a unit by another cover of the same ops (another backend, or a split / merge), keeping
   a move when the simulated makespan drops. With ``solver="ilp"`` on a small graph the
   joint ILP (:func:`tvm_pesto.solve.joint_ilp.joint_ilp`) searches all three at once,
   warm-started from the best plan so far.

Every budget of the three steps is wall-clock by default; ``deterministic=True`` makes them
work budgets (:mod:`tvm_pesto.solve.budget`), so the same problem gives the same plan on
any machine.

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
>>> plan, placed = solve_joint(problem, solver="heft")
>>> plan.backend_mix(), simulate(placed, plan).makespan   # ops per backend: torch runs a and b as one call
({'torch': 2, 'tvm': 1}, 4.0)
"""
from __future__ import annotations

import time

import numpy as np

from ..errors import InfeasibleError, PestoError, SolverError
from ..plan.plan import Plan
from ..plan.problem import JointProblem, Problem
from ..plan.simulate import simulate
from .budget import combine, mode_name
from .cover import CoverResult, best_cover
from .joint_search import improve
from .registry import get_solver, solve as place_units

#: Graphs up to this many ops (and with few unordered pairs) may go to the joint ILP.
JOINT_ILP_MAX_NODES = 60
JOINT_ILP_MAX_PAIRS = 1500


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
    label = plan.solver if plan.solver == "joint-ilp" else solver
    return Plan(plan.assignment, plan.order, solver=label, solve_s=plan.solve_s, info=facts,
                units=[problem.candidates[c] for c in cover])


def _place(problem: JointProblem, cover, solver: str, options: dict, deterministic: bool | None
           ) -> tuple[Plan, Problem, float]:
    placed = problem.contract(cover)
    placed.check_memory_feasible()
    plan = place_units(placed, solver, deterministic=deterministic, **options)
    return plan, placed, simulate(placed, plan).makespan


def _joint_ilp(problem: JointProblem, plan: Plan, placed: Problem, cover, time_limit_s: float,
               deterministic: bool | None):
    """The joint ILP warm-started from ``cover`` on the busiest device that can run all of
    it; ``None`` when the graph is too large for it, or no device runs the whole cover and
    the ILP, started cold, finds nothing."""
    # lazy: loads TVM's compiler and PuLP (the MIP solvers), which importing this module does not
    from .joint_ilp import concurrent_pairs, joint_ilp

    g = problem.graph
    D = problem.num_devices
    if g.num_nodes > JOINT_ILP_MAX_NODES:
        return None
    if D > 1 and len(concurrent_pairs(g)) * (D - 1) > JOINT_ILP_MAX_PAIRS:
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


def _candidate_covers(problem: JointProblem) -> dict[tuple, CoverResult]:
    """The cheapest cover on each kind of device, for each candidate size cap of
    :func:`cover_caps` (``info["cap"]``), by the sorted candidates it chooses."""
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
    return covers


def solve_joint(problem: JointProblem, solver: str = "heft", time_limit_s: float = 30.0, search_s: float | None = None,
                deterministic: bool | None = None, **solver_options) -> tuple[Plan, Problem]:
    """Choose a cover, place and order its units, and improve both together.

    Parameters
    ----------
    problem : JointProblem
    solver : str
        The placement solver for the cover's units (see :data:`tvm_pesto.solve.SOLVERS`).
    time_limit_s : float
        Budget of the ILPs (placement ILP and joint ILP), seconds.
    search_s : float, optional
        Budget of the joint local search (default: 5 s; 0 turns it off).
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
    get_solver(solver)  # an unknown name fails here, listing the known ones
    options = dict(solver_options)
    if solver == "ilp":
        options.setdefault("time_limit_s", time_limit_s)
    info: dict = {}
    fixed = problem.fixed_cover()
    if fixed is not None:
        plan, placed, _ = _place(problem, fixed, solver, options, deterministic)
        plan = _with_units(plan, problem, fixed, {"cover": "fixed", "budget": mode_name(deterministic),
                                                  **combine({"deterministic": True}, plan.info)}, solver, placed)
        plan.solve_s = time.perf_counter() - t0
        return plan, placed

    # 1. the cheapest cover on each kind of device, placed; with several devices also the
    #    cheapest covers by smaller candidates (a large call can block parallelism); keep the best
    best = None
    covers = _candidate_covers(problem)
    reports = [{"deterministic": True}]  # each budgeted step's report: did a clock decide it?
    errors: list[PestoError] = []
    for cr in covers.values():
        try:
            plan, placed, span = _place(problem, cr.chosen, solver, options, deterministic)
        except PestoError as e:
            errors.append(e)
            info.setdefault("cover_rejected", []).append(str(e))
            continue
        reports.append(plan.info)  # every placement took part in choosing the cover
        if best is None or span < best[3]:
            best = (plan, placed, list(cr.chosen), span, cr)
    if best is None:
        if errors and all(isinstance(e, InfeasibleError) for e in errors):
            raise errors[0]  # e.g. memory: the same reason for every cover, said once
        raise SolverError(f"no cover of the candidates could be placed ({len(errors)} tried): "
                          + "; ".join(dict.fromkeys(str(e) for e in errors)))
    plan, placed, cover, span, cr = best
    info.update(cover="dp", cover_exact=bool(cr.info.get("exact", True)), cover_cost_s=float(cr.cost),
                cover_states=int(cr.states), cover_s=float(cr.seconds), cover_cap=cr.info.get("cap"),
                covers_tried=len(covers), placed_makespan_s=float(span))

    # 2. joint local search: devices and backends together ("single" is the one-device baseline)
    budget = 5.0 if search_s is None else float(search_s)
    if budget > 0 and solver != "single":
        plan, placed, cover, span, sinfo = improve(problem, plan, placed, cover, budget_s=budget,
                                                   deterministic=deterministic)
        info["search"] = sinfo
        reports.append(sinfo)

    # 3. the joint ILP, for small graphs
    if solver == "ilp":
        res = _joint_ilp(problem, plan, placed, cover, time_limit_s, deterministic)
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
    info["makespan_s"] = float(span)
    info.update(budget=mode_name(deterministic), **combine(*reports))
    plan = _with_units(plan, problem, cover, info, solver, placed)
    plan.solve_s = time.perf_counter() - t0
    return plan, placed


__all__ = ["cover_caps", "device_kinds", "joint_lower_bound", "solve_joint"]
