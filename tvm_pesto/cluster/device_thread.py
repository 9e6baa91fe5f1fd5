"""Run work on a CPU device: a thread pinned to the device's cores with a TVM thread pool of
the device's size. Used both to measure costs and to execute placed modules, so the two
see the same conditions."""
from __future__ import annotations

import os

import tvm


def enter_device_thread(device) -> None:
    """Pin the calling thread to ``device.cpu_ids`` and size TVM's pool to its cores."""
    if device.kind != "cpu":
        return
    # Size TVM's pool first: configuring it re-pins the calling thread (TVM puts its main
    # thread on the first core of its list), which would put every device on core 0.
    cfg = tvm.get_global_func("runtime.config_threadpool", allow_missing=True)
    if cfg is not None:
        cfg(1, max(1, int(device.cores)))
    if device.cpu_ids and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, set(device.cpu_ids))  # 0 = the calling thread on Linux
        except OSError:
            pass
