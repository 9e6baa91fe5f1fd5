"""Measure the executors' dispatch per run, and keep this machine's fit of it
(:mod:`tvm_pesto.cluster.dispatch`).

Three tiny programs run through the executor itself, on real TVM VMs (a four-float add,
compiled for each device's target), so the figures hold the Python-to-VM calls, the worker
hand-offs or Ray hops, and the tensor conversions a placed module pays
(:func:`dispatch_programs`):

* ``one``: the add on device 0;
* ``there``: the add on device 0, the value copied to device 1, the add there;
* ``back``: as ``there``, then copied back and added on device 0.

``run_s`` is ``one`` minus the add's own time; ``handoff_s`` (``back - there`` minus an
add) what one more transfer costs the executor, and ``crossing_excess_s`` what that is beyond
the link bench's latency (a worker's wake-up, a Ray task's channel write and read), which the
fit adds to every link's latency, so the plan pays it per transfer; ``multi_device_s`` is
``there`` minus two adds and the one transfer the simulator charges for it: what a
multi-device run costs beyond its transfers (:func:`dispatch_from_times`). The thread
executor's programs run interleaved (rounds of each in turn; the median of the round
medians), since a worker's wake-up on a 2-vCPU machine varies by tens of microseconds from
minute to minute; the Ray executor's one after the other, each over its own actors
(:mod:`tvm_pesto.run.ray.timing`), and ``one`` also on a megabyte, for the caller's cost
per byte of input and result (``caller_s_per_byte``).

Machine constants. :func:`machine_dispatch` is the one place that fits, keeps and loads
them: for a cluster of this machine's CPU devices (:func:`tvm_pesto.cluster.dispatch.local_shape`,
at least two devices) it reads the fit kept for this machine, executor and device shape
(:func:`constants_path`, next to the cost model's machine calibration), or measures the
executor's links, its dispatch and the devices' contention now (seconds; over Ray, the
actors' start too; :func:`fit_constants`) and keeps them, then writes them into the cluster,
saying where they came from (``measured`` here and now, ``cached`` with the time of the fit,
or ``assumed``). The simulator charges all three (:func:`tvm_pesto.plan.simulate.simulate`).
The same record keeps what a switch between libraries costs on each device size it met
(:mod:`.switch`: measured the first time a size needs it; a one-device cluster adds its own).
A VM call per segment is not charged apart: the dispatch figures hold one call per device,
and a segment's VM call from Python costs a few microseconds. With
``$TVM_PESTO_MACHINE_CALIBRATION=off`` (:data:`tvm_pesto.costs.calibrate.machine.MACHINE_ENV`) nothing is
fitted on first use (a fit kept earlier still applies); ``refit=True`` (``tvm-pesto run``,
which measures the links it runs on) always measures.

This is the measuring side (it compiles its kernels); a deployed bundle never imports it.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from ...cluster.cold import assume_cold
from ...cluster.contention import measure_contention
from ...cluster.dispatch import (FIGURES, assume_dispatch, assume_switch, check_executor, dispatch_info, local_shape,
                                 set_dispatch)
from ...cluster.kernels import compile_for
from ...cluster.linkbench import fit_links, measure_links
from .machine import MACHINE_ENV, auto_enabled
from .device_size import keep_device_fits
from ..predict.calibration import machine_info, machine_key
from ..store.cache import default_cache_path
from ...errors import ClusterError
from ...jsonio import write_json
from ...run.program import Program, Step
from ...run.ray.executor import measure_ray_links
from ...run.ray.session import RaySession
from ...run.ray.timing import time_ray_programs
from ...run.thread.executor import Executor

#: Format name and version of a kept fit.
FORMAT = "tvm-pesto-machine-constants"
VERSION = 1
#: Least seconds of timed runs per program of the Ray fit (after :data:`RAY_WARMUP` runs).
RAY_MIN_S = 0.2
RAY_WARMUP = 20
#: Bytes of the large input the Ray fit also runs ``one`` on: the caller's hop of an input and a
#: result this size, less the four-float one's, gives its seconds per byte.
RAY_LARGE_BYTES = 1 << 20


def _dispatch_module():
    """The add (of any length) and an empty function, as a Relax module."""
    from tvm import relax, tirx

    bb = relax.BlockBuilder()
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n,), "float32"))
    with bb.function("add", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, relax.const(1.0, "float32")))
        bb.emit_func_output(y)
    z = relax.Var("z", relax.TensorType((n,), "float32"))
    with bb.function("empty", [z]):
        bb.emit_func_output(z)
    return bb.get()


def _kernels(device):
    """``(vm, dev, executable)``: the add and an empty function compiled for ``device``."""
    from tvm import relax

    ex = compile_for(device, _dispatch_module(), "the dispatch kernels")
    dev = device.tvm_device()
    return relax.VirtualMachine(ex, dev), dev, ex


def _add_seconds(vm, dev, x) -> float:
    """The add's own time (TVM's ``time_evaluator``), less an empty function's call."""
    add_s = float(vm.time_evaluator("add", dev, number=200, repeat=5)(x).median)
    empty_s = float(vm.time_evaluator("empty", dev, number=200, repeat=5)(x).median)
    return max(add_s - empty_s, 0.0)


def _two_cpu_devices(cluster, what: str) -> tuple[int, int]:
    devs = [k for k, d in enumerate(cluster.devices) if d.present and d.kind == "cpu"][:2]
    if len(devs) < 2:
        raise ClusterError(f"measuring {what} needs two CPU devices on this machine; {cluster.name} "
                           f"has {len(devs)}: use a cpu:N cluster with N >= 2")
    return devs[0], devs[1]


def dispatch_programs(cluster, a: int, b: int) -> dict:
    """The three measuring programs (``one``, ``there``, ``back``) on devices ``a`` and ``b``
    of ``cluster``, each taking one four-float input on ``a``."""
    def call(out, arg, d):
        return Step("call", out, [arg], device=d, func="add")

    steps = {
        "one": [call("v1:y", "in:x", a)],
        "there": [call("v1:y", "in:x", a), Step("copy", "v2:y", ["v1:y"], device=b), call("v3:z", "v2:y", b)],
        "back": [call("v1:y", "in:x", a), Step("copy", "v2:y", ["v1:y"], device=b), call("v3:z", "v2:y", b),
                 Step("copy", "v4:z", ["v3:z"], device=a), call("v5:w", "v4:z", a)],
    }
    return {name: Program(["in:x"], s, s[-1].out, cluster.num_devices, [a]) for name, s in steps.items()}


def dispatch_from_times(times: dict, kernel_s: float, latency_ab: float, latency_ba: float) -> dict:
    """The dispatch figures from the programs' seconds per run, the add's own seconds and the
    link latencies a→b and b→a (:func:`dispatch_programs`):

    * ``run_s``: ``one`` less the add;
    * ``handoff_s`` (with ``back`` timed): ``back - there`` less an add, what one more
      transfer (and the task after it) costs the executor, and ``crossing_excess_s``, what
      that is beyond the link latency b→a: the executor's own cost per crossing (a thread's
      wake-up, a Ray task's channel write and read), which the fit adds to the links' latency
      (:func:`apply_constants`), so the plan pays it per transfer;
    * ``multi_device_s``: ``there`` less two adds and one transfer at that latency.
    """
    out = {"run_s": max(times["one"] - kernel_s, 0.0)}
    excess = 0.0
    if "back" in times:
        out["handoff_s"] = max(times["back"] - times["there"] - kernel_s, 0.0)
        excess = out["crossing_excess_s"] = max(out["handoff_s"] - latency_ba, 0.0)
    out["link_latency_s"] = latency_ab + excess
    out["multi_device_s"] = max(times["there"] - 2 * kernel_s - out["link_latency_s"], 0.0)
    return out


def _median_run(ex, inputs, repeat: int) -> float:
    for _ in range(max(repeat // 10, 5)):
        ex.run(inputs)
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        ex.run(inputs)
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def measure_dispatch(cluster, repeat: int = 300, rounds: int = 7) -> dict:
    """Time the thread executor's dispatch on the first two present CPU devices of ``cluster``
    and write ``run_s`` and ``multi_device_s`` into ``cluster.meta["dispatch"]`` (source
    ``measured``).

    Returns
    -------
    dict
        ``run_s``, ``multi_device_s``, ``handoff_s``, ``crossing_excess_s``,
        ``link_latency_s`` (a→b, with the excess; seconds), ``programs_s`` (the three
        programs' medians) and ``rounds_s`` (per round), ``add_s`` (the kernel alone, from
        TVM's ``time_evaluator``, less an empty function's call), ``devices`` and ``load``
        (before, after).

    Raises
    ------
    ClusterError
        With fewer than two CPU devices on this machine, or when the kernels do not build.

    Examples
    --------
    >>> from tvm_pesto.cluster import parse_cluster
    >>> c = parse_cluster("cpu:2")
    >>> res = measure_dispatch(c, repeat=50, rounds=3)
    >>> res["run_s"] < res["programs_s"]["there"], c.meta["dispatch"]["source"]
    (True, 'measured')
    """
    import tvm

    a, b = _two_cpu_devices(cluster, "the executor's dispatch")
    load0 = os.getloadavg()[0]
    built = {k: _kernels(cluster.devices[k]) for k in (a, b)}
    vms = {k: vm for k, (vm, _, _) in built.items()}
    vm, dev, _ = built[a]
    x = tvm.runtime.tensor(np.zeros(4, np.float32), device=dev)
    kernel = _add_seconds(vm, dev, x)
    exs = {name: Executor(p, vms, cluster) for name, p in dispatch_programs(cluster, a, b).items()}
    per_round: dict = {name: [] for name in exs}
    try:
        for _ in range(rounds):
            for name, ex in exs.items():
                per_round[name].append(_median_run(ex, [x], repeat))
    finally:
        for ex in exs.values():
            ex.close()
    times = {name: float(np.median(v)) for name, v in per_round.items()}
    res = {**dispatch_from_times(times, kernel, float(cluster.latency[a, b]), float(cluster.latency[b, a])),
           "programs_s": times, "rounds_s": per_round, "add_s": kernel,
           "devices": [cluster.devices[k].name for k in (a, b)], "load": [load0, os.getloadavg()[0]]}
    set_dispatch(cluster, {k: res[k] for k in ("run_s", "multi_device_s", "handoff_s", "crossing_excess_s")},
                 "thread", "measured", _now(), load=res["load"])
    return res


def measure_ray_dispatch(cluster, session=None, programs=("one", "there", "back"), min_s: float = RAY_MIN_S) -> dict:
    """Time the Ray executor's dispatch on the first two present CPU devices of ``cluster``
    (its links measured over Ray first: ``multi_device_s`` is what a run costs beyond the
    link latency the simulator charges) and write it into ``cluster.meta["dispatch"]``
    (executor ``ray``, source ``measured``): ``run_s``, ``multi_device_s`` and
    ``caller_s_per_byte``, what the caller's hop costs per byte of input sent and of result
    read back (``one`` also run on an input of :data:`RAY_LARGE_BYTES`, interleaved with the
    four-float one: the difference less the two adds', over twice the bytes).

    Each of ``programs`` (:func:`dispatch_programs`) runs through a
    :class:`~tvm_pesto.run.ray.executor.RayExecutor` of its own, over actors that load the
    kernels' library as a placed module's actors do (:mod:`tvm_pesto.run.ray.timing`).

    Returns
    -------
    dict
        As :func:`measure_dispatch` (no ``rounds_s``; ``handoff_s`` and
        ``crossing_excess_s`` when ``back`` is timed), with ``caller_s_per_byte`` and
        ``add_large_s``.

    Raises
    ------
    ClusterError
        With fewer than two CPU devices on this machine, or when the kernels do not build.
    ExecutionError
        When Ray cannot start the actors.
    """
    import tvm

    a, b = _two_cpu_devices(cluster, "the Ray executor's dispatch")
    load0 = os.getloadavg()[0]
    built = {k: _kernels(cluster.devices[k]) for k in (a, b)}
    vm, dev, _ = built[a]
    x = tvm.runtime.tensor(np.zeros(4, np.float32), device=dev)
    big = tvm.runtime.tensor(np.zeros(RAY_LARGE_BYTES // 4, np.float32), device=dev)
    kernel, kernel_big = _add_seconds(vm, dev, x), _add_seconds(vm, dev, big)
    progs = dispatch_programs(cluster, a, b)
    runs = {name: (name, [x]) for name in programs}
    runs["one_large"] = ("one", [big])
    times = time_ray_programs(progs, runs, cluster, {k: ex for k, (_, _, ex) in built.items()}, session,
                              warmup=RAY_WARMUP, min_s=min_s)
    per_byte = (times["one_large"] - times["one"] - (kernel_big - kernel)) / (2 * RAY_LARGE_BYTES)
    res = {**dispatch_from_times(times, kernel, float(cluster.latency[a, b]), float(cluster.latency[b, a])),
           "caller_s_per_byte": max(per_byte, 0.0), "programs_s": times, "add_s": kernel, "add_large_s": kernel_big,
           "devices": [cluster.devices[k].name for k in (a, b)], "load": [load0, os.getloadavg()[0]]}
    set_dispatch(cluster, {k: res[k] for k in (*FIGURES, "caller_s_per_byte", "handoff_s", "crossing_excess_s")
                           if k in res}, "ray", "measured", _now(), load=res["load"])
    return res


# -- this machine's constants: fit, keep, load ------------------------------------------------
def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def constants_path(cluster, executor: str) -> Path:
    """Where this machine's fit of ``executor``'s links and dispatch for ``cluster``'s device
    shape is kept: the measurement cache's folder (``~/.cache/tvm-pesto``, or
    ``$TVM_PESTO_CACHE``), under ``machine/``, named by the executor,
    :func:`tvm_pesto.costs.predict.calibration.machine_key` (CPU, cores, host) and the device shape.

    Raises
    ------
    ClusterError
        When ``cluster`` has a device that is not a CPU device of this machine.
    """
    shape = local_shape(cluster)
    if shape is None:
        raise ClusterError(f"{cluster.name} has devices that are not this machine's CPUs; its executor's figures "
                           "cannot be fitted here")
    digest = hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:8]
    return default_cache_path().parent / "machine" / f"{check_executor(executor)}-{machine_key()}-{digest}.json"


def fit_constants(cluster, executor: str, session=None) -> dict:
    """Measure ``executor``'s links between ``cluster``'s devices, its dispatch
    (:func:`measure_dispatch`, :func:`measure_ray_dispatch`) and how much the devices slow
    each other when they compute at once (:func:`tvm_pesto.cluster.contention.measure_contention`:
    on a machine other jobs share, two devices pinned to their cores get less of them than
    one), write them into ``cluster`` and return them as a record :func:`apply_constants`
    reads (what :func:`machine_dispatch` keeps)."""
    check_executor(executor)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    if executor == "ray":
        links = measure_ray_links(cluster, session)
        res = measure_ray_dispatch(cluster, session)
    else:
        links = measure_links(cluster)
        res = measure_dispatch(cluster)
    cont = measure_contention(cluster)
    return {"format": FORMAT, "version": VERSION, "executor": executor, "cluster": cluster.name,
            "shape": local_shape(cluster), "machine": machine_info(),
            "fitted_at": cluster.meta["dispatch"]["fitted_at"],
            "seconds": round(time.perf_counter() - t0, 2), "load": [load0, os.getloadavg()[0]],
            "dispatch": {k: res[k] for k in (*FIGURES, "handoff_s", "crossing_excess_s", "caller_s_per_byte")
                         if k in res},
            "programs_s": res["programs_s"], "add_s": res["add_s"],
            **({"add_large_s": res["add_large_s"]} if "add_large_s" in res else {}), "links": links,
            "contention": {k: cont[k] for k in ("compute", "memory")}}


def apply_constants(cluster, record: dict, source: str, path: str | None = None) -> dict | None:
    """Write a fit (:func:`fit_constants`) into ``cluster``: its dispatch figures, and its
    links (each latency raised by the executor's ``crossing_excess_s``,
    :func:`dispatch_from_times`) and contention, except where a kept (``cached``) fit meets a
    cluster that carries links measured over the same executor already, as a file of
    ``tvm-pesto cluster bench`` does: those stay.

    Returns
    -------
    dict or None
        The links as applied (``"src->dst" -> {"latency_s", "bandwidth_Bps", "points",
        "link_latency_s"}``: ``latency_s`` with the excess, ``link_latency_s`` the link
        fit's), or None when the cluster's own stay.
    """
    executor = record["executor"]
    if source == "cached" and cluster.meta.get("links_measured") == executor:
        applied = None
    else:
        pairs = {}
        for pair, fit in (record.get("links") or {}).items():
            i, j = (int(v) for v in pair.split("->"))
            pairs[(i, j)] = {int(n): float(t) for n, t in fit["points"].items()}
        applied = fit_links(cluster, pairs, executor) if pairs else {}
        excess = float(record["dispatch"].get("crossing_excess_s") or 0.0)
        for i, j in pairs:  # what a crossing costs the executor beyond the link bench's hand-over
            cluster.latency[i, j] += excess
            a = applied[f"{i}->{j}"]
            a["link_latency_s"], a["latency_s"] = a["latency_s"], float(cluster.latency[i, j])
        if record.get("contention"):
            cluster.meta["contention"] = {**record["contention"], "measured": record.get("fitted_at"),
                                          "source": source}
    set_dispatch(cluster, record["dispatch"], executor, source, record.get("fitted_at"),
                 load=record.get("load"), **({"file": str(path)} if path else {}))
    return applied


def load_constants(path: Path) -> dict | None:
    """A kept fit, or None when there is none.

    Raises
    ------
    ClusterError
        When the file is not a readable fit of this format and version (the message says to delete it).
    """
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ClusterError(f"the machine constants in {path} are not readable JSON ({type(e).__name__}: {e}); "
                           "delete the file (they are fitted again on first use)") from e
    if not isinstance(rec, dict) or rec.get("format") != FORMAT or rec.get("version") != VERSION \
            or not all(k in (rec.get("dispatch") or {}) for k in FIGURES):
        raise ClusterError(f"{path} is not a {FORMAT} file of version {VERSION}; delete it (the figures are fitted "
                           "again on first use)")
    return rec


def _one_device(cluster, executor: str) -> dict:
    """A cluster of one device of this machine has no links to fit, and the executor's cost
    per run on one device is a figure of every fit of several: the newest fit kept for this
    machine and executor gives it (source ``cached``, ``from_shape`` naming the fit's
    devices); with none kept, the assumed figures."""
    kept = sorted((default_cache_path().parent / "machine").glob(f"{check_executor(executor)}-{machine_key()}-*.json"),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    for path in kept:
        rec = load_constants(path)
        set_dispatch(cluster, rec["dispatch"], executor, "cached", rec.get("fitted_at"), load=rec.get("load"),
                     file=str(path), from_shape=rec.get("cluster"))
        keep_device_fits(cluster, rec, path, "cached")
        return {**dispatch_info(cluster), "links": None, "file": str(path)}
    why = "one device, and no fit of this executor on this machine kept yet (it is fitted on the first cluster of two " \
          "or more of its devices)"
    assume_dispatch(cluster, executor, why)
    assume_switch(cluster, why)
    assume_cold(cluster, why)
    return {**dispatch_info(cluster), "links": None, "file": None}


def machine_dispatch(cluster, executor: str = "thread", refit: bool = False, session=None,
                     announce: bool = True) -> dict:
    """Give ``cluster`` this machine's figures for ``executor``: links, dispatch, contention.

    * A cluster that carries figures for ``executor`` already (a fit earlier in this process,
      or a file of ``tvm-pesto cluster bench``) keeps them, unless ``refit``.
    * A cluster whose links were measured over another executor (``measure_ray_links`` and
      then a plan for the thread executor) is refused, unless ``refit``: its links would be
      replaced without a word.
    * A cluster whose devices are not all CPU devices of this machine gets the assumed
      figures (:data:`tvm_pesto.cluster.dispatch.ASSUMED_DISPATCH`), and its links stay as
      its spec gives them. One device of this machine takes the dispatch figures of the
      newest fit kept for the executor (it has no links), else the assumed ones.
    * Otherwise the fit kept for this machine, executor and device shape is applied
      (source ``cached``); without one, and unless ``$TVM_PESTO_MACHINE_CALIBRATION`` is
      ``off``, the figures are measured now (:func:`fit_constants`; said on stderr when
      ``announce``) and kept (:func:`constants_path`). ``refit`` measures and keeps
      whatever is kept.

    Parameters
    ----------
    session : RaySession, optional
        The Ray session to fit ``ray`` figures in (default: the one this process is
        connected to, or a local Ray started for the fit and stopped after it).

    Returns
    -------
    dict
        :func:`tvm_pesto.cluster.dispatch.dispatch_info` of the cluster, with ``links`` (the
        links as applied now, :func:`apply_constants`, or None) and ``file`` (the kept fit,
        or None).

    Raises
    ------
    ClusterError
        For an unknown executor, a kept fit that cannot be read, or links measured over
        another executor (without ``refit``).
    CostError
        When ``$TVM_PESTO_MACHINE_CALIBRATION`` holds anything but ``auto`` or ``off``.
    """
    check_executor(executor)
    info = dispatch_info(cluster)
    if info["executor"] == executor and info["source"] != "assumed" and not refit:
        return {**info, "links": None, "file": cluster.meta["dispatch"].get("file")}
    shape = local_shape(cluster)
    if shape is not None and len(shape) == 1:
        return _one_device(cluster, executor)
    over = cluster.meta.get("links_measured")
    if over not in (None, executor) and not refit:
        raise ClusterError(f"{cluster.name}'s links were measured over the {over} executor, and planning for the "
                           f"{executor} executor would replace them with its own: plan for the executor they were "
                           f"measured over (executor={over!r} in tvm_pesto.place and build, --executor {over} "
                           f"in tvm-pesto run), or measure them over the {executor} executor (tvm-pesto cluster "
                           f"bench --executor {executor})")
    if shape is None:
        assume_dispatch(cluster, executor, "devices not on this machine")
        assume_switch(cluster, "devices not on this machine")
        assume_cold(cluster, "devices not on this machine")
        return {**dispatch_info(cluster), "links": None, "file": None}
    path = constants_path(cluster, executor)
    rec = None if refit else load_constants(path)
    if rec is not None:
        links = apply_constants(cluster, rec, "cached", path)
        keep_device_fits(cluster, rec, path, "cached")
        return {**dispatch_info(cluster), "links": links, "file": str(path)}
    if not refit and not auto_enabled():
        assume_dispatch(cluster, executor, f"${MACHINE_ENV}=off and no fit kept for this machine")
        assume_switch(cluster, f"${MACHINE_ENV}=off and no fit kept for this machine")
        assume_cold(cluster, f"${MACHINE_ENV}=off and no fit kept for this machine")
        return {**dispatch_info(cluster), "links": None, "file": None}
    if announce and not refit:
        print(f"tvm-pesto: fitting the {executor} executor's links, dispatch and contention to this machine "
              f"({cluster.name}; "
              f"once, seconds{' after Ray starts its actors' if executor == 'ray' else ''}); kept in {path}. "
              f"${MACHINE_ENV}=off skips it.", file=sys.stderr, flush=True)
    own = None
    if executor == "ray" and session is None:
        session = own = RaySession()
    try:
        rec = fit_constants(cluster, executor, session)
    finally:
        if own is not None:
            own.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(str(path), rec)
    links = apply_constants(cluster, rec, "measured", path)
    keep_device_fits(cluster, rec, path, "measured")
    return {**dispatch_info(cluster), "links": links, "file": str(path)}


__all__ = ["FORMAT", "VERSION", "apply_constants", "constants_path", "dispatch_from_times", "dispatch_programs",
           "fit_constants", "load_constants", "machine_dispatch", "measure_dispatch", "measure_ray_dispatch"]
