"""A placement problem: graph + cluster + cost table, flattened to arrays for solvers."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cluster import Cluster
from ..errors import CostError, GraphError, InfeasibleError
from ..graph import dnn_partitioning as dp
from ..graph.opgraph import OpGraph, OpNode


def checked_costs(costs, rows: int, devices: int, what: str, label) -> np.ndarray:
    """``costs`` as a float array of shape ``(rows, devices)``, seconds >= 0 (``inf`` = cannot
    run); ``label(i)`` names row ``i`` in the error.

    Raises
    ------
    CostError
        For a wrong shape, or a negative or NaN entry.
    """
    costs = np.asarray(costs, dtype=np.float64)
    if costs.shape != (rows, devices):
        raise CostError(f"{what} cost table has shape {costs.shape}; expected ({rows}, {devices}) for "
                        f"{rows} {what}s on {devices} devices")
    if np.isnan(costs).any() or (costs < 0).any():
        bad = int(np.flatnonzero(np.isnan(costs).any(1) | (costs < 0).any(1))[0])
        raise CostError(f"{what} {bad} ({label(bad)}) has a negative or NaN cost {costs[bad].tolist()}; "
                        "costs are seconds >= 0 (inf = cannot run)")
    return costs


@dataclass(frozen=True)
class HostPool:
    """The dnn-partitioning benchmark's rule for the host CPUs (Tarnawski et al., NeurIPS 2020:
    the authors' latency evaluator, ``latency-greedy/greedy.cpp -computeLatency``), a property
    of a problem (:attr:`Problem.host_pool`) where it holds: the problems of the benchmark's
    one-pass (inference) files, the graphs of its latency setting (:func:`layer_graph_problem`;
    a training file keeps one block per device and pass).

    For one sample's latency in the stage model (:meth:`applies`) the CPUs are one pool:

    * a co-location group is valid when all its members sit on CPUs (any of them) or all on
      one accelerator; nodes on the CPUs need not be contiguous, and the CPUs' memory is one
      pool (their capacities added up);
    * every CPU node runs on a core of its own as soon as its inputs are there: it finishes
      its cost after its last producer (a CPU pays no transfer; an accelerator's stage pays
      its in and out phases, :mod:`tvm_pesto.plan.stage`).

    Throughput (the device loads) and the op model keep one block per device.

    Examples
    --------
    >>> HostPool().applies("stage", "latency", None), HostPool().applies("stage", "throughput", None)
    (True, False)
    """

    source: str = "dnn-partitioning benchmark: latency-greedy/greedy.cpp -computeLatency"

    def applies(self, model: str, objective: str, microbatches=None) -> bool:
        """Whether the rule holds for ``objective`` in ``model`` (one sample's stage latency)."""
        return model == "stage" and objective == "latency" and microbatches is None

    def to_json(self) -> dict:
        """The rule as a plan's info states it."""
        return {"rule": "host-pool", "colocation": "all on the CPUs (any of them) or all on one accelerator",
                "cpu_nodes": "each on a core of its own as soon as its inputs are there", "source": self.source}


@dataclass
class Problem:
    """What every solver takes.

    Parameters
    ----------
    graph : OpGraph
    cluster : Cluster
    costs : ndarray, shape (num_nodes, num_devices)
        Seconds node ``i`` takes on device ``j``; ``inf`` where it cannot run there.
    colocate : list of list of int
        Groups of nodes that must share a device (e.g. a forward op and its backward twin).
    cost_source : str
        Where the costs came from (``measured``, ``xgb``, ``roofline``, ``file``).
    host_pool : HostPool or None
        The benchmark's rule for the host CPUs, where it holds (dnn-partitioning inference files).
    backends : list of str, optional
        The backend each node runs, where the problem is a cover of candidates
        (:meth:`JointProblem.contract`): :func:`~tvm_pesto.plan.simulate.simulate` charges a
        switch between libraries where two consecutive nodes of a device differ, for every
        plan of the problem, whichever solver made it.
    """

    graph: OpGraph
    cluster: Cluster
    costs: np.ndarray
    colocate: list[list[int]] = field(default_factory=list)
    cost_source: str = "unknown"
    host_pool: HostPool | None = None
    backends: list[str] | None = None

    def __post_init__(self):
        n, d = self.graph.num_nodes, self.cluster.num_devices
        self.costs = checked_costs(self.costs, n, d, "node", lambda i: self.graph.nodes[i].name)
        runnable = np.isfinite(self.costs).any(axis=1)
        if not runnable.all():
            bad = int(np.flatnonzero(~runnable)[0])
            raise InfeasibleError(f"node {bad} ({self.graph.nodes[bad].name}) cannot run on any device of "
                                  f"{self.cluster.name}; give it a finite cost somewhere")
        for grp in self.colocate:
            for v in grp:
                if not 0 <= v < n:
                    raise GraphError(f"co-location group {grp} names unknown node {v}")
        self.src, self.dst, self.ebytes = self.graph.edge_arrays()
        self.mem = self.graph.memory_array()
        self.capacity = self.cluster.capacities()
        self.latency = self.cluster.latency.copy()
        self.inv_bw = self.cluster.inv_bandwidth()
        self.hosts = self.cluster.host_ids  # transfers between hosts share each host's NIC

    @property
    def num_nodes(self) -> int:
        return self.graph.num_nodes

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    def transfer_s(self, src: int, dst: int, nbytes: float) -> float:
        """Seconds to move ``nbytes`` from device ``src`` to ``dst``: ``latency[src, dst] +
        nbytes * inv_bw[src, dst]`` (0 when ``src == dst``).

        The link model of :meth:`tvm_pesto.cluster.Cluster.transfer_s`, on this problem's
        arrays and with the simulator's arithmetic (bytes times the inverse bandwidth), so it
        equals the duration of the simulator's transfer bit for bit.

        Examples
        --------
        >>> import numpy as np
        >>> from tvm_pesto.cluster import parse_cluster
        >>> from tvm_pesto.graph import OpGraph, OpNode
        >>> p = Problem(OpGraph([OpNode("a", "relax.add")], []), parse_cluster("cpu:2"), np.ones((1, 2)))
        >>> p.transfer_s(0, 0, 1e6), p.transfer_s(0, 1, 0) == float(p.latency[0, 1])
        (0.0, True)
        """
        if src == dst:
            return 0.0
        return float(self.latency[src, dst] + nbytes * self.inv_bw[src, dst])

    def pooled(self, model: str, objective: str, microbatches=None) -> bool:
        """Whether :attr:`host_pool` holds for ``objective`` in ``model``."""
        return self.host_pool is not None and self.host_pool.applies(model, objective, microbatches)

    def min_cost(self) -> np.ndarray:
        return self.costs.min(axis=1)

    def check_memory_feasible(self) -> None:
        """Raise :class:`InfeasibleError` if the weights and outputs cannot fit even when
        spread perfectly, naming how much memory is needed."""
        need = float(self.mem.sum())
        have = float(self.capacity.sum())
        biggest = float(self.mem.max()) if len(self.mem) else 0.0
        if need > have:
            raise InfeasibleError(
                f"{self.graph.name}: weights and activations need {need / 2**20:.1f} MiB but the "
                f"{self.num_devices} devices of {self.cluster.name} hold {have / 2**20:.1f} MiB in all; "
                f"use devices with at least {need / self.num_devices / 2**20:.1f} MiB each, or more devices")
        if biggest > self.capacity.max():
            raise InfeasibleError(
                f"{self.graph.name}: one node needs {biggest / 2**20:.1f} MiB but the largest device holds "
                f"{self.capacity.max() / 2**20:.1f} MiB; use a device with at least {biggest / 2**20:.1f} MiB")


@dataclass
class JointProblem:
    """Backend + device + order, chosen together: what :func:`tvm_pesto.solve.joint.solver.solve_joint` takes.

    Parameters
    ----------
    graph : OpGraph
        The op graph (one node per operator call).
    cluster : Cluster
    candidates : list of Candidate
        Subgraphs a backend can run as one call (``backend``, ``nodes``). A cover is a set of
        candidates that contains every node exactly once and whose contraction is acyclic.
    costs : ndarray, shape (num_candidates, num_devices)
        Seconds candidate ``c`` takes on device ``d``; ``inf`` where it cannot run there.
    cost_source : str
        Where the costs came from.
    colocate : list of list of int
        Op-graph nodes that must share a device.

    Placement only (every op in exactly one candidate, e.g. TVM's fusion groups) is the
    special case with a single cover; :meth:`fixed_cover` returns it.
    """

    graph: OpGraph
    cluster: Cluster
    candidates: list
    costs: np.ndarray
    cost_source: str = "unknown"
    colocate: list[list[int]] = field(default_factory=list)

    def __post_init__(self):
        k, d = len(self.candidates), self.cluster.num_devices
        self._merged_nodes: dict[int, OpNode] = {}  # candidate -> its node in a contracted graph (contract)
        self.costs = checked_costs(self.costs, k, d, "candidate", lambda i: self.candidates[i].backend)
        usable = np.isfinite(self.costs).any(axis=1)
        covered = np.zeros(self.graph.num_nodes, dtype=bool)
        for c in np.flatnonzero(usable):
            covered[list(self.candidates[c].nodes)] = True
        if not covered.all():
            v = int(np.flatnonzero(~covered)[0])
            raise InfeasibleError(f"op {self.graph.nodes[v].name} ({self.graph.nodes[v].op}) has no candidate that "
                                  f"can run on any device of {self.cluster.name}; keep the tvm backend, which "
                                  "covers every op")

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    def fixed_cover(self) -> list[int] | None:
        """The only cover when the usable candidates partition the nodes, else ``None``."""
        usable = [c for c in range(len(self.candidates)) if np.isfinite(self.costs[c]).any()]
        if sum(len(self.candidates[c].nodes) for c in usable) != self.graph.num_nodes:
            return None
        return usable

    def cover_of(self, plan) -> list[int]:
        """The candidate index of each of ``plan``'s units (a plan solved on these candidates,
        or on a problem sharing them: another cost table of the same candidate set)."""
        pos = {id(c): i for i, c in enumerate(self.candidates)}
        return [pos[id(u)] for u in plan.units]

    def contract(self, cover) -> Problem:
        """The placement problem of a cover: one node per chosen candidate (in ``cover``'s
        order), its costs, and the co-location groups mapped to those nodes."""
        cover = [int(c) for c in cover]
        merged = self._merged_nodes
        for c in cover:
            if c not in merged:  # a candidate's node is the same in every cover: made once
                merged[c] = self.graph.merged(self.candidates[c].nodes)
        g = self.graph.contract([list(self.candidates[c].nodes) for c in cover], name=self.graph.name,
                                merged=[merged[c] for c in cover])
        unit_of = {}
        for k, c in enumerate(cover):
            for v in self.candidates[c].nodes:
                unit_of[v] = k
        coloc = [sorted({unit_of[v] for v in grp}) for grp in self.colocate]
        return Problem(g, self.cluster, self.costs[cover], colocate=[c for c in coloc if len(c) > 1],
                       cost_source=self.cost_source, backends=[self.candidates[c].backend for c in cover])


def layer_graph_problem(path) -> tuple[Problem, dict]:
    """The placement problem a dnn-partitioning LayerGraph file (``.json`` or ``.json.gz``)
    defines, with its devices, costs, co-location classes and the benchmark's rule for the
    host CPUs (:class:`HostPool`), and the file's facts
    (:func:`tvm_pesto.graph.dnn_partitioning.load_layer_graph`).

    Examples
    --------
    >>> problem, meta = layer_graph_problem(dp.benchmark_dir() / "throughput-inputs/LayerGraphs/bert24_inference.json")
    >>> problem.num_nodes, problem.cost_source, meta["max_accelerators"] > 0
    (32, 'file', True)
    """
    graph, meta = dp.load_layer_graph(str(path))
    cluster = dp.cluster_from_graph(meta)
    one_pass = not any(nd.op == "backward" or nd.extra.get("isBackwardNode") for nd in graph.nodes)  # stage.node_passes
    return Problem(graph, cluster, dp.costs_from_graph(graph, cluster), colocate=dp.colocation_groups(graph),
                   cost_source="file", host_pool=HostPool() if one_pass else None), meta
