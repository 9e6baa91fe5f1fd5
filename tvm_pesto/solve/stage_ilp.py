"""The stage model's MIP (after the dnn-partitioning paper's throughput and latency IPs).

Variables and constraints (all names in the model; times scaled so the upper bound is 1000):

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

Objective: ``B`` (steady state), ``T`` (latency) or ``(T + (K - 1) B) / K``. The plans it
returns are judged exactly by :func:`tvm_pesto.plan.objective.evaluate`; the MIP is warm
started from the best of the contiguous-split DP (:mod:`tvm_pesto.solve.stage_dp`) and every
heuristic's stage plan (:func:`stage_starts`) and never returns anything worse. Where it is
not built (too large) or finds nothing, the result says so: ``status`` ``heuristic``, with
``reason`` and ``start`` (whose plan it is).

Examples
--------
>>> from tvm_pesto.bench.random_dag import dnn_like_problem
>>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
>>> plan = solve(problem, objective="throughput", time_limit_s=10, deterministic=True)
>>> plan.info["status"], plan.info["objective_value_s"] > 0
('optimal', True)
"""
from __future__ import annotations

import re
import time

import networkx as nx
import numpy as np
import pulp

from ..errors import InfeasibleError, PestoError, error_line
from ..plan.objective import check_choice, evaluate
from ..plan.plan import Plan
from ..plan.problem import Problem
from ..plan.stage import BACKWARD, FORWARD, evaluate_stages, io_rates, node_passes
from .budget import combine, mode_name
from .common import colocation_index
from .mip import add_var, lin, solve_mip
from .portfolio import HEURISTIC_SOLVERS
from .stage_dp import device_orders, heuristic_stage_plan
from .stage_dp import solve as dp_solve

_SCALE = 1000.0
MAX_ROWS = 15_000
#: Relative MIP gap at which the stage MIP stops; a start this close to the lower bound is
#: returned without a MIP.
GAP = 1e-4
_SAFETY = 1e-6  # relative margin on the MIP's dual bound, as the other bounds keep


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


def build_stage_ilp(problem: Problem, objective: str = "throughput", microbatches=None, warm: Plan | None = None,
                    max_rows: int | None = None):
    """The MIP of the module docstring; returns ``(prob, vars)`` with ``vars`` a dict of the
    variable groups and the time scale (``ts``: model units per second).

    Raises
    ------
    ModelTooLarge
        As soon as the model has more than ``max_rows`` constraints (None: no limit); the
        message says how many it had when building stopped.
    """

    def check_size(part: str) -> None:
        if max_rows is not None and prob.numConstraints() > max_rows:
            raise ModelTooLarge(f"it has more than max_rows={max_rows} constraints ({prob.numConstraints()} after "
                                f"its {part} constraints)")

    n, D = problem.num_nodes, problem.num_devices
    passes = node_passes(problem.graph)
    P = sorted(set(passes.tolist()))
    lat, inv = io_rates(problem.cluster)
    ub = _upper_bound(problem, lat, inv)
    ts = _SCALE / ub
    UB = _SCALE
    maxb = float(problem.ebytes.max()) if len(problem.ebytes) else 1.0
    bs = 1.0 / maxb if maxb > 0 else 1.0
    timing = objective == "latency" or microbatches is not None
    group_of, groups = colocation_index(problem)
    fin = np.isfinite(problem.costs)
    for members in groups:
        fin[members] = fin[members].all(axis=0)
    prob = pulp.LpProblem(f"stage_{re.sub(r'[^A-Za-z0-9_]', '_', problem.graph.name)}", pulp.LpMinimize)
    x = {(v, d): add_var(prob, f"x_{v}_{d}", cat=pulp.LpBinary) for v in range(n) for d in range(D)}
    for v in range(n):
        prob += pulp.LpConstraint(lin([(x[v, d], 1.0) for d in range(D)]), pulp.LpConstraintEQ, rhs=1.0), f"assign_{v}"
        for d in np.flatnonzero(~fin[v]).tolist():
            prob += pulp.LpConstraint(lin([(x[v, d], 1.0)]), pulp.LpConstraintEQ, rhs=0.0), f"noplace_{v}_{d}"
    for gi, members in enumerate(groups):
        for v in members[1:]:
            for d in np.flatnonzero(fin[members[0]]).tolist():
                prob += pulp.LpConstraint(lin([(x[v, d], 1.0), (x[members[0], d], -1.0)]), pulp.LpConstraintEQ,
                                          rhs=0.0), f"coloc_{gi}_{v}_{d}"
    for d in range(D):
        terms = [(x[v, d], problem.mem[v] * bs) for v in range(n) if problem.mem[v] > 0 and fin[v, d]]
        if terms and problem.mem.sum() > problem.capacity[d]:
            prob += pulp.LpConstraint(lin(terms), pulp.LpConstraintLE, rhs=float(problem.capacity[d]) * bs), f"mem_{d}"
    edges = list(zip(problem.src.tolist(), problem.dst.tolist(), problem.ebytes.tolist()))
    # contiguity per (device, pass)
    z = {(v, d): add_var(prob, f"z_{v}_{d}", 0, 1) for v in range(n) for d in range(D)}
    for v in range(n):
        for d in range(D):
            prob += pulp.LpConstraint(lin([(z[v, d], 1.0), (x[v, d], -1.0)]), pulp.LpConstraintGE, rhs=0.0), \
                f"zx_{v}_{d}"
    for u, w, _b in edges:
        if passes[u] != passes[w]:
            continue
        for d in range(D):
            prob += pulp.LpConstraint(lin([(z[w, d], 1.0), (z[u, d], -1.0)]), pulp.LpConstraintLE, rhs=0.0), \
                f"zdown_{u}_{w}_{d}"
            prob += pulp.LpConstraint(lin([(z[w, d], 1.0), (x[w, d], -1.0), (x[u, d], 1.0)]), pulp.LpConstraintLE,
                                      rhs=1.0), f"zcut_{u}_{w}_{d}"
    check_size("contiguity")
    # acyclic stage graph: node ranks equal to their stage's rank, increasing across stages
    R = float(len(P) * D)
    q = {(d, p): add_var(prob, f"q_{d}_{p}", 0, R) for d in range(D) for p in P}
    pi = [add_var(prob, f"pi_{v}", 0, R) for v in range(n)]
    for v in range(n):
        for d in range(D):
            for sign, name in ((1.0, "lo"), (-1.0, "hi")):
                prob += pulp.LpConstraint(lin([(pi[v], sign), (q[d, passes[v]], -sign), (x[v, d], -(R + 1))]),
                                          pulp.LpConstraintGE, rhs=-(R + 1)), f"rankv_{name}_{v}_{d}"
    delta = {}
    for u, w, _b in edges:
        if (u, w) in delta:
            continue
        if passes[u] != passes[w]:
            delta[u, w] = 1.0
        else:
            dl = delta[u, w] = add_var(prob, f"delta_{u}_{w}", 0, 1)
            for d in range(D):
                prob += pulp.LpConstraint(lin([(dl, 1.0), (x[u, d], -1.0), (x[w, d], 1.0)]), pulp.LpConstraintGE,
                                          rhs=0.0), f"cut_{u}_{w}_{d}"
        dl = delta[u, w]
        terms = [(pi[w], 1.0), (pi[u], -1.0)] + ([] if isinstance(dl, float) else [(dl, -1.0)])
        prob += pulp.LpConstraint(lin(terms), pulp.LpConstraintGE, rhs=dl if isinstance(dl, float) else 0.0), \
            f"rank_{u}_{w}"
    check_size("acyclicity")
    # communication
    succ: dict[int, list[tuple[int, float]]] = {}
    for u, w, b in edges:
        succ.setdefault(u, []).append((w, b))
    cin, cout, rin, rout, cinp = {}, {}, {}, {}, {}
    for u, outs in succ.items():
        bmax = max(b for _w, b in outs) * bs
        for d in range(D):
            cin[u, d] = add_var(prob, f"cin_{u}_{d}", 0, 1)
            cout[u, d] = add_var(prob, f"cout_{u}_{d}", 0, 1)
            rin[u, d] = add_var(prob, f"rin_{u}_{d}", 0, bmax)
            rout[u, d] = add_var(prob, f"rout_{u}_{d}", 0, bmax)
            for w, b in outs:
                for c, r, a_, b_ in ((cin, rin, w, u), (cout, rout, u, w)):
                    tag = "in" if c is cin else "out"
                    prob += pulp.LpConstraint(lin([(c[u, d], 1.0), (x[a_, d], -1.0), (x[b_, d], 1.0)]),
                                              pulp.LpConstraintGE, rhs=0.0), f"c{tag}_{u}_{w}_{d}"
                    prob += pulp.LpConstraint(lin([(r[u, d], 1.0), (x[a_, d], -b * bs), (x[b_, d], b * bs)]),
                                              pulp.LpConstraintGE, rhs=0.0), f"r{tag}_{u}_{w}_{d}"
            if timing:
                for p in sorted({int(passes[w]) for w, _ in outs}):
                    cinp[u, d, p] = add_var(prob, f"cinp_{u}_{d}_{p}", 0, 1)
                    for w, b in outs:
                        if passes[w] == p:
                            prob += pulp.LpConstraint(lin([(cinp[u, d, p], 1.0), (x[w, d], -1.0), (x[u, d], 1.0)]),
                                                      pulp.LpConstraintGE, rhs=0.0), f"cinp_{u}_{w}_{d}"
    check_size("communication")
    k_lat = lat * ts
    k_inv = inv * ts / bs
    B = add_var(prob, "B", 0, UB)
    work = {}
    for d in range(D):
        for p in P:
            work[d, p] = [(x[v, d], float(problem.costs[v, d]) * ts) for v in range(n) if passes[v] == p and fin[v, d]]
        io = [(c[u, d], k_lat[d]) for c in (cin, cout) for u in succ] + \
             [(r[u, d], k_inv[d]) for r in (rin, rout) for u in succ]
        terms = [t for p in P for t in work[d, p]] + [t for t in io if t[1] > 0]
        prob += pulp.LpConstraint(lin([(B, 1.0)] + [(v_, -c_) for v_, c_ in terms]), pulp.LpConstraintGE,
                                  rhs=0.0), f"bottleneck_{d}"
    V = {"x": x, "z": z, "q": q, "pi": pi, "delta": delta, "cin": cin, "cout": cout, "rin": rin, "rout": rout,
         "cinp": cinp, "B": B, "ts": ts, "bs": bs, "passes": passes, "P": P, "timing": timing}
    if timing:
        T = add_var(prob, "T", 0, UB)
        s = {(d, p): add_var(prob, f"s_{d}_{p}", 0, UB) for d in range(D) for p in P}
        f = {(d, p): add_var(prob, f"f_{d}_{p}", 0, UB) for d in range(D) for p in P}
        fn = [add_var(prob, f"fn_{v}", 0, UB) for v in range(n)]
        for d in range(D):
            for p in P:
                io = [(cinp[u, d, p], -k_lat[d]) for u in succ if (u, d, p) in cinp and k_lat[d] > 0]
                io += [(cout[u, d], -k_lat[d]) for u in succ if passes[u] == p and k_lat[d] > 0]
                io += [(rin[u, d], -k_inv[d]) for u in succ if k_inv[d] > 0 and any(passes[w] == p for w, _ in succ[u])]
                io += [(rout[u, d], -k_inv[d]) for u in succ if passes[u] == p and k_inv[d] > 0]
                prob += pulp.LpConstraint(lin([(f[d, p], 1.0), (s[d, p], -1.0)] + [(v_, -c_) for v_, c_ in work[d, p]]
                                              + io), pulp.LpConstraintGE, rhs=0.0), f"block_{d}_{p}"
                prob += pulp.LpConstraint(lin([(T, 1.0), (f[d, p], -1.0)]), pulp.LpConstraintGE, rhs=0.0), \
                    f"span_{d}_{p}"
            if FORWARD in P and BACKWARD in P:
                prob += pulp.LpConstraint(lin([(s[d, BACKWARD], 1.0), (f[d, FORWARD], -1.0)]), pulp.LpConstraintGE,
                                          rhs=0.0), f"fb_{d}"
        for v in range(n):
            for d in range(D):
                if fin[v, d]:
                    prob += pulp.LpConstraint(lin([(fn[v], 1.0), (f[d, passes[v]], -1.0), (x[v, d], -UB)]),
                                              pulp.LpConstraintGE, rhs=-UB), f"nodefin_{v}_{d}"
        for (u, w), dl in delta.items():
            for d in range(D):
                if not fin[w, d]:
                    continue
                terms = [(s[d, passes[w]], 1.0), (fn[u], -1.0), (x[w, d], -UB)]
                rhs = -UB
                if isinstance(dl, float):
                    pass
                else:
                    terms.append((dl, -UB))
                    rhs -= UB
                prob += pulp.LpConstraint(lin(terms), pulp.LpConstraintGE, rhs=rhs), f"after_{u}_{w}_{d}"
        check_size("timing")
        V.update(T=T, s=s, f=f, fn=fn)
        if objective == "latency":
            prob.setObjective(lin([(T, 1.0)]))
        else:
            k = float(microbatches)
            prob.setObjective(lin([(T, 1.0 / k), (B, 1.0 - 1.0 / k)]))
    else:
        prob.setObjective(lin([(B, 1.0)]))
    if warm is not None:
        _warm_values(problem, warm, V, succ)
    return prob, V


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
    for (d, p), var in V["q"].items():
        var.setInitialValue(rank.get((d, p), 0.0))
    for v in range(n):
        V["pi"][v].setInitialValue(rank[(int(a[v]), int(passes[v]))])
    for (u, w), dl in V["delta"].items():
        if not isinstance(dl, float):
            dl.setInitialValue(0.0 if a[u] == a[w] else 1.0)
    for u, outs in succ.items():
        for d in range(D):
            into = [b for w, b in outs if a[w] == d] if a[u] != d else []
            away = [b for w, b in outs if a[w] != d] if a[u] == d else []
            V["cin"][u, d].setInitialValue(1.0 if into else 0.0)
            V["rin"][u, d].setInitialValue(max(into, default=0.0) * bs)
            V["cout"][u, d].setInitialValue(1.0 if away else 0.0)
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


def _extract(problem: Problem, V: dict) -> np.ndarray:
    n, D = problem.num_nodes, problem.num_devices
    xv = np.array([[V["x"][v, d].value() or 0.0 for d in range(D)] for v in range(n)]).reshape(n, D)
    return xv.argmax(axis=1) if n else np.zeros(0, dtype=np.int64)


#: The plans the MIP starts from: the contiguous-split DP and every heuristic, each made a
#: stage plan as the registry makes it (:func:`tvm_pesto.solve.stage_dp.heuristic_stage_plan`).
START_SOLVERS = ("stage-dp",) + tuple(HEURISTIC_SOLVERS)


def stage_starts(problem: Problem, objective: str = "throughput", microbatches=None,
                 warm_start: Plan | None = None) -> tuple[list[tuple[float, str, Plan]], dict[str, str]]:
    """Every start of :data:`START_SOLVERS` (and ``warm_start``) that is a valid stage plan,
    as ``(objective value, name, plan)``, best first (the earlier name on a tie), and the
    error of each solver that gave no plan (``Type: message``)."""
    scored, errors = [], {}
    cands = [(name, None) for name in START_SOLVERS] + ([("warm_start", warm_start)] if warm_start is not None else [])
    for rank, (name, plan) in enumerate(cands):
        if plan is None:
            try:
                plan = dp_solve(problem, objective=objective, microbatches=microbatches) if name == "stage-dp" else \
                    heuristic_stage_plan(problem, HEURISTIC_SOLVERS[name], objective, microbatches)
            except PestoError as e:  # no plan within the memory, no LP solver for m-sct: said in info
                errors[name] = error_line(e)
                continue
        ev = evaluate(problem, plan, "stage", objective, microbatches)
        if ev.valid:
            scored.append((ev.objective_value, rank, name, plan))
        else:
            errors[name] = f"invalid stage plan ({ev.violations[0]['kind']}): {ev.violations[0]['message']}"
    scored.sort(key=lambda t: (t[0], t[1]))
    return [(v, name, plan) for v, _r, name, plan in scored], errors


def mip_bound_is_valid(problem: Problem, objective: str, microbatches) -> bool:
    """Whether the MIP's optimum (so its dual bound) is a lower bound in the stage model: its
    loads are the model's exactly, and so are its block times when no edge runs between the
    passes (otherwise it charges a received tensor once per pass that needs it, where the
    model charges it once per device)."""
    if objective == "throughput" and microbatches is None:
        return True
    passes = node_passes(problem.graph)
    return bool((passes[problem.src] == passes[problem.dst]).all()) if len(problem.src) else True


def solve(problem: Problem, objective: str = "throughput", microbatches=None, time_limit_s: float = 10.0,
          solver: str = "highs", deterministic: bool | None = None, msg: bool = False, warm_start: Plan | None = None,
          max_rows: int = MAX_ROWS, **_ignored) -> Plan:
    """The ``ilp`` solver in the stage model: the MIP of the module docstring, warm started
    from the best valid stage plan among :func:`stage_starts` (the DP, every heuristic and
    ``warm_start``, judged by ``objective``), so never worse than any of them.

    No MIP is solved when the start meets the lower bound (``status`` ``optimal``,
    ``proven_by``), nor when the MIP has more than ``max_rows`` constraints (HiGHS's root LP
    alone then outlasts any sensible budget); the start is then returned with ``status``
    ``heuristic`` and ``reason``. The same when the MIP ran but gave nothing usable
    (``mip_status`` says what it ended with).

    ``info``: ``status`` (``optimal``, ``time_limit``, ``node_limit``: the MIP's real outcome,
    :mod:`tvm_pesto.solve.mip`; ``heuristic``: no MIP result), ``reason`` (why not, where
    none), ``start`` (the start's solver) and ``start_values_s`` (every start's value),
    ``start_errors`` (starts that gave no valid plan), ``source`` (``ilp`` when the MIP found
    a better plan, else the start's name), ``objective_value_s``, ``lower_bound_s`` (the
    cheap bound, or the MIP's dual bound where that is larger and valid:
    :func:`mip_bound_is_valid`), ``gap`` (value / bound - 1), ``num_vars``,
    ``num_constraints``, ``budget``, ``deterministic``.

    Raises
    ------
    InfeasibleError
        When no start is a valid stage plan (no contiguous split fits the memory).
    """
    model, objective, microbatches = check_choice("stage", objective, microbatches)
    t0 = time.perf_counter()
    scored, errors = stage_starts(problem, objective, microbatches, warm_start)
    if not scored:
        raise InfeasibleError(f"{problem.graph.name}: no valid stage plan to start the stage MIP from (no contiguous "
                              f"split fits the memory of {problem.cluster.name}); use devices with more memory")
    warm_value, warm_name, warm = scored[0]
    from .objective_bounds import objective_lower_bound

    lb = objective_lower_bound(problem, "stage", objective, microbatches, lp=False)["best"]
    info = {"start": warm_name, "warm_start_value_s": warm_value, "warm_start_solver": warm_name,
            "start_values_s": {name: v for v, name, _ in scored}, "start_errors": errors, "lower_bound_s": lb,
            "model": "stage", "objective": objective, "microbatches": microbatches, "budget": mode_name(deterministic)}

    def done(plan: Plan, source: str, value: float, **facts) -> Plan:
        info.update(facts, source=source, objective_value_s=value)
        info["gap"] = value / info["lower_bound_s"] - 1.0 if info["lower_bound_s"] > 0 else None
        return Plan(plan.assignment, plan.order, solver="ilp", solve_s=time.perf_counter() - t0, info=info)

    # The start meets the lower bound within the MIP's own gap: the MIP could only prove what
    # the bound does (the bounds sit 1e-6 below their value against solver tolerances).
    if warm_value <= lb * (1 + GAP):
        return done(warm, warm_name, warm_value, status="optimal", proven_by="lower bound", deterministic=True)
    try:
        prob, V = build_stage_ilp(problem, objective, microbatches, warm, max_rows=max_rows)
    except ModelTooLarge as e:  # its root LP alone outlasts any sensible budget: keep the start
        return done(warm, warm_name, warm_value, status="heuristic", deterministic=True, mip=f"skipped: {e}",
                    reason=f"the stage MIP was not built: {e}; the plan is {warm_name}'s, the best start")
    info.update(num_vars=len(prob.variables()), num_constraints=prob.numConstraints(), time_limit_s=time_limit_s)
    res = solve_mip(prob, solver, time_limit_s=time_limit_s, gap=GAP, msg=msg, deterministic=deterministic)
    facts = res.info(V["ts"])
    facts["mip_status"] = facts["status"]
    if res.bound is not None and mip_bound_is_valid(problem, objective, microbatches):
        mb = max(0.0, facts["bound"] * (1 - _SAFETY) - 1e-12)
        facts["mip_bound_s"] = mb
        info["lower_bound_s"] = max(lb, mb)
    best, source, value = warm, warm_name, warm_value
    if res.has_solution:
        a = _extract(problem, V)
        cand = Plan(a, device_orders(problem, a), solver="ilp")
        ev = evaluate(problem, cand, "stage", objective, microbatches)
        if ev.valid and ev.objective_value < warm_value * (1 - 1e-9):
            best, source, value = cand, "ilp", ev.objective_value
        elif not ev.valid:
            facts.update(extract_error=ev.violations[0]["message"], status="heuristic",
                         reason=f"the stage MIP's solution is not a valid stage plan; the plan is {warm_name}'s, "
                                "the best start")
    elif res.status != "optimal":
        facts.update(status="heuristic", reason=f"the stage MIP ended without a solution ({res.status}); the plan is "
                                                f"{warm_name}'s, the best start")
    facts.update(combine(res.determinism))
    return done(best, source, value, **facts)


__all__ = ["GAP", "MAX_ROWS", "ModelTooLarge", "START_SOLVERS", "build_stage_ilp", "mip_bound_is_valid", "solve",
           "stage_starts"]
