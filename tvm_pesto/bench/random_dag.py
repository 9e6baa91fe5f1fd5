"""Random layered DNN-like DAGs for the scale benchmark (``tvm-pesto bench scale``).

Layers of width 1-8, each node fed by 1-3 nodes of the previous layer, plus skip
connections from up to 8 layers back (15 % of nodes get one), like the branches and
residuals of a CNN. Costs are roofline-style (``max(flops / peak, bytes / bandwidth)``,
times a random 1.0-1.3 inefficiency, plus 5 us launch) for each device of the cluster.
Tensor and weight sizes shrink on big graphs so that the static memory model (every output
kept) uses at most a quarter of the cluster's memory, so every solver has room.
"""
from __future__ import annotations

import numpy as np

from ..cluster import parse_cluster
from ..errors import GraphError
from ..graph import OpGraph, OpNode
from ..plan import Problem


def dnn_like_problem(n: int, seed: int = 0, cluster: str = "4xV100-pcie") -> Problem:
    """A random layered DNN-like DAG with ``n`` ops and roofline-ish costs on ``cluster``.

    Parameters
    ----------
    n : int
        Number of ops (at least 1).
    seed : int
        Seed of the NumPy generator; the same ``(n, seed, cluster)`` gives the same problem.
    cluster : str
        A spec for :func:`tvm_pesto.cluster.parse_cluster`.

    Returns
    -------
    Problem
        Graph ``dnn<n>`` with ``cost_source="roofline"``.

    Raises
    ------
    GraphError
        If ``n`` is below 1.

    Examples
    --------
    >>> from tvm_pesto.bench.random_dag import dnn_like_problem
    >>> p = dnn_like_problem(100)
    >>> p.num_nodes, p.num_devices
    (100, 4)
    """
    if n < 1:
        raise GraphError(f"a random DAG needs at least 1 op, not {n}")
    rng = np.random.default_rng(seed)
    layers: list[list[int]] = []
    v = 0
    while v < n:
        w = int(min(rng.integers(1, 9), n - v))
        layers.append(list(range(v, v + w)))
        v += w
    flops = np.exp(rng.uniform(np.log(1e6), np.log(2e10), n))
    out_b = np.exp(rng.uniform(np.log(1e4), np.log(8e6), n)).astype(np.int64)
    params = np.where(rng.random(n) < 0.4, np.exp(rng.uniform(np.log(1e4), np.log(2e7), n)), 0).astype(np.int64)
    cl = parse_cluster(cluster)
    # keep weights + activations at most a quarter of the cluster's memory (static memory model)
    scale = min(1.0, 0.25 * float(cl.capacities().sum()) / float(out_b.sum() + params.sum()))
    out_b = np.maximum((out_b * scale).astype(np.int64), 1)
    params = (params * scale).astype(np.int64)
    edges = []
    for li in range(1, len(layers)):
        prev = layers[li - 1]
        for t in layers[li]:
            k = int(min(len(prev), rng.integers(1, 4)))
            for s in rng.choice(prev, size=k, replace=False).tolist():
                edges.append((s, t, int(out_b[s])))
            if li >= 2 and rng.random() < 0.15:
                back = int(rng.integers(2, min(8, li) + 1))
                s = int(rng.choice(layers[li - back]))
                edges.append((s, t, int(out_b[s])))
    nodes = [OpNode(f"op{i}", "dense", flops=float(flops[i]), bytes_read=int(out_b[i] + params[i]),
                    bytes_written=int(out_b[i]), param_bytes=int(params[i])) for i in range(n)]
    g = OpGraph(nodes, edges, name=f"dnn{n}")
    costs = np.empty((n, cl.num_devices))
    for d, dev in enumerate(cl.devices):
        base = np.maximum(flops / dev.peak_flops, (out_b + params) * 2 / dev.mem_bandwidth)
        costs[:, d] = 5e-6 + base * rng.uniform(1.0, 1.3, n)
    return Problem(g, cl, costs, cost_source="roofline")
