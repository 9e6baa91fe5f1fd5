"""A lower bound on the stage model's latency from its chain of *cut vertices* and its stage budget.

In the stage model (:mod:`tvm_pesto.plan.stage`) a device runs at most one stage per pass, so
a pass has at most ``D`` stages, each contiguous. That limits how much of a graph can run in
parallel, which the critical path and the LP with start times do not see; this bound does.

Take one weakly connected component ``H`` of the graph (zero-cost sources and sinks left out,
which only lowers any plan's latency). A *cut vertex* of ``H`` is a node comparable with every
other node of ``H`` (an ancestor or a descendant of each); in a topological order they are
``a_1 < ... < a_m``, and the other nodes fall into *modules* ``M_0`` (before ``a_1``),
``M_k`` (between ``a_k`` and ``a_k+1``), ``M_m`` (after ``a_m``). In a valid stage plan:

* a stage that does not hold ``a_k`` lies wholly before or wholly after it (else a path would
  leave the stage through ``a_k`` and come back), so the stages holding cut vertices form a
  chain, each holding an interval ``a_i..a_j`` **and all of** ``M_i..M_j-1``; its block is at
  least that work on its device, whose memory must hold it (``interval``);
* between two such stages, module ``M_k`` (a *switch*) may use ``r`` stages of its own. With
  ``r = 0`` its nodes sit in the two neighbours' blocks: all of its work is serial. With
  ``r >= 1`` the chain through the largest of them carries at least ``W / r`` of the module's
  work ``W`` (the part in the neighbours' blocks counts in full), and the critical path of
  the module lies on some chain too: ``max(cp, W / r)``;
* every change of stage along a chain in one pass is a change of device, which costs an out
  and an in phase (:func:`tvm_pesto.plan.stage.io_rates`) of at least the module's smallest
  tensor: one on a switch without stages of its own, two through one of them;
* the stages used, ``(intervals) + sum r``, are at most ``D`` per pass of ``H``.

So the latency is at least the smallest total over the choices of intervals and switches
within the budget: a small DP over the cut vertices (:func:`chain_bound`). It counts each
node's cost once, at its cheapest device where memory is not at stake.

For a training graph whose forward and backward passes meet only through co-location
(nodes of one group share a device; a device runs its forward stage first when no edge runs
from a backward node to a forward one), a forward cut vertex ``f`` and a co-located backward
cut vertex ``b`` give ``latency >= (bound on the finish of f's stage) + (bound on the time
from the start of b's stage)``: the prefix and suffix values of the same DP.

Examples
--------
>>> from tvm_pesto.cluster import parse_cluster
>>> from tvm_pesto.graph.opgraph import OpGraph, OpNode
>>> from tvm_pesto.plan import Problem
>>> # a diamond 0 -> {1, 2} -> 3: on 2 devices the branches cannot run side by side in the
>>> # stage model (that needs 2 stages for the branches and 1 more for the ends)
>>> g = OpGraph([OpNode(c, "op") for c in "abcd"], [(0, 1, 0), (0, 2, 0), (1, 3, 0), (2, 3, 0)])
>>> p = Problem(g, parse_cluster("cpu:2"), np.ones((4, 2)))
>>> stage_latency_bound(p)["bound_s"] > 3.0 - 1e-6   # the critical path says 3, the model 4
True
"""
from __future__ import annotations

import networkx as nx
import numpy as np

from ...plan.problem import Problem
from ...plan.stage import BACKWARD, FORWARD, io_rates, node_passes
from ..bounds.paths import min_costs
from ..heuristics.common import colocation_index

_SAFETY = 1e-6  # relative margin, as the other bounds keep against rounding
_TOL = 1e-9
#: Cut vertices kept in the DP (more are thinned out evenly: a dropped one only joins a
#: module, which keeps the bound valid) and the largest graph the bound looks at.
MAX_CUTS = 400
MAX_NODES = 20_000


def _reduced(problem: Problem, nodes: list[int]) -> list[int]:
    """``nodes`` without zero-cost sources and sinks (repeatedly): removing nodes from a
    plan never delays it, and free ends hide the cut vertices (GNMT's inputs and outputs)."""
    free = np.where(np.isfinite(problem.costs), problem.costs, 0.0).max(axis=1) <= 0
    keep = set(nodes)
    dag = problem.graph.dag
    changed = True
    while changed and len(keep) > 1:
        gone = [v for v in keep if free[v] and (not any(u in keep for u in dag.predecessors(v))
                                                or not any(w in keep for w in dag.successors(v)))]
        changed = bool(gone) and len(gone) < len(keep)
        if changed:
            keep.difference_update(gone)
    return sorted(keep)


def _cut_vertices(dag: nx.DiGraph, order: list[int]) -> tuple[list[int], dict[int, int]]:
    """The nodes of ``order`` (a topological order of a connected sub-DAG) comparable with all
    others, and for every other node its module (how many cut vertices precede it)."""
    pos = {v: i for i, v in enumerate(order)}
    anc = {}
    for v in order:
        m = 0
        for u in dag.predecessors(v):
            if u in pos:
                m |= anc[u] | (1 << pos[u])
        anc[v] = m
    desc = {}
    for v in reversed(order):
        m = 0
        for w in dag.successors(v):
            if w in pos:
                m |= desc[w] | (1 << pos[w])
        desc[v] = m
    n = len(order)
    cuts = [v for v in order if anc[v].bit_count() + desc[v].bit_count() == n - 1]
    cut_mask = 0
    for v in cuts:
        cut_mask |= 1 << pos[v]
    module = {v: (anc[v] & cut_mask).bit_count() for v in order if not (cut_mask >> pos[v]) & 1}
    return cuts, module


def _crossing(b: float, lat: np.ndarray, inv: np.ndarray) -> float:
    """The cheapest change of device for a tensor of ``b`` bytes: an out phase on one device
    and an in phase on another."""
    if len(lat) < 2:
        return np.inf
    io = np.sort(lat + b * inv)
    return float(io[0] + io[1])


class _Chain:
    """The DP's data for one component: cut-vertex costs, modules and interval blocks."""

    def __init__(self, problem: Problem, nodes: list[int], mc: np.ndarray, passes: np.ndarray, budget_per_pass: int):
        dag = problem.graph.dag
        topo = [v for v in problem.graph.topo_order() if v in set(nodes)]
        cuts, module = _cut_vertices(dag, topo)
        if len(cuts) > MAX_CUTS:
            keep = set(cuts[int(round(i))] for i in np.linspace(0, len(cuts) - 1, MAX_CUTS))
            module, k = {}, 0
            for v in topo:  # the dropped cut vertices join the module they fall in
                if v in keep:
                    k += 1
                else:
                    module[v] = k
            cuts = [v for v in cuts if v in keep]
        self.cuts = cuts
        m = len(cuts)
        self.m = m
        npass = len({int(passes[v]) for v in nodes})
        mixed = npass > 1
        self.budget = budget_per_pass * npass
        lat, inv = io_rates(problem.cluster)
        members = [[] for _ in range(m + 1)]
        for v, k in module.items():
            members[k].append(v)
        costs = np.asarray(problem.costs, dtype=np.float64)
        cap = np.asarray(problem.capacity, dtype=np.float64) * (1 + _TOL)
        D = problem.num_devices
        self.W = np.array([float(mc[mem].sum()) if mem else 0.0 for mem in members])
        finish = {}  # longest path ending at each module node, within its module
        for v in topo:
            if v in module:
                finish[v] = mc[v] + max((finish[u] for u in dag.predecessors(v) if module.get(u) == module[v]),
                                        default=0.0)
        self.cp = np.zeros(m + 1)
        for v, t in finish.items():
            self.cp[module[v]] = max(self.cp[module[v]], t)
        self.x = np.zeros(m + 1)  # the cheapest change of device inside each module (0 across passes)
        cut_pos = {v: i for i, v in enumerate(cuts)}
        for k, mem in enumerate(members):
            ends = set(mem) | {cuts[i] for i in (k - 1, k) if 0 <= i < m}
            bs = [float(d["bytes"]) for u in ends for w, d in dag[u].items() if w in ends
                  and (module.get(w) == k or module.get(u) == k or (u in cut_pos and w in cut_pos))]
            self.x[k] = 0.0 if mixed or not bs else _crossing(min(bs), lat, inv)
        self.one_stage = np.inf  # no cut vertices: the whole component in one stage, memory held
        if m == 0 and not mixed:
            mem = members[0]
            w = costs[mem].sum(axis=0)
            self.one_stage = float(np.where(np.isfinite(w) & (cap >= problem.mem[mem].sum()), w, np.inf).min())
        # interval blocks: a_i..a_j with M_i..M_j-1 on one device, memory held, one pass.
        # Entries: cut 0, module 1, cut 1, module 2, ..., cut m-1; brk[e] = entry e changes pass
        work = np.zeros((max(2 * m - 1, 0), D))
        memo = np.zeros(len(work))
        brk = np.zeros(len(work))
        for i, a in enumerate(cuts):
            work[2 * i] = costs[a]
            memo[2 * i] = problem.mem[a]
            brk[2 * i] = i > 0 and passes[a] != passes[cuts[i - 1]]
            if i + 1 < m and members[i + 1]:
                mem = members[i + 1]
                work[2 * i + 1] = costs[mem].sum(axis=0)
                memo[2 * i + 1] = problem.mem[mem].sum()
                brk[2 * i + 1] = any(passes[v] != passes[a] for v in mem)
        runs = np.isfinite(work)
        cw = np.vstack([np.zeros(D), np.cumsum(np.where(runs, work, 0.0), axis=0)])
        cr = np.vstack([np.zeros(D), np.cumsum(~runs, axis=0)])
        cm = np.r_[0.0, np.cumsum(memo)]
        cb = np.r_[0.0, np.cumsum(brk)]
        self.interval = np.full((m, m), np.inf)
        for i in range(m):
            lo = 2 * i
            hi = 2 * np.arange(i, m) + 1  # exclusive ends of a_i..a_j
            w = cw[hi] - cw[lo]  # (m - i, D)
            ok = (cr[hi] - cr[lo] == 0) & ((cm[hi] - cm[lo])[:, None] <= cap[None, :])
            best = np.where(ok, w, np.inf).min(axis=1)
            self.interval[i, i:] = np.where(cb[hi] - cb[lo + 1] == 0, best, np.inf)

    def switch(self, k: int) -> np.ndarray:
        """Module ``k`` between two cut stages, by the stages ``r`` it uses."""
        r = np.arange(self.budget + 1, dtype=np.float64)
        with np.errstate(divide="ignore"):
            out = np.maximum(self.cp[k] + self.x[k], self.W[k] / np.maximum(r, 1) + 2 * self.x[k])
        out[0] = self.W[k] + self.x[k]
        return out

    def end(self, k: int) -> np.ndarray:
        """Module ``k`` before the first (``k = 0``) or after the last cut vertex, by ``r``."""
        r = np.arange(self.budget + 1, dtype=np.float64)
        if self.W[k] == 0:
            return np.zeros(len(r))
        with np.errstate(divide="ignore"):
            out = np.maximum(self.cp[k], self.W[k] / np.maximum(r, 1) + self.x[k])
        out[0] = self.W[k]
        return out


def _minplus(a: np.ndarray, b: np.ndarray, shift: int = 0) -> np.ndarray:
    """``out[s] = min over t of a[t] + b[s - t - shift]`` for s in range(len(a))."""
    n = len(a)
    out = np.full(n, np.inf)
    for t in range(n):
        if np.isfinite(a[t]) and t + shift < n:
            k = n - t - shift
            np.minimum(out[t + shift:], a[t] + b[:k], out=out[t + shift:])
    return out


def _prefix_dp(ch: _Chain, order: list[int], first_end: np.ndarray, switches: list[np.ndarray]) -> np.ndarray:
    """``f[j, s]``: the least time to the finish of the stage of cut vertex ``order[j]`` with
    ``s`` stages used; ``order`` indexes the chain (forward or reversed)."""
    m, B = len(order), ch.budget
    f = np.full((m, B + 1), np.inf)
    G = np.full((m, B + 1), np.inf)  # G[i]: before the stage that starts at order[i]
    G[0] = np.r_[np.inf, first_end[:B]]  # the first cut stage plus r_0 stages of M_0
    for j in range(m):
        if j > 0:
            G[j] = _minplus(f[j - 1], switches[j - 1], shift=1)
        iv = np.array([ch.interval[min(order[i], order[j]), max(order[i], order[j])] for i in range(j + 1)])
        f[j] = (G[: j + 1] + iv[:, None]).min(axis=0)
    return f


def chain_bound(problem: Problem, nodes: list[int], mc: np.ndarray, passes: np.ndarray) -> dict:
    """The DP of the module docstring on the component ``nodes``: ``bound_s`` (its latency,
    at least), ``prefix_s`` / ``suffix_s`` (per cut vertex: the finish of its stage, and the
    time from the start of its stage to the end) and ``cuts``."""
    nodes = _reduced(problem, nodes)
    ch = _Chain(problem, nodes, mc, passes, problem.num_devices)
    B = ch.budget
    if ch.m == 0:
        r = np.arange(1, B + 1, dtype=np.float64)
        vals = np.maximum(ch.cp[0], ch.W[0] / r)
        vals[0] = max(vals[0], ch.one_stage)
        return {"bound_s": float(vals.min()), "cuts": [], "prefix_s": {}, "suffix_s": {}}
    m = ch.m
    fwd = _prefix_dp(ch, list(range(m)), ch.end(0), [ch.switch(k) for k in range(1, m)])
    rev = _prefix_dp(ch, list(range(m - 1, -1, -1)), ch.end(m), [ch.switch(k) for k in range(m - 1, 0, -1)])
    total = _minplus(fwd[m - 1], ch.end(m), shift=0)
    return {"bound_s": float(total.min()), "cuts": ch.cuts,
            "prefix_s": {v: float(fwd[i].min()) for i, v in enumerate(ch.cuts)},
            "suffix_s": {v: float(rev[m - 1 - i].min()) for i, v in enumerate(ch.cuts)}}


def stage_latency_bound(problem: Problem, max_nodes: int = MAX_NODES) -> dict:
    """A lower bound on the latency of every valid stage plan (module docstring).

    Returns
    -------
    dict
        ``bound_s`` (None when skipped: more than ``max_nodes`` nodes, or a node that runs
        nowhere), ``components`` (per weakly connected component: nodes, cut vertices,
        bound) and ``coupled_s`` (the forward-then-backward bound; None where it does not apply).
    """
    n = problem.num_nodes
    out = {"bound_s": None, "components": [], "coupled_s": None}
    if n == 0 or n > max_nodes:
        return out
    mc = min_costs(problem)
    if not np.isfinite(mc).all():
        return out
    passes = node_passes(problem.graph)
    best = 0.0
    info = {}
    for comp in sorted((sorted(c) for c in nx.weakly_connected_components(problem.graph.dag)), key=lambda c: c[0]):
        r = chain_bound(problem, comp, mc, passes)
        out["components"].append({"nodes": len(comp), "cut_vertices": len(r["cuts"]), "bound_s": r["bound_s"]})
        best = max(best, r["bound_s"])
        for v in r["cuts"]:
            info[v] = (r["prefix_s"][v], r["suffix_s"][v])
    backward_feeds_forward = any(passes[u] == BACKWARD and passes[v] == FORWARD
                                 for u, v in zip(problem.src.tolist(), problem.dst.tolist()))
    if not backward_feeds_forward:
        _, groups = colocation_index(problem)
        coupled = None
        for grp in groups:
            fs = [v for v in grp if passes[v] == FORWARD and v in info]
            bs = [v for v in grp if passes[v] == BACKWARD and v in info]
            for f in fs:
                for b in bs:
                    val = info[f][0] + info[b][1]
                    coupled = val if coupled is None else max(coupled, val)
        if coupled is not None:
            out["coupled_s"] = coupled * (1 - _SAFETY)
            best = max(best, coupled)
    out["bound_s"] = best * (1 - _SAFETY)
    return out


__all__ = ["MAX_CUTS", "MAX_NODES", "chain_bound", "stage_latency_bound"]
