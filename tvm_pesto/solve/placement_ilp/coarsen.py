"""Graph coarsening so the ILP stays small (after Pesto and Baechi).

Two phases, both cycle-safe by construction:

1. **Edge merging** (largest tensors first). An edge ``U -> V`` of the current supernode
   graph is contracted when ``U`` has no other successor or ``V`` no other predecessor:
   then no other path ``U ~> V`` exists, so contracting it cannot close a cycle. Pure chain
   links (both conditions) go first, as they cost no parallelism; then the others (a branch
   into its join, a producer into its only consumer). Expensive tensors stay inside a
   supernode. Passes repeat until nothing merges or the target is reached.
2. **Topological ranges.** If the graph is still larger than the target, the supernodes are
   laid out in a depth-first topological order (:func:`~tvm_pesto.graph.opgraph.depth_first_order`,
   so a branch stays contiguous) and cut into contiguous ranges of balanced compute weight. Every edge
   goes forward in a topological order, so between ranges edges only go from an earlier
   range to a later one: the contracted graph is acyclic. The weight budget is found by
   bisection so that at most ``target`` ranges remain.

Both phases refuse a merge that would leave a supernode (or its co-location class) with no
device every member can run on, or whose co-location class would not fit any device's
memory, and keep supernodes below a compute cap (``weight_cap`` x the average) and a memory
cap (``mem_frac`` of the largest device they may use), so the ILP keeps room to balance.
Co-location groups map to groups of supernodes that the ILP keeps on one device.

Everything runs in plain Python loops over adjacency sets plus NumPy; see the module's
benchmark (``tvm-pesto bench scale``) for timings.
"""
from __future__ import annotations

import time

import networkx as nx
import numpy as np
from networkx.utils import UnionFind

from ...errors import PestoError, PlanError
from ...graph.opgraph import OpGraph, depth_first_order
from ...plan import Plan, Problem


def _join_classes(cls: UnionFind, cmask: list[int], cmem: list[float], a: int, b: int) -> None:
    """Merge the co-location classes of roots ``a`` and ``b``: the merged class's device mask
    is the AND of theirs, its memory the sum."""
    cls.union(a, b)
    root = cls[a]
    cmask[root], cmem[root] = cmask[a] & cmask[b], cmem[a] + cmem[b]


def _device_masks(problem: Problem) -> np.ndarray:
    fin = np.isfinite(problem.costs)
    bits = np.left_shift(np.int64(1), np.arange(problem.num_devices, dtype=np.int64))
    return (fin * bits).sum(axis=1).astype(np.int64)


def _mask_capacity(capacity: np.ndarray):
    cache: dict[int, float] = {}

    def cap(mask: int) -> float:
        c = cache.get(mask)
        if c is None:
            devs = [d for d in range(len(capacity)) if mask >> d & 1]
            c = cache[mask] = float(capacity[devs].max()) if devs else 0.0
        return c

    return cap


def coarsen(problem: Problem, target: int, weight_cap: float = 2.0, mem_frac: float = 0.5,
            max_passes: int = 4, stats: dict | None = None) -> tuple[Problem, list[list[int]]]:
    """Contract ``problem``'s graph to about ``target`` supernodes without creating a cycle.

    Parameters
    ----------
    problem : Problem
        The fine problem.
    target : int
        Wanted number of supernodes (40-80 suits the ILP). More remain only when device
        feasibility, co-location or memory forbid further merging.
    weight_cap : float
        A supernode's compute (sum of its members' cheapest costs) stays below
        ``weight_cap * total / target`` (single nodes above it stay alone).
    mem_frac : float
        A supernode's weights and outputs stay below this fraction of the largest device it
        may run on.
    max_passes : int
        Edge-merging passes before falling back to topological ranges.
    stats : dict, optional
        Filled with ``after_edge_merging`` (supernodes after phase 1), ``used_ranges`` and
        ``seconds``.

    Returns
    -------
    coarse_problem : Problem
        Costs are the members' costs summed per device (``inf`` where any member cannot
        run), memory is the members' memory summed (internal tensors included, as the
        simulator keeps every output), co-location groups are mapped to supernodes.
    groups : list of list of int
        ``groups[i]`` lists the fine nodes of supernode ``i`` in topological order.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(100, cluster="2xV100-nvlink")   # 100 ops, 2 GPUs
    >>> coarse, groups = coarsen(problem, target=40)
    >>> coarse.num_nodes <= 40, sorted(v for grp in groups for v in grp) == list(range(100))
    (True, True)
    """
    t0 = time.perf_counter()
    n = problem.num_nodes
    if target < 1:
        raise PestoError(f"coarsening target must be at least 1, not {target}")
    if n <= target:
        return problem, [[v] for v in range(n)]
    weight = np.where(np.isfinite(problem.costs), problem.costs, np.inf).min(axis=1)
    cap_w = max(weight_cap * float(weight.sum()) / target, float(weight.max()) if n else 0.0)
    s = _Supernodes(problem, weight, cap_w, mem_frac)
    s.merge_edges(problem, target, max_passes)  # phase 1

    rep_arr = np.asarray(s.rep, dtype=np.int64)
    roots = np.unique(rep_arr)
    topo = problem.graph.topo_order()
    topo_pos = np.empty(n, dtype=np.int64)
    topo_pos[topo] = np.arange(n)
    first_arr = np.full(n, n, dtype=np.int64)
    np.minimum.at(first_arr, rep_arr, topo_pos)
    roots = roots[np.argsort(first_arr[roots], kind="stable")]

    if stats is not None:
        stats.update(after_edge_merging=s.count, used_ranges=s.count > target)
    lookup = np.empty(n, dtype=np.int64)
    if s.count > target:  # phase 2
        supernodes = nx.DiGraph((r, t) for r in roots.tolist() for t in s.succ[r])
        supernodes.add_nodes_from(roots.tolist())
        seq = depth_first_order(supernodes, key=first_arr.__getitem__)
        labels = _range_partition(seq, s.sw, s.sm, s.smask, target, s.cap_of, mem_frac,
                                  (s.cls, s.cmask, s.cmem) if s.has_coloc else None,
                                  needs_masks=s.has_coloc or any(m != s.masks[0] for m in s.masks))
        lookup[seq] = labels
    else:
        lookup[roots] = np.arange(len(roots))
    owner = lookup[rep_arr]
    k = int(owner.max()) + 1
    groups = _groups_from_owner(owner, topo_pos, k)
    coarse = contract_problem(problem, groups, owner)
    if stats is not None:
        stats["seconds"] = time.perf_counter() - t0
    return coarse, groups


class _Supernodes:
    """The supernode graph of phase 1: ``rep[v]`` the supernode (a node id) ``v`` belongs to,
    per supernode its members, compute ``sw``, memory ``sm``, device mask ``smask`` and
    adjacency sets; the co-location classes (``cls``, with mask ``cmask`` and memory ``cmem``
    per class root) merge along with them."""

    def __init__(self, problem: Problem, weight: np.ndarray, cap_w: float, mem_frac: float):
        n = problem.num_nodes
        self.masks = _device_masks(problem).tolist()
        self.cap_of = _mask_capacity(problem.capacity)
        self.cap_w, self.mem_frac = cap_w, mem_frac
        mem = problem.mem
        # co-location classes over fine nodes: mask = AND, mem = sum
        self.cls = cls = UnionFind(range(n))
        for grp in problem.colocate:
            cls.union(*(int(v) for v in grp))
        self.cmask, self.cmem = list(self.masks), mem.tolist()
        if problem.colocate:
            self.cmask, self.cmem = [-1] * n, [0.0] * n
            for v in range(n):
                r = cls[v]
                self.cmask[r] &= self.masks[v]
                self.cmem[r] += float(mem[v])
        self.has_coloc = bool(problem.colocate)
        self.rep = list(range(n))
        self.members: list[list[int] | None] = [[v] for v in range(n)]
        self.sw, self.sm, self.smask = weight.tolist(), mem.tolist(), list(self.masks)
        self.succ: list[set | None] = [set() for _ in range(n)]
        self.pred: list[set | None] = [set() for _ in range(n)]
        for u, v in zip(problem.src.tolist(), problem.dst.tolist()):
            self.succ[u].add(v)
            self.pred[v].add(u)
        self.count = n

    def can_merge(self, a: int, b: int) -> bool:
        """Whether supernodes ``a`` and ``b`` may become one (device, compute, memory and
        co-location limits)."""
        sw, sm, cap_of = self.sw, self.sm, self.cap_of
        m = self.smask[a] & self.smask[b]
        if not m or sw[a] + sw[b] > self.cap_w or sm[a] + sm[b] > self.mem_frac * cap_of(m):
            return False
        if self.has_coloc:
            cls, cmask, cmem = self.cls, self.cmask, self.cmem
            ca, cb = cls[a], cls[b]
            if ca != cb:
                cm = cmask[ca] & cmask[cb]
                if not cm or cmem[ca] + cmem[cb] > cap_of(cm):
                    return False
        return True

    def merge(self, a: int, b: int) -> None:
        """Contract supernodes ``a`` and ``b`` (the smaller one is relabelled)."""
        members, succ, pred = self.members, self.succ, self.pred
        if len(members[a]) < len(members[b]):
            a, b = b, a  # relabel the smaller supernode
        sa, pa = succ[a], pred[a]
        for s in succ[b]:
            ps = pred[s]
            ps.discard(b)
            if s != a:
                ps.add(a)
                sa.add(s)
        for p in pred[b]:
            sp = succ[p]
            sp.discard(b)
            if p != a:
                sp.add(a)
                pa.add(p)
        sa.discard(b)
        pa.discard(b)
        succ[b] = pred[b] = None
        rep = self.rep
        for v in members[b]:
            rep[v] = a
        members[a].extend(members[b])
        members[b] = None
        self.sw[a] += self.sw[b]
        self.sm[a] += self.sm[b]
        self.smask[a] &= self.smask[b]
        if self.has_coloc:
            ca, cb = self.cls[a], self.cls[b]
            if ca != cb:
                _join_classes(self.cls, self.cmask, self.cmem, ca, cb)
        self.count -= 1

    def merge_edges(self, problem: Problem, target: int, max_passes: int) -> None:
        """Phase 1: contract edges, largest tensors first, until ``target`` supernodes remain
        or nothing merges. Tier 1 merges pure chain links (U's only successor is V and V's
        only predecessor is U), which cost no parallelism; tier 2 also merges a node into its
        only consumer or its only producer (e.g. a branch into its join), which can
        serialise branches."""
        eorder = np.argsort(-problem.ebytes, kind="stable").tolist()
        src, dst = problem.src.tolist(), problem.dst.tolist()
        rep, succ, pred = self.rep, self.succ, self.pred
        for both in (True, False):
            for _ in range(max_passes):
                merged = 0
                for k in eorder:
                    if self.count <= target:
                        break
                    a, b = rep[src[k]], rep[dst[k]]
                    if a == b:
                        continue
                    one_out, one_in = len(succ[a]) == 1, len(pred[b]) == 1
                    if (both and not (one_out and one_in)) or not (one_out or one_in) or not self.can_merge(a, b):
                        continue
                    self.merge(a, b)
                    merged += 1
                if merged == 0 or self.count <= target:
                    break


def _range_partition(seq, sw, sm, smask, target, cap_of, mem_frac, classes, needs_masks) -> list[int]:
    """Cut ``seq`` into contiguous ranges; returns the range index of each element.

    ``classes`` is ``(union_find, class_mask, class_mem)`` of the co-location classes, or None.
    """
    m = len(seq)
    w = np.array([sw[r] for r in seq], dtype=np.float64)
    mm = np.array([sm[r] for r in seq], dtype=np.float64)
    cumw = np.concatenate([[0.0], np.cumsum(w)])
    cumm = np.concatenate([[0.0], np.cumsum(mm)])
    full_mask = -1
    for r in seq:
        full_mask &= smask[r]
    mem_cap = mem_frac * (cap_of(full_mask) if full_mask else max(cap_of(smask[r]) for r in seq))

    def cuts_for(budget: float, limit: int) -> list[int] | None:
        """Greedy range starts for a weight budget (optimal count), None past ``limit``."""
        starts = [0]
        i = 0
        while True:
            j = min(int(np.searchsorted(cumw, cumw[i] + budget, side="right")),
                    int(np.searchsorted(cumm, cumm[i] + mem_cap, side="right"))) - 1
            j = max(j, i + 1)
            if j >= m:
                return starts
            starts.append(j)
            i = j
            if len(starts) > limit:
                return None

    lo, hi = float(w.max()), float(cumw[-1]) * (1 + 1e-12) + 1e-300
    best = cuts_for(lo, target)
    if best is None:
        best = cuts_for(hi, target)
        if best is None:  # the memory cap alone needs more ranges than the target
            best = cuts_for(hi, m)
        else:
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                c = cuts_for(mid, target)
                if c is None:
                    lo = mid
                else:
                    hi, best = mid, c
                if hi - lo <= 1e-6 * hi:
                    break
    labels = np.zeros(m, dtype=np.int64)
    for s in best[1:]:
        labels[s] += 1
    labels = np.cumsum(labels).tolist()
    if not needs_masks:
        return labels
    # split ranges further where device masks or co-location classes would clash
    out = []
    g = -1
    prev_label = None
    cur_mask = 0
    cur_cls = None
    for r, lab in zip(seq, labels):
        new = lab != prev_label or not (cur_mask & smask[r])
        if not new and classes is not None:
            cls, cmask, cmem = classes
            c, cc = cls[r], cls[cur_cls]
            if c != cc:
                cm = cmask[cc] & cmask[c]
                new = not cm or cmem[cc] + cmem[c] > cap_of(cm)
        if new:
            g += 1
            prev_label = lab
            cur_mask = smask[r]
            cur_cls = r
        else:
            cur_mask &= smask[r]
            if classes is not None:
                cls, cmask, cmem = classes
                c, cc = cls[r], cls[cur_cls]
                if c != cc:
                    _join_classes(cls, cmask, cmem, cc, c)
        out.append(g)
    return out


def _groups_from_owner(owner: np.ndarray, topo_pos: np.ndarray, k: int) -> list[list[int]]:
    order = np.lexsort((topo_pos, owner))
    bounds = np.searchsorted(owner[order], np.arange(k + 1))
    flat = order.tolist()
    return [flat[bounds[i]:bounds[i + 1]] for i in range(k)]


def contract_problem(problem: Problem, groups: list[list[int]], owner: np.ndarray | None = None) -> Problem:
    """The problem of the contracted graph: per-device costs summed, memory summed,
    co-location groups mapped to supernodes.

    Examples
    --------
    >>> from tvm_pesto.cluster import parse_cluster
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode(c, "op") for c in "abc"], [(0, 1, 0), (1, 2, 0)])
    >>> problem = Problem(g, parse_cluster("2xV100-nvlink"), np.array([[1.0, 2.0], [1.0, 2.0], [3.0, 1.0]]))
    >>> coarse = contract_problem(problem, [[0, 1], [2]])
    >>> coarse.num_nodes, coarse.costs.tolist()
    (2, [[2.0, 4.0], [3.0, 1.0]])
    """
    n = problem.num_nodes
    if owner is None:
        owner = np.empty(n, dtype=np.int64)
        for gi, grp in enumerate(groups):
            owner[grp] = gi
    k = len(groups)
    graph: OpGraph = problem.graph.contract(groups, name=f"{problem.graph.name}/coarse{k}")
    costs = np.zeros((k, problem.num_devices))
    np.add.at(costs, owner, problem.costs)
    coloc = []
    for grp in problem.colocate:
        sup = sorted({int(owner[v]) for v in grp})
        if len(sup) > 1:
            coloc.append(sup)
    coarse = Problem(graph, problem.cluster, costs, colocate=coloc, cost_source=problem.cost_source)
    # The simulator keeps every node's outputs, internal tensors included.
    coarse.mem = np.bincount(owner, weights=problem.mem, minlength=k).astype(np.float64)
    return coarse


def expand_plan(plan: Plan, groups: list[list[int]], fine_problem: Problem) -> Plan:
    """Map a plan of the coarse problem back to the fine graph.

    Each fine node takes its supernode's device. A device runs its supernodes in the coarse
    order and, inside one supernode, the members in the fine topological order, i.e. nodes
    are sorted by (coarse position, fine topological index). Every fine edge then agrees with
    some global order of the coarse schedule, so the expanded plan cannot deadlock.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(100, cluster="2xV100-nvlink")   # 100 ops, 2 GPUs
    >>> from tvm_pesto.plan import simulate
    >>> from tvm_pesto.solve import solve
    >>> coarse, groups = coarsen(problem, target=40)
    >>> fine_plan = expand_plan(solve(coarse, "heft"), groups, problem)
    >>> simulate(problem, fine_plan).makespan > 0
    True
    """
    n = fine_problem.num_nodes
    k = len(groups)
    lens = np.fromiter((len(g) for g in groups), dtype=np.int64, count=k)
    members = np.fromiter((v for g in groups for v in g), dtype=np.int64, count=int(lens.sum()))
    if len(members) != n or len(np.unique(members)) != n:
        raise PlanError(f"the groups cover {len(np.unique(members))} of {n} fine nodes; every fine node "
                        "must be in exactly one group (pass the groups returned by coarsen)")
    if plan.assignment.shape != (k,):
        raise PlanError(f"the coarse plan places {plan.assignment.shape[0]} nodes but there are {k} groups")
    owner = np.empty(n, dtype=np.int64)
    owner[members] = np.repeat(np.arange(k), lens)
    cpos = np.zeros(k, dtype=np.int64)
    for seq in plan.order:
        cpos[seq] = np.arange(len(seq))
    topo = fine_problem.graph.topo_order()
    topo_pos = np.empty(n, dtype=np.int64)
    topo_pos[topo] = np.arange(n)
    assignment = plan.assignment[owner].astype(np.int64)
    order_all = np.lexsort((topo_pos, cpos[owner], assignment))
    bounds = np.searchsorted(assignment[order_all], np.arange(fine_problem.num_devices + 1))
    flat = order_all.tolist()
    order = [flat[bounds[d]:bounds[d + 1]] for d in range(fine_problem.num_devices)]
    return Plan(assignment, order, solver=plan.solver, solve_s=plan.solve_s, info=dict(plan.info))
