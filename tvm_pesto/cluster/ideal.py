"""A cluster whose devices talk for free: what a plan could reach were hand-offs free.

:func:`free_communication` copies a cluster with every link at zero latency and unbounded
bandwidth, no more dispatch for a run on several devices than for one (``multi_device_s`` =
``run_s``: any plan pays a run's own), and no contention between devices. Solving a
placement on it gives a ceiling for the real cluster: a split that does not pay there
cannot pay on the machine, however fast the executor's hand-offs become
(``tvm-pesto bench backends`` reports it per model).

Examples
--------
>>> from tvm_pesto.cluster import parse_cluster
>>> from tvm_pesto.cluster.dispatch import dispatch_info
>>> free = free_communication(parse_cluster("cpu:2"))
>>> info = dispatch_info(free)
>>> free.transfer_s(0, 1, 1 << 20), info["multi_device_s"] == info["run_s"]
(0.0, True)
"""
from __future__ import annotations

import numpy as np

from .cluster import Cluster
from .dispatch import dispatch_info, set_dispatch


def free_communication(cluster: Cluster) -> Cluster:
    """A copy of ``cluster`` whose links, multi-device dispatch and contention cost nothing
    beyond what a run on one device costs."""
    d = cluster.num_devices
    free = Cluster(cluster.name, list(cluster.devices), np.zeros((d, d)), np.full((d, d), np.inf),
                   dict(cluster.meta), list(cluster.hosts))
    info = dispatch_info(cluster)
    set_dispatch(free, {"run_s": info["run_s"], "multi_device_s": info["run_s"]}, info["executor"], "assumed",
                 why="free communication: no link, hand-off or multi-device cost (a ceiling)")
    free.meta["contention"] = {"compute": 1.0, "memory": 1.0}
    return free


__all__ = ["free_communication"]
