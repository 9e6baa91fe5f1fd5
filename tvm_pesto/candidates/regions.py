"""Regions for graph-level backends: the windows between single-tensor cut points
(:func:`region_windows`) of the maximal convex regions of the ops a backend supports
(:func:`tvm_pesto.graph.regions.convex_regions`).
"""
from __future__ import annotations

import networkx as nx

from .convex import Reach


WINDOW_UNITS = (2, 3, 4, 6, 8, 12, 16)


def region_windows(graph, region: list[int], reach: Reach, max_region: int = 40,
                   groups: list[list[int]] | None = None) -> list[list[int]]:
    """The whole region and its windows between cut points.

    A cut point is a position in the region's topological order where at most one tensor of
    the region crosses from the prefix to the suffix and (when ``groups`` are given) no
    fusion group is split. Windows span 2, 3, 4, 6, 8, 12 or 16 consecutive cut intervals and
    at most ``max_region`` ops (single intervals are the op-level patterns' job).
    """
    order = sorted(region)
    rs = set(order)
    group_of = {}
    for gi, grp in enumerate(groups or []):
        for v in grp:
            group_of[v] = gi
    # walk the order once, keeping what crosses from the prefix to the rest of the region:
    # how many prefix ops still feed a later op (live tensors), and how many edges inside one
    # fusion group cross
    cuts, prefix, waiting, live, split = [0], set(), {}, 0, 0
    for k in range(1, len(order)):
        v = order[k - 1]
        prefix.add(v)
        for u in graph.dag.predecessors(v):
            if u in waiting:
                waiting[u] -= 1
                live -= waiting[u] == 0
                split -= u in group_of and group_of[u] == group_of.get(v)
        later = [w for w in graph.dag.successors(v) if w in rs and w not in prefix]
        waiting[v] = len(later)
        live += bool(later)
        if v in group_of:
            split += sum(group_of.get(w) == group_of[v] for w in later)
        if live <= 1 and not split:
            cuts.append(k)
    cuts.append(len(order))
    out, seen = [order], {tuple(order)}
    for i, a in enumerate(cuts):
        for units in WINDOW_UNITS:
            if i + units >= len(cuts):
                break
            b = cuts[i + units]
            if b - a > max_region:
                break
            w = order[a:b]
            t = tuple(w)
            if t in seen:
                continue
            if reach.convex(w) and nx.is_weakly_connected(graph.dag.subgraph(w)):
                seen.add(t)
                out.append(w)
    return out


__all__ = ["WINDOW_UNITS", "region_windows"]
