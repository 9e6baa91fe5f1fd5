"""The *stage* execution model: each device runs its part of the graph as contiguous blocks.

This is the model of the dnn-partitioning files (Tarnawski et al., NeurIPS 2020) and of
pipeline-parallel runtimes (GPipe, PipeDream, Alpa's stages), next to the *op* model of
:mod:`tvm_pesto.plan.simulate` (a per-op schedule whose transfers overlap compute).

Definition
----------
* **Stages.** A plan's stage is the set of nodes of one pass (forward, or backward for a
  training graph: :func:`node_passes`) on one device, so a device runs at most two stages.
* **Validity.** Every stage is *contiguous* (convex: no path leaves it and comes back), the
  *stage graph* (one node per stage, an edge where a graph edge crosses stages) is acyclic,
  each device holds the nodes' memory as the graph defines it (``problem.mem``: weights and
  outputs; the ``size`` of a LayerGraph node) and **no** received tensor, co-location groups
  share a device, and every node runs where its cost is finite. :func:`evaluate_stages`
  reports every violation.
* **Blocks.** A stage runs as one block: all inputs in, the sum of its ops, all outputs out;
  communication does not overlap compute. A device moves a tensor in or out at its *IO rate*
  (:func:`io_rates`): ``latency + bytes * seconds_per_byte``. Where the cluster has CPU and
  other devices, CPUs hold the host memory every transfer goes through: a CPU pays no IO and
  an accelerator pays one host-link transfer per tensor it sends or receives, so
  accelerator -> accelerator costs one transfer at each end, as in the paper. Without a host
  (all devices alike), each end pays half of its average link. The out phase of a stage sends
  each of its nodes' outputs that another device needs once (the largest such edge); the in
  phase receives each outside producer's output once per device (the largest edge into the
  device), in the first stage of the device that needs it.
* **Time.** A device runs its stages in the order of the stage graph (forward first when
  unrelated); a stage starts when its device is free and every stage it takes input from has
  finished. The *latency* is the last block's finish; a device's *load* is the sum of its
  blocks, the time it is busy per sample when samples stream through (what the paper's
  throughput objective, its max-load, minimises).
* **The host pool** (``pooled=True``: a problem's :class:`~tvm_pesto.plan.problem.HostPool`,
  the dnn-partitioning benchmark's latency rule). The CPUs are one co-location domain and
  one pool of cores: a group is valid all on the CPUs (any of them) or all on one device,
  CPU nodes need no contiguity, the CPUs' memory is one pool, and each CPU node finishes its
  cost after its last producer (the stage graph then has one node per CPU node). The other
  devices' stages and the loads are as above. This is ``greedy.cpp -computeLatency`` of the
  benchmark's authors.

Examples
--------
>>> from tvm_pesto.cluster import parse_cluster
>>> from tvm_pesto.graph.opgraph import OpGraph, OpNode
>>> from tvm_pesto.plan import Plan, Problem
>>> g = OpGraph([OpNode(c, "op") for c in "abc"], [(0, 1, 0), (1, 2, 0)])
>>> p = Problem(g, parse_cluster("cpu:2"), np.ones((3, 2)))
>>> r = evaluate_stages(p, Plan([0, 0, 1], [[0, 1], [2]]))
>>> r.valid, len(r.stages), round(r.latency_s, 3)  # 3 ops of 1 s, one transfer
(True, 2, 3.0)
>>> evaluate_stages(p, Plan([0, 1, 0], [[0, 2], [1]])).violations[0]["kind"]
'contiguity'
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from .plan import Plan
from .problem import Problem

FORWARD, BACKWARD = 0, 1
PASS_NAMES = ("forward", "backward")
_TOL = 1e-9  # relative slack on capacities, as in the simulator's check


def node_passes(graph) -> np.ndarray:
    """1 for a backward node (``op == "backward"`` or ``extra["isBackwardNode"]``), else 0.

    Examples
    --------
    >>> from tvm_pesto.graph.opgraph import OpGraph, OpNode
    >>> node_passes(OpGraph([OpNode("a", "forward"), OpNode("b", "backward")], [(0, 1, 0)])).tolist()
    [0, 1]
    """
    return np.array([BACKWARD if (nd.op == "backward" or bool(nd.extra.get("isBackwardNode", False)))
                     else FORWARD for nd in graph.nodes], dtype=np.int64)


def io_rates(cluster) -> tuple[np.ndarray, np.ndarray]:
    """Per device ``(latency_s, seconds_per_byte)`` of moving one tensor in or out in the stage
    model (module docstring): CPUs are the host when there are other devices too (they pay
    nothing; the others pay their fastest link to a CPU, averaged over both directions);
    otherwise each device pays half of its average link.

    Examples
    --------
    >>> from tvm_pesto.cluster import parse_cluster
    >>> lat, inv = io_rates(parse_cluster("cpu:1"))
    >>> lat.tolist(), inv.tolist()
    ([0.0], [0.0])
    """
    d = cluster.num_devices
    lat_m = np.asarray(cluster.latency, dtype=np.float64)
    inv_m = np.asarray(cluster.inv_bandwidth(), dtype=np.float64)
    lat, inv = np.zeros(d), np.zeros(d)
    if d < 2:
        return lat, inv
    host = np.array([dev.kind == "cpu" for dev in cluster.devices])
    sym_lat, sym_inv = (lat_m + lat_m.T) / 2, (inv_m + inv_m.T) / 2
    if host.any() and not host.all():
        hosts = np.flatnonzero(host)
        for k in np.flatnonzero(~host):
            h = hosts[np.lexsort((sym_lat[k, hosts], sym_inv[k, hosts]))[0]]
            lat[k], inv[k] = sym_lat[k, h], sym_inv[k, h]
        return lat, inv
    off = ~np.eye(d, dtype=bool)
    for k in range(d):
        lat[k] = sym_lat[k][off[k]].mean() / 2
        inv[k] = sym_inv[k][off[k]].mean() / 2
    return lat, inv


@dataclass
class Stage:
    """One block: ``nodes`` (topological order) of pass ``pass_index`` on ``device``, and its
    times in seconds (``in_s`` + ``work_s`` + ``out_s`` = its block)."""

    device: int
    pass_index: int
    nodes: list
    work_s: float = 0.0
    in_s: float = 0.0
    out_s: float = 0.0
    start_s: float = float("nan")
    finish_s: float = float("nan")

    @property
    def block_s(self) -> float:
        return self.in_s + self.work_s + self.out_s

    def label(self, cluster=None) -> str:
        dev = cluster.devices[self.device].name if cluster is not None else f"device {self.device}"
        return f"{dev}/{PASS_NAMES[self.pass_index]}"


@dataclass
class StageResult:
    """What :func:`evaluate_stages` finds. ``latency_s`` is ``inf`` when the stage graph is
    cyclic (the blocks deadlock); ``violations`` lists dicts with ``kind`` (``memory``,
    ``contiguity``, ``acyclicity``, ``colocation``, ``placement``) and ``message``."""

    stages: list
    stage_of: np.ndarray
    stage_edges: list
    latency_s: float
    device_load_s: np.ndarray
    memory_bytes: np.ndarray
    capacity_bytes: np.ndarray
    violations: list = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.violations

    @property
    def bottleneck_s(self) -> float:
        return float(self.device_load_s.max()) if len(self.device_load_s) else 0.0

    def summary(self, cluster=None) -> dict:
        return {"valid": self.valid, "latency_s": self.latency_s, "bottleneck_s": self.bottleneck_s,
                "device_load_s": self.device_load_s.tolist(), "memory_bytes": self.memory_bytes.tolist(),
                "stages": [{"stage": s.label(cluster), "nodes": len(s.nodes), "in_s": s.in_s, "work_s": s.work_s,
                            "out_s": s.out_s, "start_s": s.start_s, "finish_s": s.finish_s} for s in self.stages],
                "violations": list(self.violations)}


def _name(problem: Problem, v: int) -> str:
    return problem.graph.nodes[v].name


def _contiguity(succ, stage_of, k: int, members: list) -> dict | None:
    """A violation when stage ``k`` is not convex: a path out of it that comes back."""
    inside = set(members)
    parent: dict[int, int] = {}
    frontier = []
    for u in members:
        for w in succ[u]:
            if stage_of[w] != k and w not in parent:
                parent[w] = u
                frontier.append(w)
    while frontier:
        x = frontier.pop()
        for w in succ[x]:
            if w in inside:
                path = [w, x]
                while path[-1] not in inside:
                    path.append(parent[path[-1]])
                path.reverse()
                return {"kind": "contiguity", "stage": k, "path": [int(v) for v in path]}
            if w not in parent:
                parent[w] = x
                frontier.append(w)
    return None


def evaluate_stages(problem: Problem, plan: Plan, passes: np.ndarray | None = None,
                    pooled: bool = False) -> StageResult:
    """The stage model (module docstring) applied to ``plan``: stages, violations, block
    times, latency and device loads.

    Parameters
    ----------
    problem : Problem
    plan : Plan
        Only ``plan.assignment`` matters: the stages and their order follow from it.
    passes : array of int, optional
        The pass of each node (default :func:`node_passes`).
    pooled : bool
        Judge by the host pool's rules (module docstring); ``problem.pooled("stage",
        "latency")`` says where they hold.

    Raises
    ------
    PlanError
        If the plan does not place every node once.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> problem = dnn_like_problem(12, cluster="2xV100-nvlink")   # 12 ops, 2 GPUs
    >>> from tvm_pesto.solve import solve
    >>> r = evaluate_stages(problem, solve(problem, "stage-dp", model="stage", objective="throughput"))
    >>> r.valid, r.latency_s >= r.bottleneck_s > 0
    (True, True)
    """
    n, d = problem.num_nodes, problem.num_devices
    plan.validate(n, d)
    a = np.asarray(plan.assignment, dtype=np.int64)
    passes = node_passes(problem.graph) if passes is None else np.asarray(passes, dtype=np.int64)
    cost = problem.costs[np.arange(n), a] if n else np.zeros(0)
    keys = sorted({(int(a[v]), int(passes[v])) for v in range(n)})
    index = {key: k for k, key in enumerate(keys)}
    stage_of = np.array([index[(int(a[v]), int(passes[v]))] for v in range(n)], dtype=np.int64)
    topo = problem.graph.topo_order()
    stages = [Stage(dev, ps, []) for dev, ps in keys]
    for v in topo:
        stages[stage_of[v]].nodes.append(int(v))
    succ: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for u, v, b in zip(problem.src.tolist(), problem.dst.tolist(), problem.ebytes.tolist()):
        succ[u].append((v, b))
    sg = nx.DiGraph()
    sg.add_nodes_from(range(len(stages)))
    sg.add_edges_from({(int(stage_of[u]), int(stage_of[v])) for u, v in zip(problem.src.tolist(), problem.dst.tolist())
                       if stage_of[u] != stage_of[v]})
    cpu = np.array([dv.kind == "cpu" for dv in problem.cluster.devices]) if pooled else np.zeros(d, dtype=bool)
    pg = _pool_graph(problem, a, stage_of, stages, cpu) if cpu.any() else None
    cyclic = not nx.is_directed_acyclic_graph(sg if pg is None else pg)
    # memory (the graph's own sizes, no received tensors)
    memory = np.bincount(a, weights=problem.mem, minlength=d).astype(np.float64) if n else np.zeros(d)
    violations = _violations(problem, a, stages, stage_of, succ, sg if pg is None else pg, cyclic, memory, cpu)
    load, latency = _block_times(problem, a, cost, stages, stage_of, succ, sg, cyclic, pg)
    return StageResult(stages, stage_of, sorted(sg.edges), latency, load, memory, problem.capacity.copy(), violations)


def _pool_graph(problem: Problem, a: np.ndarray, stage_of: np.ndarray, stages: list, cpu: np.ndarray) -> nx.DiGraph:
    """The stage graph of the host pool: ``("s", k)`` per stage off the CPUs, ``("v", v)`` per
    CPU node, an edge where a graph edge crosses them."""
    key = [("v", v) if cpu[a[v]] else ("s", int(stage_of[v])) for v in range(problem.num_nodes)]
    g = nx.DiGraph()
    g.add_nodes_from(set(key))
    g.add_edges_from({(key[u], key[w]) for u, w in zip(problem.src.tolist(), problem.dst.tolist()) if key[u] != key[w]})
    return g


def _violations(problem: Problem, a: np.ndarray, stages: list[Stage], stage_of: np.ndarray,
                succ, sg: nx.DiGraph, cyclic: bool, memory: np.ndarray, pool: np.ndarray) -> list[dict]:
    """What breaks the stage model's rules: placement, contiguity, acyclicity, memory and
    co-location, in that order (:attr:`StageResult.violations`); ``pool`` marks the CPUs of
    the host pool (none without it)."""
    cluster = problem.cluster
    violations: list[dict] = []
    cost = problem.costs[np.arange(problem.num_nodes), a] if problem.num_nodes else np.zeros(0)
    for v in np.flatnonzero(~np.isfinite(cost)).tolist():
        violations.append({"kind": "placement", "node": int(v), "device": int(a[v]),
                           "message": f"node {_name(problem, v)} is on {cluster.devices[a[v]].name}, where it "
                                      "cannot run (infinite cost); move it to a device that runs it"})
    succ_ids = [[v for v, _ in s] for s in succ]
    for k, st in enumerate(stages):
        bad = None if pool[st.device] else _contiguity(succ_ids, stage_of, k, st.nodes)
        if bad is not None:
            path = bad["path"]
            hops = " -> ".join(f"{_name(problem, v)} ({stages[stage_of[v]].label(cluster)})" for v in path)
            bad["message"] = (f"stage {st.label(cluster)} is not contiguous: the path {hops} leaves it and comes "
                              "back; put the nodes on that path on the same device, or the ends elsewhere")
            bad["path"] = [_name(problem, v) for v in path]
            violations.append(bad)
    if cyclic:
        cycle = [u for u, _ in nx.find_cycle(sg)]
        label = lambda k: stages[k].label(cluster) if isinstance(k, int) else (  # noqa: E731
            stages[k[1]].label(cluster) if k[0] == "s" else _name(problem, k[1]))
        names = " -> ".join(label(k) for k in cycle + cycle[:1])
        violations.append({"kind": "acyclicity", "stages": [label(k) for k in cycle],
                           "message": f"the stage graph has a cycle ({names}): those blocks would wait on each other "
                                      "forever; split the work so that data flows one way between stages"})
    cap = problem.capacity
    if pool.any():  # one pool: the CPUs' memory together
        memory, cap = memory.copy(), cap.copy()
        cpus = np.flatnonzero(pool)
        memory[cpus], cap[cpus] = memory[cpus].sum(), cap[cpus].sum()
        memory[cpus[1:]] = 0.0
    for k in np.flatnonzero(memory > cap * (1 + _TOL)).tolist():
        violations.append({"kind": "memory", "device": int(k), "memory_bytes": float(memory[k]),
                           "capacity_bytes": float(cap[k]),
                           "message": f"{cluster.devices[k].name} holds {memory[k] / 2**20:.1f} MiB of nodes but has "
                                      f"{cap[k] / 2**20:.1f} MiB; move {(memory[k] - cap[k]) / 2**20:.1f} MiB of nodes "
                                      "elsewhere"})
    for grp in problem.colocate:
        devs = sorted({int(a[v]) for v in grp})
        if len(devs) > 1 and not pool[devs].all():
            names = ", ".join(_name(problem, v) for v in list(grp)[:6])
            violations.append({"kind": "colocation", "nodes": [_name(problem, v) for v in grp],
                               "message": f"co-located nodes [{names}{', ...' if len(grp) > 6 else ''}] are split over "
                                          f"{', '.join(cluster.devices[k].name for k in devs)}; put them on one "
                                          "device" + (" or all on the CPUs" if pool.any() else "")})
    return violations


def _block_times(problem: Problem, a: np.ndarray, cost: np.ndarray, stages: list[Stage], stage_of: np.ndarray,
                 succ, sg: nx.DiGraph, cyclic: bool, pool: nx.DiGraph | None = None) -> tuple[np.ndarray, float]:
    """Fill each stage's work, input and output times and (when the stage graph is acyclic)
    its start and finish; returns the device loads and the latency (inf when cyclic). With
    ``pool`` (:func:`_pool_graph`) the CPU nodes' times are the host pool's."""
    n, d = problem.num_nodes, problem.num_devices
    lat, inv = io_rates(problem.cluster)
    order = _pool_order(pool, stages, cyclic) if pool is not None else None
    device_order = _device_order(sg, stages, cyclic) if order is None else \
        [k for kind, k in order if kind == "s"] + sorted({int(stage_of[k]) for kind, k in order if kind == "v"})
    first_of: dict[tuple[int, int], int] = {}  # (producer, device) -> the first stage there that needs it
    rank = {k: i for i, k in enumerate(device_order)}
    for k, st in enumerate(stages):
        st.work_s = float(cost[st.nodes].sum()) if st.nodes else 0.0
    inb: dict[tuple[int, int], float] = {}
    for u in range(n):
        du = a[u]
        out_b = -1.0
        for v, b in succ[u]:
            dv = int(a[v])
            if dv == du:
                continue
            out_b = max(out_b, b)
            key = (u, dv)
            inb[key] = max(inb.get(key, 0.0), b)
            k = int(stage_of[v])
            if key not in first_of or rank[k] < rank[first_of[key]]:
                first_of[key] = k
        if out_b >= 0:
            stages[stage_of[u]].out_s += float(lat[du] + out_b * inv[du])
    for (u, dv), b in inb.items():
        stages[first_of[(u, dv)]].in_s += float(lat[dv] + b * inv[dv])
    load = np.zeros(d)
    for st in stages:
        load[st.device] += st.block_s
    latency = float("inf")
    if not cyclic and pool is not None:
        latency = _pool_times(problem, cost, stages, pool, order)
    elif not cyclic:
        free = np.zeros(d)
        for k in device_order:
            st = stages[k]
            ready = max((stages[p].finish_s for p in sg.predecessors(k)), default=0.0)
            st.start_s = max(ready, free[st.device])
            st.finish_s = st.start_s + st.block_s
            free[st.device] = st.finish_s
        latency = max((st.finish_s for st in stages), default=0.0)
    return load, latency


def _pool_order(pool: nx.DiGraph, stages: list, cyclic: bool) -> list | None:
    """The host pool's stage graph in a topological order, forward first (then device, then
    node) among ready ones; None when it is cyclic."""
    if cyclic:
        return None
    key = lambda k: (stages[k[1]].pass_index, 0, stages[k[1]].device) if k[0] == "s" else (-1, 1, k[1])  # noqa: E731
    return list(nx.lexicographical_topological_sort(pool, key=key))


def _pool_times(problem: Problem, cost: np.ndarray, stages: list, pool: nx.DiGraph, order: list) -> float:
    """Start and finish of every stage in the host pool (module docstring), each CPU stage
    from its first node's start to its last node's finish; returns the latency."""
    free, done = np.zeros(problem.num_devices), {}
    for key in order:
        ready = max((done[p] for p in pool.predecessors(key)), default=0.0)
        if key[0] == "v":
            done[key] = ready + float(cost[key[1]])
            continue
        st = stages[key[1]]
        st.start_s = max(ready, free[st.device])
        done[key] = st.finish_s = free[st.device] = st.start_s + st.block_s
    for st in stages:
        if st.nodes and np.isnan(st.finish_s):  # a CPU stage
            st.finish_s = max(done[("v", v)] for v in st.nodes)
            st.start_s = min(done[("v", v)] - float(cost[v]) for v in st.nodes)
    return max(done.values(), default=0.0)


def _device_order(sg: nx.DiGraph, stages: list, cyclic: bool) -> list[int]:
    """The order the stages run in: a topological order of the stage graph, forward first
    (then device) among ready ones; by (pass, device) when the graph is cyclic."""
    key = lambda k: (stages[k].pass_index, stages[k].device)  # noqa: E731
    if cyclic:
        return sorted(range(len(stages)), key=key)
    return list(nx.lexicographical_topological_sort(sg, key=key))


__all__ = ["BACKWARD", "FORWARD", "PASS_NAMES", "Stage", "StageResult", "evaluate_stages", "io_rates", "node_passes"]
