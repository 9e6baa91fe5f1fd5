"""Lower bounds that charge for moving tensors and for device memory.

The bounds of :mod:`.makespan` let every node run on its fastest device with free transfers
and unlimited memory. Two cheap arguments do better on real DNN graphs:

**Segment bound** (fork/join structure). A node ``a`` that lies on every path from an input
to an output (a dominator of the sink, found with :func:`networkx.immediate_dominators`)
splits any schedule in time: all its ancestors finish before it starts and all its
descendants start after it finishes. The dominators ``a_1 .. a_k`` cut the graph into
segments (a ResNet block, a transformer layer); no edge skips a dominator. So

    makespan >= sum_i cost(a_i) + sum_segments (start of the next dominator - finish of the previous)

and each gap is at least the optimum of the segment alone: its inner nodes plus the two
dominators (cost 0) as a small placement problem, solved exactly by the ILP of
:mod:`tvm_pesto.solve.placement_ilp.model.build` (its dual bound when a limit stops it: a time
limit, or in deterministic mode a node limit, see :mod:`tvm_pesto.solve.budget`). Memory, co-location and
transfers from outside the segment are left out, which only lowers the optimum, so the sum
is a valid bound. A segment decides whether a residual shortcut or an attention head is
worth a transfer, the trade-off the critical path ignores.

**Path-memory bound**. The nodes of one path run one after another whatever the plan. Walk
the path and let each maximal run of consecutive nodes on one device hold at least its
nodes' weights and outputs plus the tensor it received; a run must fit in its device. A
dynamic program over (position, device class, memory of the current run) finds the cheapest
way to cover the path with runs, paying the node costs of each run's device class and the
cheapest transfer at each change of device. When the path's weights do not fit on one
device (a 24-layer BERT on 600 MiB accelerators), that forces transfers the critical path
never pays.

Examples
--------
>>> from tvm_pesto.solve.bounds.comm import segment_bound, path_memory_bound
>>> from tvm_pesto.bench.random_dag import dnn_like_problem
>>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
>>> segment_bound(problem)["bound_s"] > 0, path_memory_bound(problem)["bound_s"] > 0
(True, True)
"""
from __future__ import annotations

import networkx as nx
import numpy as np

from ...errors import PestoError
from ...graph.opgraph import OpGraph, OpNode
from ...plan.problem import Problem
from ...plan.stage import io_rates
from ..budget import Meter, combine
from ..placement_ilp.warm_solve import solve_ilp
from .paths import critical_path_nodes, longest_path

_SAFETY = 1e-6  # relative margin against MIP solver tolerances


def dominator_segments(problem: Problem) -> tuple[list[int], list[list[int]]]:
    """Nodes on every input-to-output path, in order, and the segments between them.

    Returns ``(chain, segments)`` with ``len(segments) == len(chain) + 1``: ``segments[0]``
    runs before ``chain[0]``, ``segments[i]`` between ``chain[i-1]`` and ``chain[i]``, the
    last one after ``chain[-1]``. Every node is in ``chain`` or in exactly one segment.

    Examples
    --------
    >>> from tvm_pesto.graph.opgraph import OpGraph, OpNode
    >>> from tvm_pesto.cluster import parse_cluster
    >>> g = OpGraph([OpNode(c, "op") for c in "abcd"], [(0, 1, 1), (0, 2, 1), (1, 3, 1), (2, 3, 1)])
    >>> p = Problem(g, parse_cluster("cpu:1"), np.ones((4, 1)))
    >>> dominator_segments(p)
    ([0, 3], [[], [1, 2], []])
    """
    n = problem.num_nodes
    if n == 0:
        return [], [[]]
    dag = nx.DiGraph()
    dag.add_nodes_from(range(n + 2))
    src, sink = n, n + 1
    dag.add_edges_from(zip(problem.src.tolist(), problem.dst.tolist()))
    indeg = np.bincount(problem.dst, minlength=n) if len(problem.dst) else np.zeros(n, dtype=np.int64)
    outdeg = np.bincount(problem.src, minlength=n) if len(problem.src) else np.zeros(n, dtype=np.int64)
    dag.add_edges_from((src, v) for v in np.flatnonzero(indeg == 0).tolist())
    dag.add_edges_from((v, sink) for v in np.flatnonzero(outdeg == 0).tolist())
    idom = nx.immediate_dominators(dag, src)
    chain = []
    v = idom[sink]
    while v != src:
        chain.append(v)
        v = idom[v]
    chain.reverse()
    topo = problem.graph.topo_order()
    pos = np.empty(n, dtype=np.int64)
    pos[topo] = np.arange(n)
    cuts = pos[chain] if chain else np.zeros(0, dtype=np.int64)
    seg_of = np.searchsorted(cuts, pos, side="right")  # chain nodes get the index after them
    is_chain = np.zeros(n, dtype=bool)
    is_chain[chain] = True
    segments: list[list[int]] = [[] for _ in range(len(chain) + 1)]
    for v in topo:
        if not is_chain[v]:
            segments[int(seg_of[v])].append(v)
    return [int(c) for c in chain], segments


def _segment_problem(problem: Problem, before: int | None, inner: list[int], after: int | None) -> Problem:
    """The segment as its own problem: ``inner`` nodes, the two dominators at cost 0, no memory."""
    nodes = ([before] if before is not None else []) + list(inner) + ([after] if after is not None else [])
    index = {v: i for i, v in enumerate(nodes)}
    edges = []
    for u, v, b in zip(problem.src.tolist(), problem.dst.tolist(), problem.ebytes.tolist()):
        if u in index and v in index:
            edges.append((index[u], index[v], int(b)))
    costs = problem.costs[nodes].copy()
    for end in (before, after):
        if end is not None:
            row = costs[index[end]]
            costs[index[end]] = np.where(np.isfinite(row), 0.0, np.inf)
    if _symmetric(problem, nodes):
        # identical devices: name them in the order the nodes (topologically sorted) first
        # use them, so node i can only be on devices 0..i; every plan has such a relabelling
        for i in range(min(len(nodes), problem.num_devices)):
            costs[i, i + 1:] = np.inf
    graph = OpGraph([OpNode(f"n{i}", "segment") for i in range(len(nodes))], edges, name="segment")
    return Problem(graph, problem.cluster.with_memory(1e30), costs, cost_source="segment")


def _symmetric(problem: Problem, nodes: list[int]) -> bool:
    """Whether every device is interchangeable for these nodes (same costs, uniform links)."""
    c = problem.costs[nodes]
    if not (c == c[:, :1]).all():
        return False
    off = ~np.eye(problem.num_devices, dtype=bool)
    lat, inv = problem.latency[off], problem.inv_bw[off]
    return bool(len(lat) == 0 or ((lat == lat[0]).all() and (inv == inv[0]).all()))


def _segment_key(sub: Problem) -> tuple:
    return (sub.costs.tobytes(), sub.src.tobytes(), sub.dst.tobytes(), sub.ebytes.tobytes())


def segment_bound(problem: Problem, max_segment_nodes: int = 16, time_limit_s: float = 5.0,
                  budget_s: float = 30.0, deterministic: bool | None = None) -> dict:
    """The segment bound of the module docstring.

    Parameters
    ----------
    problem : Problem
    max_segment_nodes : int
        Segments with more inner nodes are charged their critical path only.
    time_limit_s : float
        MIP time limit per distinct segment (identical segments are solved once); in
        deterministic mode the node limit it stands for.
    budget_s : float
        After this many seconds the remaining segments are charged their critical path. In
        deterministic mode there is no total budget, only its safety cap
        (:func:`tvm_pesto.solve.budget.cap_s`), whose expiry the result reports.
    deterministic : bool, optional
        Per-segment node limits instead of time limits, so the bound is the same on any
        machine; default: the ambient mode.

    Returns
    -------
    dict
        ``bound_s``, ``dominators`` (how many), ``segments`` (non-empty ones),
        ``solved`` (distinct segments solved exactly), ``capped`` (charged by their dual
        bound or critical path because a limit was hit), ``seconds``, ``budget`` (the mode)
        and ``deterministic`` (no clock decided the bound; else ``deterministic_reason``).

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> from tvm_pesto.plan import simulate
    >>> from tvm_pesto.solve import solve
    >>> segment_bound(problem)["bound_s"] <= simulate(problem, solve(problem, "heft")).makespan
    True
    """
    meter = Meter(budget_s, deterministic, "the segment bound")
    chain, segments = dominator_segments(problem)
    mc = problem.min_cost()
    total = float(mc[chain].sum()) if chain else 0.0
    cache: dict[tuple, float] = {}
    reports: list[dict] = []
    solved = capped = 0
    for i, inner in enumerate(segments):
        before = chain[i - 1] if i > 0 else None
        after = chain[i] if i < len(chain) else None
        if not inner:
            if before is not None and after is not None and problem.graph.dag.has_edge(before, after):
                ok = np.isfinite(problem.costs[[before, after]]).all(axis=0)
                if not ok.any():  # they can never share a device: one transfer at least
                    total += _cheapest_transfer(problem, before, after)
            continue
        cheap = longest_path(problem, mc, inner)[0]
        if len(inner) > max_segment_nodes or meter.spent():
            total += cheap
            capped += 1
            continue
        sub = _segment_problem(problem, before, inner, after)
        key = _segment_key(sub)
        if key not in cache:
            cache[key], det = _solve_segment(sub, time_limit_s, meter.deterministic)
            reports.append(det)
            solved += 1
        gap = cache[key]
        if gap is None:
            capped += 1
            gap = 0.0
        total += max(cheap, gap)
    rep = meter.report()
    return {"bound_s": total, "dominators": len(chain), "segments": sum(1 for s in segments if s),
            "solved": solved, "capped": capped, "seconds": meter.elapsed_s(), "budget": rep["budget"],
            **combine(rep, *reports)}


def _solve_segment(sub: Problem, time_limit_s: float, deterministic: bool) -> tuple[float | None, dict | None]:
    """Proven lower bound on the segment's optimum (seconds), or None; and the MIP's info
    (whose ``deterministic`` says whether a clock decided it)."""
    try:
        plan = solve_ilp(sub, time_limit_s=time_limit_s, gap=0.0, deterministic=deterministic)
    except PestoError:
        return None, None
    info = plan.info
    bound = info.get("bound")
    if info.get("status") == "optimal" and info.get("objective") is not None:
        bound = info["objective"] if bound is None else min(bound, info["objective"])
    if bound is None or not np.isfinite(bound):
        return None, info
    return max(0.0, float(bound) * (1 - _SAFETY)), info


def _cheapest_transfer(problem: Problem, u: int, v: int) -> float:
    ku = np.flatnonzero(np.isfinite(problem.costs[u]))
    kv = np.flatnonzero(np.isfinite(problem.costs[v]))
    b = problem.graph.edge_bytes(u, v)
    best = np.inf
    for a in ku.tolist():
        for c in kv.tolist():
            if a != c:
                best = min(best, problem.transfer_s(a, c, b))
    return float(best) if np.isfinite(best) else 0.0


def device_classes(problem: Problem) -> list[list[int]]:
    """Devices grouped by identical cost column and memory capacity."""
    classes: dict[tuple, list[int]] = {}
    for k in range(problem.num_devices):
        key = (problem.costs[:, k].tobytes(), float(problem.capacity[k]))
        classes.setdefault(key, []).append(k)
    return list(classes.values())


def path_memory_bound(problem: Problem, path: list[int] | None = None, max_states: int = 2000,
                      stage: bool = False) -> dict:
    """The path-memory bound of the module docstring along ``path`` (default: a critical path).

    ``stage=True``: the same argument in the stage model (:mod:`tvm_pesto.plan.stage`): a run
    holds its nodes' own memory only (received tensors do not count there), and each change
    of device costs the sender's out phase plus the receiver's in phase for that tensor
    (:func:`tvm_pesto.plan.stage.io_rates`), both of which lie between the two nodes' blocks.

    Returns
    -------
    dict
        ``bound_s`` (0 when the path cannot be covered, which the memory check reports
        elsewhere), ``path_nodes``, ``path_memory_bytes`` and ``min_runs`` (device runs of the
        cheapest cover).

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> from tvm_pesto.plan import simulate
    >>> from tvm_pesto.solve import solve
    >>> path_memory_bound(problem)["bound_s"] <= simulate(problem, solve(problem, "heft")).makespan
    True
    """
    path = critical_path_nodes(problem) if path is None else list(path)
    out = {"bound_s": 0.0, "path_nodes": len(path), "path_memory_bytes": float(problem.mem[path].sum()) if path else 0.0,
           "min_runs": 0}
    if not path:
        return out
    classes = device_classes(problem)
    ncls = len(classes)
    cap = np.array([problem.capacity[c].max() for c in classes])
    cost = np.stack([problem.costs[path][:, c[0]] for c in classes], axis=1)  # (L, ncls)
    # cheapest transfer of each path edge between (class a device) and (class b device), a != b device
    L = len(path)
    trans = np.full((max(L - 1, 0), ncls, ncls), np.inf)
    if stage:
        io_lat, io_inv = io_rates(problem.cluster)
    for i in range(L - 1):
        b = problem.graph.edge_bytes(path[i], path[i + 1])
        if stage:
            io = io_lat + b * io_inv
            t = io[:, None] + io[None, :]
        else:
            t = problem.latency + b * problem.inv_bw
        for a, ca in enumerate(classes):
            for c, cc in enumerate(classes):
                sub = t[np.ix_(ca, cc)]
                if a == c:
                    if len(ca) < 2:
                        continue
                    sub = sub[~np.eye(len(ca), dtype=bool)]
                trans[i, a, c] = float(sub.min())
    mem = problem.mem[path]
    tol = 1 + 1e-9
    # states[c] = list of (time, run_memory, runs), Pareto on (time, memory)
    states: list[list[tuple[float, float, int]]] = [[] for _ in range(ncls)]
    for c in range(ncls):
        if np.isfinite(cost[0, c]) and mem[0] <= cap[c] * tol:
            states[c] = [(float(cost[0, c]), float(mem[0]), 1)]
    for i in range(1, L):
        b = float(problem.graph.edge_bytes(path[i - 1], path[i]))
        new: list[list[tuple[float, float, int]]] = [[] for _ in range(ncls)]
        for c in range(ncls):
            if not np.isfinite(cost[i, c]):
                continue
            cand = []
            for t, m, r in states[c]:  # stay on the same device
                if m + mem[i] <= cap[c] * tol:
                    cand.append((t + cost[i, c], m + mem[i], r))
            start_mem = mem[i] + (0.0 if stage else b)
            if start_mem <= cap[c] * tol:
                best_t, best_r = np.inf, 0
                for a in range(ncls):  # change device
                    if states[a] and np.isfinite(trans[i - 1, a, c]):
                        t_min = min(t for t, _m, _r in states[a])
                        r_min = min(r for t, _m, r in states[a] if t == t_min)
                        if t_min + trans[i - 1, a, c] < best_t:
                            best_t, best_r = t_min + trans[i - 1, a, c], r_min + 1
                if np.isfinite(best_t):
                    cand.append((best_t + cost[i, c], start_mem, best_r))
            new[c] = _pareto(cand, max_states)
        states = new
    finals = [(t, r) for c in range(ncls) for t, _m, r in states[c]]
    if not finals:
        return out
    t, r = min(finals)
    out.update(bound_s=float(t) * (1 - _SAFETY), min_runs=int(r))
    return out


def _pareto(cand: list[tuple[float, float, int]], max_states: int) -> list[tuple[float, float, int]]:
    """Keep (time, memory) pairs no other pair beats on both; at most ``max_states``."""
    cand.sort()
    out: list[tuple[float, float, int]] = []
    best_m = np.inf
    for t, m, r in cand:
        if m < best_m:
            out.append((t, m, r))
            best_m = m
    if len(out) > max_states:  # keep a valid bound: merge the tail into its cheapest point
        tail = out[max_states - 1:]
        out = out[:max_states - 1] + [(tail[0][0], min(m for _t, m, _r in tail), tail[0][2])]
    return out
