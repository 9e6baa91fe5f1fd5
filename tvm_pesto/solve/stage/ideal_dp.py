"""Contiguous splits by dynamic programming over ideals (Tarnawski et al., NeurIPS 2020).

In the stage model (:mod:`tvm_pesto.plan.stage`) every stage is contiguous and the stage
graph is acyclic, so the forward stages, taken in a topological order of the stage graph,
grow a chain of *ideals* (down-closed node sets) ``{} = I_0 < I_1 < ... < I_m = V``: stage
``k`` is ``I_k - I_{k-1}`` and, for a training graph, the backward nodes co-located with it.
Conversely every such chain is a split into contiguous stages. The device load of a stage
(work plus communication, :func:`tvm_pesto.plan.stage.io_rates`) depends only on the set
and on the device's class, so

    dp[s][I] = min over ideals I' <= I of max(dp[s - one device of class c][I'], load_c(I - I'))

over the multiset ``s`` of devices used so far gives the smallest max-load (the steady-state
time per sample) over all contiguous splits, memory included: :func:`dp_split`. Devices of
one class (same costs, memory and IO rate) are interchangeable, so the DP counts them.

The DP works on *units*: the forward members of a co-location class contracted to one node
(classes on a cycle of the contracted graph must share a stage, so they are merged), with the
class's backward members riding along. Two reductions keep it small: classes whose every
member costs nothing and whose forward part is a source or a sink are dropped (GNMT's
zero-cost inputs and dangling outputs), and nothing else; dropping nodes only removes work,
transfers and memory, so the optimum on what is left is a **lower bound** for the full graph
(:func:`dp_bound`), exact when nothing was dropped.
The solver built on it is :mod:`tvm_pesto.solve.stage.dp` (``stage-dp``).

Examples
--------
>>> from tvm_pesto.cluster import parse_cluster
>>> from tvm_pesto.graph.opgraph import OpGraph, OpNode
>>> from tvm_pesto.plan import Problem
>>> g = OpGraph([OpNode(f"n{i}", "op") for i in range(4)], [(0, 1, 0), (1, 2, 0), (2, 3, 0)])
>>> p = Problem(g, parse_cluster("cpu:1").with_memory(1e9), np.array([[1.0], [2.0], [3.0], [4.0]]))
>>> dp_split(p).value_s
10.0
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from ...errors import PestoError, SolverError
from ...plan.problem import Problem
from ...plan.stage import BACKWARD, FORWARD, io_rates, node_passes
from ..heuristics.common import colocation_index

MAX_IDEALS = 4000
MAX_PAIRS = 3_000_000
_CHUNK = 4096
_TOL = 1e-9


@dataclass
class Units:
    """The graph the DP runs on: ``units[k]`` lists the kept nodes of unit ``k`` (forward and
    backward members of its co-location classes), ``dag`` the forward edges between units,
    ``dropped`` the nodes left out (a relaxation), ``exact`` whether nothing was dropped."""

    units: list
    unit_of: np.ndarray
    dag: nx.DiGraph
    dropped: list = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.dropped


def dp_units(problem: Problem, passes: np.ndarray | None = None, drop_free: bool = True,
             all_passes: bool = False) -> Units:
    """The units of the module docstring. ``all_passes``: units over the whole graph (every
    edge, both passes), for the prefix DP, where an interval of a topological order is
    contiguous in each pass whatever the co-location.

    Raises
    ------
    SolverError
        When a backward node has no co-located forward node and not ``all_passes`` (then a
        device's backward stage is not tied to its forward one, and the DP over forward
        ideals does not cover the stage model).
    """
    n = problem.num_nodes
    passes = node_passes(problem.graph) if passes is None else np.asarray(passes)
    group_of, groups = colocation_index(problem)
    cls = np.where(group_of >= 0, group_of, len(groups) + np.arange(n))
    members: dict[int, list[int]] = {}
    for v in range(n):
        members.setdefault(int(cls[v]), []).append(v)
    if all_passes:
        passes = np.full(n, FORWARD)
    for c, mem in members.items():
        if all(passes[v] == BACKWARD for v in mem):
            v = mem[0]
            raise SolverError(f"backward node {problem.graph.nodes[v].name} has no co-located forward node, so its "
                              "stage is not tied to a forward stage; the contiguous-split DP needs every backward "
                              "node co-located with a forward one (use --solver ilp or a heuristic)")
    free = np.where(np.isfinite(problem.costs), problem.costs, 0.0).max(axis=1) <= 0
    fwd = nx.DiGraph()
    fwd.add_nodes_from(members)
    for u, v in zip(problem.src.tolist(), problem.dst.tolist()):
        if passes[u] == FORWARD and passes[v] == FORWARD and cls[u] != cls[v]:
            fwd.add_edge(int(cls[u]), int(cls[v]))
    dropped: list[int] = []
    if drop_free:
        for _ in range(3):
            gone = [c for c in fwd if all(free[v] for v in members[c])
                    and (fwd.in_degree(c) == 0 or fwd.out_degree(c) == 0) and len(fwd) > 1]
            if not gone:
                break
            fwd.remove_nodes_from(gone)
            for c in gone:
                dropped.extend(members[c])
    cond = nx.condensation(fwd)  # classes on a cycle of the class graph share a stage
    order = list(nx.lexicographical_topological_sort(cond, key=lambda k: min(min(members[c]) for c in
                                                                          cond.nodes[k]["members"])))
    index = {k: i for i, k in enumerate(order)}
    unit_of = np.full(n, -1, dtype=np.int64)
    units: list[list[int]] = [[] for _ in order]
    for k in order:
        for c in cond.nodes[k]["members"]:
            for v in members[c]:
                unit_of[v] = index[k]
    for v in range(n):
        if unit_of[v] >= 0:
            units[unit_of[v]].append(v)
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(units)))
    dag.add_edges_from((index[a], index[b]) for a, b in cond.edges)
    return Units(units, unit_of, dag, sorted(dropped))


def all_ideals(dag: nx.DiGraph, limit: int = MAX_IDEALS) -> list[int] | None:
    """Every ideal of ``dag`` as a bit mask over its nodes (``0`` the empty one), smallest
    first; None when there are more than ``limit``."""
    anc = {}
    for k in nx.topological_sort(dag):
        m = 1 << k
        for p in dag.predecessors(k):
            m |= anc[p]
        anc[k] = m
    out = set()
    for chain in nx.antichains(dag):
        m = 0
        for k in chain:
            m |= anc[k]
        out.add(m)
        if len(out) > limit:
            return None
    return sorted(out, key=lambda m: (m.bit_count(), m))


def prefix_ideals(order: list[int]) -> list[int]:
    """The prefixes of ``order`` (a topological order of the units) as bit masks."""
    out, m = [0], 0
    for k in order:
        m |= 1 << k
        out.append(m)
    return out


@dataclass
class DpResult:
    """The DP's answer: ``value_s`` the smallest max-load over the splits it considered (inf
    when none fits), ``assignment`` a device per node (dropped nodes: -1) achieving it."""

    value_s: float
    assignment: np.ndarray
    exact: bool
    ideals: int
    pairs: int
    seconds: float
    family: str

    def info(self) -> dict:
        return {"dp_value_s": self.value_s, "dp_exact": self.exact, "dp_ideals": self.ideals, "dp_pairs": self.pairs,
                "dp_seconds": self.seconds, "dp_ideal_family": self.family}


def device_classes(problem: Problem) -> list[list[int]]:
    """Devices that are interchangeable in the stage model: same costs, memory and IO rate."""
    lat, inv = io_rates(problem.cluster)
    out: dict[tuple, list[int]] = {}
    for k in range(problem.num_devices):
        key = (problem.costs[:, k].tobytes(), float(problem.capacity[k]), float(lat[k]), float(inv[k]))
        out.setdefault(key, []).append(k)
    return list(out.values())


def _pairs(member: np.ndarray, mem_of_ideal: np.ndarray, max_mem: float, max_pairs: int):
    """Index arrays ``(P, Q)`` of the pairs ``masks[Q] < masks[P]`` (``member``: an ideal's
    units as a 0/1 row, the masks smallest first) whose difference could fit some device, in
    the order of ``P`` then ``Q``; raises SolverError past ``max_pairs``."""
    outside = 1.0 - member
    P, Q, total = [], [], 0
    for lo in range(0, len(member), _CHUNK // 8):
        rows = np.arange(lo, min(lo + _CHUNK // 8, len(member)))
        subset = (outside[rows] @ member.T) == 0  # (rows, ideals): masks[j] within masks[i]
        subset &= np.arange(len(member))[None, :] < rows[:, None]
        subset &= mem_of_ideal[None, :] >= (mem_of_ideal[rows] - max_mem * (1 + _TOL))[:, None]
        i, j = np.nonzero(subset)
        total += len(i)
        if total > max_pairs:
            raise SolverError(f"the contiguous-split DP would need more than {max_pairs} pairs of ideals; the graph is "
                              "too wide for it (use the linearised DP, the ILP or a heuristic)")
        P.append(rows[i])
        Q.append(j)
    return np.concatenate(P).astype(np.int64), np.concatenate(Q).astype(np.int64)


def dp_split(problem: Problem, family: str = "all", order: list[int] | None = None, passes=None,
             drop_free: bool = True, max_ideals: int = MAX_IDEALS, max_pairs: int = MAX_PAIRS,
             units: Units | None = None, combine: str = "max") -> DpResult:
    """The DP of the module docstring over every ideal (``family="all"``) or over the
    prefixes of ``order`` (``"prefix"``; a topological order of the units, default the
    units' own order).

    ``combine="max"`` minimises the largest device load (the steady-state time per sample:
    exact, and a bound); ``"sum"`` the sum of the blocks, which is the latency when the
    stages run one after another and an upper bound on it otherwise: a heuristic for the
    latency objective that avoids cuts where transfers are dear.

    Raises
    ------
    SolverError
        When the graph has more than ``max_ideals`` ideals or ``max_pairs`` pairs, or a
        backward node has no co-located forward node (see :func:`dp_units`).

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> r = dp_split(problem)
    >>> r.value_s > 0, r.exact
    (True, True)
    """
    return dp_splits(problem, (combine,), family, order, passes, drop_free, max_ideals, max_pairs, units)[0]


def dp_splits(problem: Problem, combines=("max",), family: str = "all", order: list[int] | None = None, passes=None,
              drop_free: bool = True, max_ideals: int = MAX_IDEALS, max_pairs: int = MAX_PAIRS,
              units: Units | None = None) -> list[DpResult]:
    """:func:`dp_split` once per name in ``combines``, over one set of ideals and block
    loads (their cost is the DP's; the combines differ only in the recursion)."""
    t0 = time.perf_counter()
    for combine in combines:
        if combine not in ("max", "sum"):
            raise PestoError(f"unknown DP combine {combine!r}; use 'max' (time per sample) or 'sum' (latency)")
    units = units if units is not None else dp_units(problem, passes, drop_free)
    masks = _ideal_family(problem, units, family, order, max_ideals)
    classes = device_classes(problem)
    P, Q, load = _block_loads(problem, units, masks, classes, max_pairs)
    shared = time.perf_counter() - t0
    out = []
    for combine in combines:
        t1 = time.perf_counter()
        join = np.maximum if combine == "max" else np.add
        dp = _smallest_loads(len(masks), classes, P, Q, load, join)
        top = tuple(len(c) for c in classes)
        value = float(dp[top][len(masks) - 1])
        assignment = -np.ones(problem.num_nodes, dtype=np.int64)
        if np.isfinite(value):
            _trace_back(dp, top, masks, classes, (P, Q, load), join, units, assignment)
        out.append(DpResult(value, assignment, units.exact, len(masks), len(P), shared + time.perf_counter() - t1,
                            family if combine == "max" else f"{family}, sum"))
    return out


def _ideal_family(problem: Problem, units: Units, family: str, order, max_ideals: int) -> list[int]:
    """The ideals :func:`dp_split` runs over, as bit masks over the units."""
    if family == "all":
        masks = all_ideals(units.dag, max_ideals)
        if masks is None:
            raise SolverError(f"{problem.graph.name} has more than {max_ideals} ideals (ways to cut it contiguously); "
                              "the exact DP is skipped for graphs that wide")
        return masks
    if family == "prefix":
        order = list(range(len(units.units))) if order is None else list(order)
        return prefix_ideals(order)
    raise PestoError(f"unknown ideal family {family!r}; use 'all' or 'prefix'")


def _block_loads(problem: Problem, units: Units, masks: list[int], classes: list[list[int]], max_pairs: int):
    """The pairs ``masks[Q] < masks[P]`` and the load of each difference ``masks[P] - masks[Q]``
    on one device of each class (work plus transfers in and out; inf where it does not fit):
    ``(P, Q, load)`` with ``load`` of shape (pairs, classes)."""
    nu = len(units.units)
    cap = np.array([problem.capacity[c[0]] for c in classes])
    lat_d, inv_d = io_rates(problem.cluster)
    lat = np.array([lat_d[c[0]] for c in classes])
    inv = np.array([inv_d[c[0]] for c in classes])
    # per unit: work per class (inf: cannot run), memory
    costs = problem.costs[:, [c[0] for c in classes]]
    unit_work = np.zeros((nu, len(classes)))
    unit_bad = np.zeros((nu, len(classes)))
    unit_mem = np.zeros(nu)
    for k, mem in enumerate(units.units):
        c = costs[mem]
        unit_bad[k] = (~np.isfinite(c)).sum(axis=0)
        unit_work[k] = np.where(np.isfinite(c), c, 0.0).sum(axis=0)
        unit_mem[k] = problem.mem[mem].sum()
    width = max(1, (nu + 7) // 8)
    packed = np.frombuffer(b"".join(m.to_bytes(width, "little") for m in masks), dtype=np.uint8)
    member = np.unpackbits(packed.reshape(len(masks), width), axis=1, bitorder="little")[:, :nu].astype(np.float64)
    w_ideal, bad_ideal, m_ideal = member @ unit_work, member @ unit_bad, member @ unit_mem
    P, Q = _pairs(member, m_ideal, float(cap.max()), max_pairs)
    io_count, io_bytes = _block_io(problem, units, member, P, Q)
    load = (w_ideal[P] - w_ideal[Q]) + io_count[:, None] * lat + io_bytes[:, None] * inv
    fits = ((bad_ideal[P] - bad_ideal[Q]) == 0) & ((m_ideal[P] - m_ideal[Q])[:, None] <= cap * (1 + _TOL))
    return P, Q, np.where(fits, load, np.inf)


def _producer_levels(problem: Problem, units: Units):
    """The kept edges as *levels* per producer, for :func:`_block_io`: a producer whose edges
    carry ``v_1 > ... > v_m`` bytes has level ``l`` over its edges of at least ``v_l`` bytes,
    weighted ``v_l - v_(l+1)`` (``v_(m+1) = 0``), so that the most bytes over any subset of
    its edges is the sum of the weights of the levels that subset meets; level ``m`` holds
    every edge and is the one counted. Returns ``(producer, weight, counted, incidence)``:
    the producer's unit per level, and ``incidence`` (units x levels) the number of the
    level's edges into each unit."""
    src, dst, eb = problem.src, problem.dst, problem.ebytes
    uo = units.unit_of
    keep = (uo[src] >= 0) & (uo[dst] >= 0)
    src, dst, eb = src[keep], dst[keep], eb[keep]
    producer, weight, counted, cols, rows = [], [], [], [], []
    for s in np.unique(src):
        mine = src == s
        values = np.unique(eb[mine])[::-1]
        for lvl, v in enumerate(values):
            nxt = values[lvl + 1] if lvl + 1 < len(values) else 0.0
            g = len(producer)
            producer.append(uo[s])
            weight.append(float(v - nxt))
            counted.append(lvl == len(values) - 1)
            heads = uo[dst[mine & (eb >= v)]]
            rows.extend(heads.tolist())
            cols.extend([g] * len(heads))
    incidence = np.zeros((len(units.units), len(producer)), dtype=np.float64)
    np.add.at(incidence, (np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)), 1.0)
    return (np.asarray(producer, dtype=np.int64), np.asarray(weight), np.asarray(counted, dtype=bool), incidence)


def _block_io(problem: Problem, units: Units, member: np.ndarray, P: np.ndarray, Q: np.ndarray):
    """Transfers of each block ``masks[P] - masks[Q]``: ``(count, bytes)``, a producer's
    output counted once per direction with the most bytes of its edges that cross (out of
    the block from a producer in it, into it from a producer outside).

    With ``masks[Q] < masks[P]``, a level's edges into the block number its edges into
    ``masks[P]`` less those into ``masks[Q]``, so per pair only counts are compared; no
    edge is visited per pair."""
    producer, weight, counted, incidence = _producer_levels(problem, units)
    npairs = len(P)
    io_count, io_bytes = np.zeros(npairs), np.zeros(npairs)
    if not len(producer):
        return io_count, io_bytes
    heads_in = (member @ incidence).astype(np.int32)  # (ideals, levels): edges into each ideal
    degree = incidence.sum(axis=0).astype(np.int32)
    holds = member[:, producer].astype(bool)  # (ideals, levels): the producer is in the ideal
    for lo in range(0, npairs, _CHUNK):
        p, q = P[lo:lo + _CHUNK], Q[lo:lo + _CHUNK]
        into = heads_in[p] - heads_in[q]  # the level's edges whose consumer is in the block
        inside = holds[p] & ~holds[q]
        crossing = (inside & (into < degree)) | (~inside & (into > 0))
        io_count[lo:lo + _CHUNK] = crossing[:, counted].sum(axis=1)
        io_bytes[lo:lo + _CHUNK] = crossing @ weight
    return io_count, io_bytes


def _smallest_loads(num_ideals: int, classes, P, Q, load, join) -> dict:
    """The DP over the multiset of devices used (counts per class): state -> per ideal the
    smallest ``join`` of block loads that covers it."""
    shape = tuple(len(c) + 1 for c in classes)
    dp = {}
    start = np.full(num_ideals, np.inf)
    start[0] = 0.0
    for state in np.ndindex(*shape):
        if sum(state) == 0:
            dp[state] = start
            continue
        best = np.full(num_ideals, np.inf)
        for c in range(len(classes)):
            if state[c] == 0:
                continue
            prev = dp[tuple(s - (i == c) for i, s in enumerate(state))]
            np.minimum(best, prev, out=best)
            cand = join(prev[Q], load[:, c])
            np.minimum.at(best, P, cand)
        dp[state] = best
    return dp


def _trace_back(dp, top, masks, classes, blocks, join, units: Units, assignment: np.ndarray) -> None:
    """Write into ``assignment`` the devices of a chain of blocks that achieves ``dp[top]``
    for the whole graph; ``blocks`` is :func:`_block_loads`' ``(P, Q, load)``."""
    P, Q, load = blocks
    used = [0] * len(classes)
    state, i = top, len(masks) - 1
    while i != 0:
        moved = False
        for c in range(len(classes)):
            if state[c] == 0:
                continue
            ps = tuple(s - (j == c) for j, s in enumerate(state))
            prev = dp[ps]
            if prev[i] <= dp[state][i] * (1 + 1e-12) + 1e-18:
                state, moved = ps, True
                break
            sel = np.flatnonzero(P == i)
            cand = join(prev[Q[sel]], load[sel, c])
            j = int(np.argmin(cand))
            if cand[j] <= dp[state][i] * (1 + 1e-12) + 1e-18:
                dev = classes[c][used[c]]
                used[c] += 1
                diff = masks[i] & ~masks[Q[sel[j]]]
                for k in range(len(units.units)):
                    if diff >> k & 1:
                        assignment[units.units[k]] = dev
                state, i, moved = ps, int(Q[sel[j]]), True
                break
        if not moved:  # cannot happen: the values came from these transitions
            raise SolverError("internal: the contiguous-split DP could not trace back its optimum")


def dp_bound(problem: Problem, max_ideals: int = MAX_IDEALS) -> dict:
    """The DP optimum over every ideal as a lower bound on the stage model's device load.

    Returns
    -------
    dict
        ``bound_s`` (None when the DP does not apply: too many ideals, or a backward node
        without a forward twin; ``reason`` says which) and the DP's facts.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> from tvm_pesto.plan.objective import evaluate
    >>> from tvm_pesto.solve.stage.dp import solve
    >>> plan = solve(problem)   # the stage model, throughput
    >>> dp_bound(problem)["bound_s"] <= evaluate(problem, plan, "stage", "throughput").objective_value
    True
    """
    try:
        r = dp_split(problem, "all", max_ideals=max_ideals)
    except SolverError as e:
        return {"bound_s": None, "reason": str(e)}
    value = r.value_s if np.isfinite(r.value_s) else None
    return {"bound_s": None if value is None else value * (1 - 1e-9), **r.info(),
            **({"reason": "no contiguous split fits the memory"} if value is None else {})}



__all__ = ["DpResult", "MAX_IDEALS", "MAX_PAIRS", "Units", "all_ideals", "device_classes", "dp_bound", "dp_split", "dp_splits",
           "dp_units", "prefix_ideals"]
