"""A lower bound on one sample's stage latency under the host pool, from a path and the
contiguity of the accelerators' stages (:class:`tvm_pesto.plan.problem.HostPool`).

The nodes of one path ``u_0 -> ... -> u_L`` run one after another whatever the plan. Cover
the path with *runs*, each a maximal stretch of consecutive path nodes on one device. A run
``u_s .. u_i`` on an accelerator lies in one stage, and a stage is contiguous, so every node
on a path from ``u_s`` to ``u_i`` (a descendant of ``u_s`` and an ancestor of ``u_i``: the run's
*hull*) is in that stage too: the stage's block holds the hull's work (at that device's
costs), and the device holds the hull's memory. Each other producer ``p`` of a hull node
(``u_s``'s path predecessor aside, whose change is counted below) is in the stage, adding its
work, or outside, adding the in phase of its smallest tensor: the block holds at least the
smaller of the two. A run on the CPUs needs no hull (CPU nodes run
side by side) and no memory cap (one pool), and costs its path nodes at CPU costs. A change
of device costs the sender's out phase and the receiver's in phase of that tensor
(:func:`tvm_pesto.plan.stage.io_rates`; nothing between two CPUs). So the latency is at least
the cheapest cover, found by a DP over (run end, run start, device class); the path-memory
bound (:func:`tvm_pesto.solve.bounds.comm.path_memory_bound`) is the same DP without hulls.

Single-pass graphs only (a training graph's stages are per pass); elsewhere the bound is 0.

Examples
--------
>>> import numpy as np
>>> from tvm_pesto.cluster import parse_cluster
>>> from tvm_pesto.graph.opgraph import OpGraph, OpNode
>>> from tvm_pesto.plan import Problem
>>> from tvm_pesto.plan.problem import HostPool
>>> # 0 -> {1, 2} -> 3: the path 0 -> 1 -> 3 on one device holds 2 as well
>>> g = OpGraph([OpNode(c, "op") for c in "abcd"], [(0, 1, 0), (0, 2, 0), (1, 3, 0), (2, 3, 0)])
>>> p = Problem(g, parse_cluster("1xV100-nvlink"), np.ones((4, 1)), host_pool=HostPool())
>>> round(hull_path_bound(p, [0, 1, 3])["bound_s"], 3)
4.0
"""
from __future__ import annotations

import networkx as nx
import numpy as np

from ...plan.problem import Problem
from ...plan.stage import io_rates, node_passes
from ..bounds.comm import device_classes
from ..bounds.paths import critical_path_nodes

_SAFETY = 1e-6  # relative margin, as the other bounds keep against rounding
_TOL = 1e-9


def _reach(problem: Problem, path: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(down, up)``: per path node, the nodes it reaches and the nodes that reach it (itself included)."""
    dag, n = problem.graph.dag, problem.num_nodes
    down, up = np.zeros((len(path), n), dtype=bool), np.zeros((len(path), n), dtype=bool)
    for k, u in enumerate(path):
        down[k, list(nx.descendants(dag, u) | {u})] = True
        up[k, list(nx.ancestors(dag, u) | {u})] = True
    return down, up


def hull_path_bound(problem: Problem, path: list[int] | None = None) -> dict:
    """The bound of the module docstring along ``path`` (default: a critical path).

    Returns
    -------
    dict
        ``bound_s`` (0 for a graph of several passes or a path no cover fits) and
        ``path_nodes``.
    """
    path = critical_path_nodes(problem) if path is None else list(path)
    out = {"bound_s": 0.0, "path_nodes": len(path)}
    if not path or (node_passes(problem.graph) != 0).any():
        return out
    L, n = len(path), problem.num_nodes
    classes = device_classes(problem)
    cpu = [problem.cluster.devices[c[0]].kind == "cpu" for c in classes]
    down, up = _reach(problem, path)
    lat, inv = io_rates(problem.cluster)
    preds = [list(problem.graph.dag.predecessors(v)) for v in range(n)]
    smallest = np.full(n, np.inf)
    if len(problem.src):
        np.minimum.at(smallest, problem.src, problem.ebytes)
    smallest[~np.isfinite(smallest)] = 0.0
    # trans[i, a, c]: the cheapest change from class a to class c on the path edge into node i
    trans = np.full((L, len(classes), len(classes)), np.inf)
    for i in range(1, L):
        io = lat + problem.graph.edge_bytes(path[i - 1], path[i]) * inv
        for a, ca in enumerate(classes):
            for c, cc in enumerate(classes):
                pairs = [io[x] + io[y] for x in ca for y in cc if x != y]
                trans[i, a, c] = 0.0 if cpu[a] and cpu[c] else min(pairs, default=np.inf)
    end = np.full((L, len(classes)), np.inf)  # best time with a run of class c ending at node i
    for i in range(L):
        for c, cc in enumerate(classes):
            cost = problem.costs[:, cc[0]]
            if cpu[c]:  # the pool: a CPU run costs its path nodes
                stay = end[i - 1, c] if i else np.inf
                enter = _entry(end, trans, i, c)
                end[i, c] = min(stay, enter) + cost[path[i]]
                continue
            work = np.where(np.isfinite(cost), cost, 0.0)
            side = np.minimum(work, float(lat[cc].min()) + smallest * float(inv[cc].min()))  # in the stage or in
            bad = ~np.isfinite(cost)
            cap = float(problem.capacity[cc].max())
            inside, ext, total, extra = np.zeros(n, dtype=bool), set(), 0.0, 0.0
            for s in range(i, -1, -1):  # runs u_s .. u_i; the hull grows as s moves back
                hull = down[s] & up[i]
                if bad[hull].any() or float(problem.mem[hull].sum()) > cap * (1 + _TOL):
                    break
                for v in np.flatnonzero(hull & ~inside).tolist():
                    inside[v], total = True, total + float(work[v])
                    if v in ext:
                        ext.discard(v)
                        extra -= float(side[v])
                    for q in preds[v]:
                        if not inside[q] and q not in ext:
                            ext.add(q)
                            extra += float(side[q])
                own = extra - (float(side[path[s - 1]]) if s and path[s - 1] in ext else 0.0)
                end[i, c] = min(end[i, c], _entry(end, trans, s, c) + total + own)
    best = float(end[L - 1].min())
    if np.isfinite(best):
        out["bound_s"] = best * (1 - _SAFETY)
    return out


def _entry(end: np.ndarray, trans: np.ndarray, s: int, c: int) -> float:
    """The earliest a run of class ``c`` can start at path node ``s``."""
    if s == 0:
        return 0.0
    return float((end[s - 1] + trans[s, :, c]).min())


__all__ = ["hull_path_bound"]
