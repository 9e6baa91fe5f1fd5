"""What one run of a placed module costs beyond its kernels and transfers: the executor's dispatch.

A placed module is run by the thread executor (:mod:`tvm_pesto.run.executor`): a program
on one device runs its segments in the calling thread; a program on several devices hands
each device's steps to that device's worker thread and waits for all of them. Neither is
free, and neither is in the plan's schedule (the solvers' makespan):

* ``run_s``: one run of a one-device program (calling the segment's VM function from Python,
  the executor's steps), beyond the kernels;
* ``multi_device_s``: one run of a program that uses several devices: waking the workers and
  waiting for the last one, beyond the kernels and beyond the hand-over of each value between
  devices, which the plan's link latency already charges per transfer.

:func:`tvm_pesto.run.dispatch.measure_dispatch` times them with the executor itself on tiny
TVM kernels (``tvm-pesto cluster bench`` stores them in ``cluster.meta["dispatch"]``); a
cluster without measured figures gets :data:`DEFAULT_DISPATCH`. The simulator adds the
figure for the devices a plan uses to its makespan (``SimResult.run_s``), so a small model
is not split over two devices to save less than the split costs per run.

Examples
--------
>>> from tvm_pesto.cluster import parse_cluster
>>> c = parse_cluster("cpu:2")
>>> dispatch_s(c, 1) < dispatch_s(c, 2)
True
"""
from __future__ import annotations

from .cluster import Cluster

#: Measured on the 2-vCPU development machine (2026-12-01 18:18, three runs of
#: :func:`tvm_pesto.run.dispatch.measure_dispatch` on ``cpu:2`` at load 0.1-0.2: run 2.4 us
#: each time, multi-device 60.6 / 39.7 / 41.8 us, the median kept): used for clusters that
#: carry no measurement of their own.
DEFAULT_DISPATCH = {"run_s": 2.4e-6, "multi_device_s": 41.8e-6}


def dispatch_figures(cluster: Cluster) -> dict:
    """``{"run_s", "multi_device_s", "measured"}``: the cluster's measured figures, or the
    defaults (``measured`` False)."""
    m = cluster.meta.get("dispatch") or {}
    if all(k in m for k in DEFAULT_DISPATCH):
        return {k: max(float(m[k]), 0.0) for k in DEFAULT_DISPATCH} | {"measured": True}
    return dict(DEFAULT_DISPATCH) | {"measured": False}


def dispatch_s(cluster: Cluster, devices_used: int) -> float:
    """Seconds of dispatch per run of a program on ``devices_used`` devices (0 for none)."""
    if devices_used <= 0:
        return 0.0
    f = dispatch_figures(cluster)
    return f["run_s"] if devices_used == 1 else f["multi_device_s"]


__all__ = ["DEFAULT_DISPATCH", "dispatch_figures", "dispatch_s"]
