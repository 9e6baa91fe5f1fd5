"""The stage model's MIP (after the dnn-partitioning paper's throughput and latency IPs), solved by
:mod:`tvm_pesto.solve.stage.ilp`.

Variables and constraints (all names in the model; times scaled so the upper bound is
:data:`tvm_pesto.solve.mip.MIP_TIME_SCALE`):

* ``x[v,d]`` binary: node ``v`` on device ``d`` (``assign``, ``noplace`` where the cost is
  infinite, ``coloc``, ``mem``: the nodes' own memory, as the stage model counts it);
* contiguity of every stage ``(d, pass)`` (``zdown``, ``zcut``): ``z[v,d] >= x[v,d]``,
  ``z[w,d] <= z[u,d]`` and ``z[w,d] <= x[w,d] - x[u,d] + 1`` on each edge ``u -> w`` of the
  pass, so once a path leaves the stage it cannot come back;
* an acyclic stage graph (``cut``, ``rank``, ``rankv``): a rank ``q[d,p]`` per stage and
  ``pi[v]`` per node equal to its stage's rank, and ``pi[w] >= pi[u] + delta[u,w]`` on every
  edge, where ``delta[u,w] >= x[u,d] - x[w,d]`` is 1 when the edge crosses stages;
* communication (``cin``, ``cout``, ``rin``, ``rout``): a producer pays its device's IO rate
  (:func:`tvm_pesto.plan.stage.io_rates`) once to send (the largest edge that leaves) and
  each other device pays once to receive (the largest edge into it);
* ``load[d]`` = work + communication, ``B >= load[d]`` (``bottleneck``);
* for the latency (and a finite number of microbatches): block start ``s[d,p]`` and finish
  ``f[d,p]`` = start + the stage's work and communication (inputs charged per stage,
  ``cinp``: at least the model's once-per-device), forward before backward on a device
  (``fb``), and ``s`` of a consumer's stage >= the producer's stage's finish on every edge
  that crosses stages (``nodefin``, ``after``); ``T >= f`` (``span``).

Objective: ``B`` (steady state), ``T`` (latency) or ``(T + (K - 1) B) / K``.

``relaxed=True`` builds a relaxation, for graphs where the model is too large: no
acyclicity rows (``q``, ``pi``, ``rank``), and each producer's send and receive cost its
smallest outgoing tensor (``cin``, ``cout`` alone, no ``rin``, ``rout``; exact where a
node's edges carry the same bytes, as in the dnn-partitioning files). For the steady state
(a third the size of the full model) every valid stage plan is a solution of no larger
``B``. For one sample's latency (:func:`relaxed_applies`: no microbatches, no edge from the
backward pass to the forward one) it keeps the timing rows with ``delta`` from the ``cut``
rows alone, and charges a received tensor once per device as the stage model does: in the
forward block where a forward consumer is on the device (``cinp``), else in the backward
block (``cinpb``: ``cinp[u,d,B] >= x[w,d] - x[u,d] - cinp[u,d,F]``). Take a valid stage plan
and its schedule (:func:`tvm_pesto.plan.stage.evaluate_stages`): its ``x``, ``z``, ``delta``,
``cin``, ``cout``, ``cinp`` at their true 0/1 values, each block's ``s`` and ``f`` its start
and finish, ``fn`` its node's block's finish, ``T`` its latency. Every row holds: a block lasts
at least its work plus the charged IO (no more than the model's: the smallest tensor, and a
device's forward stages run before its backward ones when no edge goes backward -> forward,
so the model's one charge falls in the forward block exactly where ``cinp[u,d,F]`` is 1);
a stage starts after every stage it takes input from and, backward after forward, after its
device's other block. So every valid plan is a solution with ``T`` its latency, and the
relaxation's dual bound is a lower bound on the optimum (``tests/test_stage_relaxed.py``
checks it against brute force). A solution whose stage graph has a cycle is not a plan (the
evaluator says so).
"""
from __future__ import annotations

import re

import networkx as nx
import numpy as np
import pulp

from ...errors import PestoError
from ...plan.plan import Plan
from ...plan.problem import Problem
from ...plan.stage import BACKWARD, FORWARD, evaluate_stages, io_rates, node_passes
from ..heuristics.common import colocation_index
from ..mip import MIP_TIME_SCALE, add_var, lin


class ModelTooLarge(PestoError):
    """The stage MIP has more constraints than it may (``max_rows`` of :func:`build_stage_ilp`)."""


def _upper_bound(problem: Problem, lat: np.ndarray, inv: np.ndarray) -> float:
    """A time no stage schedule exceeds: every node at its dearest device and every tensor
    moved out and in at the dearest IO rate, all in series."""
    c = np.where(np.isfinite(problem.costs), problem.costs, 0.0).max(axis=1).sum()
    maxb = np.zeros(problem.num_nodes)
    if len(problem.src):
        np.maximum.at(maxb, problem.src, problem.ebytes)
    io = ((lat.max() + maxb * inv.max()) * problem.num_devices * 2).sum()
    return float(c + io) or 1.0


def relaxed_applies(problem: Problem, objective: str, microbatches) -> str | None:
    """Why ``relaxed=True`` is no relaxation of ``objective`` (module docstring), or None.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> p = dnn_like_problem(6, cluster="2xV100-nvlink")
    >>> relaxed_applies(p, "latency", None) is None, relaxed_applies(p, "throughput", 4)
    (True, "it models the steady state and one sample's latency, not 4 microbatches")
    """
    if microbatches is not None:
        return f"it models the steady state and one sample's latency, not {microbatches} microbatches"
    passes = node_passes(problem.graph)
    if objective == "latency" and len(problem.src) and (passes[problem.src] > passes[problem.dst]).any():
        return "an edge runs from the backward pass to the forward one, so a device's blocks may run backward first"
    return None


def build_stage_ilp(problem: Problem, objective: str = "throughput", microbatches=None, warm: Plan | None = None,
                    max_rows: int | None = None, relaxed: bool = False):
    """The MIP of the module docstring (``relaxed``: its relaxation); returns ``(prob, vars)``
    with ``vars`` a dict of the variable groups and the time scale (``ts``: model units per
    second).

    Raises
    ------
    ModelTooLarge
        As soon as the model has more than ``max_rows`` constraints (None: no limit); the
        message says how many it had when building stopped.
    PestoError
        For ``relaxed`` where it is no relaxation (:func:`relaxed_applies`).
    """
    n, D = problem.num_nodes, problem.num_devices
    passes = node_passes(problem.graph)
    lat, inv = io_rates(problem.cluster)
    ub = _upper_bound(problem, lat, inv)
    ts = MIP_TIME_SCALE / ub
    maxb = float(problem.ebytes.max()) if len(problem.ebytes) else 1.0
    bs = 1.0 / maxb if maxb > 0 else 1.0
    timing = objective == "latency" or microbatches is not None
    why_not = relaxed_applies(problem, objective, microbatches) if relaxed else None
    if why_not is not None:
        raise PestoError(f"the relaxed stage MIP does not apply: {why_not}; use relaxed=False")
    group_of, groups = colocation_index(problem)
    fin = np.isfinite(problem.costs)
    for members in groups:
        fin[members] = fin[members].all(axis=0)
    prob = pulp.LpProblem(f"stage_{re.sub(r'[^A-Za-z0-9_]', '_', problem.graph.name)}", pulp.LpMinimize)
    b = _Build(problem, prob, passes, sorted(set(passes.tolist())), fin, ts, bs, max_rows,
               list(zip(problem.src.tolist(), problem.dst.tolist(), problem.ebytes.tolist())))
    V = b.V
    x = V["x"] = {(v, d): add_var(prob, f"x_{v}_{d}", cat=pulp.LpBinary) for v in range(n) for d in range(D)}
    for v in range(n):
        b.add([(x[v, d], 1.0) for d in range(D)], pulp.LpConstraintEQ, 1.0, f"assign_{v}")
        for d in np.flatnonzero(~fin[v]).tolist():
            b.add([(x[v, d], 1.0)], pulp.LpConstraintEQ, 0.0, f"noplace_{v}_{d}")
    for gi, members in enumerate(groups):
        for v in members[1:]:
            for d in np.flatnonzero(fin[members[0]]).tolist():
                b.add([(x[v, d], 1.0), (x[members[0], d], -1.0)], pulp.LpConstraintEQ, 0.0, f"coloc_{gi}_{v}_{d}")
    for d in range(D):
        terms = [(x[v, d], problem.mem[v] * bs) for v in range(n) if problem.mem[v] > 0 and fin[v, d]]
        if terms and problem.mem.sum() > problem.capacity[d]:
            b.add(terms, pulp.LpConstraintLE, float(problem.capacity[d]) * bs, f"mem_{d}")
    _add_contiguity(b)
    if not relaxed:
        _add_acyclicity(b)
    elif timing:
        _add_cuts(b)
    else:
        b.V["delta"] = {}
    succ = _add_communication(b, timing, compact=relaxed)
    k_lat, k_inv = lat * ts, inv * ts / bs
    work = _add_bottleneck(b, succ, k_lat, k_inv)
    V.update(ts=ts, bs=bs, passes=passes, P=b.P, timing=timing, relaxed=relaxed)
    if timing:
        _add_timing(b, succ, work, k_lat, k_inv)
        if objective == "latency":
            prob.setObjective(lin([(V["T"], 1.0)]))
        else:
            k = float(microbatches)
            prob.setObjective(lin([(V["T"], 1.0 / k), (V["B"], 1.0 - 1.0 / k)]))
    else:
        prob.setObjective(lin([(V["B"], 1.0)]))
    if warm is not None:
        _warm_values(problem, warm, V, succ)
    return prob, V


class _Build:
    """What the constraint families of one stage MIP share while they are added; ``V`` the
    variable groups so far, by name."""

    def __init__(self, problem: Problem, prob, passes, P, fin, ts: float, bs: float, max_rows, edges):
        self.problem, self.prob, self.passes, self.P, self.fin = problem, prob, passes, P, fin
        self.ts, self.bs, self.UB, self.max_rows, self.edges = ts, bs, MIP_TIME_SCALE, max_rows, edges
        self.V: dict = {}

    def add(self, terms, sense, rhs: float, name: str) -> None:
        """The constraint ``sum(terms) <sense> rhs`` named ``name``."""
        self.prob += pulp.LpConstraint(lin(terms), sense, rhs=rhs), name

    def check_size(self, part: str) -> None:
        """Raise :class:`ModelTooLarge` past ``max_rows`` constraints."""
        rows = self.prob.numConstraints()
        if self.max_rows is not None and rows > self.max_rows:
            raise ModelTooLarge(f"it has more than max_rows={self.max_rows} constraints ({rows} after "
                                f"its {part} constraints)")


def _add_contiguity(b: _Build) -> None:
    """``z``, ``zx``, ``zdown`` and ``zcut``: contiguity per (device, pass)."""
    n, D, x, prob = b.problem.num_nodes, b.problem.num_devices, b.V["x"], b.prob
    z = b.V["z"] = {(v, d): add_var(prob, f"z_{v}_{d}", 0, 1) for v in range(n) for d in range(D)}
    for v in range(n):
        for d in range(D):
            b.add([(z[v, d], 1.0), (x[v, d], -1.0)], pulp.LpConstraintGE, 0.0, f"zx_{v}_{d}")
    for u, w, _b in b.edges:
        if b.passes[u] != b.passes[w]:
            continue
        for d in range(D):
            b.add([(z[w, d], 1.0), (z[u, d], -1.0)], pulp.LpConstraintLE, 0.0, f"zdown_{u}_{w}_{d}")
            b.add([(z[w, d], 1.0), (x[w, d], -1.0), (x[u, d], 1.0)], pulp.LpConstraintLE, 1.0, f"zcut_{u}_{w}_{d}")
    b.check_size("contiguity")


def _add_cuts(b: _Build, then=None) -> None:
    """``delta`` and ``cut``: ``delta[u,w]`` is at least 1 where the edge crosses stages (the
    constant 1.0 between passes); ``then(u, w, delta)`` after each edge's rows (the caller
    then checks the size)."""
    D, x, prob, passes = b.problem.num_devices, b.V["x"], b.prob, b.passes
    delta = b.V["delta"] = {}
    for u, w, _b in b.edges:
        if (u, w) in delta:
            continue
        if passes[u] != passes[w]:
            delta[u, w] = 1.0
        else:
            dl = delta[u, w] = add_var(prob, f"delta_{u}_{w}", 0, 1)
            for d in range(D):
                b.add([(dl, 1.0), (x[u, d], -1.0), (x[w, d], 1.0)], pulp.LpConstraintGE, 0.0, f"cut_{u}_{w}_{d}")
        if then is not None:
            then(u, w, delta[u, w])
    if then is None:  # the caller checks after its own rows
        b.check_size("cut")


def _add_acyclicity(b: _Build) -> None:
    """``q``, ``pi``, ``delta``, ``rankv``, ``cut`` and ``rank``: node ranks equal to their
    stage's rank, increasing across stages."""
    n, D, x, prob, passes = b.problem.num_nodes, b.problem.num_devices, b.V["x"], b.prob, b.passes
    R = float(len(b.P) * D)
    q = b.V["q"] = {(d, p): add_var(prob, f"q_{d}_{p}", 0, R) for d in range(D) for p in b.P}
    pi = b.V["pi"] = [add_var(prob, f"pi_{v}", 0, R) for v in range(n)]
    for v in range(n):
        for d in range(D):
            for sign, name in ((1.0, "lo"), (-1.0, "hi")):
                b.add([(pi[v], sign), (q[d, passes[v]], -sign), (x[v, d], -(R + 1))], pulp.LpConstraintGE,
                      -(R + 1), f"rankv_{name}_{v}_{d}")

    def rank(u: int, w: int, dl) -> None:
        terms = [(pi[w], 1.0), (pi[u], -1.0)] + ([] if isinstance(dl, float) else [(dl, -1.0)])
        b.add(terms, pulp.LpConstraintGE, dl if isinstance(dl, float) else 0.0, f"rank_{u}_{w}")

    _add_cuts(b, then=rank)
    b.check_size("acyclicity")


def _add_communication(b: _Build, timing: bool, compact: bool = False) -> dict[int, list[tuple[int, float]]]:
    """``cin``, ``cout``, ``rin``, ``rout`` per producer and device (``cinp`` per consumer
    pass too, when ``timing``; ``compact``: no ``rin``, ``rout``, the bytes of each
    producer's smallest tensor in ``cbytes``, and ``cinpb``: a backward block receives what
    the device's forward block did not); returns each producer's consumers and edge bytes."""
    D, x, prob, passes, bs = b.problem.num_devices, b.V["x"], b.prob, b.passes, b.bs
    succ: dict[int, list[tuple[int, float]]] = {}
    for u, w, nb in b.edges:
        succ.setdefault(u, []).append((w, nb))
    cin, cout, rin, rout, cinp, cbytes = {}, {}, {}, {}, {}, {}
    for u, outs in succ.items():
        bmax = max(nb for _w, nb in outs) * bs
        cbytes[u] = min(nb for _w, nb in outs) * bs
        for d in range(D):
            cin[u, d] = add_var(prob, f"cin_{u}_{d}", 0, 1)
            cout[u, d] = add_var(prob, f"cout_{u}_{d}", 0, 1)
            if not compact:
                rin[u, d] = add_var(prob, f"rin_{u}_{d}", 0, bmax)
                rout[u, d] = add_var(prob, f"rout_{u}_{d}", 0, bmax)
            for w, nb in outs:
                for c, r, a_, b_ in ((cin, rin, w, u), (cout, rout, u, w)):
                    tag = "in" if c is cin else "out"
                    b.add([(c[u, d], 1.0), (x[a_, d], -1.0), (x[b_, d], 1.0)], pulp.LpConstraintGE, 0.0,
                          f"c{tag}_{u}_{w}_{d}")
                    if not compact:
                        b.add([(r[u, d], 1.0), (x[a_, d], -nb * bs), (x[b_, d], nb * bs)], pulp.LpConstraintGE,
                              0.0, f"r{tag}_{u}_{w}_{d}")
            if timing:
                for p in sorted({int(passes[w]) for w, _ in outs}):
                    cinp[u, d, p] = add_var(prob, f"cinp_{u}_{d}_{p}", 0, 1)
                    # compact: once per device, in the forward block where a forward consumer is there
                    once = [(cinp[u, d, FORWARD], 1.0)] if compact and p == BACKWARD and (u, d, FORWARD) in cinp \
                        else []
                    for w, nb in outs:
                        if passes[w] == p:
                            b.add([(cinp[u, d, p], 1.0), (x[w, d], -1.0), (x[u, d], 1.0)] + once, pulp.LpConstraintGE,
                                  0.0, f"cinp{'b' if once else ''}_{u}_{w}_{d}")
    b.V.update(cin=cin, cout=cout, rin=rin, rout=rout, cinp=cinp, cbytes=cbytes if compact else None)
    b.check_size("communication")
    return succ


def _add_bottleneck(b: _Build, succ, k_lat, k_inv) -> dict:
    """``B`` >= each device's load, work plus communication (``bottleneck``); returns the
    work terms per (device, pass)."""
    problem, V, passes = b.problem, b.V, b.passes
    n, D, x = problem.num_nodes, problem.num_devices, V["x"]
    B = V["B"] = add_var(b.prob, "B", 0, b.UB)
    work = {}
    for d in range(D):
        for p in b.P:
            work[d, p] = [(x[v, d], float(problem.costs[v, d]) * b.ts) for v in range(n)
                          if passes[v] == p and b.fin[v, d]]
        if V["cbytes"] is not None:  # compact: each send and receive at the smallest tensor
            io = [(c[u, d], k_lat[d] + k_inv[d] * V["cbytes"][u]) for c in (V["cin"], V["cout"]) for u in succ]
        else:
            io = [(c[u, d], k_lat[d]) for c in (V["cin"], V["cout"]) for u in succ] + \
                 [(r[u, d], k_inv[d]) for r in (V["rin"], V["rout"]) for u in succ]
        terms = [t for p in b.P for t in work[d, p]] + [t for t in io if t[1] > 0]
        b.add([(B, 1.0)] + [(v_, -c_) for v_, c_ in terms], pulp.LpConstraintGE, 0.0, f"bottleneck_{d}")
    return work


def _add_timing(b: _Build, succ, work: dict, k_lat, k_inv) -> None:
    """``T``, ``s``, ``f``, ``fn`` with ``block``, ``span``, ``fb``, ``nodefin`` and ``after``:
    the latency of the stage schedule."""
    problem, V, passes, prob, UB, fin, P = b.problem, b.V, b.passes, b.prob, b.UB, b.fin, b.P
    n, D, x = problem.num_nodes, problem.num_devices, V["x"]
    cinp, cout, rin, rout = V["cinp"], V["cout"], V["rin"], V["rout"]
    T = add_var(prob, "T", 0, UB)
    s = {(d, p): add_var(prob, f"s_{d}_{p}", 0, UB) for d in range(D) for p in P}
    f = {(d, p): add_var(prob, f"f_{d}_{p}", 0, UB) for d in range(D) for p in P}
    fn = [add_var(prob, f"fn_{v}", 0, UB) for v in range(n)]
    cb = V["cbytes"]  # compact: each send and receive at the smallest tensor
    for d in range(D):
        k = {u: k_lat[d] + (k_inv[d] * cb[u] if cb is not None else 0.0) for u in succ}
        for p in P:
            io = [(cinp[u, d, p], -k[u]) for u in succ if (u, d, p) in cinp and k[u] > 0]
            io += [(cout[u, d], -k[u]) for u in succ if passes[u] == p and k[u] > 0]
            if cb is None:
                io += [(rin[u, d], -k_inv[d]) for u in succ
                       if k_inv[d] > 0 and any(passes[w] == p for w, _ in succ[u])]
                io += [(rout[u, d], -k_inv[d]) for u in succ if passes[u] == p and k_inv[d] > 0]
            b.add([(f[d, p], 1.0), (s[d, p], -1.0)] + [(v_, -c_) for v_, c_ in work[d, p]] + io, pulp.LpConstraintGE,
                  0.0, f"block_{d}_{p}")
            b.add([(T, 1.0), (f[d, p], -1.0)], pulp.LpConstraintGE, 0.0, f"span_{d}_{p}")
        if FORWARD in P and BACKWARD in P:
            b.add([(s[d, BACKWARD], 1.0), (f[d, FORWARD], -1.0)], pulp.LpConstraintGE, 0.0, f"fb_{d}")
    for v in range(n):
        for d in range(D):
            if fin[v, d]:
                b.add([(fn[v], 1.0), (f[d, passes[v]], -1.0), (x[v, d], -UB)], pulp.LpConstraintGE, -UB,
                      f"nodefin_{v}_{d}")
    for (u, w), dl in V["delta"].items():
        for d in range(D):
            if not fin[w, d]:
                continue
            terms = [(s[d, passes[w]], 1.0), (fn[u], -1.0), (x[w, d], -UB)]
            rhs = -UB
            if not isinstance(dl, float):
                terms.append((dl, -UB))
                rhs -= UB
            b.add(terms, pulp.LpConstraintGE, rhs, f"after_{u}_{w}_{d}")
    b.check_size("timing")
    V.update(T=T, s=s, f=f, fn=fn)


def _warm_values(problem: Problem, plan: Plan, V: dict, succ: dict) -> None:
    """Every variable's value for a valid stage plan (so the solver starts from it)."""
    n, D = problem.num_nodes, problem.num_devices
    a = plan.assignment
    passes, ts, bs = V["passes"], V["ts"], V["bs"]
    st = evaluate_stages(problem, plan)
    for (v, d), var in V["x"].items():
        var.setInitialValue(1.0 if a[v] == d else 0.0)
    # z[v,d] = 1 when v or a descendant in its pass is on d
    dag = problem.graph.dag
    for p in V["P"]:
        sub = dag.subgraph([v for v in range(n) if passes[v] == p])
        down = {v: {a[v]} for v in sub}
        for v in reversed(list(nx.topological_sort(sub))):
            for w in sub.successors(v):
                down[v] |= down[w]
        for v in sub:
            for d in range(D):
                V["z"][v, d].setInitialValue(1.0 if d in down[v] else 0.0)
    sg = nx.DiGraph()
    sg.add_nodes_from(range(len(st.stages)))
    sg.add_edges_from(st.stage_edges)
    order = nx.lexicographical_topological_sort(sg, key=lambda k: (st.stages[k].pass_index, st.stages[k].device))
    rank = {(st.stages[k].device, st.stages[k].pass_index): float(i) for i, k in enumerate(order)}
    for (d, p), var in V.get("q", {}).items():
        var.setInitialValue(rank.get((d, p), 0.0))
    for v in range(n if "pi" in V else 0):
        V["pi"][v].setInitialValue(rank[(int(a[v]), int(passes[v]))])
    for (u, w), dl in V["delta"].items():
        if not isinstance(dl, float):
            dl.setInitialValue(0.0 if a[u] == a[w] else 1.0)
    for u, outs in succ.items():
        for d in range(D):
            into = [b for w, b in outs if a[w] == d] if a[u] != d else []
            away = [b for w, b in outs if a[w] != d] if a[u] == d else []
            V["cin"][u, d].setInitialValue(1.0 if into else 0.0)
            V["cout"][u, d].setInitialValue(1.0 if away else 0.0)
            if (u, d) in V["rin"]:
                V["rin"][u, d].setInitialValue(max(into, default=0.0) * bs)
                V["rout"][u, d].setInitialValue(max(away, default=0.0) * bs)
            for p in V["P"]:
                if (u, d, p) in V["cinp"]:
                    V["cinp"][u, d, p].setInitialValue(1.0 if a[u] != d and any(a[w] == d and passes[w] == p
                                                                                for w, _ in outs) else 0.0)
    lat, inv = io_rates(problem.cluster)
    cost = problem.costs[np.arange(n), a]
    load = np.zeros(D)
    np.add.at(load, a, cost)
    for u, outs in succ.items():
        for d in range(D):
            into = [b for w, b in outs if a[w] == d] if a[u] != d else []
            away = [b for w, b in outs if a[w] != d] if a[u] == d else []
            for side in (into, away):
                if side:
                    load[d] += lat[d] + max(side) * inv[d]
    V["B"].setInitialValue(float(load.max()) * ts)
    if V["timing"]:
        # the MIP's own block times (inputs charged per stage), in the stage order
        blk = {}
        for d in range(D):
            for p in V["P"]:
                mask = (a == d) & (passes == p)
                t = float(cost[mask].sum())
                for u, outs in succ.items():
                    if a[u] != d and any(a[w] == d and passes[w] == p for w, _ in outs):
                        t += lat[d] + max(b for w, b in outs if a[w] == d) * inv[d]
                    if a[u] == d and passes[u] == p:
                        away = [b for w, b in outs if a[w] != d]
                        if away:
                            t += lat[d] + max(away) * inv[d]
                blk[d, p] = t
        start, finish = {}, {}
        free = np.zeros(D)
        keys = sorted(blk, key=lambda k: (rank.get(k, 0.0), k[1], k[0]))
        for d, p in keys:
            ready = 0.0
            for u, w in V["delta"]:
                if a[w] == d and passes[w] == p and (a[u], passes[u]) != (d, p):
                    ready = max(ready, finish.get((int(a[u]), int(passes[u])), 0.0))
            start[d, p] = max(ready, free[d])
            finish[d, p] = start[d, p] + blk[d, p]
            free[d] = finish[d, p]
        for k, var in V["s"].items():
            var.setInitialValue(start[k] * ts)
        for k, var in V["f"].items():
            var.setInitialValue(finish[k] * ts)
        for v in range(n):
            V["fn"][v].setInitialValue(finish[(int(a[v]), int(passes[v]))] * ts)
        V["T"].setInitialValue(max(finish.values()) * ts)


def extract_assignment(problem: Problem, V: dict) -> np.ndarray:
    """The device of each node in the solved model (the largest ``x``)."""
    n, D = problem.num_nodes, problem.num_devices
    xv = np.array([[V["x"][v, d].value() or 0.0 for d in range(D)] for v in range(n)]).reshape(n, D)
    return xv.argmax(axis=1) if n else np.zeros(0, dtype=np.int64)


__all__ = ["ModelTooLarge", "build_stage_ilp", "extract_assignment", "relaxed_applies"]
