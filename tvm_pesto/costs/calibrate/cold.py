"""Measure what a library call costs more after the rest of a model has run, on a device of
this machine, and keep it beside the executor's dispatch figures (:mod:`tvm_pesto.cluster.cold`).

How it is measured (:func:`measure_cold`, a few seconds): ONNX Runtime units of
:data:`UNIT_BYTES` bytes of weights (a chain of matrix-vector products: all reads, no compute
to hide them), on a thread pinned to a device of the size, through the callables a placed
module's units are (:func:`tvm_pesto.run.libraries.loaders.onnx_runner`). Each unit is timed
call after call (its loop, as a candidate's measurement is), and then with
:data:`FLUSH_BYTES` bytes of a buffer written before each call, as the rest of a model's
units would between two of its calls. The grid (``extra_s``) keeps the median call's seconds
over the loop's, made non-decreasing in both the bytes written and the unit's weights (a
larger unit or more bytes in between never costs less: what is left is noise). The same is
timed with another unit of the library called between the writes and the call
(``warm_code_s``, kept for the record): the part of ``extra_s`` that is the library's code and
shared state rather than the unit's own weights, which a unit right after another of its
library's does not pay.

Measured on a 2-vCPU Xeon VM (family 6 model 167, 2 MiB of L2 per core), one core (the fit
kept there, 2026-12-07 21:38, 2.9 s): a unit of 16 KiB of weights ran 4.8 us in its loop and
46-187 us more after 4-256 MiB were written, 11-32 us more with another unit of the library
called in between; a unit of 2 MiB 75 us in its loop, 291 us more after 256 MiB (159 with the
other call); one of 16 MiB 690 us, 985 us more after 256 MiB (831). In mixed plans of corpus models (``lab/scripts/cold_units.py``, two
one-core devices, plans made on the loops' seconds, two runs each) the ONNX Runtime units'
calls took 8.2-8.6 ms more in the run than in their loops in inception_v3 (91 units), 0.53-0.64
ms in mobilenetv3_large_100 (21) and 0.09-0.11 ms in resnet18 (7): ``extra_s`` gives 11.8-12.4,
1.35-1.47 and 0.40, ``warm_code_s`` 3.3, 0.29 and 0.11. The costs take ``extra_s``: it errs towards
fewer, larger library calls, which on this machine is what measures faster.

:func:`tvm_pesto.costs.calibrate.device_size.keep_device_fits` gives a kept fit the grid of each
device size of a cluster that it lacks (measured now, unless ``$TVM_PESTO_MACHINE_CALIBRATION=off``),
and :func:`apply_cold` writes the record's grids into the cluster (:func:`tvm_pesto.cluster.cold.set_cold`).
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from ...cluster.cold import check_grid, set_cold
from ...cluster.device_thread import enter_device_thread
from ...errors import ClusterError
from ...run.libraries.loaders import onnx_runner

#: The bytes written between two calls of a unit, and the units' bytes of weights.
FLUSH_BYTES = (1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20)
UNIT_BYTES = (16 << 10, 2 << 20, 16 << 20)
#: Calls timed per unit in its loop and per flush size (their median is kept), warm-up calls.
CALLS, WARMUP = 15, 5


def _matvec_chain(nbytes: int) -> tuple[bytes, int]:
    """An ONNX model of ``nbytes`` bytes of float32 weights: a chain of ``[1, k] x [k, k]``
    products (``x`` in, ``y`` out); returns the model and ``k``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    k = 512 if nbytes >= 512 * 512 * 4 else int(np.sqrt(nbytes / 4))
    n = max(1, int(nbytes // (k * k * 4)))
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((k, k)) / np.sqrt(k)).astype("float32"), f"w{i}")
             for i in range(n)]
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], ["y" if i == n - 1 else f"h{i}"])
             for i in range(n)]
    io = [helper.make_tensor_value_info(v, TensorProto.FLOAT, [1, k]) for v in ("x", "y")]
    model = helper.make_model(helper.make_graph(nodes, "cold_unit", io[:1], io[1:], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString(), k


def _median_call(call, flush=None, n: int = 0, calls: int = CALLS, before=None) -> float:
    """The median seconds of ``calls`` calls, each after writing ``n`` bytes of ``flush`` (one
    byte per 64-byte line) when given, and then calling ``before`` when given."""
    out = []
    for _ in range(calls):
        if flush is not None:
            flush[:n:64] += 1
        if before is not None:
            before()
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
    return float(np.median(out))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def measure_cold(device, flush_bytes=FLUSH_BYTES, unit_bytes=UNIT_BYTES, calls: int = CALLS) -> dict:
    """Time ONNX Runtime units of ``unit_bytes`` of weights on a thread pinned to ``device`` (a
    CPU device of this machine) in a loop and after ``flush_bytes`` were written, without and
    with another unit called in between (a second session of the smallest unit); returns the
    grid (:func:`tvm_pesto.cluster.cold.check_grid`) with ``warm_code_s`` (the grid of the
    calls after another unit), the loops' seconds (``loop_s``), the
    device's ``cores``, ``fitted_at``, the fit's ``seconds`` and the 1-minute ``load`` before
    and after.

    Raises
    ------
    ClusterError
        When ONNX Runtime (or onnx) does not import here.
    """
    import tvm

    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    box: dict = {}

    def work():
        try:
            enter_device_thread(device)
            calls_of = []
            for nbytes in unit_bytes:
                model, k = _matvec_chain(int(nbytes))
                f = onnx_runner(model, max(int(device.cores), 1))
                x = tvm.runtime.tensor(np.ones((1, k), "float32"))
                y = tvm.runtime.tensor(np.zeros((1, k), "float32"))
                calls_of.append(lambda f=f, x=x, y=y: f(x, y))
            model, k = _matvec_chain(int(unit_bytes[0]))
            g, xp, yp = onnx_runner(model, max(int(device.cores), 1)), *(tvm.runtime.tensor(
                np.ones((1, k), "float32")) for _ in range(2))
            flush = np.zeros(int(max(flush_bytes)), dtype=np.uint8)
            for call in calls_of:
                _median_call(call, calls=WARMUP)
            loop = [_median_call(call, calls=calls) for call in calls_of]
            cold, warm = [], []
            for n in flush_bytes:
                cold.append([_median_call(call, flush, int(n), calls) for call in calls_of])
                warm.append([_median_call(call, flush, int(n), calls, lambda: g(xp, yp)) for call in calls_of])
            box["loop"], box["cold"], box["warm"] = loop, cold, warm
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    th = threading.Thread(target=work, name=f"pesto-cold-{device.name}")
    th.start()
    th.join()
    if isinstance(box.get("error"), ImportError):
        raise ClusterError(f"the cold-call fit times ONNX Runtime units, and {box['error']}: install onnxruntime "
                           "and onnx (pip install tvm-pesto installs both)") from box["error"]
    if "error" in box:
        raise box["error"]

    def over_loop(times):
        extra = np.maximum(np.array(times) - np.array(box["loop"])[None, :], 0.0)
        return np.maximum.accumulate(np.maximum.accumulate(extra, axis=0), axis=1).tolist()  # what is left is noise

    grid = check_grid({"flush_bytes": list(flush_bytes), "unit_bytes": list(unit_bytes),
                       "extra_s": over_loop(box["cold"])}, "the measured grid")
    return {**grid, "warm_code_s": over_loop(box["warm"]), "loop_s": box["loop"], "cores": int(device.cores), "fitted_at": _now(),
            "seconds": round(time.perf_counter() - t0, 2), "load": [load0, os.getloadavg()[0]]}


def apply_cold(cluster, record: dict, source: str, path=None) -> dict:
    """Write ``record``'s grids into ``cluster`` (:func:`tvm_pesto.cluster.cold.set_cold`; a
    device size without one gets the assumed grid)."""
    grids = {c: g for c, g in (record.get("cold") or {}).items()}
    fitted = [g.get("fitted_at") for g in grids.values() if g.get("fitted_at")]
    return set_cold(cluster, grids, source, max(fitted) if fitted else None, **({"file": str(path)} if path else {}))


__all__ = ["CALLS", "FLUSH_BYTES", "UNIT_BYTES", "apply_cold", "measure_cold"]
