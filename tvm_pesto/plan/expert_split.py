"""Human-expert splits of the dnn-partitioning graphs: a split file read as a :class:`Plan`,
and a plan written as one.

A split file is ``{"fpgas": [{"nodes": [ids]}, ...], "cpus": [...]}`` with the graph file's
original node ids (:mod:`tvm_pesto.graph.dnn_partitioning` keeps them in
``OpNode.extra["id"]``); :func:`~tvm_pesto.graph.dnn_partitioning.find_expert_split` finds
the one the benchmark folder has for a graph. ``tvm-pesto place --expert`` and
``tvm-pesto bench placement`` compare the solvers' plans with it.

Examples
--------
>>> from tvm_pesto.graph.dnn_partitioning import (benchmark_dir, cluster_from_graph, find_expert_split,
...                                                load_layer_graph)
>>> path = str(benchmark_dir() / "throughput-inputs" / "LayerGraphs" / "resnet50_inference.json")
>>> g, meta = load_layer_graph(path)
>>> cluster = cluster_from_graph(meta)
>>> plan = load_expert_split(find_expert_split(path), g, cluster)
>>> write_split(plan, g, cluster) == write_split(load_expert_split(find_expert_split(path), g, cluster), g, cluster)
True
"""
from __future__ import annotations

import os

import numpy as np

from ..cluster import Cluster
from ..errors import PlanError
from ..graph.dnn_partitioning import read_json_file
from ..graph.opgraph import OpGraph
from .plan import Plan


def _split_devices(cluster: Cluster | None, n_fpgas: int, n_cpus: int) -> tuple[list[int], list[int], int]:
    if cluster is None:
        return list(range(n_fpgas)), list(range(n_fpgas, n_fpgas + n_cpus)), n_fpgas + n_cpus
    acc = [i for i, dev in enumerate(cluster.devices) if dev.kind != "cpu"]
    cpus = [i for i, dev in enumerate(cluster.devices) if dev.kind == "cpu"]
    return acc, cpus, cluster.num_devices


def _node_ids(graph: OpGraph) -> list[int]:
    return [int(nd.extra.get("id", v)) for v, nd in enumerate(graph.nodes)]


def load_expert_split(path: str, graph: OpGraph, cluster: Cluster | None = None) -> Plan:
    """Read a split file (``{"fpgas": [{"nodes": [ids]}, ...], "cpus": [...]}``) as a Plan.

    The k-th ``fpgas`` entry goes to the cluster's k-th accelerator, the k-th ``cpus`` entry
    to its k-th CPU (without a cluster: accelerators first, then CPUs). Each device runs its
    nodes in the graph's topological order.

    Raises
    ------
    PlanError
        Unknown or repeated ids, nodes the split leaves out, or more non-empty entries than
        the cluster has devices of that kind.

    Examples
    --------
    >>> # plan = load_expert_split("human-experts/resnet50_inference_expert.json", g, cluster)
    """
    data = read_json_file(path, "split file")
    where = os.path.basename(path)
    if not isinstance(data, dict) or "fpgas" not in data:
        raise PlanError(f"{where}: a split needs an 'fpgas' list (and optionally 'cpus')")
    fpgas, cpus = data.get("fpgas") or [], data.get("cpus") or []
    acc_devs, cpu_devs, d = _split_devices(cluster, len(fpgas), len(cpus))
    index = {nid: v for v, nid in enumerate(_node_ids(graph))}
    assignment = np.full(graph.num_nodes, -1, dtype=np.int64)
    for kind, entries, devs in (("fpgas", fpgas, acc_devs), ("cpus", cpus, cpu_devs)):
        for k, entry in enumerate(entries):
            ids = entry.get("nodes", []) if isinstance(entry, dict) else entry
            if not ids:
                continue
            if k >= len(devs):
                raise PlanError(f"{where}: {kind}[{k}] has nodes but the cluster has only {len(devs)} "
                                f"{'accelerators' if kind == 'fpgas' else 'CPUs'}; use a cluster with more")
            for nid in ids:
                v = index.get(int(nid))
                if v is None:
                    raise PlanError(f"{where}: {kind}[{k}] names node id {nid}, which {graph.name} does not have")
                if assignment[v] >= 0:
                    raise PlanError(f"{where}: node id {nid} is placed twice; each node needs one device")
                assignment[v] = devs[k]
    missing = np.flatnonzero(assignment < 0)
    if len(missing):
        ids = [graph.nodes[v].extra.get("id", v) for v in missing[:8]]
        raise PlanError(f"{where}: {len(missing)} nodes of {graph.name} are in no entry (ids {ids}"
                        f"{', ...' if len(missing) > 8 else ''}); a split must place every node")
    pos = np.empty(graph.num_nodes, dtype=np.int64)
    pos[graph.topo_order()] = np.arange(graph.num_nodes)
    return Plan.from_assignment(assignment, pos, d, solver="expert", info={"source": os.path.abspath(path)})


def write_split(plan: Plan, graph: OpGraph, cluster: Cluster) -> dict:
    """The plan in the split format, with original node ids, in each device's order.

    Examples
    --------
    >>> # json.dump(write_split(plan, g, cluster), open("split.json", "w"))
    """
    if plan.num_devices != cluster.num_devices:
        raise PlanError(f"plan has {plan.num_devices} devices; cluster {cluster.name} has {cluster.num_devices}")
    ids = _node_ids(graph)
    acc, cpus, _ = _split_devices(cluster, 0, 0)
    return {
        "fpgas": [{"nodes": [ids[v] for v in plan.order[k]]} for k in acc],
        "cpus": [{"nodes": [ids[v] for v in plan.order[k]]} for k in cpus],
    }


__all__ = ["load_expert_split", "write_split"]
