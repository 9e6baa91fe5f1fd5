"""Roofline cost estimate for devices that are not on this machine."""
from __future__ import annotations

import numpy as np

# A kernel launch / dispatch costs at least this much, even when it does no work.
LAUNCH_S = {"gpu": 5e-6, "cpu": 2e-6}
# Fraction of peak a well-scheduled kernel reaches, by op category.
EFFICIENCY = {"anchor": 0.6, "default": 0.5}


def roofline_costs(graph, cluster) -> np.ndarray:
    """[n, d] seconds: max(FLOPs / (eff * peak), bytes / (eff * bandwidth)) + launch."""
    from ..graph.flops import op_category

    n, d = graph.num_nodes, cluster.num_devices
    out = np.zeros((n, d))
    for i, nd in enumerate(graph.nodes):
        cat = op_category(nd.op.split("+")[0])
        eff = EFFICIENCY.get(cat, EFFICIENCY["default"])
        nbytes = nd.bytes_read + nd.bytes_written
        for j, dev in enumerate(cluster.devices):
            out[i, j] = max(nd.flops / (eff * dev.peak_flops), nbytes / (eff * dev.mem_bandwidth)) \
                + LAUNCH_S.get(dev.kind, 2e-6)
    return out
