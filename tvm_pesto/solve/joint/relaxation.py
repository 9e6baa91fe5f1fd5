"""Backend and device together on whole graphs, as one ILP with a proven lower bound.

:func:`relaxed_joint_ilp` chooses a cover of the ops by candidates (hence backends) and a
device for each chosen candidate, minimising a makespan ``M`` that no plan of that choice
can beat. It keeps what makes the joint problem hard to scale out of the model (the order
of the units on a device: one binary per pair of ops that may overlap) and keeps what
bounds every plan instead:

* ``cover_v``: every op is covered by exactly one chosen candidate on one device;
* ``first_v`` / ``prec_u_v``: along every path of the op graph, the calls it passes
  through, each in full, plus a transfer on each edge whose ends are on different devices
  (``cross_u_v_d``), take at most ``M`` (``span_v``). ``f[v]`` stands for the end of the
  call that runs op ``v``: every call ends after its own cost (``first_v``), and after the
  end of the call of each input ``u`` it does not hold plus the transfer, if any, and its
  own cost (``prec_u_v``): a call starts only when all of its inputs are there, and all of
  its outputs are there when it ends. An edge inside one call charges nothing;
* ``load_d``: every device's busy time is at most ``M``;
* ``coloc_g_k_d``: ops of a co-location group share a device.

Every plan with the same cover and devices takes at least ``M``: the solver's dual bound
is a lower bound on the makespan of every plan of the joint problem (without link
contention, dispatch or memory limits, which only add time or remove plans). Its solution
is a plan once each device's units are ordered (by upward rank, :func:`plan_of`), which the
simulator then checks.

Variables: ``y[c,d]`` binary where ``cost[c, d]`` is finite (dominated candidates are
dropped first, :func:`~tvm_pesto.solve.joint.ilp.prune_dominated`, which keeps the
optimum), ``f[v]`` the end of op ``v``'s call along the longest path to it, ``z[u,v]`` in
[0, 1] whether edge ``u -> v`` crosses devices. Sizes grow with candidates times devices
plus edges times devices: thousands of ops solve within seconds.

Examples
--------
>>> from tvm_pesto.plan.examples import chain_with_a_library_call
>>> problem = chain_with_a_library_call()   # a -> b -> c; tvm per op, or torch for a and b
>>> res = relaxed_joint_ilp(problem, time_limit_s=10)
>>> res.status, sorted(res.chosen), round(res.bound_s, 9)   # torch (a, b), then tvm c: 4 s, proven
('optimal', [2, 3], 4.0)
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import numpy as np
import pulp

from ...plan.plan import Plan
from ...plan.problem import JointProblem
from ..budget import is_deterministic
from ..heuristics.common import GraphArrays, upward_rank
from ..mip import MIP_TIME_SCALE, add_var, lin, solve_mip
from .ilp import prune_dominated


#: Dominated-candidate pruning splits candidates of at most this many ops (larger ones stay:
#: keeping a candidate never loses the optimum, and their covering searches cost seconds).
PRUNE_SPLIT_NODES = 16


@dataclass
class RelaxedResult:
    """What :func:`relaxed_joint_ilp` proved and chose.

    Attributes
    ----------
    status : str
        The MIP's real outcome (:data:`tvm_pesto.solve.mip.STATUSES`).
    bound_s : float or None
        Seconds no plan of the problem beats: the MIP's dual bound; None when the solver
        proved nothing.
    chosen : list of int
        Chosen candidates (empty without a solution).
    device : dict
        Candidate -> device, for ``chosen``.
    objective_s : float or None
        The model's makespan of the solution (a bound of that choice, not its simulation).
    seconds : float
        Building and solving.
    info : dict
        Sizes and the MIP's report (:meth:`tvm_pesto.solve.mip.MipResult.info`).
    """

    status: str
    bound_s: float | None
    chosen: list[int] = field(default_factory=list)
    device: dict = field(default_factory=dict)
    objective_s: float | None = None
    seconds: float = 0.0
    info: dict = field(default_factory=dict)


def _min_transfer_s(cluster, nbytes: float) -> float:
    """The fastest transfer of ``nbytes`` between two different devices."""
    D = cluster.num_devices
    return min(cluster.transfer_s(a, e, nbytes) for a in range(D) for e in range(D) if a != e)


def relaxed_joint_ilp(problem: JointProblem, time_limit_s: float = 30.0, warm: tuple[list, dict] | None = None,
                      gap: float = 1e-5, solver: str = "highs", deterministic: bool | None = None) -> RelaxedResult:
    """Cover and devices by the ILP of the module docstring.

    Parameters
    ----------
    problem : JointProblem
    time_limit_s, gap, solver, deterministic
        The MIP's budget and solver (:func:`tvm_pesto.solve.mip.solve_mip`); with wall-clock
        budgets, building the MIP counts against ``time_limit_s``.
    warm : (list of int, dict), optional
        A known plan's chosen candidates and their devices: the MIP's start.

    Returns
    -------
    RelaxedResult
    """
    t0 = time.perf_counter()
    g, D = problem.graph, problem.num_devices
    costs = np.asarray(problem.costs, dtype=np.float64)
    sets = [tuple(sorted(c.nodes)) for c in problem.candidates]
    keep = set(prune_dominated(g, sets, costs, max_split_nodes=PRUNE_SPLIT_NODES))
    if warm is not None:
        keep |= set(warm[0])
    feas = sorted((c, d) for c in keep for d in range(D) if np.isfinite(costs[c, d]))
    members = {c: frozenset(sets[c]) for c in keep}
    finite = costs[np.isfinite(costs)]
    ub = float(finite.sum()) if finite.size else 1.0
    ts = MIP_TIME_SCALE / max(ub, 1e-12)
    prob = pulp.LpProblem(f"relaxed_{re.sub(r'[^A-Za-z0-9_]', '_', g.name)}", pulp.LpMinimize)
    y = {(c, d): add_var(prob, f"y_{c}_{d}", 0, 1, pulp.LpBinary) for c, d in feas}
    f = [add_var(prob, f"f_{v}", 0) for v in range(g.num_nodes)]
    M = add_var(prob, "M", 0)
    prob += lin([(M, 1.0)]), "makespan"
    cov: list[list[tuple[int, int]]] = [[] for _ in range(g.num_nodes)]
    for c, d in feas:
        for v in sets[c]:
            cov[v].append((c, d))

    def add(terms, sense, rhs, name):
        prob.addConstraint(pulp.LpConstraint(lin(terms), sense, rhs=rhs), name)

    for v in range(g.num_nodes):
        add([(y[c, d], 1.0) for c, d in cov[v]], pulp.LpConstraintEQ, 1.0, f"cover_{v}")
        add([(f[v], 1.0)] + [(y[c, d], -costs[c, d] * ts) for c, d in cov[v]], pulp.LpConstraintGE, 0.0, f"first_{v}")
        if not g.succs(v):
            add([(M, 1.0), (f[v], -1.0)], pulp.LpConstraintGE, 0.0, f"span_{v}")
    for u, v, b in g.edges():  # the path enters v's call here unless that call holds u too
        terms = [(f[v], 1.0), (f[u], -1.0)] + [(y[c, d], -costs[c, d] * ts) for c, d in cov[v] if u not in members[c]]
        if D > 1:
            z = add_var(prob, f"z_{u}_{v}", 0, 1)
            terms.append((z, -_min_transfer_s(problem.cluster, b) * ts))
            for d in range(D):  # z >= Y[u, d] - Y[v, d]
                add([(z, 1.0)] + [(y[c, e], -1.0) for c, e in cov[u] if e == d]
                    + [(y[c, e], 1.0) for c, e in cov[v] if e == d], pulp.LpConstraintGE, 0.0, f"cross_{u}_{v}_{d}")
        add(terms, pulp.LpConstraintGE, 0.0, f"prec_{u}_{v}")
    for d in range(D):
        add([(M, 1.0)] + [(y[c, e], -costs[c, e] * ts) for c, e in feas if e == d], pulp.LpConstraintGE, 0.0,
            f"load_{d}")
    for k, grp in enumerate(problem.colocate):
        for j, (u, w) in enumerate(zip(grp, grp[1:])):
            for d in range(D):
                add([(y[c, e], 1.0) for c, e in cov[u] if e == d] + [(y[c, e], -1.0) for c, e in cov[w] if e == d],
                    pulp.LpConstraintEQ, 0.0, f"coloc_{k}_{j}_{d}")
    if warm is not None:
        _set_warm(y, warm)
    build_s = time.perf_counter() - t0
    mip_s = time_limit_s if is_deterministic(deterministic) else max(0.5, time_limit_s - build_s)  # building counts
    res = solve_mip(prob, solver, time_limit_s=mip_s, gap=gap, deterministic=deterministic)
    info = {"candidates_kept": len(keep), "num_vars": len(prob.variables()), "num_constraints": prob.numConstraints(),
            "build_s": build_s, "time_limit_s": time_limit_s, **res.info(ts)}
    bound = res.bound  # the dual bound; an optimum only within the MIP's relative gap
    if bound is None and res.status == "optimal" and res.objective is not None:
        bound = res.objective * (1.0 - (gap if res.gap is None else max(res.gap, 0.0)))
    out = RelaxedResult(res.status, None if bound is None else float(bound) / ts, info=info)
    if res.has_solution:
        out.device = {c: d for (c, d), var in y.items() if (var.value() or 0.0) > 0.5}
        out.chosen = sorted(out.device)
        out.objective_s = float((M.value() or 0.0) / ts)
    out.seconds = time.perf_counter() - t0
    return out


def _set_warm(y: dict, warm: tuple[list, dict]) -> None:
    chosen, device = warm
    on = {(int(c), int(device[c])) for c in chosen}
    for key, var in y.items():
        var.setInitialValue(1.0 if key in on else 0.0)


def plan_of(problem: JointProblem, chosen: list[int], device: dict, **kw) -> tuple[Plan, object]:
    """The plan of a cover and its devices: each device's units in order of upward rank
    (ties by topological position), with the placement problem of that cover.

    Raises
    ------
    PestoError
        When the cover's units depend on each other in a cycle (the relaxation does not
        rule that out).
    """
    placed = problem.contract(chosen)
    arrays = GraphArrays(placed)
    rank = upward_rank(placed, arrays)
    key = np.empty(placed.num_nodes, dtype=np.int64)
    key[np.lexsort((arrays.pos, -rank))] = np.arange(placed.num_nodes)
    assignment = np.array([device[c] for c in chosen], dtype=np.int32)
    return Plan.from_assignment(assignment, key, problem.num_devices, **kw), placed


__all__ = ["RelaxedResult", "plan_of", "relaxed_joint_ilp"]
