"""The units and pieces of the stage model's piece MIP (:mod:`tvm_pesto.solve.stage.piece_mip`).

A *unit* is a set of nodes every valid stage plan puts on one device: a co-location group
(the files' colour classes), grown to a strongly connected component of the graph of groups
(a path that leaves a stage and comes back breaks contiguity, so groups on a cycle share a
device, as the authors' greedy fuses them). The units form a DAG (:class:`Units`).

A *piece* is the contiguous set of units on one accelerator; every CPU is the host of the
stage model (:func:`tvm_pesto.plan.stage.io_rates`: no IO of its own), and the MIP treats the
CPUs as the paper's latency IP does: one machine whose units run as soon as their inputs are
ready, as if there were as many CPUs as needed; under the host pool
(:class:`tvm_pesto.plan.problem.HostPool`) each CPU node does (:class:`CpuNodes`), which is
the rule itself. :func:`piece_times` computes that model's latency of an assignment of units
to machines (the MIP's values, also its warm start); :func:`cpu_devices` spreads the CPU
units over the real CPUs as contiguous stages where there is no pool.

Examples
--------
>>> from tvm_pesto.cluster import parse_cluster
>>> from tvm_pesto.graph.opgraph import OpGraph, OpNode
>>> from tvm_pesto.plan import Problem
>>> g = OpGraph([OpNode(c, "op") for c in "abc"], [(0, 1, 0), (1, 2, 0)])
>>> p = Problem(g, parse_cluster("cpu:2"), np.ones((3, 2)), colocate=[[0, 1]])
>>> u = contract_units(p)
>>> u.members, u.edges
([[0, 1], [2]], [(0, 1)])
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np

from ...plan.problem import Problem


@dataclass
class Units:
    """The units of a problem in a topological order.

    Attributes
    ----------
    members : list of list of int
        Each unit's nodes.
    unit_of : numpy.ndarray
        The unit of each node.
    edges : list of (int, int)
        Unit edges ``i -> j`` (``i < j``), each once.
    producers : dict
        Node ``u`` -> the units its edges reach outside its own unit (the nodes whose output
        may have to travel).
    """

    members: list
    unit_of: np.ndarray
    edges: list
    producers: dict

    @property
    def count(self) -> int:
        """The number of units."""
        return len(self.members)


@dataclass
class CpuNodes:
    """The CPU side at node level (the host pool): each node's CPU ``cost`` (seconds), its
    producers ``preds``, and each unit's nodes in a topological ``order``."""

    cost: np.ndarray
    preds: list
    order: list

    @classmethod
    def of(cls, problem: Problem, units: Units, cost: np.ndarray) -> CpuNodes:
        """The CPU nodes of ``problem`` on ``units``, each at ``cost``."""
        preds: list = [[] for _ in range(problem.num_nodes)]
        for u, w in zip(problem.src.tolist(), problem.dst.tolist()):
            preds[w].append(u)
        pos = {v: i for i, v in enumerate(problem.graph.topo_order())}
        return cls(np.asarray(cost, dtype=np.float64), preds, [sorted(ms, key=pos.__getitem__) for ms in units.members])


def contract_units(problem: Problem) -> Units:
    """The units of ``problem`` (module docstring), numbered in a topological order."""
    n = problem.num_nodes
    uf = nx.utils.UnionFind(range(n))
    for grp in problem.colocate:
        grp = [int(v) for v in grp]
        if len(grp) > 1:
            uf.union(*grp)
    root = np.array([uf[v] for v in range(n)], dtype=np.int64)
    g = nx.DiGraph()
    g.add_nodes_from(set(root.tolist()))
    g.add_edges_from((int(root[u]), int(root[w])) for u, w in zip(problem.src.tolist(), problem.dst.tolist())
                     if root[u] != root[w])
    cond = nx.condensation(g)
    comp = cond.graph["mapping"]
    order = list(nx.lexicographical_topological_sort(cond, key=lambda c: min(cond.nodes[c]["members"])))
    pos = {c: i for i, c in enumerate(order)}
    unit_of = np.array([pos[comp[int(root[v])]] for v in range(n)], dtype=np.int64)
    members: list[list[int]] = [[] for _ in order]
    for v in range(n):
        members[unit_of[v]].append(v)
    edges, producers = set(), {}
    for u, w in zip(problem.src.tolist(), problem.dst.tolist()):
        i, j = int(unit_of[u]), int(unit_of[w])
        if i != j:
            edges.add((i, j))
            producers.setdefault(u, set()).add(j)
    return Units(members, unit_of, sorted(edges), {u: sorted(js) for u, js in sorted(producers.items())})


def piece_times(units: Units, machine: np.ndarray, cpu_cost: np.ndarray, acc_cost: np.ndarray,
                comm: np.ndarray, nodes: CpuNodes | None = None) -> dict:
    """The latency of ``machine`` (per unit: 0 = the CPUs, ``m >= 1`` accelerator ``m``) in
    the piece model: a CPU unit finishes its cost after its last input (with ``nodes``, each
    CPU node its own cost after its last producer: the host pool); a piece starts when every
    outside producer it reads has finished, runs all inputs in (``comm[u, m]`` per producer
    node), its units' work (``acc_cost[i, m]``) and all outputs out, and all its units finish
    with it.

    Returns ``{"finish": per unit, "start": per machine, "end": per machine, "latency": max}``;
    ``latency`` is ``inf`` when the pieces form a cycle.
    """
    k = acc_cost.shape[1]
    g = nx.DiGraph()
    key = [("cpu", i) if machine[i] == 0 else ("acc", int(machine[i])) for i in range(units.count)]
    g.add_nodes_from(set(key))
    for i, j in units.edges:
        if key[i] != key[j]:
            g.add_edge(key[i], key[j])
    start, end = np.zeros(k), np.zeros(k)
    load = np.zeros(k)
    for i in range(units.count):
        load[machine[i] - 1] += acc_cost[i, machine[i] - 1] if machine[i] > 0 else 0.0
    for u, outs in units.producers.items():
        mu = machine[units.unit_of[u]]
        into = {int(machine[j]) for j in outs if machine[j] > 0 and machine[j] != mu}
        for m in into:
            load[m - 1] += comm[u, m - 1]
        if mu > 0 and any(machine[j] != mu for j in outs):
            load[mu - 1] += comm[u, mu - 1]
    if not nx.is_directed_acyclic_graph(g):
        return {"finish": np.full(units.count, np.inf), "start": start, "end": end, "latency": float("inf")}
    finish = np.zeros(units.count)
    preds: dict = {}
    for i, j in units.edges:
        preds.setdefault(j, []).append(i)
    by_key: dict = {}
    for i in range(units.count):
        by_key.setdefault(key[i], []).append(i)
    nfin = np.zeros(len(units.unit_of)) if nodes is not None else None
    for node in nx.lexicographical_topological_sort(g, key=str):
        kind, idx = node
        mine = by_key[node]
        if kind == "cpu" and nodes is not None:
            for i in mine:
                for v in nodes.order[i]:
                    nfin[v] = max((nfin[p] for p in nodes.preds[v]), default=0.0) + nodes.cost[v]
                finish[i] = nfin[units.members[i]].max()
        elif kind == "cpu":
            for i in mine:
                finish[i] = max((finish[p] for p in preds.get(i, [])), default=0.0) + cpu_cost[i]
        else:
            if nodes is not None:
                ready = max((nfin[p] for i in mine for v in units.members[i] for p in nodes.preds[v]
                             if machine[units.unit_of[p]] != idx), default=0.0)
            else:
                ready = max((finish[p] for i in mine for p in preds.get(i, []) if machine[p] != idx), default=0.0)
            start[idx - 1], end[idx - 1] = ready, ready + load[idx - 1]
            finish[mine] = end[idx - 1]
            if nodes is not None:
                for i in mine:
                    nfin[units.members[i]] = end[idx - 1]
    return {"finish": finish, "start": start, "end": end, "latency": float(finish.max(initial=0.0)),
            "node_finish": nfin}


def cpu_devices(units: Units, machine: np.ndarray, num_cpus: int) -> np.ndarray | None:
    """A CPU (``0..num_cpus-1``) for each unit on the CPUs (-1 for the others) such that each
    CPU's units are contiguous; None when it needs more CPUs than there are.

    The CPU units are cut into levels as the authors' evaluator cuts a split into contiguous
    pieces (a unit's level counts how often a path to it left the CPUs and came back), and
    each level into its weakly connected parts; parts get CPUs of their own while there are
    enough, else each level one CPU.
    """
    lvl = np.zeros(units.count, dtype=np.int64)
    preds: dict = {}
    for i, j in units.edges:
        preds.setdefault(j, []).append(i)
    for j in range(units.count):
        for i in preds.get(j, []):
            step = 1 if machine[j] == 0 and machine[i] != 0 else 0
            lvl[j] = max(lvl[j], lvl[i] + step)
    out = np.full(units.count, -1, dtype=np.int64)
    on_cpu = [i for i in range(units.count) if machine[i] == 0]
    if not on_cpu:
        return out
    g = nx.Graph()
    g.add_nodes_from(on_cpu)
    g.add_edges_from((i, j) for i, j in units.edges if machine[i] == 0 and machine[j] == 0 and lvl[i] == lvl[j])
    parts = sorted((sorted(c) for c in nx.connected_components(g)), key=lambda c: (lvl[c[0]], c[0]))
    levels = sorted({int(lvl[i]) for i in on_cpu})
    if len(parts) <= num_cpus:
        for k, part in enumerate(parts):
            out[part] = k
    elif len(levels) <= num_cpus:
        for i in on_cpu:
            out[i] = levels.index(int(lvl[i]))
    else:
        return None
    return out


def is_convex(units: Units, machine: np.ndarray, m: int, succ: dict) -> bool:
    """Whether the units on machine ``m`` are contiguous (no path leaves them and comes back)."""
    inside = machine == m
    seen = np.zeros(units.count, dtype=bool)
    stack = [j for i in np.flatnonzero(inside) for j in succ.get(int(i), []) if not inside[j]]
    while stack:
        j = stack.pop()
        if seen[j]:
            continue
        seen[j] = True
        for k in succ.get(j, []):
            if inside[k]:
                return False
            if not seen[k]:
                stack.append(k)
    return True


def improve(units: Units, machine: np.ndarray, times, allowed: np.ndarray, mem: np.ndarray, cap: np.ndarray,
            max_rounds: int = 4) -> np.ndarray:
    """Moves to another machine (another accelerator, an empty one, the CPUs) while the
    latency drops: of one unit, or of a unit with its ancestors or its descendants on its
    machine (a chain of small ops, such as a mask, moves at once; what stays is contiguous).
    Each round takes the best move over all units and machines that keeps the memory (``cap``
    per accelerator) and the pieces contiguous; at most ``max_rounds`` rounds (a fixed amount
    of work: no clock). ``times(machine)`` is the latency; ``allowed[i, m]`` whether unit
    ``i`` may run on machine ``m``."""
    succ: dict = {}
    for i, j in units.edges:
        succ.setdefault(i, []).append(j)
    g = nx.DiGraph(units.edges)
    g.add_nodes_from(range(units.count))
    closures = [(sorted(nx.ancestors(g, i)), sorted(nx.descendants(g, i))) for i in range(units.count)]
    best, best_val = machine.copy(), times(machine)
    k = allowed.shape[1] - 1
    for _ in range(max_rounds):
        used = np.bincount(best, weights=mem, minlength=k + 1)
        cand_best, cand_val = None, best_val * (1 - 1e-9)
        for i in range(units.count):
            sets = {(i,)} | {tuple([i] + [j for j in c if best[j] == best[i]]) for c in closures[i]}
            for group in sorted(sets):
                group = list(group)
                for m in np.flatnonzero(allowed[group].all(axis=0)).tolist():
                    if m == best[i] or (m > 0 and used[m] + mem[group].sum() > cap[m - 1] * (1 + 1e-9)):
                        continue
                    trial = best.copy()
                    trial[group] = m
                    if (m > 0 and not is_convex(units, trial, m, succ)) or \
                            (best[i] > 0 and not is_convex(units, trial, int(best[i]), succ)):
                        continue
                    val = times(trial)
                    if val < cand_val:
                        cand_best, cand_val = trial, val
        if cand_best is None:
            break
        best, best_val = cand_best, cand_val
    return best


__all__ = ["CpuNodes", "Units", "contract_units", "cpu_devices", "improve", "is_convex", "piece_times"]
