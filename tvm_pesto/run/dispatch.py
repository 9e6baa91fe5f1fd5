"""Measure the thread executor's dispatch per run (:mod:`tvm_pesto.cluster.dispatch`).

Three tiny programs run through :class:`~tvm_pesto.run.executor.Executor` itself, on real
TVM VMs (a four-float add, compiled for each device's target), so the figures hold the
Python-to-VM calls and the worker hand-offs a placed module pays:

* ``one``: the add on device 0 (the calling thread runs it);
* ``there``: the add on device 0, the value copied to device 1, the add there;
* ``back``: as ``there``, then copied back and added on device 0.

The three run interleaved (rounds of each in turn; the median of the round medians), since a
worker's wake-up on this 2-vCPU machine varies by tens of microseconds from minute to minute.
``run_s`` is ``one`` minus the add's own time; ``multi_device_s`` is ``there`` minus two adds
and the one transfer the simulator charges for it (the cluster's link latency): what a
multi-device run costs beyond its transfers. ``handoff_s`` (``back - there`` minus an add:
what one more transfer costs) is reported next to that latency, to check it.

This is the measuring side (it compiles its kernels); a deployed bundle never imports it.
"""
from __future__ import annotations

import os
import time

import numpy as np

from ..cluster.kernels import compile_for
from ..errors import ClusterError


def _kernels(device):
    """``(vm, dev)``: the add and an empty function compiled for ``device``."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("add", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, relax.const(1.0, "float32")))
        bb.emit_func_output(y)
    z = relax.Var("z", relax.TensorType((4,), "float32"))
    with bb.function("empty", [z]):
        bb.emit_func_output(z)
    ex = compile_for(device, bb.get(), "the dispatch kernels")
    dev = device.tvm_device()
    return relax.VirtualMachine(ex, dev), dev


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
    """Time the executor's dispatch on the first two present CPU devices of ``cluster`` and
    write ``run_s`` and ``multi_device_s`` into ``cluster.meta["dispatch"]``.

    Returns
    -------
    dict
        ``run_s``, ``multi_device_s``, ``handoff_s``, ``link_latency_s`` (seconds),
        ``programs_s`` (the three programs' medians) and ``rounds_s`` (per round), ``add_s`` (the kernel alone, from TVM's ``time_evaluator``,
        less an empty function's call), ``devices`` and ``load`` (before, after).

    Raises
    ------
    ClusterError
        With fewer than two CPU devices on this machine, or when the kernels do not build.

    Examples
    --------
    >>> from tvm_pesto.cluster import parse_cluster
    >>> c = parse_cluster("cpu:2")
    >>> measure_dispatch(c)["multi_device_s"] > 0    # doctest: +SKIP
    True
    """
    import tvm

    from .executor import Executor
    from .program import Program, Step

    devs = [k for k, d in enumerate(cluster.devices) if d.present and d.kind == "cpu"][:2]
    if len(devs) < 2:
        raise ClusterError(f"measuring the executor's dispatch needs two CPU devices on this machine; {cluster.name} "
                           f"has {len(devs)}: use a cpu:N cluster with N >= 2")
    load0 = os.getloadavg()[0]
    a, b = devs
    built = {k: _kernels(cluster.devices[k]) for k in devs}
    vms = {k: vm for k, (vm, _) in built.items()}
    x = tvm.runtime.tensor(np.zeros(4, np.float32), device=built[a][1])
    vm, dev = built[a]
    add_s = float(vm.time_evaluator("add", dev, number=200, repeat=5)(x).median)
    empty_s = float(vm.time_evaluator("empty", dev, number=200, repeat=5)(x).median)
    kernel = max(add_s - empty_s, 0.0)

    def call(out, arg, d):
        return Step("call", out, [arg], device=d, func="add")

    programs = {
        "one": [call("v1:y", "in:x", a)],
        "there": [call("v1:y", "in:x", a), Step("copy", "v2:y", ["v1:y"], device=b), call("v3:z", "v2:y", b)],
        "back": [call("v1:y", "in:x", a), Step("copy", "v2:y", ["v1:y"], device=b), call("v3:z", "v2:y", b),
                 Step("copy", "v4:z", ["v3:z"], device=a), call("v5:w", "v4:z", a)],
    }
    exs = {name: Executor(Program(["in:x"], steps, steps[-1].out, cluster.num_devices, [a]), vms, cluster)
           for name, steps in programs.items()}
    per_round: dict = {name: [] for name in exs}
    try:
        for _ in range(rounds):
            for name, ex in exs.items():
                per_round[name].append(_median_run(ex, [x], repeat))
    finally:
        for ex in exs.values():
            ex.close()
    times = {name: float(np.median(v)) for name, v in per_round.items()}
    latency = float(cluster.latency[a, b])
    res = {
        "run_s": max(times["one"] - kernel, 0.0),
        "multi_device_s": max(times["there"] - 2 * kernel - latency, 0.0),
        "handoff_s": max(times["back"] - times["there"] - kernel, 0.0), "link_latency_s": latency,
        "programs_s": times, "rounds_s": per_round, "add_s": kernel,
        "devices": [cluster.devices[k].name for k in devs], "load": [load0, os.getloadavg()[0]],
    }
    cluster.meta["dispatch"] = {k: res[k] for k in ("run_s", "multi_device_s", "handoff_s")}
    return res


__all__ = ["measure_dispatch"]
