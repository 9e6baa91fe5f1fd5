"""The flow up to a plan: analyze -> candidates -> costs -> solve (:func:`place`).

:func:`place` is :func:`cost_candidates` (candidates and their costs) then
:func:`place_from_costs` (solve, hybrid rounds, split decision); callers that solve one cost
table several times (``place --solver all``, the benchmarks' restricted tables) call the two
halves. A :class:`Request` holds what a user asked of the flow besides the module and the
cluster, so the final choice (:mod:`tvm_pesto.choose`) places the same module again on
another core shape as the user asked for the first.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from .candidates import placement_candidates
from .candidates.flow import make_candidates, with_precision
from .cluster import Cluster, as_cluster
from .constraints import NodeConstraints, as_constraints, resolve
from .costs import CostTable, candidate_costs
from .costs.auto import auto_source
from .costs.measure.build_time import estimate as estimate_build_s
from .costs.predict.hybrid import Hybrid, plan_units_to_measure
from .costs.calibrate.machine import calibrate_machine, needs_fit
from .costs.predict.xgb import load_model
from .errors import ConstraintError, InfeasibleError, PestoError, SolverError, error_line
from .graph.analysis import Analysis, analyze
from .plan import JointProblem, simulate
from .plan.placement import Placement
from .plan.simulate import HOME_DEVICE
from .costs.calibrate.dispatch import machine_dispatch
from .solve import budget, split
from .solve.build_budget import solve_within
from .solve.joint.cover import best_cover
from .solve.joint.solver import MIN_ILP_S, solve_joint


def estimate_costs(analysis: Analysis, cluster, source: str = "auto", cache=None, progress=None,
                   calibrate: bool = True) -> tuple[np.ndarray, str]:
    """``[groups, devices]`` seconds of the fusion groups, and the source really used.

    The costs of placement alone: :func:`tvm_pesto.costs.candidate_costs` on the ``tvm``
    candidates (one per fusion group).
    """
    cluster = as_cluster(cluster)
    cs = placement_candidates(analysis.rg, analysis.groups)
    source = auto_source(cs, cluster).source if source == "auto" else source
    if calibrate:
        _fit_machine_if_needed(cluster, source)
    ct = candidate_costs(cs, cluster, source, cache=cache, progress=progress, calibrate=calibrate)
    return ct.table, ct.source


def _machine_constants(cluster: Cluster, executor: str) -> None:
    """Before the first plan of a cluster of this machine's CPU devices, give it the
    executor's links, dispatch and contention fitted here (kept per machine; fitted now when
    none is kept, :func:`tvm_pesto.costs.calibrate.dispatch.machine_dispatch`); other clusters get the
    assumed figures, which their reports name as assumed."""
    machine_dispatch(cluster, executor)


def _fit_machine_if_needed(cluster: Cluster, source: str) -> None:
    """Before the first ``xgb``/``hybrid`` costs on a local CPU device size this machine has
    no calibration for, fit one (:func:`tvm_pesto.costs.calibrate.machine.needs_fit`)."""
    if source not in ("xgb", "hybrid"):
        return
    try:
        cm = load_model()
    except (ImportError, PestoError):  # no xgboost or no model: the cost source says so, with its fix
        return
    if needs_fit(cm, cluster):
        calibrate_machine(cluster, cm, announce=True)


#: ``costs="hybrid"`` in :func:`place`: the share of the measuring budget spent on the close
#: calls of the predictions (:meth:`tvm_pesto.costs.predict.hybrid.Hybrid.measure_stakes`); the rest goes to
#: rounds that measure the plan's own predicted units and plan again (at most this many).
HYBRID_STAKE_SHARE = 1 / 3
HYBRID_MAX_ROUNDS = 8
#: With ``solver="auto"`` and ``hybrid`` costs, the solver of the rounds that only choose what
#: to measure next: HEFT's plan of the cheapest cover, no local search, no ILP (0.2 s where a
#: full solve took 5.5-7.9 s: timm's ``regnety_004`` at size small on ``cpu:2``, whose three
#: local searches a solve spent their last thousand evaluations finding nothing). The table
#: the rounds end with is solved in full, and a plan of that solve whose units are still
#: predictions is measured and solved in full again.
HYBRID_ROUND_SOLVER = "heft"


def place(mod_or_analysis, cluster, backends="all", solver: str = "auto", costs="auto", cache=None, progress=None,
          time_limit_s: float = 30.0, search_s: float | None = None, deterministic: bool | None = None,
          colocate: list[list[int]] | None = None, split_margin: float | None = None, executor: str = "thread",
          max_build_s: float | None = None, precision: str = "fp32", constraints=None, leave_whole: bool = False,
          **solver_options) -> Placement:
    """Decide backend, device and order for every subgraph of a module.

    Parameters
    ----------
    mod_or_analysis : tvm.IRModule or Analysis
    cluster : Cluster or str
        e.g. ``"cpu:2"``, ``"4xV100-pcie"``, a JSON file.
    backends : "all", "tvm", or list of str
    solver : str
        ``auto`` (default: every heuristic, then the joint ILPs decide and prove a bound;
        ``plan.info["decided_by"]``, ``solver_status``, ``solver_gap``) or one placement solver
        (``heft``, ``m-etf``, ``m-sct``, ``m-topo``, ``single``, ``ilp``).
    costs : {"auto", "measured", "xgb", "roofline", "hybrid"}, ndarray or CostTable
        The cost source, or a ready ``[candidates, devices]`` table (a
        :class:`~tvm_pesto.costs.CostTable` keeps its source, and so its split margin) for
        the candidates this call generates. ``hybrid`` predicts every candidate, measures the close calls
        with a third of its budget (:mod:`tvm_pesto.costs.predict.hybrid`), then measures the
        plan's units that are still predictions and plans again until the plan is
        measured or the budget (1 in 25 distinct candidates) is spent; the cost table's
        ``hybrid["rounds"]`` lists what each round measured.
    time_limit_s, search_s
        Solving budget and joint local-search budget (:func:`tvm_pesto.solve.joint.solver.solve_joint`).
        With wall-clock budgets ``time_limit_s`` bounds all the solving of this call: the
        plan's solve, then the single-device plans of the split check, which keep
        :data:`~tvm_pesto.solve.split.SINGLE_SHARE` of it, and any ``hybrid`` rounds, each
        within what the solves before it left; ``plan.solve_s`` counts them all. With
        deterministic budgets each solve gets ``time_limit_s`` nominal seconds of work.
    deterministic : bool, optional
        Work budgets and fixed seeds instead of wall-clock budgets, so the plan is the same
        on any machine (default: off, unless inside
        :func:`tvm_pesto.solve.budget.deterministic_mode`). ``plan.info["deterministic"]``
        says whether no clock decided the plan.
    colocate : list of list of int, optional
        Groups of op-graph nodes that must share a device (``JointProblem.colocate``), e.g.
        a training step's forward and gradient ops (:mod:`tvm_pesto.train.constraints`).
    split_margin : float, optional
        A plan that uses several devices is kept only when it is predicted faster than the
        best single-device plan by more than this share (default: the cost source's error,
        :data:`tvm_pesto.solve.split.SPLIT_MARGIN`; 0 keeps every split; ignored with
        ``colocate``, whose groups were asked for). ``plan.info["split"]`` has both
        predictions and the decision.
    executor : {"thread", "ray"}
        The executor the plan will run on: the simulator charges its links and dispatch
        (:mod:`tvm_pesto.cluster.dispatch`). For a cluster of this machine's CPU devices they
        are fitted here on first use and kept per machine (seconds; over Ray, after its
        actors start; ``$TVM_PESTO_MACHINE_CALIBRATION=off`` turns that off), other clusters
        get assumed figures: ``Placement.summary()["dispatch"]`` says which.
    max_build_s : float, optional
        A budget for building the plan's library units, in seconds: each candidate's build
        time is estimated from this machine's earlier builds of its backend (0 when this
        process built it already: a cached build; :mod:`tvm_pesto.costs.measure.build_time`), and
        the plan's sum is kept within it (:mod:`tvm_pesto.solve.build_budget`; the TVM
        device modules every plan compiles are not in it). ``plan.info["build_budget"]``
        says what the plan is estimated to take.
    precision : {"fp32", "bf16"}
        ``fp32`` (default): every backend computes in float32. ``bf16``: the backends that
        compute in bfloat16 on this CPU (``openvino-bf16``) compete too
        (:func:`~tvm_pesto.candidates.flow.with_precision`); the final choice holds their
        outputs to :data:`~tvm_pesto.choose.trial.REDUCED_TOL` of the float32 build's. ``build``
        and ``PlacementPass`` take it too.
    constraints : Constraints, dict or list, optional
        The user's pins, forbids and device memory caps (:mod:`tvm_pesto.constraints`;
        :func:`~tvm_pesto.constraints.as_constraints` reads the forms), honoured by every
        solver as hard constraints: applied once where the candidates and their costs are
        made (:func:`cost_candidates`). One that no plan can honour raises a
        :class:`~tvm_pesto.errors.ConstraintError` naming it, before anything is built;
        ``Placement.claim()["holds_under"]`` names the constraints the plan's claim holds under.
    leave_whole : bool
        The caller times each library's whole model itself (``build``'s final choice does, on
        ``cpu:N``): the ``hybrid`` source predicts those candidates instead of measuring them
        (:class:`~tvm_pesto.costs.predict.hybrid.Hybrid`); other sources are unchanged.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> mod, _ = tiny_mlp()
    >>> pl = place(mod, "cpu:2", costs="roofline", solver="ilp", deterministic=True)
    >>> pl.plan.info["budget"], pl.plan.info["deterministic"]
    ('work', True)
    """
    costed = cost_candidates(mod_or_analysis, cluster, with_precision(backends, precision), costs, cache=cache,
                             progress=progress, executor=executor, constraints=constraints, leave_whole=leave_whole)
    return place_from_costs(costed, solver, time_limit_s=time_limit_s, search_s=search_s,
                            deterministic=deterministic, colocate=colocate, split_margin=split_margin,
                            max_build_s=max_build_s, **solver_options)


@dataclass
class CostedCandidates:
    """A module's candidates on a cluster with their costs: what :func:`place_from_costs`
    solves (:func:`cost_candidates` makes it).

    Attributes
    ----------
    analysis : Analysis
    cluster : Cluster
    candidates : CandidateSet
    costs : CostTable
        Seconds per (candidate, device). ``dataclasses.replace(costed, costs=...)`` solves the
        same candidates on other costs (e.g. one backend's alone).
    hybrid : Hybrid, optional
        With ``costs="hybrid"``: the source that measures the plan's units in the rounds of
        :func:`place_from_costs` (it keeps what it measured, for the next solve too).
    constraints : NodeConstraints, optional
        The user's constraints bound to the model and cluster: ``candidates`` hold only what
        honours them, and :meth:`table` prices a node pinned to a device infinite elsewhere.
    """

    analysis: Analysis
    cluster: Cluster
    candidates: object
    costs: object
    hybrid: object = None
    constraints: NodeConstraints | None = None

    def table(self, ct: CostTable | None = None) -> CostTable:
        """``ct`` (default :attr:`costs`) with the device pins applied (a table the caller
        gives, or a ``hybrid`` round's, is masked again: every solve sees them)."""
        ct = self.costs if ct is None else dataclasses.replace(ct, auto=self.costs.auto)  # a hybrid round's
        if self.constraints is None or not self.constraints.device:
            return ct
        return dataclasses.replace(ct, table=self.constraints.mask(ct.table, self.candidates))

    def joint(self, table=None, colocate: list[list[int]] | None = None) -> JointProblem:
        """The joint problem of these candidates with ``table`` (a CostTable; default
        :attr:`costs`) and the co-location groups ``colocate``."""
        t = self.table(table)
        return JointProblem(self.analysis.op_graph, self.cluster, list(self.candidates), t.table,
                            cost_source=t.source, colocate=[list(g) for g in colocate or []])


def cost_candidates(mod_or_analysis, cluster, backends="all", costs="auto", cache=None, progress=None,
                    executor: str = "thread", constraints=None, leave_whole: bool = False) -> CostedCandidates:
    """The first half of :func:`place`: give ``cluster`` this machine's figures for
    ``executor`` (fitted on first use), make the candidates of ``backends`` and cost them
    (``xgb``/``hybrid`` fit this machine's calibration on first use); the arguments are
    :func:`place`'s. ``constraints`` are applied here, once, before any cost is made: the
    cluster takes the memory caps, the candidates that break a pin or forbid are dropped
    (a given cost table may hold a row per candidate before or after that), and a node that
    is left no candidate, or a model left no acyclic cover, is refused
    (:class:`~tvm_pesto.errors.ConstraintError`). ``leave_whole``: as in :func:`place`.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> mod, _ = tiny_mlp()
    >>> costed = cost_candidates(mod, "cpu:2", costs="roofline")
    >>> costed.costs.table.shape == (len(costed.candidates), 2)
    True
    >>> place_from_costs(costed, "heft").plan.solver
    'heft'
    """
    analysis = mod_or_analysis if isinstance(mod_or_analysis, Analysis) else analyze(mod_or_analysis)
    cluster = as_cluster(cluster)
    _machine_constants(cluster, executor)
    nc = None if (c := as_constraints(constraints)) is None else resolve(c, analysis.op_graph, cluster)
    cluster = cluster if nc is None else nc.cluster
    made = make_candidates(analysis, cluster, backends)
    cs = made if nc is None else honouring_candidates(nc, analysis.op_graph, made)
    if isinstance(costs, (CostTable, np.ndarray)) and len(cs) != len(made) and np.shape(_rows(costs))[0] == len(made):
        keep = [i for i, c in enumerate(made) if nc.allows(c)]  # a table of every candidate made: the kept rows
        costs = dataclasses.replace(costs, table=costs.table[keep]) if isinstance(costs, CostTable) else costs[keep]
    h = None
    auto = auto_source(cs, cluster) if isinstance(costs, str) and costs == "auto" else None
    costs = costs if auto is None else auto.source
    if isinstance(costs, str):
        _fit_machine_if_needed(cluster, costs)
    if isinstance(costs, CostTable):
        ct = costs
    elif isinstance(costs, np.ndarray):
        ct = CostTable(np.asarray(costs, dtype=np.float64), ["given"] * cluster.num_devices)
    elif costs == "hybrid":  # a third of the budget on the close calls, the rest on the plan's own units
        h = Hybrid(cs, cluster, cache=cache, progress=progress, leave_whole=leave_whole)
        h.measure_stakes(HYBRID_STAKE_SHARE)
        ct = h.cost_table()
    else:
        ct = candidate_costs(cs, cluster, costs, cache=cache, progress=progress)
    ct = ct if auto is None else dataclasses.replace(ct, auto=auto)
    if ct.table.shape != (len(cs), cluster.num_devices):
        raise PestoError(f"the cost table has shape {ct.table.shape}, but the module has {len(cs)} candidates on "
                         f"{cluster.num_devices} devices; give one row per candidate this call generates (in its "
                         "order) and one column per device")
    return CostedCandidates(analysis, cluster, cs, ct, h, nc)


def _rows(costs):
    return costs.table if isinstance(costs, CostTable) else costs


def honouring_candidates(nc: NodeConstraints, op_graph, cs):
    """``cs`` without the candidates that break a pin or forbid of ``nc``
    (:meth:`~tvm_pesto.constraints.NodeConstraints.restrict`), refused
    (:class:`~tvm_pesto.errors.ConstraintError`) when a node is left no candidate or the rest
    admit no acyclic exact cover of ``op_graph`` (pins that force a cycle between pinned
    regions, or regions that overlap), by the covering search the flow runs."""
    kept = nc.restrict(cs)
    if nc.constraints.pins or nc.constraints.forbids:
        try:  # the covering search the flow runs, on unit costs and its bounded rule: no cover, no plan
            best_cover(op_graph, [c.nodes for c in kept], np.ones(len(kept)), exact_work=0)
        except (InfeasibleError, SolverError) as e:
            raise ConstraintError(f"{', '.join(nc.restricting())}: no plan honours these, since the candidates left "
                                  f"admit no acyclic cover of the model (pinned regions would form a cycle, or "
                                  f"overlap): {error_line(e)}; pin fewer nodes to that backend, or pin a whole "
                                  "region that it runs as one call") from None
    return kept


def place_from_costs(costed: CostedCandidates, solver: str = "auto", time_limit_s: float = 30.0,
                     search_s: float | None = None, deterministic: bool | None = None,
                     colocate: list[list[int]] | None = None, split_margin: float | None = None,
                     max_build_s: float | None = None, **solver_options) -> Placement:
    """The second half of :func:`place`: solve ``costed`` (with ``hybrid`` costs, measure the
    plan's predicted units and solve again, in rounds), then keep a split only when it beats
    the best single-device plan by ``split_margin``; the arguments are :func:`place`'s.
    Several solvers can be run on one :class:`CostedCandidates` (``tvm-pesto place --solver
    all``); with ``hybrid`` costs each one's rounds add to the measurements the next starts from.
    """
    # seconds in solve_joint so far (a hybrid round's measurements are not solving)
    solving = budget.Solving(time_limit_s, measured=False, deterministic=deterministic, min_s=MIN_ILP_S)
    ct = costed.table(None if costed.hybrid is None else costed.hybrid.cost_table())
    build_s = None if max_build_s is None else estimate_build_s(costed.candidates, costed.cluster)
    may_split = costed.cluster.num_devices > 1 and not colocate and split_margin != 0

    def limit(share: float) -> float:  # wall-clock: ``share`` of what is left; work budgets: the whole limit
        return solving.left_s() * share if solving.wall else solving.left_s()

    def solve(table: CostTable, search=search_s, share=1.0 - split.SINGLE_SHARE if may_split else 1.0,
              how: str = solver):
        def once(t: np.ndarray):
            t0 = time.perf_counter()
            jp = costed.joint(CostTable(t, list(table.columns)), colocate)
            out = (jp, *solve_joint(jp, solver=how, time_limit_s=limit(share), search_s=search,
                                    deterministic=deterministic, **solver_options))
            solving.spend(time.perf_counter() - t0)
            return out

        if build_s is None:
            return once(table.table)
        return solve_within(costed.joint(table, colocate), build_s, max_build_s, once)

    def screen(table: CostTable):  # a hybrid round's solve: it only chooses what to measure next
        return solve(table, search=0.0, how=HYBRID_ROUND_SOLVER)

    try:
        if costed.hybrid is None:
            jp, plan, problem = solve(ct)
        else:
            rounds_solve = screen if solver == "auto" else None
            jp, plan, problem = (rounds_solve or solve)(ct)
            jp, plan, problem, ct = _hybrid_rounds(costed, jp, plan, problem, solve, rounds_solve)
    except InfeasibleError as e:
        if costed.constraints is None or isinstance(e, ConstraintError):
            raise
        raise ConstraintError(f"{', '.join(costed.constraints.constraints.spellings())}: no plan honours these on "
                              f"{costed.cluster.name}: {error_line(e)}") from None
    sim = simulate(problem, plan)
    margin = split.split_margin(ct.source) if split_margin is None else split.check_margin(split_margin)
    away = bool((plan.assignment != HOME_DEVICE).any())  # a plan elsewhere than home pays copies too
    if (len(set(plan.assignment.tolist())) > 1 or away) and margin > 0 and not colocate:
        jp, plan, problem, sim = split.keep_split_if_worth(ct, jp, plan, problem, sim, margin, solve)
    plan.solve_s = solving.spent_s  # every solve above: rounds, the split check
    return Placement(costed.analysis, costed.candidates, ct, jp, problem, plan, sim, build_s, costed.constraints)


def _hybrid_rounds(costed: CostedCandidates, jp, plan, problem, solve, screen=None) -> tuple:
    """The rounds of ``hybrid`` costs from ``plan``: measure the plan's units that are still
    predictions, costliest first, and solve again while any were measured, with ``screen``
    (when given: ``plan`` came from it too) until its plan has nothing left to measure, then
    with ``solve``, the asked solver, on the last table and while its plan has units the
    budget can still measure. ``(jp, plan, problem, table)``."""
    h = costed.hybrid
    for _ in range(HYBRID_MAX_ROUNDS):
        measured = h.measure(plan_units_to_measure(h.table, jp.cover_of(plan), h.done))
        if not measured and screen is None:
            break
        if not measured:  # the screened plan is measured: the full solve of this table
            screen = None
        jp, plan, problem = (screen or solve)(costed.table(h.cost_table()))
    else:
        if screen is not None:
            jp, plan, problem = solve(costed.table(h.cost_table()))
    return jp, plan, problem, costed.table(h.cost_table())


@dataclass(frozen=True)
class Request:
    """What a user asked of the flow, besides the module and the cluster: :func:`place`'s
    arguments. :meth:`place` places a module as asked, on any cluster, with the costs or the
    solving budget the caller gives instead.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> mod, _ = tiny_mlp()
    >>> req = Request(costs="roofline", solver="heft")
    >>> req.place(analyze(mod), "cpu:2", time_limit_s=5.0).plan.solver
    'heft'
    """

    backends: object = "all"
    solver: str = "auto"
    costs: object = "auto"
    cache: object = None
    progress: object = None
    deterministic: bool | None = None
    executor: str = "thread"
    time_limit_s: float = budget.SOLVE_S
    options: dict = field(default_factory=dict)  # the rest of place's keywords (split_margin=, max_build_s=, ...)
    constraints: object = None  # pins, forbids, memory caps (tvm_pesto.constraints)

    def place(self, analysis, cluster, costs=None, time_limit_s: float | None = None,
              leave_whole: bool = False) -> Placement:
        """:func:`place` of ``analysis`` on ``cluster`` as asked; ``costs`` and
        ``time_limit_s`` replace the asked ones where given; ``leave_whole``: the caller
        times the whole-model candidates (:func:`place`)."""
        return place(analysis, cluster, backends=self.backends, solver=self.solver,
                     costs=self.costs if costs is None else costs, cache=self.cache, progress=self.progress,
                     deterministic=self.deterministic, executor=self.executor,
                     time_limit_s=self.time_limit_s if time_limit_s is None else time_limit_s,
                     constraints=self.constraints, leave_whole=leave_whole, **self.options)


__all__ = ["CostedCandidates", "HYBRID_MAX_ROUNDS", "HYBRID_STAKE_SHARE", "Request", "cost_candidates",
           "estimate_costs", "honouring_candidates", "place", "place_from_costs"]
