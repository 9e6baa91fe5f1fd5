"""What one run of a placed module costs beyond its kernels and transfers: the executor's dispatch.

A placed module is run by the thread executor (:mod:`tvm_pesto.run.thread.executor`) or by the Ray
executor (:mod:`tvm_pesto.run.ray.executor`). Neither is free, and neither is in the plan's
schedule (the solvers' makespan):

* ``run_s``: one run of a one-device program beyond its kernels. Threads: calling the
  segment's VM function from Python and the executor's steps. Ray: the hop from the caller to
  the device's actor and back (the input written to a Ray channel, the actor's task, the
  result read back).
* ``multi_device_s``: one run of a program that uses several devices, beyond the kernels and
  beyond the hand-over of each value between devices, which the plan's link latency already
  charges per transfer. Threads: waking the workers and waiting for the last one. Ray: the
  hops from the caller to the actors and from every device's last task back.

The figures are machine constants: :func:`tvm_pesto.costs.calibrate.dispatch.machine_dispatch` fits them
(with the executor itself, on tiny TVM kernels; the executor's links and the devices'
contention with them) the first time a cluster of this machine's CPU devices needs them,
keeps them per machine, executor and device shape, and writes them into
``cluster.meta["dispatch"]`` with where they came from (:data:`SOURCES`). A cluster
without figures (GPU presets, clusters read from graph files, devices of another machine)
gets the assumed ones of :data:`ASSUMED_DISPATCH`, which a report names as assumed.

The simulator adds the figure for the devices a plan uses to its makespan
(``SimResult.run_s``), so a small model is not split over two devices to save less than the
split costs per run. Under Ray the caller sends each input straight to the actor that reads
it and reads each result from the actor that made it, so no home-device copy is charged,
only the bytes of those hops (``caller_s_per_byte``).

Examples
--------
>>> from tvm_pesto.cluster import parse_cluster
>>> c = parse_cluster("cpu:2")
>>> dispatch_s(c, 1) < dispatch_s(c, 2)
True
>>> dispatch_info(c)["source"]
'assumed'
"""
from __future__ import annotations

from ..errors import ClusterError
from .cluster import Cluster

#: The executors a cluster's dispatch figures can be for.
EXECUTORS = ("thread", "ray")
#: Where figures came from: fitted in this process, read from this machine's cache of an
#: earlier fit, or assumed (no fit for these devices on this machine).
SOURCES = ("measured", "cached", "assumed")
#: The figures the simulator reads.
FIGURES = ("run_s", "multi_device_s")

#: Assumed figures per executor, for clusters without a fit of their own (devices not on this
#: machine, or fitting turned off): orders of magnitude from fits on a 2-vCPU VM, not a
#: property of any other machine. Ray's also hold ``caller_s_per_byte``, what the caller's
#: hops cost per byte of the inputs it sends and the results it reads back.
ASSUMED_DISPATCH = {
    "thread": {"run_s": 2.4e-6, "multi_device_s": 41.8e-6},
    "ray": {"run_s": 800e-6, "multi_device_s": 1000e-6, "caller_s_per_byte": 0.25e-9},
}
#: The thread executor's assumed figures (the executor a cluster without figures is run by).
DEFAULT_DISPATCH = ASSUMED_DISPATCH["thread"]


def check_executor(executor: str) -> str:
    """``executor`` if it is one of :data:`EXECUTORS`.

    Raises
    ------
    ClusterError
        For any other name (the message lists the known ones).
    """
    if executor not in EXECUTORS:
        raise ClusterError(f"unknown executor {executor!r}; use one of {', '.join(EXECUTORS)}")
    return executor


def dispatch_info(cluster: Cluster) -> dict:
    """The cluster's dispatch figures and where they came from: ``run_s``,
    ``multi_device_s`` (and for Ray ``caller_s_per_byte``), ``executor``, ``source``
    (:data:`SOURCES`; figures without one, as in a file of ``tvm-pesto cluster bench``, count
    as measured), ``fitted_at`` (ISO time of the fit, None when assumed or unknown),
    ``measured`` (fitted on a machine, not assumed) and ``why`` (for assumed figures: why no
    fit applies)."""
    m = dict(cluster.meta.get("dispatch") or {})
    executor = str(m.get("executor", "thread"))
    have = all(m.get(k) is not None for k in FIGURES)
    source = str(m.get("source", "measured")) if have else "assumed"
    assumed = ASSUMED_DISPATCH.get(executor, DEFAULT_DISPATCH)
    figures = ({k: max(float(m[k]), 0.0) for k in FIGURES} if have else dict(assumed))
    if executor == "ray":  # a fit without a per-byte figure (an older one) gets the assumed one
        figures["caller_s_per_byte"] = max(float(m["caller_s_per_byte"] if m.get("caller_s_per_byte") is not None
                                                  else assumed["caller_s_per_byte"]), 0.0)
    out = {**figures, "executor": executor, "source": source, "fitted_at": m.get("fitted_at") if have else None,
           "measured": source != "assumed"}
    if source == "assumed":
        out["why"] = m.get("why") or "no fit of these devices on this machine"
    return out


def dispatch_figures(cluster: Cluster) -> dict:
    """``{"run_s", "multi_device_s", "measured"}``: the figures :func:`dispatch_info` gives,
    and whether they were measured (fitted on a machine) rather than assumed."""
    info = dispatch_info(cluster)
    return {k: info[k] for k in (*FIGURES, "measured")}


def dispatch_s(cluster: Cluster, devices_used: int) -> float:
    """Seconds of dispatch per run of a program on ``devices_used`` devices (0 for none)."""
    if devices_used <= 0:
        return 0.0
    f = dispatch_info(cluster)
    return f["run_s"] if devices_used == 1 else f["multi_device_s"]


def set_dispatch(cluster: Cluster, figures: dict, executor: str, source: str, fitted_at: str | None = None,
                 **extra) -> dict:
    """Write dispatch figures into ``cluster.meta["dispatch"]`` (the one writer): ``figures``
    holds at least :data:`FIGURES`; ``extra`` is kept beside them (``why``, ``file``, ...)."""
    check_executor(executor)
    if source not in SOURCES:
        raise ClusterError(f"unknown source {source!r} of dispatch figures; use one of {', '.join(SOURCES)}")
    missing = [k for k in FIGURES if k not in figures]
    if missing:
        raise ClusterError(f"dispatch figures lack {', '.join(missing)}; give {', '.join(FIGURES)} in seconds")
    cluster.meta["dispatch"] = {**figures, "executor": executor, "source": source, "fitted_at": fitted_at, **extra}
    return cluster.meta["dispatch"]


def assume_dispatch(cluster: Cluster, executor: str, why: str) -> dict:
    """Give ``cluster`` the assumed figures of ``executor`` (:data:`ASSUMED_DISPATCH`),
    saying ``why`` no fit applies."""
    return set_dispatch(cluster, {k: None for k in FIGURES}, executor, "assumed", why=why)


def local_shape(cluster: Cluster) -> list | None:
    """The shape of ``cluster``'s devices when all of them are CPU devices of this machine
    (present, not measured over RPC, on a host without a remote address), else None: one
    ``[cores, cpu ids]`` per device. With at least two devices, a fit of the executor's
    figures is possible here (:func:`tvm_pesto.costs.calibrate.dispatch.machine_dispatch`)."""
    hosts = cluster.hosts or []
    for dev in cluster.devices:
        if not dev.present or dev.remote or dev.kind != "cpu":
            return None
        if dev.host < len(hosts) and hosts[dev.host].address:
            return None
    return [[int(dev.cores), [int(c) for c in dev.cpu_ids]] for dev in cluster.devices]


__all__ = ["ASSUMED_DISPATCH", "DEFAULT_DISPATCH", "EXECUTORS", "FIGURES", "SOURCES", "assume_dispatch",
           "check_executor", "dispatch_figures", "dispatch_info", "dispatch_s", "local_shape",
           "set_dispatch"]
