"""Measure the a + b·bytes link model between real devices.

For CPU devices the measurement uses the executor's own mechanism: a value made on one
device's worker thread is copied to the other device and handed over with an event, so
the fitted latency includes the hand-off, not only the memcpy. The Ray executor's links
(Ray channels between actors) are measured by
:func:`tvm_pesto.run.ray.executor.measure_ray_links`, fitted by :func:`fit_links` too.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..errors import ClusterError
from .cluster import Cluster

SIZES = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22)


def _one_pair(src_dev, dst_dev, sizes, repeat):
    """Median seconds from 'copy starts on the source thread' to 'consumer thread sees it',
    with two persistent pinned threads handing values over by events (as the executor does)."""
    import tvm

    # lazy: loads TVM, which importing this module does not
    from .device_thread import enter_device_thread

    jobs = [(n, k) for n in sizes for k in range(repeat + 2)]
    go = [threading.Event() for _ in jobs]
    ready = [threading.Event() for _ in jobs]
    t0 = np.zeros(len(jobs))
    t1 = np.zeros(len(jobs))
    srcs = {n: tvm.runtime.tensor(np.ones(n // 4, dtype="float32"), device=src_dev.tvm_device()) for n in sizes}
    dst = dst_dev.tvm_device()

    def producer():
        enter_device_thread(src_dev)
        for k, (n, _) in enumerate(jobs):
            go[k].wait()
            t0[k] = time.perf_counter()
            box[k] = srcs[n].copyto(dst)
            ready[k].set()

    def consumer():
        enter_device_thread(dst_dev)
        for k in range(len(jobs)):
            go[k].set()
            ready[k].wait()
            t1[k] = time.perf_counter()
            box.pop(k, None)

    box: dict = {}
    th = [threading.Thread(target=producer), threading.Thread(target=consumer)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    out = {}
    for n in sizes:
        ks = [k for k, (m, r) in enumerate(jobs) if m == n and r >= 2]  # two warm-up rounds
        out[n] = float(np.median(t1[ks] - t0[ks]))
    return out


def measure_links(cluster: Cluster, sizes=SIZES, repeat: int = 15) -> dict:
    """Fit latency (s) and bandwidth (B/s) for every ordered pair of present devices and
    write them into ``cluster``. Returns the raw points."""
    if not cluster.all_present:
        raise ClusterError(f"{cluster.name}: links can only be measured between devices on this machine")
    d = cluster.num_devices
    pairs = {(i, j): _one_pair(cluster.devices[i], cluster.devices[j], sizes, repeat)
             for i in range(d) for j in range(d) if i != j}
    return fit_links(cluster, pairs, "thread")


def fit_links(cluster: Cluster, pairs: dict, engine: str) -> dict:
    """Fit ``latency + bytes / bandwidth`` to each pair's points (least squares on relative
    errors) and write the fits into ``cluster`` (``meta["links_measured"]`` says over which
    ``engine``).

    Parameters
    ----------
    pairs : dict
        ``(src, dst) -> {bytes: median seconds}``.
    engine : str
        What moved the bytes (``thread``: the executor's hand-off between threads; ``ray``:
        Ray channels between actors).

    Returns
    -------
    dict
        ``"src->dst" -> {"latency_s", "bandwidth_Bps", "points"}``.

    Examples
    --------
    >>> from tvm_pesto.cluster import parse_cluster
    >>> c = parse_cluster("2xV100-nvlink")
    >>> fit = fit_links(c, {(0, 1): {0: 1e-5, 1000: 2e-5}}, "thread")
    >>> round(fit["0->1"]["latency_s"] * 1e6, 3), round(fit["0->1"]["bandwidth_Bps"] / 1e6), c.meta["links_measured"]
    (10.0, 100, 'thread')
    """
    points = {}
    for (i, j), pts in pairs.items():
        x = np.array(list(pts.keys()), dtype=np.float64)
        y = np.array(list(pts.values()), dtype=np.float64)
        # relative residuals: sizes span three orders of magnitude, and the small ones fix the latency
        b, a = np.polyfit(x, y, 1, w=1.0 / np.maximum(y, 1e-9))
        a = max(float(a), 1e-7)
        b = max(float(b), 1e-13)
        cluster.latency[i, j] = a
        cluster.bandwidth[i, j] = 1.0 / b
        points[f"{i}->{j}"] = {"latency_s": a, "bandwidth_Bps": 1.0 / b,
                               "points": {str(k): v for k, v in pts.items()}}
    cluster.meta["links_measured"] = engine
    return points
