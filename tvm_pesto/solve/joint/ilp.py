"""Backend choice inside the placement ILP: candidates, devices and order, jointly.

Variables (PuLP; times scaled so the upper bound ``UB`` is :data:`tvm_pesto.solve.mip.MIP_TIME_SCALE`):

* ``x[c,d]`` binary: candidate ``c`` is chosen and runs on device ``d`` (only where its
  measured cost is finite). Node ``v``'s device indicator is ``X[v,d] = sum_{c ∋ v} x[c,d]``.
* ``S[v]``, ``F[v]``: start and finish of the candidate that covers node ``v``; ``M`` the makespan.
* ``o[u,w]`` binary for node pairs with no path between them (two or more devices only):
  ``u`` before ``w`` when they share a device and are in different candidates.

Constraints (named): ``cover_v`` every node is covered by exactly one chosen candidate on
one device; ``dur_v`` ``F[v] >= S[v] + cost`` of the candidate covering ``v`` on its device;
``sync_c_k`` nodes of a chosen candidate start together (so chosen candidates cannot form a
cycle); ``prec_u_v`` a consumer starts after its producer's candidate finishes unless both
are in one candidate; ``comm_u_v_a_e`` plus the transfer ``latency + bytes / bandwidth``
when they are on devices ``a != e``; ``ord_u_w_a``/``ordr_u_w_a`` two candidates on one device
do not overlap; ``load_d`` ``M >=`` the busy time of each device; ``span_v`` ``M >= F[v]``;
``mem_d`` weights and outputs fit each device; ``coloc_g_k_d`` the ops of a co-location group
are on the same device.

With one device the model is exactly "cheapest acyclic exact cover", the problem
:func:`~tvm_pesto.solve.joint.cover.collage_dp` solves, and the DP's cover is given as the
warm start, so the ILP is never worse. With more devices the transfers are modelled without
link contention; the chosen cover and placement are then checked with the simulator.

The model is solved with :func:`tvm_pesto.solve.mip.solve_mip`, so ``info["status"]`` is
the solver's real outcome: ``optimal`` (proved within the gap), ``time_limit`` (the
incumbent, with ``mip_gap``), ``infeasible``, ``no_solution`` or ``solver_failed``.

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
>>> from tvm_pesto.solve.joint.ilp import joint_ilp
>>> res = joint_ilp(g, [c.nodes for c in cands], costs, problem.cluster)
>>> sorted(res.chosen), res.info["status"], round(res.objective_s, 9)   # torch (a, b), then tvm c
([2, 3], 'optimal', 4.0)
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import numpy as np
import pulp

from ...candidates.convex import Reach
from ...errors import InfeasibleError, PestoError, SolverError
from ..mip import MIP_TIME_SCALE, add_var, lin, solve_mip
from ..settings import MipSettings
from .cover import CoverResult, collage_dp


@dataclass
class JointResult:
    """Chosen candidates with their device and start time (seconds, model time)."""

    chosen: list[int]
    device: dict[int, int]
    start: dict[int, float]
    objective_s: float
    seconds: float
    info: dict = field(default_factory=dict)


def concurrent_pairs(graph) -> list[tuple[int, int]]:
    """Node pairs ``u < w`` with no path between them."""
    reach = Reach(graph.dag, graph.num_nodes)
    out = []
    for u in range(graph.num_nodes):
        rel = reach.desc[u] | reach.anc[u]
        for w in range(u + 1, graph.num_nodes):
            if not (rel >> w) & 1:
                out.append((u, w))
    return out


def prune_dominated(graph, node_sets, costs, max_split_nodes: int | None = None) -> list[int]:
    """Candidates worth keeping for the joint ILP.

    Dropped: a candidate another candidate with the same nodes beats (or ties, later index)
    on every device, and a candidate whose nodes smaller kept candidates cover at no more
    cost on every device (splitting it then never delays anything: the pieces can run back
    to back on its device). Both keep the optimum. The second test covers candidates of at
    most ``max_split_nodes`` ops (default: all; its covering search grows with the size).

    Examples
    --------
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode("a", "relax.add"), OpNode("b", "relax.nn.relu")], [(0, 1, 4)])
    >>> prune_dominated(g, [[0], [1], [0, 1]], np.array([[1.0], [1.0], [3.0]]))
    [0, 1]
    """
    costs = np.asarray(costs, dtype=np.float64)
    K = len(node_sets)
    sets = [tuple(sorted(x)) for x in node_sets]
    alive = [c for c in range(K) if np.isfinite(costs[c]).any() and sets[c]]
    by_set: dict[tuple, list[int]] = {}
    for c in alive:
        by_set.setdefault(sets[c], []).append(c)
    kept = []
    for grp in by_set.values():
        for c in grp:
            if not any(o != c and (costs[o] <= costs[c]).all() and ((costs[o] < costs[c]).any() or o < c)
                       for o in grp):
                kept.append(c)
    kept.sort(key=lambda c: (len(sets[c]), c))
    final: list[int] = []
    for c in kept:
        if 1 < len(sets[c]) <= (max_split_nodes or len(sets[c])):
            inside = set(sets[c])
            subs = [o for o in final if set(sets[o]) < inside]
            if subs:
                dominated = True
                for d in range(costs.shape[1]):
                    if not np.isfinite(costs[c, d]):
                        continue
                    try:
                        best = collage_dp(graph, [sets[o] for o in subs], costs[subs, d], nodes=inside).cost
                    except PestoError:
                        best = np.inf
                    if best > costs[c, d]:
                        dominated = False
                        break
                if dominated:
                    continue
        final.append(c)
    return sorted(final)


def warm_schedule(graph, node_sets, costs, cover: list[int], device: int = 0) -> tuple[dict, dict, float]:
    """Start times of ``cover`` run back to back on one device, in the given order."""
    start, t = {}, 0.0
    for c in cover:
        start[c] = t
        t += float(costs[c, device])
    return start, {c: device for c in cover}, t


def joint_ilp(graph, node_sets, costs, cluster, warm: CoverResult | None = None, warm_device: int | None = None,
              memory: bool = True, prune: bool = True, colocate=(), **settings) -> JointResult:
    """Choose candidates (hence backends), devices and order together.

    Parameters
    ----------
    graph : OpGraph
        The original op graph.
    node_sets : list of sequences of int
        Node ids of each candidate.
    costs : ndarray, shape (candidates, devices)
        Measured seconds (``inf`` = cannot run there).
    cluster : Cluster
        Devices and links.
    warm : CoverResult, optional
        A cover (e.g. from :func:`collage_dp`) used as the warm start, run on ``warm_device``
        (default: the device where it is cheapest). It also sets the upper bound, so the
        result is never worse than it.
    prune : bool
        Drop dominated candidates first (:func:`prune_dominated`); keeps the optimum.
    **settings
        The fields of :class:`~tvm_pesto.solve.settings.MipSettings` (``solver`` default
        ``highs``): ``time_limit_s``, ``gap``, ``solver``, ``msg``, ``threads`` and
        ``deterministic`` (a node limit from ``time_limit_s``, one thread and a fixed seed
        instead of the time limit, :func:`tvm_pesto.solve.budget.mip_limits`; default: the
        ambient mode).

    Returns
    -------
    JointResult
        ``info`` holds ``status`` (the solver's real outcome: ``optimal`` only when proved
        within ``gap``; ``time_limit`` with the incumbent's ``objective`` and ``mip_gap``;
        ``infeasible``; ``no_solution``; ``solver_failed``), ``timed_out``, ``mip_gap``,
        ``objective`` and ``bound`` (seconds, when known), ``solver_status``,
        ``pulp_status``, ``solver_backend``, ``budget``, ``deterministic`` (no clock decided
        the result; else ``deterministic_reason``) and ``source`` (``"ilp"`` or ``"warm_start"``).
        With a warm start the result is the warm start whenever the ILP has nothing better
        (including ``infeasible``: nothing below the warm start's makespan fits memory).

    Raises
    ------
    InfeasibleError
        When the candidates cannot cover the graph, or, without a warm start, when the
        model is infeasible (memory).
    SolverError
        When every solver fails, or finds no solution, and there is no warm start.
    ValueError
        When ``warm`` holds a candidate that cannot run on ``warm_device`` (infinite cost):
        such a warm start is no solution to fall back on.

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
    >>> res = joint_ilp(g, [c.nodes for c in cands], costs, parse_cluster("cpu:2"))
    >>> sorted(res.chosen)
    [2, 3]
    """
    mip = MipSettings(**{"solver": "highs", **settings})
    t0 = time.perf_counter()
    n, D = graph.num_nodes, cluster.num_devices
    costs = np.asarray(costs, dtype=np.float64).reshape(len(node_sets), D)
    sets = [tuple(sorted(s)) for s in node_sets]
    keep, cov = _kept_candidates(graph, sets, costs, prune, warm)
    feas = {(c, d) for c in sorted(keep) for d in range(D) if np.isfinite(costs[c, d]) and sets[c]}
    wstart, wdev, ub = _warm_and_bound(graph, sets, costs, cov, feas, warm, warm_device)
    ub_s = ub * (1 + 1e-6) + 1e-12
    ts = MIP_TIME_SCALE / ub_s
    m = _new_model(graph, feas, cov, ts, ub_s * ts, D)
    _add_constraints(m, graph, sets, costs, cluster, keep, memory, colocate)
    if wstart is not None:
        m.set_warm(warm.chosen, sets, costs, wstart, wdev, ub)
    build_s = time.perf_counter() - t0
    res = solve_mip(m.prob, mip.solver, **mip.solve_options())
    info = {"candidates_kept": len(keep), "num_vars": len(m.prob.variables()),
            "num_constraints": m.prob.numConstraints(), "build_s": build_s, "order_binaries": len(m.o),
            "time_limit_s": mip.time_limit_s, **res.info(ts)}
    if wstart is None:
        _check_without_warm(graph, res)
    if res.has_solution:
        chosen, device, start, obj = m.solution(sets)
        if _is_cover(n, sets, chosen) and (wstart is None or obj <= ub * (1 + 1e-6)):
            chosen.sort(key=lambda c: (round(start[c], 12), sets[c][0]))
            info["source"] = "ilp"
            return JointResult(chosen, device, start, obj, time.perf_counter() - t0, info)
        info["note"] = "the ILP's answer was not a valid cover; returning the warm start"
    if wstart is None:
        raise SolverError(f"the joint ILP found no solution within its {mip.time_limit_s} s budget (status {res.status}) "
                          "and there is no warm start; raise time_limit_s or pass the Collage-DP cover as warm start")
    if not res.has_solution:
        info["note"] = f"the ILP ended {res.status} without a solution; returning the warm start"
    info["source"] = "warm_start"
    return JointResult(list(warm.chosen), dict(wdev), dict(wstart), float(ub), time.perf_counter() - t0, info)


def _check_without_warm(graph, res) -> None:
    """Raise when the MIP solvers failed or the model is infeasible: with no warm start,
    there is nothing to return."""
    if res.status == "solver_failed":
        raise SolverError(f"the MIP solvers failed on the joint model ({'; '.join(res.failures)}); "
                          "pass the Collage-DP cover as warm start")
    if res.status == "infeasible":
        raise InfeasibleError(f"{graph.name}: the joint ILP has no feasible choice of candidates and devices; "
                              "most likely the weights and outputs do not fit the devices' memory; add devices "
                              "or memory, or pass memory=False")


def _kept_candidates(graph, sets, costs: np.ndarray, prune: bool, warm) -> tuple[set, list[list[int]]]:
    """The candidates the model keeps (undominated ones and the warm start's, with ``prune``)
    and, per node, the kept candidates with a finite cost that cover it.

    Raises
    ------
    InfeasibleError
        When a node has no candidate with a finite cost.
    """
    n, K = graph.num_nodes, len(sets)
    cov: list[list[int]] = [[] for _ in range(n)]
    for c in range(K):
        if np.isfinite(costs[c]).any():
            for v in sets[c]:
                cov[v].append(c)
    if any(not cv for cv in cov):
        bad = [v for v in range(n) if not cov[v]]
        raise InfeasibleError(f"nodes {bad[:8]} have no candidate with a finite cost; keep the tvm backend")
    keep = set(range(K))
    if prune:
        keep = set(prune_dominated(graph, sets, costs))
        if warm is not None:
            keep |= set(warm.chosen)
        cov = [[c for c in cv if c in keep] for cv in cov]
    return keep, cov


def _warm_and_bound(graph, sets, costs: np.ndarray, cov, feas: set, warm, warm_device):
    """The warm start's schedule (start and device per chosen candidate; None without one)
    and the makespan bound: the warm start's makespan, else every node at its cheapest."""
    n, K, D = graph.num_nodes, len(sets), costs.shape[1]
    wstart = wdev = None
    ub = None
    if warm is not None:
        if warm_device is None:
            warm_device = int(np.argmin([sum(costs[c, d] for c in warm.chosen) for d in range(D)]))
        wstart, wdev, ub = warm_schedule(graph, sets, costs, warm.chosen, warm_device)
        if not np.isfinite(ub):
            raise ValueError(f"the warm start cannot run on device {warm_device}: "
                             f"{sum(1 for c in warm.chosen if not np.isfinite(costs[c, warm_device]))} of its "
                             "candidates have an infinite cost there; pass a device that runs all of them")
    if ub is None or not np.isfinite(ub):
        ub = float(sum(min(costs[c, d] for c in cov[v] for d in range(D) if (c, d) in feas) for v in range(n)))
        ub = max(ub, float(sum(np.min(np.where(np.isfinite(costs[c]), costs[c], np.inf)) for c in range(K)
                               if np.isfinite(costs[c]).any())))
    return wstart, wdev, ub


@dataclass
class _Model:
    """The joint MIP (module docstring): its problem and variables, ``cov[v]`` the kept
    candidates that cover node ``v``, ``ts`` model units per second, ``UB`` the bound."""

    prob: pulp.LpProblem
    x: dict
    S: list
    F: list
    M: pulp.LpVariable
    cov: list
    ts: float
    UB: float
    num_devices: int
    o: dict = field(default_factory=dict)

    def X(self, v, d) -> list:
        """Terms of node ``v``'s device indicator for device ``d``."""
        return [(self.x[c, d], 1.0) for c in self.cov[v] if (c, d) in self.x]

    def same(self, u, w) -> list:
        """Terms that sum to 1 when ``u`` and ``w`` are in one chosen candidate."""
        common = set(self.cov[u]) & set(self.cov[w])
        return [(self.x[c, d], 1.0) for c in sorted(common) for d in range(self.num_devices) if (c, d) in self.x]

    def add(self, terms, sense, rhs: float, name: str) -> None:
        """The constraint ``sum(terms) <sense> rhs`` named ``name``."""
        self.prob += pulp.LpConstraint(lin(terms), sense, rhs=rhs), name

    def set_warm(self, chosen, sets, costs, wstart: dict, wdev: dict, ub: float) -> None:
        """Every variable's value in the warm start (``chosen`` on ``wdev``, starting at ``wstart``)."""
        ts, UB = self.ts, self.UB
        chosen_of = {}
        for c in chosen:
            for v in sets[c]:
                chosen_of[v] = c
        for (c, d), var in self.x.items():
            var.setInitialValue(1.0 if (c in wdev and wdev[c] == d) else 0.0)
        for v in range(len(self.S)):
            c = chosen_of[v]
            self.S[v].setInitialValue(min(wstart[c] * ts, UB))
            self.F[v].setInitialValue(min((wstart[c] + costs[c, wdev[c]]) * ts, UB))
        self.M.setInitialValue(min(ub * ts, UB))
        for (u, w), var in self.o.items():
            var.setInitialValue(1.0 if wstart[chosen_of[u]] <= wstart[chosen_of[w]] else 0.0)

    def solution(self, sets) -> tuple[list[int], dict, dict, float]:
        """The chosen candidates, their devices and start times (seconds) and the makespan."""
        xv = {(c, d): (var.value() or 0.0) for (c, d), var in self.x.items()}
        chosen, device = [], {}
        for (c, d), val in xv.items():
            if val > 0.5:
                chosen.append(c)
                device[c] = d
        start = {c: float((self.S[sets[c][0]].value() or 0.0) / self.ts) for c in chosen}
        return chosen, device, start, float((self.M.value() or 0.0) / self.ts)


def _new_model(graph, feas: set, cov, ts: float, UB: float, D: int) -> _Model:
    """The MIP's choice, start, finish and makespan variables and its objective."""
    n = graph.num_nodes
    prob = pulp.LpProblem(f"joint_{re.sub(r'[^A-Za-z0-9_]', '_', graph.name)}", pulp.LpMinimize)
    x = {(c, d): add_var(prob, f"x_{c}_{d}", 0, 1, pulp.LpBinary) for (c, d) in sorted(feas)}
    S = [add_var(prob, f"S_{v}", 0, UB) for v in range(n)]
    F = [add_var(prob, f"F_{v}", 0, UB) for v in range(n)]
    M = add_var(prob, "M", 0, UB)
    prob += lin([(M, 1.0)]), "makespan"
    return _Model(prob, x, S, F, M, cov, ts, UB, D)


def _add_constraints(m: _Model, graph, sets, costs, cluster, keep: set, memory: bool, colocate) -> None:
    """The constraints of the module docstring, in its order."""
    n, D, x, S, F, M, ts, UB, cov = graph.num_nodes, m.num_devices, m.x, m.S, m.F, m.M, m.ts, m.UB, m.cov
    for v in range(n):
        m.add([(x[c, d], 1.0) for c in cov[v] for d in range(D) if (c, d) in x], pulp.LpConstraintEQ, 1.0,
              f"cover_{v}")
        terms = [(F[v], 1.0), (S[v], -1.0)] + [(x[c, d], -costs[c, d] * ts) for c in cov[v]
                                               for d in range(D) if (c, d) in x]
        m.add(terms, pulp.LpConstraintGE, 0.0, f"dur_{v}")
        m.add([(M, 1.0), (F[v], -1.0)], pulp.LpConstraintGE, 0.0, f"span_{v}")
    for c in sorted(keep):
        ys = [(x[c, d], 1.0) for d in range(D) if (c, d) in x]
        if not ys or len(sets[c]) < 2:
            continue
        for k, (a, b) in enumerate(zip(sets[c], sets[c][1:])):
            yterm = [(var, UB) for var, _ in ys]
            m.add([(S[a], 1.0), (S[b], -1.0)] + yterm, pulp.LpConstraintLE, UB, f"sync_{c}_{k}")
            m.add([(S[b], 1.0), (S[a], -1.0)] + yterm, pulp.LpConstraintLE, UB, f"syncr_{c}_{k}")
    _add_edges(m, graph, cluster)
    if D > 1:
        _add_orders(m, graph)
    for d in range(D):
        terms = [(x[c, d], -costs[c, d] * ts) for c in sorted(keep) if (c, d) in x]
        m.add([(M, 1.0)] + terms, pulp.LpConstraintGE, 0.0, f"load_{d}")
    if memory:
        mem = graph.memory_array()
        caps = cluster.capacities()
        bs = 1.0 / max(float(mem.max()), 1.0)
        for d in range(D):
            terms = [(x[c, d], float(sum(mem[v] for v in sets[c])) * bs) for c in sorted(keep) if (c, d) in x]
            m.add(terms, pulp.LpConstraintLE, float(caps[d]) * bs, f"mem_{d}")
    for g, grp in enumerate(colocate):  # ops that must share a device: the same device indicator
        for k, (u, w) in enumerate(zip(grp, grp[1:])):
            for d in range(D):
                m.add(m.X(u, d) + [(var, -1.0) for var, _ in m.X(w, d)], pulp.LpConstraintEQ, 0.0,
                      f"coloc_{g}_{k}_{d}")


def _add_edges(m: _Model, graph, cluster) -> None:
    """``prec_u_v`` per edge and, with several devices, ``comm_u_v_a_e`` per pair of devices."""
    D, UB, S, F = cluster.num_devices, m.UB, m.S, m.F
    edges = [(int(u), int(v), int(b)) for u, v, b in graph.edges()]
    for u, v, b in edges:
        sm = [(var, UB) for var, _ in m.same(u, v)]
        m.add([(S[v], 1.0), (F[u], -1.0)] + sm, pulp.LpConstraintGE, 0.0, f"prec_{u}_{v}")
        if D > 1:
            for a in range(D):
                for e in range(D):
                    if a == e:
                        continue
                    tr = cluster.transfer_s(a, e, b) * m.ts
                    big = UB + tr  # relaxes S[v] - F[u] >= tr down to -UB (always true)
                    terms = [(S[v], 1.0), (F[u], -1.0)] + [(var, -big) for var, _ in m.X(u, a)] + \
                        [(var, -big) for var, _ in m.X(v, e)]
                    m.add(terms, pulp.LpConstraintGE, tr - 2 * big, f"comm_{u}_{v}_{a}_{e}")


def _add_orders(m: _Model, graph) -> None:
    """``o[u,w]`` per concurrent pair, with ``ord_u_w_a``/``ordr_u_w_a`` per device."""
    UB, S, F = m.UB, m.S, m.F
    for u, w in concurrent_pairs(graph):
        m.o[u, w] = var = add_var(m.prob, f"o_{u}_{w}", 0, 1, pulp.LpBinary)
        sm = [(s_, UB) for s_, _ in m.same(u, w)]
        for a in range(m.num_devices):
            xs = [(t, -UB) for t, _ in m.X(u, a)] + [(t, -UB) for t, _ in m.X(w, a)]
            if not m.X(u, a) or not m.X(w, a):
                continue
            # o = 1: u before w; o = 0: w before u (relaxed unless both on device a, different candidates)
            m.add([(S[w], 1.0), (F[u], -1.0), (var, -UB)] + xs + sm, pulp.LpConstraintGE, -3 * UB, f"ord_{u}_{w}_{a}")
            m.add([(S[u], 1.0), (F[w], -1.0), (var, UB)] + xs + sm, pulp.LpConstraintGE, -2 * UB, f"ordr_{u}_{w}_{a}")


def _is_cover(n: int, sets, chosen) -> bool:
    seen = np.zeros(n, dtype=np.int64)
    for c in chosen:
        for v in sets[c]:
            seen[v] += 1
    return bool((seen == 1).all())


__all__ = ["JointResult", "concurrent_pairs", "joint_ilp", "prune_dominated", "warm_schedule"]
