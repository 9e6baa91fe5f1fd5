"""The constraint families of the placement ILP (:mod:`tvm_pesto.solve.placement_ilp.model.build`), one function
each; :func:`tvm_pesto.solve.placement_ilp.model.build.build_ilp` creates the node variables (``x``, ``S``,
``C``, ``M``) and adds the families in this order: :func:`add_placement`, :func:`add_transfers`,
:func:`add_precedence`, :func:`add_orders`, :func:`add_memory`, :func:`add_makespan_cuts`,
:func:`add_window` and, for the throughput objective, :func:`add_bottleneck`.

The constraints are named as in :mod:`tvm_pesto.solve.placement_ilp.model.build`'s description; times are in
model units (``V.time_scale`` per second) and bytes in ``V.byte_scale`` per byte.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np
import pulp

from ....plan import Problem
from ...mip import add_var, lin


@dataclass
class ModelParts:
    """What the constraint families of one model share while they are added."""

    problem: Problem
    prob: pulp.LpProblem
    V: Any  # the model's tvm_pesto.solve.placement_ilp.model.build.IlpVars
    feas: list[set[int]]
    succ: list[list[int]]
    eb: dict[tuple[int, int], float]
    UB: float
    #: producer -> the devices some consumer of it can run on (one transfer variable each)
    dest: dict[int, list[int]] = field(default_factory=dict)
    #: producer -> the bytes of its out-edges, when they all have the same size
    uniform: dict[int, float] = field(default_factory=dict)

    def add(self, terms, sense, rhs: float, name: str) -> None:
        """The constraint ``sum(terms) <sense> rhs`` named ``name``."""
        self.prob += pulp.LpConstraint(lin(terms), sense, rhs=rhs), name

    def received(self, u: int, e: int) -> list:
        """Terms of the (scaled) bytes the transfer of ``u``'s output to ``e`` carries."""
        if u in self.uniform:
            return [(self.V.act[u, e], self.uniform[u] * self.V.byte_scale)]
        return [(self.V.r[u, e], 1.0)]


def add_placement(m: ModelParts) -> None:
    """``assign``, ``noplace`` and ``finish`` per node, ``coloc`` per co-location group."""
    problem, V, feas = m.problem, m.V, m.feas
    x, S, C, ts = V.x, V.S, V.C, V.time_scale
    D = problem.num_devices
    for v in range(problem.num_nodes):
        m.add([(x[v, d], 1.0) for d in range(D)], pulp.LpConstraintEQ, 1.0, f"assign_{v}")
        for d in range(D):
            if d not in feas[v]:
                m.add([(x[v, d], 1.0)], pulp.LpConstraintEQ, 0.0, f"noplace_{v}_{d}")
        terms = [(C[v], 1.0), (S[v], -1.0)] + [(x[v, d], -problem.costs[v, d] * ts) for d in sorted(feas[v])]
        m.add(terms, pulp.LpConstraintEQ, 0.0, f"finish_{v}")
    for g, grp in enumerate(problem.colocate):
        grp = list(grp)
        for v in grp[1:]:
            for d in sorted(feas[grp[0]]):
                m.add([(x[v, d], 1.0), (x[grp[0], d], -1.0)], pulp.LpConstraintEQ, 0.0, f"coloc_{g}_{v}_{d}")


def add_transfers(m: ModelParts) -> None:
    """One transfer per (producer, destination device): its variables, ``txready``,
    ``arrive_ub``, ``act``, ``recv`` and ``dur``; fills ``m.dest`` and ``m.uniform``."""
    problem, prob, V, feas, succ, eb, UB = m.problem, m.prob, m.V, m.feas, m.succ, m.eb, m.UB
    x, C, ts, bs = V.x, V.C, V.time_scale, V.byte_scale
    for u in range(problem.num_nodes):
        if not succ[u]:
            continue
        m.dest[u] = sorted(set().union(*(feas[v] for v in succ[u])))
        bset = {eb[(u, v)] for v in succ[u]}
        bmax = max(bset)
        if len(bset) == 1:
            m.uniform[u] = bmax
        for e in m.dest[u]:
            T = V.T[u, e] = add_var(prob, f"T_{u}_{e}", 0, UB)
            dur = V.dur[u, e] = add_var(prob, f"dur_{u}_{e}", 0, UB)
            act = V.act[u, e] = add_var(prob, f"act_{u}_{e}", 0, 1)
            if u not in m.uniform:
                V.r[u, e] = add_var(prob, f"r_{u}_{e}", 0, bmax * bs)
            m.add([(T, 1.0), (C[u], -1.0)], pulp.LpConstraintGE, 0.0, f"txready_{u}_{e}")
            m.add([(T, 1.0), (dur, 1.0)], pulp.LpConstraintLE, UB, f"arrive_ub_{u}_{e}")
            for v in succ[u]:
                if e not in feas[v]:
                    continue
                m.add([(act, 1.0), (x[v, e], -1.0), (x[u, e], 1.0)], pulp.LpConstraintGE, 0.0, f"act_{u}_{v}_{e}")
                if u not in m.uniform:
                    b = eb[(u, v)] * bs
                    m.add([(V.r[u, e], 1.0), (x[v, e], -b), (x[u, e], b)], pulp.LpConstraintGE, 0.0,
                          f"recv_{u}_{v}_{e}")
            for a in sorted(feas[u]):
                if a == e:
                    continue
                lat = problem.latency[a, e] * ts
                k = problem.inv_bw[a, e] * ts / bs  # model time per scaled byte
                big = lat + k * bmax * bs
                if u in m.uniform:
                    terms = [(dur, 1.0), (act, -big), (x[u, a], -big)]
                else:
                    terms = [(dur, 1.0), (act, -lat), (V.r[u, e], -k), (x[u, a], -big)]
                m.add(terms, pulp.LpConstraintGE, -big, f"dur_{u}_{e}_{a}")


def add_precedence(m: ModelParts) -> None:
    """``prec`` per edge, and ``arrive``: a consumer starts after the transfer to its device."""
    V, UB = m.V, m.UB
    for u, v in zip(m.problem.src.tolist(), m.problem.dst.tolist()):
        m.add([(V.S[v], 1.0), (V.C[u], -1.0)], pulp.LpConstraintGE, 0.0, f"prec_{u}_{v}")
        for e in sorted(m.feas[v]):
            m.add([(V.S[v], 1.0), (V.T[u, e], -1.0), (V.dur[u, e], -1.0), (V.x[v, e], -UB)],
                  pulp.LpConstraintGE, -UB, f"arrive_{u}_{v}_{e}")


def add_orders(m: ModelParts, rank: np.ndarray, pairs: int | None) -> None:
    """``same``, ``order`` and ``fifo`` for the pairs of nodes that may share a device; an
    ordering binary ``y`` for those that no path orders and whose ranks differ by at most
    ``pairs`` (every such pair when None), the rank order for the others."""
    problem, prob, V, feas, succ, UB = m.problem, m.prob, m.V, m.feas, m.succ, m.UB
    x, S, C = V.x, V.S, V.C
    n = problem.num_nodes
    closure = nx.transitive_closure_dag(problem.graph.dag)
    is_prod = [bool(succ[v]) for v in range(n)]
    for u in range(n):
        for w in range(u + 1, n):
            common = feas[u] & feas[w]
            if not common:
                continue
            if closure.has_edge(u, w):
                first, second, free = u, w, False
            elif closure.has_edge(w, u):
                first, second, free = w, u, False
            else:
                first, second = (u, w) if rank[u] < rank[w] else (w, u)
                free = pairs is None or abs(int(rank[u]) - int(rank[w])) <= pairs
                if not free:
                    V.fixed_pairs += 1
            if not free and closure.has_edge(first, second) and not (is_prod[u] and is_prod[w]):
                continue  # a path orders them and no shared link can matter
            same = V.same[u, w] = add_var(prob, f"same_{u}_{w}", 0, 1)
            for a in sorted(common):
                m.add([(same, 1.0), (x[u, a], -1.0), (x[w, a], -1.0)], pulp.LpConstraintGE, -1.0, f"same_{u}_{w}_{a}")
            if free:
                y = V.y[first, second] = add_var(prob, f"y_{first}_{second}", cat=pulp.LpBinary)
                # first before second (y = 1): relaxed by UB * (2 - y - same);
                # second before first (y = 0): relaxed by UB * (1 + y - same)
                orders = [(first, second, [(y, -UB)], 2 * UB), (second, first, [(y, UB)], UB)]
            else:
                orders = [(first, second, [], UB)]
            for p, q, yterm, rhs_relax in orders:
                if not closure.has_edge(p, q):
                    m.add([(S[q], 1.0), (C[p], -1.0), (same, -UB)] + yterm, pulp.LpConstraintGE, -rhs_relax,
                          f"order_{p}_{q}")
                if is_prod[p] and is_prod[q]:
                    for e in sorted(set(m.dest[p]) & set(m.dest[q])):
                        m.add([(V.T[q, e], 1.0), (V.T[p, e], -1.0), (V.dur[p, e], -1.0), (same, -UB)] + yterm,
                              pulp.LpConstraintGE, -rhs_relax, f"fifo_{p}_{q}_{e}")


def add_memory(m: ModelParts) -> None:
    """``mem``: per device, the placed nodes' memory and the tensors it receives."""
    problem, V, feas = m.problem, m.V, m.feas
    mem, bs = problem.mem, V.byte_scale
    for d in range(problem.num_devices):
        terms = [(V.x[v, d], mem[v] * bs) for v in range(problem.num_nodes) if d in feas[v] and mem[v] > 0]
        for u in m.dest:
            if d in m.dest[u]:
                terms += m.received(u, d)
        if terms:
            m.add(terms, pulp.LpConstraintLE, problem.capacity[d] * bs, f"mem_{d}")


def add_makespan_cuts(m: ModelParts, topo: list[int]) -> None:
    """``span``: M >= C[v] + the cheapest remaining path after ``v`` (M >= C[v] for sinks);
    ``load``: M >= each device's busy time (valid cuts that tighten the LP bound)."""
    problem, V, feas, succ = m.problem, m.V, m.feas, m.succ
    n, costs, ts = problem.num_nodes, problem.costs, V.time_scale
    minc = np.array([min(costs[v, d] for d in feas[v]) for v in range(n)]) * ts
    tail = np.zeros(n)
    for v in reversed(topo):
        if succ[v]:
            tail[v] = max(minc[w] + tail[w] for w in succ[v])
    for v in range(n):
        m.add([(V.M, 1.0), (V.C[v], -1.0)], pulp.LpConstraintGE, float(tail[v]), f"span_{v}")
    for d in range(problem.num_devices):
        terms = [(V.x[v, d], -costs[v, d] * ts) for v in range(n) if d in feas[v]]
        if terms:
            m.add([(V.M, 1.0)] + terms, pulp.LpConstraintGE, 0.0, f"load_{d}")


def add_window(m: ModelParts, release: np.ndarray | None, tails: np.ndarray | None) -> None:
    """``release`` and ``tail``: what precedes and follows the model in a larger schedule."""
    V, feas, ts = m.V, m.feas, m.V.time_scale
    if release is not None:
        rel = np.asarray(release, dtype=np.float64) * ts
        for v in range(m.problem.num_nodes):
            terms = [(V.x[v, d], -float(rel[v, d])) for d in sorted(feas[v]) if rel[v, d] > 0]
            if terms:
                m.add([(V.S[v], 1.0)] + terms, pulp.LpConstraintGE, 0.0, f"release_{v}")
    if tails is not None:
        tl = np.asarray(tails, dtype=np.float64) * ts
        for v in range(m.problem.num_nodes):
            terms = [(V.x[v, d], -float(tl[v, d])) for d in sorted(feas[v]) if tl[v, d] > 0]
            if terms:
                m.add([(V.M, 1.0), (V.C[v], -1.0)] + terms, pulp.LpConstraintGE, 0.0, f"tail_{v}")


def add_bottleneck(m: ModelParts, microbatches) -> None:
    """The throughput objective: ``B`` >= each device's busy time and each link's transfers."""
    problem, prob, V, feas, UB = m.problem, m.prob, m.V, m.feas, m.UB
    n, ts = problem.num_nodes, V.time_scale
    V.B = B = add_var(prob, "B", 0, UB)
    for d in range(problem.num_devices):
        terms = [(V.x[v, d], -problem.costs[v, d] * ts) for v in range(n) if d in feas[v]]
        if terms:
            m.add([(B, 1.0)] + terms, pulp.LpConstraintGE, 0.0, f"busy_{d}")
    links: dict[tuple[int, int], list] = {}
    for u, es in m.dest.items():
        for e in es:
            for a in sorted(feas[u]):
                if a == e:
                    continue
                w = V.w[u, a, e] = add_var(prob, f"w_{u}_{a}_{e}", 0, UB)
                m.add([(w, 1.0), (V.dur[u, e], -1.0), (V.x[u, a], -UB)], pulp.LpConstraintGE, -UB, f"w_{u}_{a}_{e}")
                links.setdefault((a, e), []).append(w)
    for (a, e), ws in links.items():
        m.add([(B, 1.0)] + [(w, -1.0) for w in ws], pulp.LpConstraintGE, 0.0, f"link_{a}_{e}")
    k = float(microbatches) if microbatches else None
    prob.setObjective(lin([(V.M, 1.0 / k), (B, 1.0 - 1.0 / k)]) if k else lin([(B, 1.0), (V.M, 1e-3)]))


__all__ = ["ModelParts", "add_bottleneck", "add_makespan_cuts", "add_memory", "add_orders", "add_placement",
           "add_precedence", "add_transfers", "add_window"]
