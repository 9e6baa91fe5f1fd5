"""The roofline cost source: FLOPs and bytes over a device's peak, for any device.

``max(FLOPs / (eff * peak), bytes / (eff * bandwidth)) + launch``, with ``eff`` by op
category. It knows nothing about libraries: every backend's candidate of the same ops
gets the same estimate (plus one launch per call, so fewer, larger calls win ties). Use it
for devices that are not on this machine and have no trained cost model.
"""
from __future__ import annotations

import numpy as np

from ...graph.flops import op_category
from .features import TIME_FLOOR_S, _dtype_size, _prod

# A kernel launch / dispatch costs at least this much, even when it does no work.
LAUNCH_S = {"gpu": 5e-6, "cpu": 2e-6}
# Fraction of peak a well-scheduled kernel reaches, by op category.
EFFICIENCY = {"anchor": 0.6, "default": 0.5}


def node_seconds(node, device) -> float:
    """The roofline estimate for one (possibly merged) op-graph node on ``device``."""
    cat = op_category(node.op.split("+")[0])
    eff = EFFICIENCY.get(cat, EFFICIENCY["default"])
    nbytes = node.bytes_read + node.bytes_written
    return max(node.flops / (eff * device.peak_flops), nbytes / (eff * device.mem_bandwidth)) \
        + LAUNCH_S.get(device.kind, 2e-6)


def work_s(desc: dict, dev: dict) -> float:
    """The work of a subgraph description (:func:`~tvm_pesto.costs.predict.features.describe_group`)
    on a device descriptor, in seconds: ``max(FLOPs / peak, bytes / bandwidth)``, floored at
    :data:`~tvm_pesto.costs.predict.features.TIME_FLOOR_S`, where a gather whose dominant op is
    ``take`` reads the rows it writes, not its whole table (a token embedding of 30,522 rows
    reads 128 of them), and a group with a ``take`` elsewhere reads its output's bytes in
    place of its weights (the table). What the ``log_work`` target of the learned model is relative to:
    it grows with the subgraph, so a subgraph far larger than any training row is priced
    from its work, not at the largest label.

    Examples
    --------
    >>> dev = {"peak_flops": 1e11, "mem_bandwidth": 1e10}
    >>> mm = {"flops": 2e9, "bytes_read": 4e6, "bytes_written": 1e6, "dominant": {"op": "relax.matmul"}}
    >>> work_s(mm, dev)                               # compute-bound: FLOPs / peak
    0.02
    >>> emb = {"flops": 0.0, "bytes_read": 30522 * 768 * 4 + 512, "bytes_written": 128 * 768 * 4, "dtype": "float32",
    ...        "dominant": {"op": "relax.take", "inputs": [[30522, 768], [128]], "outputs": [[128, 768]]}}
    >>> round(work_s(emb, dev) * 1e6, 1)               # 128 rows read and written, not the table
    78.7
    """
    br, bw = float(desc["bytes_read"]), float(desc["bytes_written"])
    dom = desc.get("dominant") or {}
    ins, outs = dom.get("inputs") or [], dom.get("outputs") or []
    if dom.get("op") == "relax.take" and ins and outs:
        size = _dtype_size(desc)
        br = max(br - _prod(ins[0]) * size, 0.0) + _prod(outs[0]) * size
    elif "relax.take" in desc.get("ops", ()):  # the table is the group's weight; the gather reads what it writes
        br = max(br - float(desc.get("param_bytes", 0)), 0.0) + bw
    return max(float(desc["flops"]) / dev["peak_flops"], (br + bw) / dev["mem_bandwidth"], TIME_FLOOR_S)


def roofline_costs(graph, cluster) -> np.ndarray:
    """``[nodes, devices]`` seconds for every node of ``graph``."""
    return np.array([[node_seconds(nd, dev) for dev in cluster.devices] for nd in graph.nodes]).reshape(
        graph.num_nodes, cluster.num_devices)


def roofline_candidate_costs(cs, cluster) -> np.ndarray:
    """``[candidates, devices]`` seconds; ``inf`` where the candidate's backend does not run
    on the device's kind."""
    # lazy: loads TVM's compiler, which importing this module does not
    from ...backends import get_backend

    graph = cs.rg.graph
    out = np.empty((len(cs), cluster.num_devices))
    for i, c in enumerate(cs):
        node = graph.merged(c.nodes)
        bk = get_backend(c.backend)
        for j, dev in enumerate(cluster.devices):
            out[i, j] = node_seconds(node, dev) if bk.supports_device(dev) else np.inf
    return out
