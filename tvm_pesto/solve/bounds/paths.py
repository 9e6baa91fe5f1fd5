"""Critical paths: longest paths through the graph with node weights and free edges.

One function, :func:`longest_path` (``networkx.dag_longest_path`` on the graph with each
node's weight on its in-edges), serves every caller: the critical-path bound
(:func:`critical_path`), the segment bound's cheapest segment
(:mod:`tvm_pesto.solve.bounds.comm`), the path-memory bound's path and the local search's
floor and split points (:func:`critical_path_nodes`).
"""
from __future__ import annotations

import networkx as nx
import numpy as np

from ...plan.problem import Problem
from ..heuristics.common import colocation_index


def min_costs(problem: Problem) -> np.ndarray:
    """Smallest cost of each node over the devices its co-location group may use."""
    c = problem.costs.copy()
    group_of, groups = colocation_index(problem)
    fin = np.isfinite(c)
    for members in groups:
        ok = fin[members].all(axis=0)
        if ok.any():
            c[np.ix_(members, np.flatnonzero(~ok))] = np.inf
    return c.min(axis=1)


def longest_path(problem: Problem, weights: np.ndarray, nodes: list[int] | None = None) -> tuple[float, list[int]]:
    """Length and nodes (first node first) of a longest path with node weights ``weights``
    (non-negative) and free edges, among ``nodes`` (topologically sorted; default all).

    Ties: the path ends at the first node of the order that finishes last; before each node
    comes its first predecessor (smallest id) that finishes last, unless that one finishes at
    0 (then the path starts at the node).

    Examples
    --------
    >>> from tvm_pesto.graph.opgraph import OpGraph, OpNode
    >>> from tvm_pesto.cluster import parse_cluster
    >>> g = OpGraph([OpNode(c, "op") for c in "abcd"], [(0, 1, 1), (0, 2, 1), (1, 3, 1), (2, 3, 1)])
    >>> p = Problem(g, parse_cluster("cpu:1"), np.ones((4, 1)))
    >>> longest_path(p, np.array([1.0, 2.0, 3.0, 1.0]))
    (5.0, [0, 2, 3])
    """
    order = problem.graph.topo_order() if nodes is None else list(nodes)
    if not order:
        return 0.0, []
    root = -1  # above every node: a path may start anywhere, its first node's weight counted
    weighted = nx.DiGraph()
    weighted.add_nodes_from([root] + order)
    inside = set(order)
    # each node's in-edges from the root first, then by id: ties go to the path starting at
    # the node, else to the predecessor of least id (dag_longest_path keeps the first maximum)
    for v in order:
        w = float(weights[v])
        weighted.add_edge(root, v, w=w)
        weighted.add_edges_from((u, v, {"w": w}) for u in sorted(problem.graph.dag.predecessors(v)) if u in inside)
    path = nx.dag_longest_path(weighted, weight="w", topo_order=[root] + order)[1:] or order[:1]  # all weights 0
    return float(sum(float(weights[v]) for v in path)), path


def critical_path(problem: Problem, weights: np.ndarray | None = None) -> float:
    """Longest path with node weights ``weights`` (default: smallest costs) and free edges.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> critical_path(problem) > 0   # seconds
    True
    """
    w = min_costs(problem) if weights is None else np.asarray(weights, dtype=np.float64)
    return float(longest_path(problem, w)[0])


def critical_path_nodes(problem: Problem) -> list[int]:
    """The nodes of a critical path (each node at its cheapest device), first node first."""
    return longest_path(problem, problem.min_cost())[1]


__all__ = ["critical_path", "critical_path_nodes", "longest_path", "min_costs"]
