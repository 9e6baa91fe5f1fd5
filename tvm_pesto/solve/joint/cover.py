"""Collage's covering search: the cheapest acyclic exact cover of a graph by candidates.

A state is the set of nodes already covered; a move picks one candidate that overlaps no
covered node and whose external inputs are all covered, at the candidate's cost on one
device. The cheapest path from "nothing covered" to "everything covered" is the cheapest
exact cover. Requiring every picked candidate's inputs to be covered makes every path a
topological order of the chosen candidates, so no cover is cyclic (Collage's own rule,
"expand the candidates that contain the first uncovered node", can combine valid
candidates into a cycle and misses covers). The search is A* with the admissible,
consistent bound ``sum over uncovered nodes v of min over candidates c containing v of
cost(c) / |c|``.

Three things keep it from blowing up on real models:

* **Pieces.** Node ids follow program order, a topological order. Where no candidate spans
  a position of that order, the graph splits into pieces that are covered independently
  (edges only go from earlier pieces to later ones, so the union stays acyclic).
* **Canonical order.** Independent moves commute: covering weight-only ops (a transposed
  weight has no inputs, so it is always ready) in any order reaches ``2^k`` sets. A move
  is expanded only when its first node comes after the previous move's, or when the
  previous move made it ready. The cheapest-first-node-first topological order of any
  cover obeys that rule (a candidate that was ready earlier would have been picked
  earlier), so the search stays exact.
* **Collage's rule first.** Each piece is first covered under the rule "every move covers
  the first uncovered node" (with the readiness check, so still acyclic): a few states per
  node, and on the zoo models the same cost as the exact search. The exact search then
  runs with a budget and replaces it when it finishes; ``info["exact"]`` says whether
  every piece was proved optimal.

Examples
--------
>>> from tvm_pesto.graph import OpGraph, OpNode
>>> g = OpGraph([OpNode("a", "relax.add"), OpNode("b", "relax.nn.relu")], [(0, 1, 4)])
>>> r = best_cover(g, [[0], [1], [0, 1]], [1.0, 1.0, 1.5])
>>> r.chosen, r.cost, r.info["exact"]
([2], 1.5, True)
"""
from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from ...errors import InfeasibleError, SolverError

#: Default budget of the exact search, in expanded states per piece.
MAX_STATES = 200_000


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


class _Piece:
    """One covering problem over ``nodes`` (local bit ``i`` = ``nodes[i]``); nodes outside
    count as covered."""

    def __init__(self, graph, node_sets, costs, usable, nodes):
        self.nodes = sorted(int(v) for v in nodes)
        local = {v: i for i, v in enumerate(self.nodes)}
        self.k = len(self.nodes)
        self.full = (1 << self.k) - 1
        pred = [0] * self.k
        for v in self.nodes:
            for u in graph.dag.predecessors(v):
                if u in local:
                    pred[local[v]] |= 1 << local[u]
        self.pred = pred
        inside = set(self.nodes)
        self.cands = [c for c in usable if inside.issuperset(node_sets[c])]
        self.cost = {c: float(costs[c]) for c in self.cands}
        self.cmask, self.cpred, self.key = {}, {}, {}
        self.cover: list[list[int]] = [[] for _ in range(self.k)]
        for c in self.cands:
            m = p = 0
            for v in node_sets[c]:
                m |= 1 << local[v]
                p |= pred[local[v]]
            self.cmask[c], self.cpred[c] = m, p & ~m
            self.key[c] = min(local[v] for v in node_sets[c])
            for v in node_sets[c]:
                self.cover[local[v]].append(c)
        missing = [self.nodes[i] for i in range(self.k) if not self.cover[i]]
        if missing:
            ops = [graph.nodes[v].op for v in missing[:4]]
            raise InfeasibleError(f"nodes {missing[:8]} ({ops}) have no usable candidate; keep the tvm backend "
                                  "enabled (it covers every op)")
        lb = [min(self.cost[c] / len(node_sets[c]) for c in self.cover[i]) for i in range(self.k)]
        # each candidate's bound summed over its own ops (in local order), not over the piece
        self.clb = {c: float(sum(lb[i] for i in sorted({local[v] for v in node_sets[c]}))) for c in self.cands}
        self.h0 = float(sum(lb))

    def moves(self, mask: int, last: int, rule: str):
        """Candidates that may be picked at ``mask`` after ``last`` (-1 at the start)."""
        rest = ~mask & self.full
        if rule == "first":
            low = rest & -rest
            v = low.bit_length() - 1
            for c in self.cover[v]:
                if not self.cmask[c] & mask and not self.cpred[c] & ~mask:
                    yield c
            return
        tried = set()
        while rest:
            low = rest & -rest
            v = low.bit_length() - 1
            rest ^= low
            if self.pred[v] & ~mask:
                continue
            for c in self.cover[v]:
                if c in tried:
                    continue
                tried.add(c)
                if self.cmask[c] & mask or self.cpred[c] & ~mask:
                    continue
                if last >= 0 and self.key[c] < self.key[last] and not self.cpred[c] & self.cmask[last]:
                    continue  # not canonical: it was ready before ``last`` and comes first
                yield c

    def search(self, max_states: int, rule: str) -> tuple[list[int], float, int]:
        """A* from nothing covered; raises SolverError past ``max_states`` expansions."""
        start = (0, -1)
        g_best = {start: 0.0}
        parent: dict = {}
        tie = itertools.count()
        heap = [(self.h0, next(tie), 0.0, 0, -1, self.h0)]
        expanded = 0
        while heap:
            _, _, g, mask, last, h = heapq.heappop(heap)
            if g > g_best.get((mask, last), np.inf) + 1e-18:
                continue
            if mask == self.full:
                chosen, st = [], (mask, last)
                while st != start:
                    st, c = parent[st]
                    chosen.append(c)
                chosen.reverse()
                return chosen, g, expanded
            expanded += 1
            if expanded > max_states:
                raise SolverError(f"the covering search expanded {max_states} states")
            for c in self.moves(mask, last, rule):
                nst = (mask | self.cmask[c], c if rule == "canonical" else -1)
                ng = g + self.cost[c]
                if ng < g_best.get(nst, np.inf) - 1e-18:
                    g_best[nst] = ng
                    parent[nst] = ((mask, last), c)
                    nh = max(h - self.clb[c], 0.0)
                    heapq.heappush(heap, (ng + nh, next(tie), ng, nst[0], nst[1], nh))
        raise InfeasibleError("no acyclic exact cover exists with the usable candidates; keep the tvm backend "
                              "enabled so that every op has a single-op candidate")


def _usable(node_sets, costs) -> list[int]:
    return [i for i in range(len(node_sets)) if np.isfinite(costs[i]) and len(node_sets[i])]


def collage_dp(graph, node_sets, costs, max_states: int = 2_000_000, nodes=None) -> CoverResult:
    """The cheapest acyclic exact cover of ``graph``'s nodes (or of ``nodes``) by candidates.

    Exact, over the whole node set at once (see :func:`best_cover` for pieces and budgets).

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
    SolverError
        When the search expands ``max_states`` states without finishing.

    Examples
    --------
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode("a", "relax.add"), OpNode("b", "relax.nn.relu")], [(0, 1, 4)])
    >>> collage_dp(g, [[0], [1], [0, 1]], [1.0, 1.0, 1.5]).chosen
    [2]
    """
    t0 = time.perf_counter()
    costs = np.asarray(costs, dtype=np.float64)
    universe = range(graph.num_nodes) if nodes is None else nodes
    piece = _Piece(graph, node_sets, costs, _usable(node_sets, costs), universe)
    try:
        chosen, cost, states = piece.search(max_states, "canonical")
    except SolverError:
        raise SolverError(f"the covering search expanded {max_states} states without finishing; use best_cover "
                          "(pieces and a bounded fallback) or fewer candidates") from None
    return CoverResult(chosen, cost, states, time.perf_counter() - t0, {"rule": "canonical", "exact": True})


def pieces(num_nodes: int, node_sets, usable) -> list[list[int]]:
    """Runs of node ids that no usable candidate spans (program order is topological, so
    each run only depends on earlier runs).

    Examples
    --------
    >>> pieces(5, [[0], [1, 2], [2], [3], [4], [3, 4]], range(6))
    [[0], [1, 2], [3, 4]]
    """
    spans = np.zeros(num_nodes + 1, dtype=np.int64)
    for c in usable:
        lo, hi = min(node_sets[c]), max(node_sets[c])
        if hi > lo:
            spans[lo + 1] += 1
            spans[hi + 1] -= 1
    covered = np.cumsum(spans)[:num_nodes]  # covered[p] > 0: a candidate spans p-1 | p
    out, cur = [], []
    for v in range(num_nodes):
        if cur and covered[v] == 0:
            out.append(cur)
            cur = []
        cur.append(v)
    if cur:
        out.append(cur)
    return out


def best_cover(graph, node_sets, costs, max_states: int = MAX_STATES, exact_work: int = 2_000_000,
               nodes=None) -> CoverResult:
    """A cheapest acyclic cover, piece by piece, within a budget (see the module doc).

    Each piece is first covered by A* under Collage's first-uncovered-node rule (every
    move covers the first uncovered node; bounded in practice by a few states per node),
    then by the exact canonical search with ``exact_work / piece size`` expansions (an
    expansion costs about one step per op of the piece), which replaces the first cover
    when it finishes. ``info``: ``exact`` (every piece was proved optimal),
    ``pieces``, ``largest_piece``, ``inexact_pieces``, ``lower_bound_s`` (no cover costs
    less), ``states``. ``nodes`` restricts the cover to those nodes (the others count as
    covered; candidates touching them are not used).

    Raises
    ------
    InfeasibleError
        When some node has no usable candidate.
    SolverError
        When a piece has no cover within ``max_states`` states under the bounded rule.
    """
    t0 = time.perf_counter()
    costs = np.asarray(costs, dtype=np.float64)
    usable = _usable(node_sets, costs)
    if nodes is None:
        parts = pieces(graph.num_nodes, node_sets, usable)
    else:  # pieces of the subset, in its own program order
        universe = sorted(int(v) for v in nodes)
        pos = {v: i for i, v in enumerate(universe)}
        inside = set(universe)
        usable = [c for c in usable if inside.issuperset(node_sets[c])]
        kept = set(usable)
        local = [[pos[v] for v in node_sets[c]] if c in kept else [] for c in range(len(node_sets))]
        parts = [[universe[i] for i in part] for part in pieces(len(universe), local, usable)]
    chosen: list[int] = []
    total, states, inexact, bound = 0.0, 0, 0, 0.0
    for part in parts:
        piece = _Piece(graph, node_sets, costs, usable, part)
        bound += piece.h0
        try:
            ch, cost, st = piece.search(max_states, "first")
        except SolverError:
            raise SolverError(f"the covering search found no cover of a {piece.k}-op piece within {max_states} "
                              "states; lower the number of candidates (fewer backends, smaller max_region)") from None
        states += st
        exact = False
        exact_states = int(exact_work // max(piece.k, 1))
        if exact_states > 0:
            try:
                ech, ecost, est = piece.search(exact_states, "canonical")
                states += est
                exact = True
                if ecost < cost - 1e-15:
                    ch, cost = ech, ecost
            except SolverError:
                states += exact_states
        inexact += 0 if exact else 1
        chosen.extend(ch)
        total += cost
    info = {"exact": inexact == 0, "pieces": len(parts), "largest_piece": max(len(p) for p in parts) if parts else 0,
            "inexact_pieces": inexact, "lower_bound_s": float(bound), "rule": "pieces"}
    return CoverResult(chosen, float(total), states, time.perf_counter() - t0, info)


def brute_force_cover(graph, node_sets, costs) -> CoverResult:
    """Try every subset of candidates (tiny cases only, for tests): cheapest acyclic exact cover.

    Examples
    --------
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode("a", "relax.add"), OpNode("b", "relax.nn.relu")], [(0, 1, 4)])
    >>> brute_force_cover(g, [[0], [1], [0, 1]], [1.0, 1.0, 1.5]).cost
    1.5
    """
    # lazy: loads TVM's compiler, which importing this module does not
    from ...candidates.convex import combined_acyclic

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
