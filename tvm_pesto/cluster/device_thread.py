"""Run work on a CPU device: a thread pinned to the device's cores with a TVM thread pool of
the device's size. Used both to measure costs and to execute placed modules, so the two
see the same conditions.

A thread that cannot be pinned (the cores are not on this machine, the process may not use
them, the OS has no ``sched_setaffinity``) still runs, on any core, so its costs and run
times are not those the plan assumed. That is said: :func:`enter_device_thread` returns the
reason, :func:`pinning_failures` keeps it per device for the process (what run reports
show), and a ``RuntimeWarning`` names the device, once per device per process.

Examples
--------
>>> import threading
>>> from tvm_pesto.cluster import parse_cluster
>>> device = parse_cluster("cpu:1").devices[0]        # one core of this machine
>>> got = []
>>> worker = threading.Thread(target=lambda: got.append(enter_device_thread(device)))
>>> worker.start(); worker.join()
>>> got                                               # pinned: no reason to give
[None]
"""
from __future__ import annotations

import os
import threading
import warnings

import tvm

_FAILURES: dict[str, str] = {}
_LOCK = threading.Lock()


def enter_device_thread(device) -> str | None:
    """Pin the calling thread to ``device.cpu_ids`` and size TVM's pool to its cores.

    Returns
    -------
    str or None
        Why the thread could not be pinned (it then runs on any core), or None when it was
        pinned or there was nothing to pin (not a CPU device, no ``cpu_ids``).
    """
    if device.kind != "cpu":
        return None
    # Size TVM's pool first: configuring it re-pins the calling thread (TVM puts its main
    # thread on the first core of its list), which would put every device on core 0.
    cfg = tvm.get_global_func("runtime.config_threadpool", allow_missing=True)
    if cfg is not None:
        cfg(1, max(1, int(device.cores)))
    if not device.cpu_ids:
        return None
    if not hasattr(os, "sched_setaffinity"):
        why = "this OS has no os.sched_setaffinity"
    else:
        try:
            os.sched_setaffinity(0, set(device.cpu_ids))  # 0 = the calling thread on Linux
            return None
        except OSError as e:
            why = f"os.sched_setaffinity failed: {type(e).__name__}: {e}"
    _record(device, why)
    return why


def _record(device, why: str) -> None:
    name = str(getattr(device, "name", device))
    with _LOCK:
        first = name not in _FAILURES
        _FAILURES[name] = why
    if first:
        warnings.warn(f"device {name}: the thread could not be pinned to cores {list(device.cpu_ids)} ({why}); it "
                      "runs on any core, so its measured costs and run times may differ from the plan's",
                      RuntimeWarning, stacklevel=3)


def pinning_failures() -> dict[str, str]:
    """Device name -> why a thread of it could not be pinned, for every such device of this
    process (the latest reason); empty when every pinning succeeded."""
    with _LOCK:
        return dict(_FAILURES)


def owns_every_core(cores: int) -> bool:
    """Whether a device of ``cores`` cores has every core this process may use (no other
    device of this machine to take cores from).

    Examples
    --------
    >>> owns_every_core(1 << 20), owns_every_core(0)
    (True, False)
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 1
    return int(cores) >= usable


__all__ = ["enter_device_thread", "owns_every_core", "pinning_failures"]
