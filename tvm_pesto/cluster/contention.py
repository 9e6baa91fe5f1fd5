"""Measure how much devices that share a memory system slow each other.

Two ``cpu:N`` devices are cores of one machine: they share the last-level cache and the
memory bus, so a kernel runs slower while the other device computes too (GPUs behind one
PCIe switch share the switch in the same way). :func:`measure_contention` runs the same
kernels on each device alone and on every device of a host at once, and stores two factors
per cluster in ``cluster.meta["contention"]``:

* ``compute``: the slowdown of a compute-bound kernel (a matmul, cache resident);
* ``memory``: the slowdown of a memory-bound one (an add over arrays larger than the cache).

The simulator (:func:`tvm_pesto.plan.simulate.simulate`) slows each node by the factor of
its kind (arithmetic intensity below the device's ridge point: ``memory``) for the part of
its run during which another device of its host computes.

Examples
--------
>>> from tvm_pesto.cluster import parse_cluster
>>> c = parse_cluster("cpu:1")
>>> contention_factors(c)          # nothing measured: no slowdown
{'compute': 1.0, 'memory': 1.0}
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from ..errors import ClusterError
from .cluster import Cluster
from .kernels import compile_for

#: The kernels: name -> (kind, builder arguments). 128^3 matmul: ~4 MFLOP on cache-resident
#: operands; the add streams 3 x 16 MiB.
KERNELS = {"matmul": ("compute", 128), "stream-add": ("memory", 1 << 22)}


def contention_factors(cluster: Cluster) -> dict:
    """``{"compute": s, "memory": s}``: the measured slowdowns, 1.0 where none was measured."""
    c = cluster.meta.get("contention") or {}
    return {k: max(float(c.get(k, 1.0)), 1.0) for k in ("compute", "memory")}


def _kernel_module(name: str):
    import tvm
    from tvm import relax

    kind, n = KERNELS[name]
    bb = relax.BlockBuilder()
    if kind == "compute":
        a = relax.Var("a", relax.TensorType((n, n), "float32"))
        b = relax.Var("b", relax.TensorType((n, n), "float32"))
        params, shapes = [a, b], [(n, n), (n, n)]
    else:
        a = relax.Var("a", relax.TensorType((n,), "float32"))
        b = relax.Var("b", relax.TensorType((n,), "float32"))
        params, shapes = [a, b], [(n,), (n,)]
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit_output(relax.op.matmul(a, b) if kind == "compute" else relax.op.add(a, b))
        bb.emit_func_output(y)
    return tvm.IRModule({"main": bb.get()["main"]}), shapes


def _compile(device, name: str):
    mod, shapes = _kernel_module(name)
    return compile_for(device, mod, f"the {name} kernel"), shapes


def _time_on(device, built, barrier, out: dict, repeat: int, min_repeat_ms: int) -> None:
    import tvm
    from tvm import relax

    # lazy: loads TVM, which importing this module does not
    from .device_thread import enter_device_thread

    try:
        enter_device_thread(device)
        ex, shapes = built
        dev = device.tvm_device()
        vm = relax.VirtualMachine(ex, dev)
        rng = np.random.default_rng(0)
        args = [tvm.runtime.tensor(rng.standard_normal(s).astype("float32"), device=dev) for s in shapes]
        vm["main"](*args)
        timer = vm.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)
        if barrier is not None:
            barrier.wait()
        t0 = time.perf_counter()
        res = timer(*args)
        out[device.name] = (float(np.median(res.results)), t0, time.perf_counter())
    except BaseException as e:  # noqa: BLE001 - reported in the caller's thread
        out[device.name] = e
        if barrier is not None:
            barrier.abort()


def _run(devices, name: str, together: bool, repeat: int, min_repeat_ms: int) -> dict:
    """``device name -> (median seconds, wall start, wall end)`` of the kernel on each device,
    one after another or (``together``) all at once from a barrier. Compiled here first:
    TVM's compiler is not run from several threads at once."""
    built = {d.name: _compile(d, name) for d in devices}
    out: dict = {}
    barrier = threading.Barrier(len(devices)) if together else None
    groups = [devices] if together else [[d] for d in devices]
    for grp in groups:
        th = [threading.Thread(target=_time_on, args=(d, built[d.name], barrier, out, repeat, min_repeat_ms))
              for d in grp]
        for t in th:
            t.start()
        for t in th:
            t.join()
    errors = [(d, out.get(d.name)) for d in devices if isinstance(out.get(d.name), BaseException)]
    errors.sort(key=lambda de: isinstance(de[1], threading.BrokenBarrierError))  # the cause first
    if errors:
        d, e = errors[0]
        raise ClusterError(f"timing the {name} kernel on {d.name} failed: {type(e).__name__}: {e}") from e
    return out


def measure_contention(cluster: Cluster, repeat: int = 7, min_repeat_ms: int = 40) -> dict:
    """Time each kernel of :data:`KERNELS` on every present device of each host alone, then
    on all of them at once, and write the median slowdowns into ``cluster.meta["contention"]``.

    Returns
    -------
    dict
        ``{"compute", "memory"}`` (slowdowns, >= 1), ``"kernels"``: per kernel its kind,
        ``alone_s`` / ``together_s`` per device and ``overlap`` (the share of the shortest
        run during which all devices timed at once; near 1 means the figure is sound),
        ``"load"``: the 1-minute load average before and after.

    Raises
    ------
    ClusterError
        When no host has two present devices (nothing can contend), or a kernel fails.
    """
    hosts: dict[int, list] = {}
    for d in cluster.devices:
        if d.present and d.kind == "cpu":
            hosts.setdefault(int(d.host), []).append(d)
    groups = [ds for ds in hosts.values() if len(ds) > 1]
    if not groups:
        raise ClusterError(f"cluster {cluster.name} has no host with two devices on this machine, so nothing can "
                           "slow anything down; measure contention on cpu:2 or more")
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    kernels, by_kind = {}, {"compute": [], "memory": []}
    for name, (kind, _) in KERNELS.items():
        rec = {"kind": kind, "alone_s": {}, "together_s": {}, "overlap": []}
        for devs in groups:
            alone = _run(devs, name, False, repeat, min_repeat_ms)
            both = _run(devs, name, True, repeat, min_repeat_ms)
            start = max(v[1] for v in both.values())
            end = min(v[2] for v in both.values())
            shortest = min(v[2] - v[1] for v in both.values())
            rec["overlap"].append(max(end - start, 0.0) / shortest if shortest > 0 else 0.0)
            for d in devs:
                rec["alone_s"][d.name] = alone[d.name][0]
                rec["together_s"][d.name] = both[d.name][0]
                by_kind[kind].append(both[d.name][0] / alone[d.name][0])
        kernels[name] = rec
    res = {k: max(float(np.median(v)), 1.0) for k, v in by_kind.items()}
    res["kernels"] = kernels
    res["load"] = [load0, os.getloadavg()[0] if hasattr(os, "getloadavg") else None]
    cluster.meta["contention"] = {"compute": res["compute"], "memory": res["memory"],
                                  "measured": time.strftime("%Y-%m-%d %H:%M")}
    return res


__all__ = ["KERNELS", "contention_factors", "measure_contention"]
