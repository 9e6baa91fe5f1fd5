"""Measure what a switch between libraries costs on a device of this machine, and keep it
beside the executor's dispatch figures (:mod:`tvm_pesto.cluster.dispatch`, ``switch_s``).

A unit of library B right after a unit of library A (A not B) on one device runs slower than
B's unit right after another of B's: B's thread pool sleeps while A computes (ONNX Runtime's
and OpenVINO's workers, PyTorch's OpenMP threads) and must wake, and A's data has taken B's
weights out of the caches. What it costs depends on the pair of libraries, on how long B's
pool slept, on the units' data and on the device's cores, and varies by as much from one fit
to the next on a shared VM (docs/placement.md, "Switches between libraries", has the
measurements): the fit keeps each pair's figure (``pairs_s``, for the record) and one figure
per device size, their median, which the simulator charges once per change of backend on a
device (:func:`tvm_pesto.plan.simulate.switch_charges`).

How it is measured (:func:`measure_switch`, a few seconds): the same small convolution
(:data:`UNIT_SHAPE`) in each library installed here (TVM's VM, ONNX Runtime, OpenVINO,
PyTorch; :func:`switch_units`, the callables a placed module's units are), on a thread pinned
to a device of the size, timed in rotating blocks (:func:`tvm_pesto.costs.measure.blocks.time_blocks`):
each library alone, call after call, and each pair of libraries in turn. A round of the pair
A, B is A after B and B after A: two switches, so one switch of the pair costs
:func:`switch_from_times`, ``(pair - A - B) / 2``, in each round; the pair's figure is its
median over the rounds (:func:`switch_from_rounds`).

:func:`tvm_pesto.costs.calibrate.device_size.keep_device_fits` gives a kept fit of the dispatch
figures the figure of each device size of a cluster that it lacks (measured now, unless
``$TVM_PESTO_MACHINE_CALIBRATION=off``) and :func:`apply_switch` writes the record's figures
into the cluster (source ``measured`` or
``cached``; a device size without one is ``assumed``).

Examples
--------
>>> times = {"tvm": 1e-4, "onnxruntime": 4e-5, "tvm,onnxruntime": 1.5e-4}
>>> switch_s, pairs = switch_from_times(times)
>>> round(switch_s * 1e6, 3), {k: round(v * 1e6, 3) for k, v in pairs.items()}
(5.0, {'tvm,onnxruntime': 5.0})
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from ...cluster.device_thread import enter_device_thread
from ...cluster.dispatch import set_switch
from ...cluster.kernels import compile_for
from ...errors import ClusterError
from ...run.libraries.loaders import onnx_runner, openvino_runner, torch_runner, vm_runner
from ..measure.blocks import time_blocks

#: The libraries whose switches are measured, where installed (TVM always is).
LIBRARIES = ("tvm", "onnxruntime", "openvino", "torch")
#: The unit each library runs: a 3x3 convolution of 16 channels on a 32x32 image (NCHW).
UNIT_SHAPE = (1, 16, 32, 32)
#: Blocks per callable, seconds per block and warm-up per block of the fit's timing.
ROUNDS, BLOCK_S, WARMUP_S = 5, 0.05, 0.01


@dataclass
class SwitchFit:
    """One device size's fit: ``switch_s`` (seconds per switch, the median over
    ``pairs_s``), ``pairs_s`` (per pair of libraries ``"a,b"``, seconds per switch, signed as
    measured: the median over the rounds), ``alone_s`` (each library's call after its own,
    the median block), the device's ``cores``, the
    ``libraries`` timed, the fit's ``seconds`` and the 1-minute ``load`` before and after."""

    cores: int
    switch_s: float
    pairs_s: dict = field(default_factory=dict)
    alone_s: dict = field(default_factory=dict)
    libraries: list = field(default_factory=list)
    fitted_at: str | None = None
    seconds: float = 0.0
    load: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"cores": self.cores, "switch_s": self.switch_s, "pairs_s": self.pairs_s, "alone_s": self.alone_s,
                "libraries": self.libraries, "fitted_at": self.fitted_at, "seconds": self.seconds, "load": self.load}

    @classmethod
    def from_json(cls, data: dict, where: str = "the switch fit") -> "SwitchFit":
        """A fit as :meth:`to_json` wrote it.

        Raises
        ------
        ClusterError
            When ``switch_s`` or ``cores`` is missing or not a number (the message says to delete the file).
        """
        try:
            return cls(int(data["cores"]), float(data["switch_s"]), dict(data.get("pairs_s") or {}),
                       dict(data.get("alone_s") or {}), list(data.get("libraries") or []), data.get("fitted_at"),
                       float(data.get("seconds") or 0.0), list(data.get("load") or []))
        except (KeyError, TypeError, ValueError) as e:
            raise ClusterError(f"{where} is not a switch fit ({type(e).__name__}: {e}); delete the file (the figures "
                               "are fitted again on first use)") from e


def switch_from_times(times: dict) -> tuple[float, dict]:
    """Seconds per switch from the blocks' seconds per call: ``times`` holds each library
    alone (``"a"``) and each pair in turn (``"a,b"``: a call of ``a``, then one of ``b``).
    Returns the median over the pairs (at least 0) and each pair's ``(a,b - a - b) / 2``.

    Raises
    ------
    ClusterError
        When ``times`` holds no pair.
    """
    pairs = {k: (v - sum(times[n] for n in k.split(","))) / 2 for k, v in times.items() if "," in k}
    if not pairs:
        raise ClusterError("a switch between libraries needs two libraries to measure; install onnxruntime, "
                           "openvino or torch beside TVM")
    return max(float(np.median(list(pairs.values()))), 0.0), pairs


def switch_from_rounds(blocks: dict) -> tuple[float, dict]:
    """As :func:`switch_from_times`, from each callable's block medians, one per round
    (``name -> [seconds, ...]``): each pair's figure is the median over the rounds of what
    the round's blocks give (neighbouring blocks share a moment's speed; a slow spell spoils
    one round, not the figure), and the figure the median over the pairs (at least 0).

    Examples
    --------
    >>> blocks = {"a": [1e-4, 2e-4, 1e-4], "b": [4e-5, 4e-5, 8e-5], "a,b": [1.5e-4, 2.5e-4, 3e-4]}
    >>> s, pairs = switch_from_rounds(blocks)
    >>> round(s * 1e6, 3), round(pairs["a,b"] * 1e6, 3)   # the rounds give 5, 5 and 60 us
    (5.0, 5.0)
    """
    rounds = min(len(v) for v in blocks.values())
    per_round = [switch_from_times({n: v[r] for n, v in blocks.items()})[1] for r in range(rounds)]
    pairs = {k: float(np.median([p[k] for p in per_round])) for k in per_round[0]}
    return max(float(np.median(list(pairs.values()))), 0.0), pairs


def _onnx_conv() -> bytes:
    """The unit as an ONNX model (``x`` in, ``y`` out)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    c = UNIT_SHAPE[1]
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((c, c, 3, 3)).astype("float32"), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(UNIT_SHAPE)) for n in ("x", "y")]
    model = helper.make_model(helper.make_graph([node], "switch_unit", io[:1], io[1:], [w]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _tvm_conv(device):
    """The unit compiled by TVM for ``device``: ``f(x, y)`` through the VM."""
    import tvm
    from tvm import relax

    c = UNIT_SHAPE[1]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(UNIT_SHAPE, "float32"))
    w = relax.const(np.random.default_rng(0).standard_normal((c, c, 3, 3)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.conv2d(x, w, padding=1))
        bb.emit_func_output(y)
    vm = relax.VirtualMachine(compile_for(device, bb.get(), "the switch unit"), tvm.cpu())
    return vm_runner(vm["main"], 1, 1)


def switch_units(device, libraries=LIBRARIES) -> dict:
    """The unit in each of ``libraries`` installed here, built for ``device`` (its cores):
    name -> ``f(x, y)`` on TVM tensors, the DPS callables a placed module's units are
    (:mod:`tvm_pesto.run.libraries.loaders`). A library that does not import is left out."""
    cores = max(int(device.cores), 1)
    out = {}
    for lib in libraries:
        try:
            if lib == "tvm":
                out[lib] = _tvm_conv(device)
            elif lib == "onnxruntime":
                out[lib] = onnx_runner(_onnx_conv(), cores)
            elif lib == "openvino":
                out[lib] = openvino_runner(_onnx_conv(), cores)
            elif lib == "torch":
                import torch

                wt = torch.from_numpy(np.random.default_rng(0).standard_normal(
                    (UNIT_SHAPE[1], UNIT_SHAPE[1], 3, 3)).astype("float32"))
                out[lib] = torch_runner(lambda x: torch.nn.functional.conv2d(x, wt, padding=1), 1, cores)
        except ImportError:
            continue
    return out


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def measure_switch(device, libraries=LIBRARIES, rounds: int = ROUNDS, block_s: float = BLOCK_S) -> SwitchFit:
    """Time the switches between ``libraries`` on a thread pinned to ``device`` (a CPU device
    of this machine) and fit seconds per switch (:func:`switch_from_rounds`).

    Raises
    ------
    ClusterError
        When fewer than two of ``libraries`` are installed, or the TVM unit does not build.
    """
    import tvm

    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    box: dict = {}

    def work():
        try:
            enter_device_thread(device)
            units = switch_units(device, libraries)
            x = tvm.runtime.tensor(np.random.default_rng(1).standard_normal(UNIT_SHAPE).astype("float32"))
            ys = {n: tvm.runtime.tensor(np.zeros(UNIT_SHAPE, "float32")) for n in units}
            calls = {n: (lambda f=f, y=ys[n]: f(x, y)) for n, f in units.items()}
            for a, b in combinations(units, 2):
                calls[f"{a},{b}"] = (lambda fa=calls[a], fb=calls[b]: (fa(), fb()))
            box["blocks"] = {n: r["blocks_s"] for n, r in time_blocks(calls, rounds=rounds, warmup_s=WARMUP_S,
                                                                      block_s=block_s, min_calls=5).items()}
            box["libraries"] = list(units)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    th = threading.Thread(target=work, name=f"pesto-switch-{device.name}")
    th.start()
    th.join()
    if "error" in box:
        raise box["error"]
    if len(box.get("libraries", [])) < 2:
        raise ClusterError(f"a switch between libraries needs two libraries to measure; of {', '.join(libraries)} "
                           f"only {', '.join(box.get('libraries', [])) or 'none'} imports here: install onnxruntime, "
                           "openvino or torch beside TVM")
    switch_s, pairs = switch_from_rounds(box["blocks"])
    alone = {n: float(np.median(t)) for n, t in box["blocks"].items() if "," not in n}
    return SwitchFit(int(device.cores), switch_s, pairs, alone, box["libraries"], _now(),
                     round(time.perf_counter() - t0, 2), [load0, os.getloadavg()[0]])


def apply_switch(cluster, record: dict, source: str, path=None) -> dict:
    """Write ``record``'s switch fits into ``cluster`` (:func:`tvm_pesto.cluster.dispatch.set_switch`;
    a device size without one gets the assumed figure)."""
    fits = [SwitchFit.from_json(v, str(path or "the kept fit")) for v in (record.get("switch") or {}).values()]
    fitted = [f.fitted_at for f in fits if f.fitted_at]
    return set_switch(cluster, {f.cores: f.switch_s for f in fits}, source, max(fitted) if fitted else None,
                      **({"file": str(path)} if path else {}))


__all__ = ["BLOCK_S", "LIBRARIES", "ROUNDS", "SwitchFit", "UNIT_SHAPE", "WARMUP_S", "apply_switch",
           "measure_switch", "switch_from_rounds", "switch_from_times", "switch_units"]
