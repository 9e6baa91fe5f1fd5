"""Convexity of node sets: a set can be outlined as one call without creating a cycle when no
path leaves it and comes back (:class:`Reach`, :func:`is_valid`), and a set of disjoint groups
when contracting them all leaves a DAG (:func:`combined_acyclic`).
"""
from __future__ import annotations

import networkx as nx


class Reach:
    """Ancestor/descendant bitmasks of a DAG (Python ints), for convexity tests."""

    def __init__(self, dag: nx.DiGraph, n: int):
        order = list(nx.topological_sort(dag))
        self.n = n
        self.desc = [0] * n
        self.anc = [0] * n
        for v in reversed(order):
            m = 0
            for w in dag.successors(v):
                m |= (1 << w) | self.desc[w]
            self.desc[v] = m
        for v in order:
            m = 0
            for u in dag.predecessors(v):
                m |= (1 << u) | self.anc[u]
            self.anc[v] = m

    def convex(self, nodes) -> bool:
        """No node outside ``nodes`` lies on a path between two nodes of it."""
        mask = 0
        for v in nodes:
            mask |= 1 << v
        d = a = 0
        for v in nodes:
            d |= self.desc[v]
            a |= self.anc[v]
        return (d & a & ~mask) == 0


def is_valid(graph, nodes, reach: Reach | None = None) -> bool:
    """Whether ``nodes`` can be outlined without a cycle: convex and weakly connected.

    Examples
    --------
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode(str(i), "relax.add") for i in range(3)], [(0, 1, 4), (1, 2, 4), (0, 2, 4)])
    >>> is_valid(g, [0, 2]), is_valid(g, [0, 1, 2])
    (False, True)
    """
    nodes = list(nodes)
    if not nodes:
        return False
    reach = reach or Reach(graph.dag, graph.num_nodes)
    if not reach.convex(nodes):
        return False
    return len(nodes) == 1 or nx.is_weakly_connected(graph.dag.subgraph(nodes))


def combined_acyclic(graph, groups) -> bool:
    """Whether contracting the disjoint ``groups`` (other nodes stay single) leaves a DAG."""
    owner = {}
    for gi, grp in enumerate(groups):
        for v in grp:
            owner[v] = ("g", gi)
    q = nx.DiGraph()
    for v in range(graph.num_nodes):
        q.add_node(owner.get(v, ("n", v)))
    for u, v in graph.dag.edges():
        a, b = owner.get(u, ("n", u)), owner.get(v, ("n", v))
        if a != b:
            q.add_edge(a, b)
    return nx.is_directed_acyclic_graph(q)


__all__ = ["Reach", "combined_acyclic", "is_valid"]
