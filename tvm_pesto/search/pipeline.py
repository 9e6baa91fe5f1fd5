"""Backend choice + placement, end to end: candidates -> measured costs -> search -> lowered,
placed module.

Methods:

* ``dp``: Collage's search on one device (the cheapest for the cover).
* ``joint``: the joint ILP over candidates x devices x order (warm-started with the DP
  cover) when the graph has at most ``max_joint_nodes`` ops; for larger graphs the DP fixes
  the backends and the spine's placement ILP places the chosen candidates.
* ``single:<backend>``: that backend alone, TVM only for ops it has no candidate for; on one
  device.

Examples
--------
>>> from tvm_pesto.search.pipeline import search_backends, build_placed   # doctest: +SKIP
>>> bp = search_backends(mod, "cpu:2", method="joint")                     # doctest: +SKIP
>>> placed = build_placed(bp)                                              # doctest: +SKIP
>>> placed(x)                                                              # doctest: +SKIP
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..backends import available_backends
from ..candidates.generate import CandidateSet, generate_candidates
from ..candidates.measure import MeasureReport, measure_cost_table
from ..cluster import Cluster
from ..errors import PestoError
from ..plan import Plan, Problem, simulate
from .collage_dp import CoverResult, collage_dp


@dataclass
class Prepared:
    """Candidates of one model with their measured cost table."""

    rg: object
    cs: CandidateSet
    costs: np.ndarray  # [candidates, devices]
    cluster: Cluster
    report: MeasureReport
    unavailable: dict = field(default_factory=dict)


@dataclass
class BackendPlan:
    """A backend choice with a placement: ``cover`` candidate indices, ``device`` per candidate."""

    prep: Prepared
    method: str
    cover: list[int]
    device: dict[int, int]
    plan: Plan  # over the contracted graph (one node per chosen candidate, in ``cover`` order)
    problem: Problem
    predicted_s: float
    search_s: float
    info: dict = field(default_factory=dict)

    def backend_mix(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.cover:
            b = self.prep.cs[c].backend
            out[b] = out.get(b, 0) + len(self.prep.cs[c].nodes)
        return out


def prepare(mod, cluster, backends=None, cache=None, max_region: int = 40, progress=None) -> Prepared:
    """Import ``mod``, generate candidates for the usable backends and measure them all.

    Unavailable backends are skipped and reported (``unavailable``: name -> reason).
    """
    from ..api import as_cluster
    from ..graph.relax_import import RelaxGraph, from_relax

    cluster = as_cluster(cluster)
    rg = mod if isinstance(mod, RelaxGraph) else from_relax(mod)
    bks, why, seen = [], {}, set()
    for kind in sorted({d.kind for d in cluster.devices}):  # backends for any device kind present
        got, reasons = available_backends(backends, device_kind=kind)
        for b in got:
            if b.name not in seen:
                seen.add(b.name)
                bks.append(b)
        for k, v in reasons.items():
            why.setdefault(k, v)
    for b in bks:
        why.pop(b.name, None)
    cs = generate_candidates(rg, bks, max_region=max_region)
    cs.unavailable = dict(why)
    report = MeasureReport()
    costs = measure_cost_table(cs, cluster, cache, report=report, progress=progress)
    return Prepared(rg, cs, costs, cluster, report, dict(why))


def _restrict(prep: Prepared, backend: str) -> np.ndarray:
    """Costs with every candidate not usable by ``backend``-alone set to inf: ``backend``'s
    own candidates, plus TVM candidates made only of ops ``backend`` has no candidate for."""
    cs = prep.cs
    mine = np.array([c.backend == backend for c in cs])
    # Only nodes with a finite-cost candidate of the backend count as coverable.
    fin = np.isfinite(prep.costs).any(axis=1)
    coverable = {v for c, m, f in zip(cs, mine, fin) if m and f for v in c.nodes}
    keep = np.array([m or (c.backend == "tvm" and not (set(c.nodes) & coverable)) for c, m in zip(cs, mine)])
    out = prep.costs.copy()
    out[~keep] = np.inf
    return out


def _contracted(prep: Prepared, cover: list[int], costs: np.ndarray, cluster: Cluster) -> Problem:
    g = prep.rg.graph.contract([list(prep.cs[c].nodes) for c in cover], name=prep.rg.graph.name)
    return Problem(g, cluster, costs[cover], cost_source="measured")


def _one_device_plan(problem: Problem, device: int) -> Plan:
    n = problem.num_nodes
    topo = problem.graph.topo_order()
    pos = np.empty(n, dtype=np.int64)
    pos[topo] = np.arange(n)
    return Plan.from_assignment(np.full(n, device), pos, problem.num_devices, solver="single")


def search(prep: Prepared, method: str = "joint", cluster: Cluster | None = None, time_limit_s: float = 30.0,
           max_joint_nodes: int = 60, max_pairs: int = 1500, min_gain: float = 0.05) -> BackendPlan:
    """Choose backends (and devices and order) for a prepared model.

    ``cluster`` may be a sub-cluster with the same device types as ``prep.cluster``
    (e.g. its first device); its costs are the matching columns. A plan that uses several
    devices (or another device than the DP's) is kept only when the simulator predicts it
    at least ``min_gain`` (5 %) faster than the DP's cover on one device: cross-device
    hand-offs cost more than the link model says when the machine is busy, inputs start on
    device 0, and below that margin the prediction cannot tell the plans apart. For the
    same reason the DP's device is device 0 unless another is ``min_gain`` cheaper.
    """
    from .joint_ilp import concurrent_pairs, joint_ilp

    t0 = time.perf_counter()
    cluster = cluster or prep.cluster
    D = cluster.num_devices
    costs = prep.costs[:, :D]
    graph = prep.rg.graph
    node_sets = [c.nodes for c in prep.cs]
    info: dict = {}
    if method.startswith("single:"):
        costs = _restrict(prep, method.split(":", 1)[1])
        method_kind = "dp"
    else:
        method_kind = method
    # Collage's DP on the device where the cover is cheapest (all devices are alike here).
    best = None
    for d in range(D):
        res = collage_dp(graph, node_sets, costs[:, d])
        if best is None or res.cost < best[0].cost:
            best = (res, d)
    dp, d0 = best
    if d0 != 0:  # the inputs live on device 0: move only for a clear gain
        at0 = collage_dp(graph, node_sets, costs[:, 0])
        if at0.cost <= dp.cost * (1.0 + min_gain):
            dp, d0 = at0, 0
    info["dp_cost_s"] = dp.cost
    info["dp_states"] = dp.states
    if method_kind == "dp":
        cover, device = dp.chosen, {c: d0 for c in dp.chosen}
        problem = _contracted(prep, cover, costs, cluster)
        plan = _one_device_plan(problem, d0)
    elif method_kind == "joint":
        pairs = len(concurrent_pairs(graph)) if D > 1 else 0
        info["concurrent_pairs"] = pairs
        if graph.num_nodes <= max_joint_nodes and pairs * (D - 1) <= max_pairs:
            jr = joint_ilp(graph, node_sets, costs, cluster, warm=CoverResult(dp.chosen, dp.cost), warm_device=d0,
                           time_limit_s=time_limit_s)
            info.update({f"ilp_{k}": v for k, v in jr.info.items()})
            info["ilp_objective_s"] = jr.objective_s
            info["path"] = "joint_ilp"
            cover, device = jr.chosen, jr.device
            problem = _contracted(prep, cover, costs, cluster)
            pr = np.array([jr.start[c] for c in cover])
            plan = Plan.from_assignment(np.array([device[c] for c in cover]), pr, D, solver="joint_ilp")
            try:
                simulate(problem, plan)
            except PestoError:  # order ties can deadlock the simulator: fall back to topological order
                topo = problem.graph.topo_order()
                pos = np.empty(len(cover), dtype=np.int64)
                pos[topo] = np.arange(len(cover))
                plan = Plan.from_assignment(plan.assignment, pos, D, solver="joint_ilp")
        else:
            info["path"] = "dp+place"
            cover = dp.chosen
            problem = _contracted(prep, cover, costs, cluster)
            plan = _place(problem, time_limit_s, d0)
            device = {c: int(plan.assignment[k]) for k, c in enumerate(cover)}
    else:
        raise PestoError(f"unknown search method {method!r}; use dp, joint or single:<backend>")
    sim = simulate(problem, plan)
    used = set(int(a) for a in plan.assignment)
    if method_kind == "joint" and (len(used) > 1 or used != {d0}):
        one_problem = _contracted(prep, dp.chosen, costs, cluster)
        one_plan = _one_device_plan(one_problem, d0)
        one_s = simulate(one_problem, one_plan).makespan
        info["multi_device_predicted_s"] = float(sim.makespan)
        info["one_device_predicted_s"] = float(one_s)
        if sim.makespan > one_s * (1.0 - min_gain):
            info["path"] = str(info.get("path")) + "+one-device(min_gain)"
            cover, device = dp.chosen, {c: d0 for c in dp.chosen}
            problem, plan = one_problem, one_plan
            sim = simulate(problem, plan)
    return BackendPlan(prep, method, list(cover), {int(k): int(v) for k, v in device.items()}, plan, problem,
                       float(sim.makespan), time.perf_counter() - t0, info)


def _place(problem: Problem, time_limit_s: float, d0: int) -> Plan:
    """Place fixed candidates with the spine's ILP (warm start: best heuristic or one device)."""
    one = _one_device_plan(problem, d0)
    if problem.num_devices == 1:
        return one
    try:
        from ..solve.ilp import best_heuristic_plan, solve_ilp

        warm, _ = best_heuristic_plan(problem)
        if warm is None or simulate(problem, warm).makespan > simulate(problem, one).makespan:
            warm = one
        return solve_ilp(problem, time_limit_s=time_limit_s, solver="highs", warm_start=warm, pairs=8)
    except PestoError:
        from ..solve import solve

        plan = solve(problem, "heft")
        return plan if simulate(problem, plan).makespan < simulate(problem, one).makespan else one


def build_placed(bp: BackendPlan, strict: bool = True):
    """Lower the chosen candidates and build the per-device modules.

    Returns
    -------
    (PlacedModule, Lowered)
    """
    from ..api import analyze
    from ..builder.placed import PlacedModule
    from ..builder.rewrite import apply_plan
    from .lower import lower

    prep = bp.prep
    cluster = bp.problem.cluster
    devs = {c: cluster.devices[bp.device.get(c, 0)] for c in bp.cover}
    low = lower(prep.rg, prep.cs, bp.cover, devs, strict=strict)
    an = analyze(low.mod)
    cand_of = {}
    for k, c in enumerate(bp.cover):
        for v in prep.cs[c].nodes:
            cand_of[v] = k
    sim = simulate(bp.problem, bp.plan)
    g = an.rg.graph
    D = cluster.num_devices
    assign = np.zeros(len(an.groups), dtype=np.int64)
    prio = np.zeros(len(an.groups))
    topo = {v: i for i, v in enumerate(g.topo_order())}
    for gi, grp in enumerate(an.groups):
        votes = np.zeros(D)
        start = np.inf
        for v in grp:
            orig = low.var_nodes.get(g.nodes[v].extra.get("var", ""), ())
            for u in orig:
                k = cand_of[u]
                votes[bp.plan.assignment[k]] += 1
                start = min(start, float(sim.start[k]))
        assign[gi] = int(np.argmax(votes)) if votes.any() else 0
        prio[gi] = start if np.isfinite(start) else 0.0
    order_key = np.lexsort(([topo[grp[0]] for grp in an.groups], prio))
    rank = np.empty(len(an.groups), dtype=np.int64)
    rank[order_key] = np.arange(len(an.groups))
    plan = Plan.from_assignment(assign, rank, D, solver=f"backends:{bp.method}")
    placed_mod = apply_plan(an.rg, an.groups, plan, cluster)
    return PlacedModule(placed_mod, cluster, plan, None, None, an), low


__all__ = ["BackendPlan", "Prepared", "build_placed", "prepare", "search"]
