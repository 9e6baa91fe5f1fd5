"""The maximal convex regions of a set of ops (:func:`convex_regions`): what a graph-level
backend can take as one subgraph, for the candidate generator
(:mod:`tvm_pesto.candidates.generate`) and the GPU backends' region patterns
(:mod:`tvm_pesto.backends.gpu.patterns`).
"""
from __future__ import annotations

import networkx as nx


def convex_regions(graph, supported: set[int]) -> list[list[int]]:
    """Split the supported nodes into maximal convex, weakly connected regions.

    A node's rank is the largest number of unsupported nodes on a path from a source to it;
    nodes of one rank that are connected through supported nodes of that rank form a region.
    Any path between two nodes of a region through an unsupported node would raise the rank,
    so regions are convex.
    """
    rank = {}
    for v in graph.topo_order():
        r = 0
        for u in graph.dag.predecessors(v):
            r = max(r, rank[u] + (0 if u in supported else 1))
        rank[v] = r
    h = nx.Graph()
    h.add_nodes_from(supported)
    for u, v in graph.dag.edges():
        if u in supported and v in supported and rank[u] == rank[v]:
            h.add_edge(u, v)
    regions = [sorted(c) for c in nx.connected_components(h)]
    regions.sort(key=lambda r: r[0])
    return regions


__all__ = ["convex_regions"]
