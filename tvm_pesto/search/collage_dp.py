"""Collage's search: a shortest path over sets of covered nodes (single device).

A state is the set of nodes already covered; a move picks one candidate that overlaps no
covered node and whose external inputs are all covered, at the candidate's measured cost.
The cheapest path from "nothing covered" to "everything covered" is the cheapest exact cover
by candidates.

Collage expands only candidates that contain the first uncovered node and keys states by
the covered set, which can combine individually valid candidates into a cyclic partition.
Requiring every picked candidate's inputs to be covered already makes every path a
topological order of the chosen candidates, so the covered set is a sufficient state and
the search is exact over acyclic covers. It runs as A* with the admissible, consistent bound
``sum over uncovered nodes of min over candidates c containing v of cost(c) / |c|``.

Examples
--------
>>> from tvm_pesto.search.collage_dp import collage_dp   # doctest: +SKIP
>>> res = collage_dp(graph, [c.nodes for c in cs], costs[:, 0])   # doctest: +SKIP
>>> res.cost, res.chosen                                          # doctest: +SKIP
"""
from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InfeasibleError, SolverError


@dataclass
class CoverResult:
    """Chosen candidate indices (in a valid execution order) and their total cost."""

    chosen: list[int]
    cost: float
    states: int = 0
    seconds: float = 0.0
    info: dict = field(default_factory=dict)


def _masks(num_nodes: int, node_sets, graph):
    pred = [0] * num_nodes
    for u, v in graph.dag.edges():
        pred[v] |= 1 << u
    cmask, cpred = [], []
    for nodes in node_sets:
        m = p = 0
        for v in nodes:
            m |= 1 << v
            p |= pred[v]
        cmask.append(m)
        cpred.append(p & ~m)
    return pred, cmask, cpred


def collage_dp(graph, node_sets, costs, max_states: int = 2_000_000, nodes=None) -> CoverResult:
    """The cheapest acyclic exact cover of ``graph``'s nodes by candidates.

    Parameters
    ----------
    graph : OpGraph
    node_sets : list of sequences of int
        Node ids of each candidate.
    costs : array of float
        Seconds per candidate (``inf`` = unusable).
    max_states : int
        Give up (SolverError) after expanding this many states.
    nodes : iterable of int, optional
        Cover only these nodes (the others count as covered; candidates touching them are
        not used). Default: all nodes.

    Returns
    -------
    CoverResult
        ``chosen`` in the order the search picked them (a topological order).

    Raises
    ------
    InfeasibleError
        When the finite-cost candidates cannot cover every node.

    Examples
    --------
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode("a", "relax.add"), OpNode("b", "relax.nn.relu")], [(0, 1, 4)])
    >>> collage_dp(g, [[0], [1], [0, 1]], [1.0, 1.0, 1.5]).chosen
    [2]
    """
    t0 = time.perf_counter()
    n = graph.num_nodes
    costs = np.asarray(costs, dtype=np.float64)
    universe = set(range(n)) if nodes is None else set(int(v) for v in nodes)
    usable = [i for i in range(len(node_sets)) if np.isfinite(costs[i]) and len(node_sets[i])
              and universe.issuperset(node_sets[i])]
    _, cmask, cpred = _masks(n, node_sets, graph)
    cover: list[list[int]] = [[] for _ in range(n)]
    for i in usable:
        for v in node_sets[i]:
            cover[v].append(i)
    missing = [v for v in sorted(universe) if not cover[v]]
    if missing:
        raise InfeasibleError(f"nodes {missing[:8]} ({[graph.nodes[v].op for v in missing[:4]]}) have no usable "
                              "candidate; keep the tvm backend enabled (it covers every op)")
    lb = np.array([min(costs[i] / len(node_sets[i]) for i in cover[v]) if cover[v] else 0.0 for v in range(n)])
    clb = {i: float(sum(lb[v] for v in node_sets[i])) for i in usable}
    full = (1 << n) - 1
    pred = [0] * n
    for u, v in graph.dag.edges():
        pred[v] |= 1 << u

    def h(mask: int) -> float:
        return float(sum(lb[v] for v in range(n) if not (mask >> v) & 1))

    start = 0
    for v in range(n):
        if v not in universe:
            start |= 1 << v
    g_best = {start: 0.0}
    parent: dict[int, tuple[int, int]] = {}
    tie = itertools.count()
    h_cache = {start: h(start)}
    heap = [(h_cache[start], next(tie), 0.0, start)]
    expanded = 0
    while heap:
        f, _, g, mask = heapq.heappop(heap)
        if g > g_best.get(mask, np.inf) + 1e-18:
            continue
        if mask == full:
            chosen = []
            m = mask
            while m != start:
                pm, ci = parent[m]
                chosen.append(ci)
                m = pm
            chosen.reverse()
            return CoverResult(chosen, g, expanded, time.perf_counter() - t0, {"rule": "ready"})
        expanded += 1
        if expanded > max_states:
            raise SolverError(f"the covering search expanded {max_states} states without finishing; "
                              "reduce the candidates (smaller max_region) or use the ILP")
        # frontier: uncovered nodes whose predecessors are all covered
        tried = set()
        rest = ~mask & full
        v = 0
        while rest:
            low = rest & -rest
            v = low.bit_length() - 1
            rest ^= low
            if pred[v] & ~mask:
                continue
            for ci in cover[v]:
                if ci in tried:
                    continue
                tried.add(ci)
                cm = cmask[ci]
                if cm & mask or cpred[ci] & ~mask:
                    continue
                nm = mask | cm
                ng = g + costs[ci]
                if ng < g_best.get(nm, np.inf) - 1e-18:
                    g_best[nm] = ng
                    parent[nm] = (mask, ci)
                    hv = h_cache.get(nm)
                    if hv is None:
                        hv = h_cache[nm] = max(h_cache[mask] - clb[ci], 0.0)
                    heapq.heappush(heap, (ng + hv, next(tie), ng, nm))
    raise InfeasibleError("no acyclic exact cover exists with the usable candidates; keep the tvm backend "
                          "enabled so that every op has a single-op candidate")


def brute_force_cover(graph, node_sets, costs) -> CoverResult:
    """Try every subset of candidates (tiny cases only, for tests): cheapest acyclic exact cover.

    Examples
    --------
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode("a", "relax.add"), OpNode("b", "relax.nn.relu")], [(0, 1, 4)])
    >>> brute_force_cover(g, [[0], [1], [0, 1]], [1.0, 1.0, 1.5]).cost
    1.5
    """
    from ..candidates.generate import combined_acyclic

    t0 = time.perf_counter()
    k = len(node_sets)
    if k > 22:
        raise SolverError(f"brute force over {k} candidates is too large (2^{k} subsets); use collage_dp")
    n = graph.num_nodes
    full = (1 << n) - 1
    _, cmask, _ = _masks(n, node_sets, graph)
    best, best_set = np.inf, None
    for bits in range(1, 1 << k):
        m = 0
        cost = 0.0
        ok = True
        sel = []
        for i in range(k):
            if (bits >> i) & 1:
                if m & cmask[i] or not np.isfinite(costs[i]):
                    ok = False
                    break
                m |= cmask[i]
                cost += costs[i]
                sel.append(i)
        if not ok or m != full or cost >= best:
            continue
        if combined_acyclic(graph, [node_sets[i] for i in sel]):
            best, best_set = cost, sel
    if best_set is None:
        raise InfeasibleError("no acyclic exact cover exists")
    return CoverResult(best_set, float(best), 1 << k, time.perf_counter() - t0, {"rule": "brute"})
