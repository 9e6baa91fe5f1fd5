"""Importer for the profiled layer graphs of msr-fiddle/dnn-partitioning (Tarnawski et al.,
"Efficient Algorithms for Device Placement of DNN Graph Operators", NeurIPS 2020).

File format (see ``benchmarks/dnn-partitioning/ABOUT.md``): top-level ``maxFPGAs``
accelerators of ``maxSizePerFPGA`` bytes and ``maxCPUs`` CPU cores; nodes with ``id``,
``cpuLatency``, ``fpgaLatency`` (profiled GPU times), ``supportedOnFpga``, ``size`` (bytes on
an accelerator), ``colorClass`` (same class = same device) and ``isBackwardNode``; edges with
``sourceId``, ``destId``, ``cost`` (time to move the source's output between an accelerator
and CPU memory, the same for every edge leaving a node) and ``size`` (bytes).

How the file maps onto tvm-pesto's model
----------------------------------------
* Times: the files give no unit; they are read as milliseconds (``time_unit_s=1e-3``), so a
  cost table in seconds is ``latency * time_unit_s``.
* Nodes are renumbered ``0..n-1`` in a topological order (smallest id first among ready
  nodes). The original id is kept in ``OpNode.extra["id"]`` and starts ``OpNode.name``
  (``"<id>:<file name>"``, e.g. ``"33:node1grad"``); every raw field is kept in ``extra``.
* ``size`` becomes the node's ``param_bytes`` (what it keeps resident on its device).
* Edge cost is a time, so it is turned into bytes on a link whose bandwidth reproduces it:
  ``bytes = round(cost * R)`` and ``bandwidth = R / time_unit_s`` with zero latency, where
  ``R`` is the file's bytes per time unit (the median of ``size / cost``; 2^31 for the
  throughput inputs, 2^31/1000 for the latency inputs). The simulated transfer time is then
  the file's cost up to floating-point rounding, and for inference graphs (where cost is
  proportional to size) the bytes equal the file's edge size.
* :func:`cluster_from_graph` follows the paper's latency model: accelerator <-> CPU costs the
  edge cost, accelerator -> accelerator goes through CPU memory and costs twice that, CPU <->
  CPU is free (shared DRAM; infinite bandwidth). CPUs have no memory limit in the paper; here
  each CPU gets enough memory for the whole graph.
* One difference remains: tvm-pesto's memory model also counts received tensors on the
  receiving device, the paper's model counts only node sizes.

The graphs themselves ship with tvm-pesto (``benchmarks/dnn-partitioning/`` in the repository,
``tvm_pesto/benchmarks/dnn-partitioning/`` in the wheel, MIT licence); :func:`benchmark_dir`
finds them.

Examples
--------
>>> path = benchmark_dir() / "latency-inputs" / "LayerGraphs" / "bert24_inference.json"
>>> g, meta = load_layer_graph(str(path))
>>> g.num_nodes, meta["max_accelerators"] >= 1
(32, True)
"""
from __future__ import annotations

import gzip
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from ..cluster import Cluster, Device
from ..errors import ClusterError, CostError, CycleError, GraphError
from ..package_data import data_dirs
from .opgraph import OpGraph, OpNode

DEFAULT_TIME_UNIT_S = 1e-3
DEFAULT_BYTES_PER_UNIT = float(1 << 30)
#: Environment variable naming another dnn-partitioning folder (same layout as the shipped one).
BENCHMARK_ENV = "TVM_PESTO_DNN_PARTITIONING"


def benchmark_dir() -> Path:
    """The dnn-partitioning folder (``latency-inputs/``, ``throughput-inputs/``,
    ``human-experts/``): ``$TVM_PESTO_DNN_PARTITIONING`` if set, else the copy installed with
    the package, else the source checkout's ``benchmarks/dnn-partitioning``.

    Raises
    ------
    GraphError
        When ``$TVM_PESTO_DNN_PARTITIONING`` names no folder, or no shipped copy is found.

    Examples
    --------
    >>> sorted(p.name for p in benchmark_dir().iterdir() if p.is_dir())
    ['human-experts', 'latency-inputs', 'throughput-inputs']
    """
    env = os.environ.get(BENCHMARK_ENV)
    if env:
        if not os.path.isdir(env):
            raise GraphError(f"${BENCHMARK_ENV} is {env!r}, which is not a folder; point it at a dnn-partitioning "
                             "folder (with latency-inputs/ and throughput-inputs/) or unset it to use the shipped one")
        return Path(env)
    tried = [d / "dnn-partitioning" for d in data_dirs("benchmarks")]
    for d in tried:
        if d.is_dir():
            return d
    raise GraphError(f"the shipped dnn-partitioning graphs are missing (looked in {', '.join(map(str, tried))}); "
                     f"reinstall tvm-pesto (`pip install .` from a checkout) or set ${BENCHMARK_ENV} to the folder")


def is_graph_file(path: str) -> bool:
    """Whether ``path`` names a dnn-partitioning graph file (``.json``, or ``.json.gz`` as the
    shipped operator graphs are).

    Examples
    --------
    >>> is_graph_file("bert_l-3_inference.json.gz"), is_graph_file("resnet50.onnx")
    (True, False)
    """
    return path.endswith((".json", ".json.gz"))


def graph_stem(path: str) -> str:
    """The file's name without ``.json`` / ``.json.gz`` (the graph's name).

    Examples
    --------
    >>> graph_stem("latency-inputs/OperatorGraphs/bert_l-3_inference.json.gz")
    'bert_l-3_inference'
    """
    name = os.path.basename(path)
    for ext in (".json.gz", ".json"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return os.path.splitext(name)[0]


def read_json_file(path: str, what: str) -> Any:
    """The JSON in ``path`` (gzip-compressed when it ends in ``.gz``); ``what`` names the file
    in the errors.

    Raises
    ------
    GraphError
        When the file is missing, truncated or not JSON.
    """
    if not os.path.isfile(path):
        raise GraphError(f"{what} {path!r} does not exist (working directory {os.getcwd()!r}); check the path")
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if path.endswith(".gz") else open(path, encoding="utf-8")) as f:
            return json.load(f)
    except (OSError, EOFError) as err:  # a .gz that is not gzip, or cut short
        raise GraphError(f"{what} {path!r} is not a readable gzip file ({err}); give the file as "
                         "`gzip` writes it, or the plain .json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        cut = isinstance(err, json.JSONDecodeError) and (err.pos >= len(err.doc.rstrip())
                                                         or err.msg.startswith("Unterminated string"))
        why = "it ends before the JSON is complete (truncated?)" if cut else "it is not JSON text"
        raise GraphError(f"{what} {path!r} is not valid JSON: {why} ({err}); give the whole file, as the "
                         "dnn-partitioning tools write it") from None


def _number(value: Any, what: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise GraphError(f"{what} is {value!r}; it must be a number") from None
    if math.isnan(x):
        raise CostError(f"{what} is NaN; give a number")
    return x


def _setting(path: str) -> str | None:
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    for part in reversed(parts):
        if part.endswith("-inputs"):
            return part[: -len("-inputs")]
    return None


def _nodes_by_id(raw_nodes: list, where: str) -> dict[int, dict]:
    """The file's nodes by id, each checked (an id, latencies and a size that are numbers >= 0).

    Raises
    ------
    GraphError, CostError
        The first node that breaks a rule (``where`` names the file).
    """
    by_id: dict[int, dict] = {}
    for k, nd in enumerate(raw_nodes):
        if not isinstance(nd, dict) or "id" not in nd:
            raise GraphError(f"{where}: node #{k} has no 'id'")
        nid = int(nd["id"])
        if nid in by_id:
            raise GraphError(f"{where}: node id {nid} appears twice; ids must be unique")
        for field in ("cpuLatency", "fpgaLatency"):
            if field not in nd:
                raise GraphError(f"{where}: node {nid} has no {field!r}")
            val = _number(nd[field], f"{where}: node {nid} {field}")
            if val < 0:
                raise CostError(f"{where}: node {nid} has negative {field} {val}; latencies are times >= 0")
        size = _number(nd.get("size", 0.0), f"{where}: node {nid} size")
        if size < 0:
            raise GraphError(f"{where}: node {nid} has negative size {size}; sizes are bytes >= 0")
        by_id[nid] = nd
    return by_id


def _checked_edges(raw_edges: list, by_id: dict, where: str) -> list[tuple[int, int, float]]:
    """The file's edges as ``(source id, destination id, cost)``, each checked.

    Raises
    ------
    GraphError, CycleError, CostError
        The first edge that breaks a rule (``where`` names the file).
    """
    edges: list[tuple[int, int, float]] = []
    for k, e in enumerate(raw_edges):
        try:
            s, t = int(e["sourceId"]), int(e["destId"])
        except (KeyError, TypeError, ValueError):
            raise GraphError(f"{where}: edge #{k} needs integer 'sourceId' and 'destId', got {e!r}") from None
        for end in (s, t):
            if end not in by_id:
                raise GraphError(f"{where}: edge #{k} ({s} -> {t}) names unknown node {end}; "
                                 "every edge end must be a node id")
        if s == t:
            raise CycleError(f"{where}: edge #{k} ({s} -> {t}) is a self-loop; a placement needs a DAG")
        cost = _number(e.get("cost", 0.0), f"{where}: edge #{k} ({s} -> {t}) cost")
        if cost < 0:
            raise CostError(f"{where}: edge #{k} ({s} -> {t}) has negative cost {cost}; costs are times >= 0")
        edges.append((s, t, cost))
    return edges


def load_layer_graph(path: str, time_unit_s: float = DEFAULT_TIME_UNIT_S) -> tuple[OpGraph, dict]:
    """Read a dnn-partitioning graph file.

    Parameters
    ----------
    path : str
        A ``*.json`` graph (``LayerGraphs`` or ``OperatorGraphs``), or the same gzip-compressed
        (``*.json.gz``, as the operator graphs ship).
    time_unit_s : float
        Seconds per time unit of the file (milliseconds by default).

    Returns
    -------
    (OpGraph, dict)
        The graph and ``meta``: ``max_accelerators``, ``max_size_per_accelerator``,
        ``max_cpus``, ``time_unit_s``, ``bytes_per_time_unit``, ``id_to_index``,
        ``index_to_id``, ``setting`` ("latency"/"throughput"/None), ``path``, ``total_bytes``.

    Raises
    ------
    GraphError
        Missing fields, duplicate ids, an edge naming an unknown node.
    CostError
        A negative or NaN latency or edge cost.
    CycleError
        The edges form a cycle (the message lists it by original id).

    Examples
    --------
    >>> # g, meta = load_layer_graph("throughput-inputs/LayerGraphs/resnet50_inference.json")
    """
    data = read_json_file(path, "graph file")
    where = os.path.basename(path)
    if not isinstance(data, dict):
        raise GraphError(f"{where}: the top level must be an object with 'nodes' and 'edges'")
    for key in ("nodes", "edges", "maxFPGAs", "maxSizePerFPGA", "maxCPUs"):
        if key not in data:
            raise GraphError(f"{where}: missing top-level field {key!r} (needs nodes, edges, maxFPGAs, "
                             "maxSizePerFPGA, maxCPUs)")
    if time_unit_s <= 0:
        raise GraphError(f"time_unit_s must be > 0, not {time_unit_s}")
    raw_edges = data["edges"]
    by_id = _nodes_by_id(data["nodes"], where)
    edges = _checked_edges(raw_edges, by_id, where)
    dag = nx.DiGraph()
    dag.add_nodes_from(by_id)
    dag.add_edges_from((s, t) for s, t, _ in edges)
    if not nx.is_directed_acyclic_graph(dag):
        cycle = nx.find_cycle(dag)
        ids = " -> ".join(str(u) for u, _ in cycle) + f" -> {cycle[0][0]}"
        raise CycleError(f"{where}: the edges form a cycle through node ids {ids}; a placement needs a DAG")
    order = list(nx.lexicographical_topological_sort(dag))
    index = {nid: i for i, nid in enumerate(order)}

    ratios = [float(e["size"]) / float(e["cost"]) for e in raw_edges
              if float(e.get("cost", 0) or 0) > 0 and float(e.get("size", 0) or 0) > 0]
    per_unit = float(statistics.median(ratios)) if ratios else DEFAULT_BYTES_PER_UNIT

    nodes = []
    for nid in order:
        nd = by_id[nid]
        label = str(nd.get("name", f"node{nid}"))
        backward = bool(nd.get("isBackwardNode", False))
        extra = dict(nd)
        extra.update({
            "id": nid,
            "cpu_s": float(nd["cpuLatency"]) * time_unit_s,
            "accel_s": float(nd["fpgaLatency"]) * time_unit_s,
            "supported_on_accelerator": bool(nd.get("supportedOnFpga", True)),
        })
        nodes.append(OpNode(name=f"{nid}:{label}", op="backward" if backward else "forward",
                            param_bytes=int(round(float(nd.get("size", 0.0)))), extra=extra))
    graph_edges = [(index[s], index[t], int(round(cost * per_unit))) for s, t, cost in edges]
    name = graph_stem(path)
    graph = OpGraph(nodes, graph_edges, name=name)
    meta = {
        "path": os.path.abspath(path),
        "name": name,
        "setting": _setting(path),
        "max_accelerators": int(data["maxFPGAs"]),
        "max_size_per_accelerator": float(data["maxSizePerFPGA"]),
        "max_cpus": int(data["maxCPUs"]),
        "time_unit_s": float(time_unit_s),
        "bytes_per_time_unit": per_unit,
        "id_to_index": index,
        "index_to_id": list(order),
        "total_bytes": float(graph.memory_array().sum() + sum(b for _, _, b in graph_edges)),
    }
    return graph, meta


def cluster_from_graph(meta: dict, accel_to_accel_factor: float = 2.0) -> Cluster:
    """The cluster a graph file describes ("from-graph").

    ``max_accelerators`` devices of kind ``gpu`` named ``fpga0..`` with
    ``max_size_per_accelerator`` bytes each, then ``max_cpus`` devices of kind ``cpu``.
    Links have zero latency and the bandwidth that turns edge bytes back into the file's
    cost: accelerator <-> CPU one cost, accelerator -> accelerator ``accel_to_accel_factor``
    costs (through CPU memory), CPU <-> CPU free.

    Raises
    ------
    ClusterError
        If the file asks for no devices.

    Examples
    --------
    >>> # cluster = cluster_from_graph(meta); cluster.num_devices == meta["max_accelerators"] + meta["max_cpus"]
    """
    k, l = int(meta["max_accelerators"]), int(meta["max_cpus"])
    if k < 0 or l < 0 or k + l == 0:
        raise ClusterError(f"{meta.get('name', 'graph')}: maxFPGAs={k}, maxCPUs={l} gives no devices; "
                           "set maxFPGAs or maxCPUs in the file to at least 1")
    if meta["max_size_per_accelerator"] <= 0 and k > 0:
        raise ClusterError(f"{meta.get('name', 'graph')}: maxSizePerFPGA must be > 0")
    if accel_to_accel_factor <= 0:
        raise ClusterError(f"accel_to_accel_factor must be > 0, not {accel_to_accel_factor}")
    cpu_mem = max(float(meta["total_bytes"]), 1.0)
    devs = []
    for i in range(k):
        devs.append(Device(name=f"fpga{i}", kind="gpu", target={"kind": "cuda"},
                           memory_bytes=float(meta["max_size_per_accelerator"]), peak_flops=1e12,
                           mem_bandwidth=1e11, cores=1, index=i, present=False, model="from-graph-accelerator"))
    for i in range(l):
        devs.append(Device(name=f"cpu{i}", kind="cpu", target={"kind": "llvm", "num-cores": 1},
                           memory_bytes=cpu_mem, peak_flops=1e10, mem_bandwidth=1e10, cores=1, index=i,
                           present=False, model="from-graph-cpu"))
    d = k + l
    bw_unit = float(meta["bytes_per_time_unit"]) / float(meta["time_unit_s"])
    bw = np.full((d, d), bw_unit)
    bw[:k, :k] = bw_unit / accel_to_accel_factor
    bw[k:, k:] = np.inf
    return Cluster("from-graph", devs, np.zeros((d, d)), bw, {
        "preset": "from-graph", "source": meta.get("path"), "num_accelerators": k, "num_cpus": l,
        "time_unit_s": meta["time_unit_s"], "bytes_per_time_unit": meta["bytes_per_time_unit"],
        "accel_to_accel_factor": accel_to_accel_factor})


def costs_from_graph(graph: OpGraph, cluster: Cluster) -> np.ndarray:
    """Cost table ``[n, d]`` in seconds: ``fpgaLatency`` on accelerators (``inf`` where the
    node is not supported there), ``cpuLatency`` on CPUs.

    Raises
    ------
    CostError
        If the graph was not read by :func:`load_layer_graph` (no latencies on its nodes).

    Examples
    --------
    >>> # costs = costs_from_graph(g, cluster_from_graph(meta))
    """
    n, d = graph.num_nodes, cluster.num_devices
    costs = np.empty((n, d))
    is_cpu = np.array([dev.kind == "cpu" for dev in cluster.devices])
    for v, nd in enumerate(graph.nodes):
        if "cpu_s" not in nd.extra or "accel_s" not in nd.extra:
            raise CostError(f"node {nd.name} has no profiled latencies; costs_from_graph needs a graph "
                            "read by load_layer_graph")
        acc = nd.extra["accel_s"] if nd.extra.get("supported_on_accelerator", True) else np.inf
        costs[v] = np.where(is_cpu, nd.extra["cpu_s"], acc)
    return costs


def colocation_groups(graph: OpGraph, forward_backward: bool = True) -> list[list[int]]:
    """Groups of nodes that must share a device.

    The file's ``colorClass`` says which nodes go together (in the training graphs each
    forward node shares it with its backward twin). Without ``colorClass`` fields, a backward
    node ``Xgrad`` is paired with ``X`` by name. ``forward_backward=False`` returns no groups.

    Examples
    --------
    >>> # colocation_groups(g)[:2]  ->  [[0, 63], [1, 62]]
    """
    if not forward_backward:
        return []
    classes: dict[Any, list[int]] = {}
    if any("colorClass" in nd.extra for nd in graph.nodes):
        for v, nd in enumerate(graph.nodes):
            if "colorClass" in nd.extra:
                classes.setdefault(nd.extra["colorClass"], []).append(v)
    else:
        by_label = {str(nd.extra.get("name", nd.name)): v for v, nd in enumerate(graph.nodes)}
        for v, nd in enumerate(graph.nodes):
            label = str(nd.extra.get("name", nd.name))
            if label.endswith("grad") and label[:-4] in by_label:
                classes.setdefault(label[:-4], []).extend([by_label[label[:-4]], v])
    return sorted(sorted(set(g)) for g in classes.values() if len(set(g)) > 1)


def find_expert_split(graph_path: str) -> str | None:
    """The human-expert split for a graph file, if the benchmark folder has one."""
    stem = graph_stem(graph_path)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(graph_path))))
    cand = os.path.join(root, "human-experts", f"{stem}_expert.json")
    return cand if os.path.isfile(cand) else None
