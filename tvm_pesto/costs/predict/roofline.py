"""The roofline cost source: FLOPs and bytes over a device's peak, for any device.

``max(FLOPs / (eff * peak), bytes / (eff * bandwidth)) + launch``, with ``eff`` by op
category. It knows nothing about libraries: every backend's candidate of the same ops
gets the same estimate (plus one launch per call, so fewer, larger calls win ties). Use it
for devices that are not on this machine and have no trained cost model.
"""
from __future__ import annotations

import numpy as np

from ...graph.flops import op_category

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
