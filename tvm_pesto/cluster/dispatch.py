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

A switch between libraries on a device: a unit whose backend is not the one of the unit
before it on its device runs slower than it would right after its own library's call (the
library's thread pool wakes, its weights come back into the caches). Its figure,
``switch_s`` (:class:`SwitchFigure`), is a property of a device size of this machine,
fitted on first use beside the dispatch figures and kept in the same record per device
core count (:mod:`tvm_pesto.costs.calibrate.switch`); :func:`set_switch` is the one writer of
``cluster.meta["switch"]`` and :func:`switch_figures` its reader (per device; a device size
without a fit gets :data:`ASSUMED_SWITCH_S`, source ``assumed``). The simulator charges it
once per change of backend between consecutive units in a device's order
(:func:`tvm_pesto.plan.simulate.switch_charges`).

Examples
--------
>>> from tvm_pesto.cluster import parse_cluster
>>> c = parse_cluster("cpu:2")
>>> dispatch_s(c, 1) < dispatch_s(c, 2)
True
>>> dispatch_info(c)["source"]
'assumed'
>>> [f.source for f in switch_figures(c)]
['assumed', 'assumed']
>>> _ = set_switch(c, {1: 3e-6}, "measured", "2026-01-01T00:00:00")
>>> [(f.seconds, f.source) for f in switch_figures(c)]
[(3e-06, 'measured'), (3e-06, 'measured')]
"""
from __future__ import annotations

from dataclasses import dataclass

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


#: Assumed seconds one switch between libraries costs on a device (a device size without a fit
#: of its own on this machine, or a cluster of another machine's devices): the order of
#: magnitude fitted on a 2-vCPU VM (docs/placement.md, "Switches between libraries").
ASSUMED_SWITCH_S = 5e-6


@dataclass(frozen=True)
class SwitchFigure:
    """What one switch between libraries costs on a device: ``seconds``, the device's
    ``cores``, ``source`` (:data:`SOURCES`), ``fitted_at`` (None when assumed) and ``why``
    (for an assumed figure: why no fit applies)."""

    seconds: float
    cores: int
    source: str
    fitted_at: str | None = None
    why: str | None = None

    def to_json(self) -> dict:
        return {"switch_s": self.seconds, "cores": self.cores, "source": self.source, "fitted_at": self.fitted_at,
                **({"why": self.why} if self.why else {})}


def set_switch(cluster: Cluster, per_cores: dict, source: str, fitted_at: str | None = None, **extra) -> dict:
    """Write the switch figures into ``cluster.meta["switch"]`` (the one writer): ``per_cores``
    maps a device core count to seconds per switch on a device of that size; ``extra`` is
    kept beside them (``why``, ``file``, ...).

    Raises
    ------
    ClusterError
        For an unknown source, or a figure that is not a number of seconds >= 0.
    """
    if source not in SOURCES:
        raise ClusterError(f"unknown source {source!r} of switch figures; use one of {', '.join(SOURCES)}")
    figures = {}
    for cores, sec in per_cores.items():
        try:
            figures[str(int(cores))] = float(sec)
        except (TypeError, ValueError):
            raise ClusterError(f"the switch figure for {cores}-core devices is {sec!r}; give seconds >= 0") from None
        if not figures[str(int(cores))] >= 0.0:
            raise ClusterError(f"the switch figure for {cores}-core devices is {sec!r}; give seconds >= 0")
    cluster.meta["switch"] = {"per_cores_s": figures, "source": source, "fitted_at": fitted_at, **extra}
    return cluster.meta["switch"]


def assume_switch(cluster: Cluster, why: str) -> dict:
    """Give ``cluster`` no switch fit: every device gets :data:`ASSUMED_SWITCH_S`, saying ``why``."""
    return set_switch(cluster, {}, "assumed", why=why)


def switch_figures(cluster: Cluster) -> list[SwitchFigure]:
    """Per device of ``cluster``, the seconds one switch between libraries costs there: the
    fit for its core count, or :data:`ASSUMED_SWITCH_S` (source ``assumed``); 0 on a device
    that is not a CPU (the figure is of thread pools and CPU caches)."""
    m = cluster.meta.get("switch") or {}
    per = m.get("per_cores_s") or {}
    out = []
    for dev in cluster.devices:
        cores = int(dev.cores)
        if dev.kind != "cpu":
            out.append(SwitchFigure(0.0, cores, "assumed", None, "not a CPU device: its libraries' kernels go to one "
                                    "stream, with no thread pool to wake"))
        elif str(cores) in per and m.get("source", "measured") != "assumed":
            out.append(SwitchFigure(float(per[str(cores)]), cores, str(m.get("source", "measured")),
                                    m.get("fitted_at")))
        else:
            why = m.get("why") or (f"no fit for {cores}-core devices on this machine" if m
                                   else "no fit of these devices on this machine")
            out.append(SwitchFigure(ASSUMED_SWITCH_S, cores, "assumed", None, why))
    return out


__all__ = ["ASSUMED_DISPATCH", "ASSUMED_SWITCH_S", "DEFAULT_DISPATCH", "EXECUTORS", "FIGURES", "SOURCES",
           "SwitchFigure", "assume_dispatch", "assume_switch", "check_executor", "dispatch_figures", "dispatch_info",
           "dispatch_s", "local_shape", "set_dispatch", "set_switch", "switch_figures"]
