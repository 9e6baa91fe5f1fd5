"""A placed model ready to run: per-device VMs and the program that drives them.

:class:`PlacedRuntime` is what :func:`tvm_pesto.load` returns for an exported bundle and
what :class:`~tvm_pesto.builder.placed.PlacedModule` (a freshly built model) extends. It
needs TVM's runtime only.
"""
from __future__ import annotations

import time

import numpy as np

from ..errors import ExecutionError
from .executor import Executor, to_numpy


class PlacedRuntime:
    """Call it like a function on numpy arrays (returns numpy) or TVM tensors (returns TVM
    tensors). ``vms`` maps a device index to its ``VirtualMachine`` (only devices on this
    machine); ``program`` says which segment runs where and what moves between devices.

    The worker threads (one per device) start on the first call. :meth:`close` stops and
    joins them; a closed module called again starts new ones. A failing segment raises
    :class:`~tvm_pesto.errors.ExecutionError` naming the device, the segment and the
    original error; when the failure left the executor unusable (a worker thread gone), the
    module drops it, and its next call starts new workers. Ctrl-C during a call stops the
    run and propagates; the module stays usable.
    """

    def __init__(self, program, vms: dict, cluster, plan_info: dict | None = None):
        self.program = program
        self.vms = vms
        self.cluster = cluster
        self.plan_info = plan_info or {}
        self._executor = None
        self.last_trace: list = []

    @property
    def devices_used(self) -> list[int]:
        return sorted({s.device for s in self.program.calls()})

    def _exec(self) -> Executor:
        if self._executor is None:
            missing = [d for d in self.devices_used if d not in self.vms]
            if missing:
                raise ExecutionError(f"devices {missing} ({[self.cluster.devices[d].name for d in missing]}) are not "
                                     "on this machine; the plan can be simulated and exported, not run here")
            self._executor = Executor(self.program, self.vms, self.cluster)
        return self._executor

    def _inputs(self, args):
        import tvm

        if len(args) != len(self.program.inputs):
            raise ExecutionError(f"the module takes {len(self.program.inputs)} inputs "
                                 f"({', '.join(k.split(':', 1)[1] for k in self.program.inputs)}), got {len(args)}")
        dev0 = self.cluster.devices[0].tvm_device()
        out = []
        for a in args:
            if isinstance(a, tvm.runtime.Tensor):
                out.append(a if a.device == dev0 else a.copyto(dev0))
            else:
                out.append(tvm.runtime.tensor(np.ascontiguousarray(a), device=dev0))
        return out

    def _run(self, ex: Executor, inputs, trace=None):
        try:
            return ex.run(inputs, trace=trace)
        except ExecutionError:
            if ex.broken is not None and ex is self._executor:  # a worker is gone: the next call starts anew
                try:
                    self.close(timeout=1.0)
                except ExecutionError:  # a live worker still in a step: its thread ends after it
                    pass
            raise

    def __call__(self, *args):
        as_numpy = any(isinstance(a, np.ndarray) for a in args)
        res = self._run(self._exec(), self._inputs(args))
        return to_numpy(res) if as_numpy else res

    def run_traced(self, *args):
        trace: list = []
        res = self._run(self._exec(), self._inputs(args), trace=trace)
        self.last_trace = trace
        return res, trace

    def benchmark(self, *args, repeat: int = 20, warmup: int = 3) -> dict:
        """Wall-clock seconds per run (median, min, max over ``repeat`` runs)."""
        ex = self._exec()
        inputs = self._inputs(args)
        for _ in range(warmup):
            self._run(ex, inputs)
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            self._run(ex, inputs)
            times.append(time.perf_counter() - t)
        return {"median_s": float(np.median(times)), "min_s": float(np.min(times)),
                "max_s": float(np.max(times)), "repeat": repeat}

    def close(self, timeout: float | None = None):
        """Stop and join the worker threads (see :meth:`Executor.close`); the next call
        starts new ones."""
        ex, self._executor = self._executor, None
        if ex is not None:
            ex.close(timeout)

    def __del__(self):
        try:
            self.close(timeout=1.0)  # a finalizer must not hang on a step that does not end
        except Exception:  # noqa: BLE001
            pass


__all__ = ["PlacedRuntime"]
