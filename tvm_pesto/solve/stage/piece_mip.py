"""The stage model's latency MIP on large graphs: one piece per accelerator, after the paper's
latency IP (``latency-ip/lip.py`` of msr-fiddle/dnn-partitioning), on units.

It applies to one sample's latency of an inference graph (one pass) on a cluster of
accelerators and CPUs, where the CPUs are the stage model's host
(:func:`tvm_pesto.plan.stage.io_rates`); :func:`applies` says why not otherwise. Its size
grows with the graph times the accelerators, not with the devices squared: the CPUs are one
machine (machine 0) whose units run as soon as their inputs are ready.

Model (units of :func:`tvm_pesto.solve.stage.pieces.contract_units`; machine ``m >= 1`` is
accelerator ``m``; times scaled so the start's latency is :data:`~tvm_pesto.solve.mip.MIP_TIME_SCALE`):

* ``x[i,m]`` binary, one machine per unit (``assign``), none where a member's cost is
  infinite; ``mem_m``: the units' memory within the accelerator's;
* contiguity of each piece (``zx``, ``zdown``, ``zcut``), as in the paper;
* ``cin[u,m]``, ``cout[u,m]``: node ``u``'s output enters / leaves piece ``m``; each costs
  ``m``'s IO of ``u``'s smallest outgoing tensor (exact where its edges carry the same bytes,
  as in the files);
* ``s[m]``, ``f[m] = s[m] +`` work + IO (``fin``), ``s[m] >= L[i]`` for every producer of unit
  ``i`` it reads (``start``), ``L[i] >= f[m]`` on ``m`` (``lat``), ``L[j] >= L[i] + cpu[j]
  x[j,0]`` on every unit edge (``cpu``), ``T >= L``, ``T >= f`` (``span``), big-M the start's
  latency (a better plan never exceeds it);
* symmetry breaking between identical accelerators (same memory, IO and costs): accelerator
  ``m`` may hold unit ``i`` only if ``m - 1`` holds an earlier unit (``sym``, with the running
  counts ``c[i,m]``).

Every valid stage plan has a solution of no larger ``T`` (the CPUs' stages only add up
their nodes' costs where the model takes the longest path), so the MIP's dual bound is a
lower bound of the stage model's latency. Its solutions become stage plans through
:func:`~tvm_pesto.solve.stage.pieces.cpu_devices` and are judged by the stage evaluator.

Under the host pool (:class:`tvm_pesto.plan.problem.HostPool`, the problem's rule) the CPU
side is the rule's, node by node: ``Ln[v] >= L[i]`` of its unit (``nacc``), ``Ln[w] >=
Ln[u] + cpu[w] x[j,0]`` on every graph edge (``ncpu``, ``ncpu0`` at the sources), pieces
start after ``Ln`` of the producers they read, ``T >= Ln`` at the sinks (``nsink``). The
model is then the rule's latency itself, so its dual bound is a lower bound and its
solutions are plans as they are (the CPU units on the first CPU: any CPU is the pool).

Examples
--------
>>> from tvm_pesto.graph import dnn_partitioning as dp
>>> path = dp.benchmark_dir() / "latency-inputs" / "LayerGraphs" / "bert24_inference.json"
>>> g, meta = dp.load_layer_graph(str(path))
>>> cl = dp.cluster_from_graph(meta)
>>> from tvm_pesto.plan import Problem
>>> problem = Problem(g, cl, dp.costs_from_graph(g, cl), colocate=dp.colocation_groups(g))
>>> applies(problem, "latency", None) is None
True
"""
from __future__ import annotations

import numpy as np
import pulp

from ...plan.objective import evaluate
from ...plan.plan import Plan
from ...plan.problem import Problem
from ...plan.stage import io_rates, node_passes
from ..mip import MIP_TIME_SCALE, add_var, lin, solve_mip
from ..settings import MipSettings
from .dp import device_orders
from .pieces import CpuNodes, Units, contract_units, cpu_devices, improve, piece_times

_SAFETY = 1e-6  # relative margin on the MIP's dual bound, as the other bounds keep


def applies(problem: Problem, objective: str, microbatches) -> str | None:
    """None when the piece MIP models ``problem``'s stage latency, else why not."""
    if objective != "latency" or microbatches is not None:
        return "it models one sample's latency only"
    if (node_passes(problem.graph) != 0).any():
        return "it models inference graphs (one pass) only"
    cpu = np.array([d.kind == "cpu" for d in problem.cluster.devices])
    if not cpu.any() or cpu.all():
        return "it needs CPUs (the host) and accelerators"
    return None


class PieceData:
    """What the piece MIP is built from: units, machines, costs (seconds)."""

    def __init__(self, problem: Problem):
        self.problem = problem
        self.units: Units = contract_units(problem)
        cpu = np.array([d.kind == "cpu" for d in problem.cluster.devices])
        self.cpus, self.accs = np.flatnonzero(cpu), np.flatnonzero(~cpu)
        lat, inv = io_rates(problem.cluster)
        costs, U = problem.costs, self.units
        self.cpu_cost = np.array([costs[np.ix_(ms, self.cpus)].min(axis=1).sum() for ms in U.members])
        self.acc_cost = np.array([costs[np.ix_(ms, self.accs)].sum(axis=0) for ms in U.members]).reshape(
            U.count, len(self.accs))
        self.mem = np.array([float(problem.mem[ms].sum()) for ms in U.members])
        small = {}
        for u, w, b in zip(problem.src.tolist(), problem.dst.tolist(), problem.ebytes.tolist()):
            if U.unit_of[u] != U.unit_of[w]:
                small[u] = min(small.get(u, float(b)), float(b))
        self.comm = np.zeros((problem.num_nodes, len(self.accs)))
        for u, b in small.items():
            self.comm[u] = lat[self.accs] + b * inv[self.accs]
        sig = [(float(problem.capacity[d]), float(lat[d]), float(inv[d]), problem.costs[:, d].tobytes())
               for d in self.accs]
        self.same_as_prev = [k > 0 and sig[k] == sig[k - 1] for k in range(len(self.accs))]
        self.pool = CpuNodes.of(problem, U, costs[:, self.cpus].min(axis=1)) \
            if problem.pooled("stage", "latency") else None

    def times(self, machine: np.ndarray) -> dict:
        """:func:`~tvm_pesto.solve.stage.pieces.piece_times` of a unit -> machine array."""
        return piece_times(self.units, machine, self.cpu_cost, self.acc_cost, self.comm, self.pool)

    def machines_of(self, plan: Plan) -> np.ndarray:
        """The machine of each unit in ``plan`` (:meth:`canonical`)."""
        a = np.asarray(plan.assignment)
        acc_index = {int(d): k + 1 for k, d in enumerate(self.accs)}
        return self.canonical(np.array([acc_index.get(int(a[ms[0]]), 0) for ms in self.units.members],
                                       dtype=np.int64))

    def canonical(self, machine: np.ndarray) -> np.ndarray:
        """``machine`` with identical accelerators renumbered in the order of their first
        unit (empty ones last), as the symmetry breaking wants."""
        first = {}
        for i, m in enumerate(machine.tolist()):
            if m > 0:
                first.setdefault(m, i)
        relabel, k = {}, 0
        while k < len(self.accs):  # runs of identical accelerators, each sorted by first use
            e = k + 1
            while e < len(self.accs) and self.same_as_prev[e]:
                e += 1
            run = sorted(range(k + 1, e + 1), key=lambda m: (first.get(m, 1 << 60), m))
            relabel.update({old: new for new, old in zip(range(k + 1, e + 1), run)})
            k = e
        return np.array([relabel.get(m, 0) for m in machine.tolist()], dtype=np.int64)

    def improved(self, machine: np.ndarray, max_rounds: int = 4) -> np.ndarray:
        """:func:`~tvm_pesto.solve.stage.pieces.improve` of ``machine`` in the piece model."""
        allowed = np.column_stack([np.isfinite(self.cpu_cost), np.isfinite(self.acc_cost)])
        cap = self.problem.capacity[self.accs].astype(np.float64)
        out = improve(self.units, machine, lambda m: self.times(m)["latency"], allowed, self.mem, cap, max_rounds)
        return self.canonical(out)

    def assignment(self, machine: np.ndarray) -> np.ndarray | None:
        """A device per node for a unit -> machine array (CPU units spread over the CPUs by
        :func:`~tvm_pesto.solve.stage.pieces.cpu_devices`, or on the first CPU in the host
        pool); None when the CPUs are too few."""
        cpu_of = np.zeros(self.units.count, dtype=np.int64) if self.pool is not None else \
            cpu_devices(self.units, machine, len(self.cpus))
        if cpu_of is None:
            return None
        dev = np.where(machine > 0, self.accs[np.maximum(machine - 1, 0)], self.cpus[np.maximum(cpu_of, 0)])
        return dev[self.units.unit_of]


def build_piece_mip(data: PieceData, big_m_s: float, warm: np.ndarray | None = None):
    """The MIP of the module docstring; returns ``(prob, vars)`` (``vars["ts"]``: model
    units per second). ``big_m_s``: no latency above it is of interest (the start's)."""
    U, K = data.units, len(data.accs)
    ts = MIP_TIME_SCALE / big_m_s
    M = MIP_TIME_SCALE * (1 + 1e-6)
    prob = pulp.LpProblem("stage_pieces", pulp.LpMinimize)
    fin = np.isfinite(data.acc_cost)
    cpu_ok = np.isfinite(data.cpu_cost)
    x = {}
    for i in range(U.count):
        ms = ([0] if cpu_ok[i] else []) + [m + 1 for m in np.flatnonzero(fin[i]).tolist()]
        for m in ms:
            x[i, m] = add_var(prob, f"x_{i}_{m}", cat=pulp.LpBinary)
        prob += pulp.LpConstraint(lin([(x[i, m], 1.0) for m in ms]), pulp.LpConstraintEQ, rhs=1.0), f"assign_{i}"
    V = {"x": x, "ts": ts}
    scale = 1.0 / max(float(data.mem.max(initial=0.0)), 1.0)
    for m in range(1, K + 1):
        cap = float(data.problem.capacity[data.accs[m - 1]])
        terms = [(x[i, m], data.mem[i] * scale) for i in range(U.count) if (i, m) in x and data.mem[i] > 0]
        if terms and sum(c for _, c in terms) > cap * scale:
            prob += pulp.LpConstraint(lin(terms), pulp.LpConstraintLE, rhs=cap * scale), f"mem_{m}"
    _contiguity(prob, U, K, x, V)
    _timing(prob, data, x, V, ts, M)
    _symmetry(prob, data, x, V)
    if warm is not None:
        _warm_values(data, warm, V, ts)
    return prob, V


def _x(x, i, m):
    return x.get((i, m))


def _contiguity(prob, U: Units, K: int, x, V) -> None:
    z = V["z"] = {}
    for m in range(1, K + 1):
        for i in range(U.count):
            z[i, m] = add_var(prob, f"z_{i}_{m}", 0, 1)
            if (i, m) in x:
                prob += pulp.LpConstraint(lin([(z[i, m], 1.0), (x[i, m], -1.0)]), pulp.LpConstraintGE, rhs=0.0), \
                    f"zx_{i}_{m}"
        for i, j in U.edges:
            prob += pulp.LpConstraint(lin([(z[j, m], 1.0), (z[i, m], -1.0)]), pulp.LpConstraintLE, rhs=0.0), \
                f"zdown_{i}_{j}_{m}"
            terms = [(z[j, m], 1.0)] + ([(x[j, m], -1.0)] if (j, m) in x else []) + \
                ([(x[i, m], 1.0)] if (i, m) in x else [])
            prob += pulp.LpConstraint(lin(terms), pulp.LpConstraintLE, rhs=1.0), f"zcut_{i}_{j}_{m}"


def _timing(prob, data: PieceData, x, V, ts: float, M: float) -> None:
    U, K = data.units, len(data.accs)
    cin, cout = V["cin"], V["cout"] = {}, {}
    s = V["s"] = {m: add_var(prob, f"s_{m}", 0, M) for m in range(1, K + 1)}
    f = V["f"] = {m: add_var(prob, f"f_{m}", 0, M) for m in range(1, K + 1)}
    L = V["L"] = [add_var(prob, f"L_{i}", 0, M) for i in range(U.count)]
    T = V["T"] = add_var(prob, "T", 0, M)
    if data.pool is not None:
        V["Ln"] = [add_var(prob, f"Ln_{v}", 0, M) for v in range(len(U.unit_of))]
    for u, outs in U.producers.items():
        i = int(U.unit_of[u])
        for m in range(1, K + 1):
            cin[u, m] = add_var(prob, f"cin_{u}_{m}", 0, 1)
            cout[u, m] = add_var(prob, f"cout_{u}_{m}", 0, 1)
            for j in outs:
                xi, xj = _x(x, i, m), _x(x, j, m)
                own = [(xi, 1.0)] if xi is not None else []
                other = [(xj, 1.0)] if xj is not None else []
                if xj is not None:  # cin >= x[j,m] - x[i,m]
                    prob += pulp.LpConstraint(lin([(cin[u, m], 1.0), (xj, -1.0)] + own), pulp.LpConstraintGE,
                                              rhs=0.0), f"cin_{u}_{j}_{m}"
                if xi is not None:  # cout >= x[i,m] - x[j,m]
                    prob += pulp.LpConstraint(lin([(cout[u, m], 1.0), (xi, -1.0)] + other), pulp.LpConstraintGE,
                                              rhs=0.0), f"cout_{u}_{j}_{m}"
            # the piece starts after every producer it reads: s >= L[i] (Ln[u] in the pool) - M (1 - cin)
            ready = L[i] if data.pool is None else V["Ln"][u]
            prob += pulp.LpConstraint(lin([(s[m], 1.0), (ready, -1.0), (cin[u, m], -M)]), pulp.LpConstraintGE,
                                      rhs=-M), f"start_{u}_{m}"
    for m in range(1, K + 1):
        work = [(x[i, m], float(data.acc_cost[i, m - 1]) * ts) for i in range(U.count)
                if (i, m) in x and data.acc_cost[i, m - 1] > 0]
        io = [(c[u, m], float(data.comm[u, m - 1]) * ts) for c in (cin, cout) for u in U.producers
              if data.comm[u, m - 1] > 0]
        prob += pulp.LpConstraint(lin([(f[m], 1.0), (s[m], -1.0)] + [(v, -c) for v, c in work + io]),
                                  pulp.LpConstraintEQ, rhs=0.0), f"fin_{m}"
        prob += pulp.LpConstraint(lin([(T, 1.0), (f[m], -1.0)]), pulp.LpConstraintGE, rhs=0.0), f"span_{m}"
        for i in range(U.count):
            if (i, m) in x:
                prob += pulp.LpConstraint(lin([(L[i], 1.0), (f[m], -1.0), (x[i, m], -M)]), pulp.LpConstraintGE,
                                          rhs=-M), f"lat_{i}_{m}"
    if data.pool is not None:
        _pool_timing(prob, data, x, V, ts)
        prob.setObjective(lin([(T, 1.0)]))
        return
    for i in range(U.count):
        if (i, 0) in x and data.cpu_cost[i] > 0:
            prob += pulp.LpConstraint(lin([(L[i], 1.0), (x[i, 0], -float(data.cpu_cost[i]) * ts)]),
                                      pulp.LpConstraintGE, rhs=0.0), f"cpu0_{i}"
    has_succ = set()
    for i, j in U.edges:
        has_succ.add(i)
        c = float(data.cpu_cost[j]) * ts if (j, 0) in x else 0.0
        prob += pulp.LpConstraint(lin([(L[j], 1.0), (L[i], -1.0)] + ([(x[j, 0], -c)] if c > 0 else [])),
                                  pulp.LpConstraintGE, rhs=0.0), f"cpu_{i}_{j}"
    for i in range(U.count):
        if i not in has_succ:
            prob += pulp.LpConstraint(lin([(T, 1.0), (L[i], -1.0)]), pulp.LpConstraintGE, rhs=0.0), f"sink_{i}"
    prob.setObjective(lin([(T, 1.0)]))


def _pool_timing(prob, data: PieceData, x, V, ts: float) -> None:
    """The host pool's CPU side, node by node (``nacc``, ``ncpu``, ``ncpu0``, ``nsink``)."""
    U, Ln, L, T, pool = data.units, V["Ln"], V["L"], V["T"], data.pool

    def on_cpu(v):  # the term cpu[v] x[unit(v), 0]
        i, c = int(U.unit_of[v]), float(pool.cost[v]) * ts
        return [(x[i, 0], -c)] if (i, 0) in x and c > 0 else []

    has_succ = set()
    for v in range(len(U.unit_of)):
        prob += pulp.LpConstraint(lin([(Ln[v], 1.0), (L[int(U.unit_of[v])], -1.0)]), pulp.LpConstraintGE, rhs=0.0), \
            f"nacc_{v}"
        for u in pool.preds[v]:
            has_succ.add(u)
            prob += pulp.LpConstraint(lin([(Ln[v], 1.0), (Ln[u], -1.0)] + on_cpu(v)), pulp.LpConstraintGE, rhs=0.0), \
                f"ncpu_{u}_{v}"
        if not pool.preds[v] and on_cpu(v):
            prob += pulp.LpConstraint(lin([(Ln[v], 1.0)] + on_cpu(v)), pulp.LpConstraintGE, rhs=0.0), f"ncpu0_{v}"
    for v in range(len(U.unit_of)):
        if v not in has_succ:
            prob += pulp.LpConstraint(lin([(T, 1.0), (Ln[v], -1.0)]), pulp.LpConstraintGE, rhs=0.0), f"nsink_{v}"


def _symmetry(prob, data: PieceData, x, V) -> None:
    U, K = data.units, len(data.accs)
    c = V["c"] = {}
    for m in range(1, K + 1):
        if not ((m < K and data.same_as_prev[m]) or data.same_as_prev[m - 1]):
            continue
        for i in range(U.count):
            c[i, m] = add_var(prob, f"c_{i}_{m}", 0, i + 1)
            terms = [(c[i, m], 1.0)] + ([(c[i - 1, m], -1.0)] if i else []) + \
                ([(x[i, m], -1.0)] if (i, m) in x else [])
            prob += pulp.LpConstraint(lin(terms), pulp.LpConstraintEQ, rhs=0.0), f"cnt_{i}_{m}"
    for m in range(2, K + 1):
        if not data.same_as_prev[m - 1]:
            continue
        for i in range(U.count):
            if (i, m) in x:
                prev = [(c[i - 1, m - 1], -1.0)] if i else []
                prob += pulp.LpConstraint(lin([(x[i, m], 1.0)] + prev), pulp.LpConstraintLE, rhs=0.0), f"sym_{i}_{m}"


def _warm_values(data: PieceData, machine: np.ndarray, V: dict, ts: float) -> None:
    """Every variable's value for the unit -> machine array ``machine``."""
    U = data.units
    t = data.times(machine)
    for (i, m), var in V["x"].items():
        var.setInitialValue(1.0 if machine[i] == m else 0.0)
    anc = {}  # z[i,m] = 1 when i or a descendant is on m
    for i in reversed(range(U.count)):
        anc[i] = {int(machine[i])}
    succ = {}
    for i, j in U.edges:
        succ.setdefault(i, []).append(j)
    for i in reversed(range(U.count)):
        for j in succ.get(i, []):
            anc[i] |= anc[j]
    for (i, m), var in V["z"].items():
        var.setInitialValue(1.0 if m in anc[i] else 0.0)
    for (u, m), var in V["cin"].items():
        mu = machine[U.unit_of[u]]
        var.setInitialValue(1.0 if mu != m and any(machine[j] == m for j in U.producers[u]) else 0.0)
    for (u, m), var in V["cout"].items():
        mu = machine[U.unit_of[u]]
        var.setInitialValue(1.0 if mu == m and any(machine[j] != m for j in U.producers[u]) else 0.0)
    for m, var in V["s"].items():
        var.setInitialValue(min(t["start"][m - 1] * ts, var.upBound))
        V["f"][m].setInitialValue(min(t["end"][m - 1] * ts, var.upBound))
    for i, var in enumerate(V["L"]):
        var.setInitialValue(min(t["finish"][i] * ts if machine[i] > 0 or data.pool is None else 0.0, var.upBound))
    for v, var in enumerate(V.get("Ln", [])):
        var.setInitialValue(min(t["node_finish"][v] * ts, var.upBound))
    V["T"].setInitialValue(min(t["latency"] * ts, V["T"].upBound))
    counts = {}
    for (i, m), var in sorted(V["c"].items()):
        counts[m] = counts.get(m, 0) + (1 if machine[i] == m else 0)
        var.setInitialValue(float(counts[m]))


def extract_machines(data: PieceData, V: dict) -> np.ndarray:
    """The machine of each unit in the solved model."""
    out = np.zeros(data.units.count, dtype=np.int64)
    best = np.full(data.units.count, -1.0)
    for (i, m), var in V["x"].items():
        val = var.value() or 0.0
        if val > best[i]:
            best[i], out[i] = val, m
    return out




def solve_pieces(problem: Problem, warm: Plan, warm_value_s: float, mip: MipSettings = MipSettings(solver="highs")):
    """The piece MIP of ``problem`` warm started from the valid stage plan ``warm`` (of
    latency ``warm_value_s``) and solved as ``mip`` says, first improved by single moves
    (:func:`~tvm_pesto.solve.stage.pieces.improve`); returns ``(assignments, MipResult, facts)``.

    ``assignments``: the start's and the MIP's best solution (where it has one and its CPU
    units fit the CPUs), each a device per node; ``facts``: ``mip`` (``pieces``),
    ``num_units``, ``num_vars``, ``num_constraints``, ``mip_bound_s`` (a lower bound of the
    stage model's latency: the MIP's dual bound, at most the start's value), ``mip_status``.
    """
    data = PieceData(problem)
    start = data.machines_of(warm)
    moved = data.improved(start)
    if data.times(moved)["latency"] < data.times(start)["latency"]:
        a = data.assignment(moved)
        ev = evaluate(problem, Plan(a, device_orders(problem, a)), "stage", "latency") if a is not None else None
        if ev is not None and ev.valid and ev.objective_value < warm_value_s:
            start, warm_value_s = moved, ev.objective_value
    prob, V = build_piece_mip(data, warm_value_s, start)
    facts = {"mip": "pieces", "num_units": data.units.count, "num_vars": len(prob.variables()),
             "num_constraints": prob.numConstraints(), "time_limit_s": mip.time_limit_s,
             "moves_start_s": warm_value_s}
    res = solve_mip(prob, mip.solver, **mip.solve_options())
    facts.update(res.info(V["ts"]))
    facts["mip_status"] = facts["status"]
    if res.bound is not None:
        facts["mip_bound_s"] = max(0.0, min(float(facts["bound"]), warm_value_s) * (1 - _SAFETY) - 1e-12)
    found = [data.assignment(start)]
    if res.has_solution:
        found.append(data.assignment(extract_machines(data, V)))
    return [a for a in found if a is not None], res, facts


__all__ = ["PieceData", "applies", "build_piece_mip", "extract_machines", "solve_pieces"]
