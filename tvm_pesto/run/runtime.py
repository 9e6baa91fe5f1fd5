"""A placed model ready to run: per-device VMs and the program that drives them.

:class:`PlacedRuntime` is what :func:`tvm_pesto.load` returns for an exported bundle and
what :class:`~tvm_pesto.builder.placed.PlacedModule` (a freshly built model) extends. It
needs TVM's runtime only.
"""
from __future__ import annotations

import time

import numpy as np
import tvm
import tvm_ffi

from ..errors import ExecutionError, error_line
from .libraries.loaders import direct_call
from .ray.executor import DEFAULT_TIMEOUT_S, use_ray
from .thread.executor import Executor, TraceEvent, to_numpy
from .torch_io import as_torch, from_torch

#: Least seconds :meth:`PlacedRuntime.benchmark` times and warms up for (a 40-µs model: 5,000
#: timed runs after 1,250 warm-up runs; a 3-ms one: 67 after 17).
BENCH_MIN_S = 0.2
BENCH_WARMUP_S = 0.05
#: Bytes TVM's kernels expect a tensor's data to be aligned to.
ALIGN = 64


class PlacedRuntime:
    """Call it like a function on numpy arrays (returns numpy), torch tensors (returns torch
    tensors sharing the outputs' memory; a CPU tensor goes in as a numpy view) or TVM tensors
    (returns TVM tensors). ``vms`` maps a device index to its ``VirtualMachine`` (only devices on this
    machine); ``program`` says which segment runs where and what moves between devices.

    The worker threads (one per device) start on the first call. :meth:`close` stops and
    joins them; a closed module called again starts new ones. A failing segment raises
    :class:`~tvm_pesto.errors.ExecutionError` naming the device, the segment and the
    original error; when the failure left the executor unusable (a worker thread gone), the
    module drops it, and its next call starts new workers. Ctrl-C during a call stops the
    run and propagates; the module stays usable.

    Inputs go to the device the program names for them (``program.input_devices``; device 0
    unless the placement put them elsewhere). A program with *state* (``program.state``:
    outputs that are the next values of inputs, e.g. a training step's parameters) is
    driven with :meth:`set_state` once and :meth:`step` per run: the state stays on its
    devices as TVM tensors, each run's new values become the next run's inputs, and only
    the other outputs are returned.
    """

    def __init__(self, program, vms: dict, cluster, plan_info: dict | None = None):
        self.program = program
        self.vms = vms
        self.cluster = cluster
        self.plan_info = plan_info or {}
        self._executor = None
        self.last_trace: list = []
        self._state: dict = {}  # input index -> its current value (a TVM tensor on its device)
        #: What :func:`tvm_pesto.build` weighed before choosing this module (:mod:`tvm_pesto.choose`).
        self.decision = None  # the final choice's Decision (tvm_pesto.choose.decision), once made
        self._direct = _direct(program)  # held here: the model owns its one unit's call
        self._devs = [dev.tvm_device() for dev in cluster.devices]
        self._torch_views: dict = {}  # the last call's views of its torch inputs (torch_io.from_torch)

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
        if len(args) != len(self.program.inputs):
            raise ExecutionError(f"the module takes {len(self.program.inputs)} inputs "
                                 f"({', '.join(k.split(':', 1)[1] for k in self.program.inputs)}), got {len(args)}")
        return [self._on_device(a, d) for a, d in zip(args, self.program.input_devices)]

    def _on_device(self, value, d: int):
        """``value`` (numpy or a TVM tensor) as a TVM tensor on device ``d`` (a numpy
        array is copied: the module's units may keep or reuse their input buffers)."""
        dev = self._devs[d]
        if isinstance(value, tvm.runtime.Tensor):
            return value if value.device == dev else value.copyto(dev)
        arr = np.asarray(value, order="C")  # keeps 0-d arrays 0-d
        if dev.dlpack_device_type() == 1:  # host memory: copied through a view, not TVM's slower copy
            try:
                return _host_copy(arr, dev)
            except (TypeError, BufferError, RuntimeError, ValueError):  # a dtype without a DLPack view
                pass
        return tvm.runtime.tensor(arr, device=dev)

    # -- state that stays on its device between runs ----------------------------------
    def _state_inputs(self) -> list[int]:
        if not self.program.state:
            raise ExecutionError("this module has no state (no output is the next value of an input); call it "
                                 "directly instead of set_state/step")
        return [i for _, i in self.program.state]

    def set_state(self, values) -> None:
        """Put the state inputs' values (one per ``program.state`` pair, in that order) on
        their devices; :meth:`step` then carries them from run to run."""
        ins = self._state_inputs()
        values = list(values)
        if len(values) != len(ins):
            raise ExecutionError(f"the module has {len(ins)} state inputs, got {len(values)} values")
        values, _ = from_torch(values)
        self._state = {i: self._on_device(v, self.program.input_devices[i]) for i, v in zip(ins, values)}

    def state(self) -> list[np.ndarray]:
        """The current state values, copied to the host (in ``program.state`` order)."""
        ins = self._state_inputs()
        if not self._state:
            raise ExecutionError("the state is not set; call set_state(values) first")
        return [self._state[i].numpy() for i in ins]

    def step(self, *args, trace: list | None = None):
        """Run once on the non-state inputs ``args`` (in input order) and the current state;
        keep the new state on its devices and return the other outputs (one value, or a
        tuple), as TVM tensors (torch tensors when ``args`` has one).

        Raises
        ------
        ExecutionError
            When the state is not set, or the number of inputs is wrong.
        """
        self._state_inputs()
        if not self._state:
            raise ExecutionError("the state is not set; call set_state(values) first")
        data = [k for k in range(len(self.program.inputs)) if k not in self._state]
        if len(args) != len(data):
            raise ExecutionError(f"step takes the {len(data)} non-state inputs "
                                 f"({', '.join(self.program.inputs[k].split(':', 1)[1] for k in data)}), "
                                 f"got {len(args)}")
        args, torch_in = from_torch(args)
        given = dict(zip(data, args))
        inputs = [self._state[k] if k in self._state else self._on_device(given[k], self.program.input_devices[k])
                  for k in range(len(self.program.inputs))]
        res = self._run(self._exec(), inputs, trace=trace)
        for o, i in self.program.state:
            self._state[i] = res[o]
        carried = {o for o, _ in self.program.state}
        rest = tuple(as_torch(r) if torch_in else r for k, r in enumerate(res) if k not in carried)
        return rest[0] if len(rest) == 1 else rest

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
        args, torch_in = from_torch(args, self._torch_views)
        if self._direct_applies(args):
            res = self._call_direct(args)
        else:
            res = self._run(self._exec(), self._inputs(args))
            if not torch_in and any(isinstance(a, np.ndarray) for a in args):
                res = to_numpy(res)
        return as_torch(res) if torch_in else res

    def _direct_applies(self, args) -> bool:
        return (self._direct is not None and all(isinstance(a, np.ndarray) or _host_tensor(a) for a in args)
                and (self._executor is None or isinstance(self._executor, Executor)))

    def _call_direct(self, args):
        """A program that is one library unit, on numpy arrays or host TVM tensors: the
        library's own call (tensors viewed as arrays, its outputs returned as tensors)."""
        step, fn, result = self._direct
        if len(args) != len(self.program.inputs):
            self._inputs(args)  # raises the usual error
        tensors = not all(isinstance(a, np.ndarray) for a in args)
        try:
            outs = fn(*[a if isinstance(a, np.ndarray) else np.from_dlpack(a) for a in args])
        except Exception as e:  # noqa: BLE001 - the library's error, explained at our boundary
            raise ExecutionError(f"device {step.device} failed in segment {step.func} ({step.extern}): "
                                 f"{error_line(e)}") from e
        if tensors:  # TVM tensors in, TVM tensors out on the unit's device, as the VM path returns
            outs = [_as_tensor(o, self._devs[step.device]) for o in outs]
        return result(args, outs)

    def run_traced(self, *args):
        """Run once and return ``(outputs, trace)``: what ran on which device when (a list of
        :class:`~tvm_pesto.run.thread.executor.TraceEvent`, seconds from the start). A call that
        takes the library's own call (one unit, numpy inputs) is one event, its outputs numpy
        arrays; otherwise the executor's steps, its outputs TVM tensors (torch tensors, either
        way, for torch tensors in)."""
        args, torch_in = from_torch(args)
        trace: list = []
        if self._direct_applies(args):
            step = self._direct[0]
            t0 = time.perf_counter()
            res = self._call_direct(args)
            trace.append(TraceEvent(step.device, step.func, "compute", 0.0, time.perf_counter() - t0))
        else:
            res = self._run(self._exec(), self._inputs(args), trace=trace)
        self.last_trace = trace
        return (as_torch(res) if torch_in else res), trace

    def benchmark(self, *args, repeat: int = 20, warmup: int = 3, min_seconds: float = BENCH_MIN_S,
                  warmup_seconds: float = BENCH_WARMUP_S) -> dict:
        """Wall-clock seconds per run: median, min and max over at least ``repeat`` runs that
        together last at least ``min_seconds``, after at least ``warmup`` runs lasting
        ``warmup_seconds``.

        A small model's first runs after a build are slower (caches, ONNX Runtime's first
        allocations), so a few runs of a model of tens of microseconds overstate its time.
        The time floors make the figure independent of the model's size; ``min_seconds=0, warmup_seconds=0`` runs exactly ``repeat`` and ``warmup``.

        Returns
        -------
        dict
            ``median_s``, ``min_s``, ``max_s``, ``repeat`` (the runs timed), ``warmup`` (the
            runs before them).
        """
        args, _ = from_torch(args)  # timed as a call on them runs, less the outputs' wrapping
        if self._direct_applies(args):  # what a call on these numpy arrays runs
            def once():
                self._call_direct(args)
        else:
            ex, inputs = self._exec(), self._inputs(args)

            def once():
                self._run(ex, inputs)
        warm, t0 = 0, time.perf_counter()
        while warm < warmup or time.perf_counter() - t0 < warmup_seconds:
            once()
            warm += 1
        times: list[float] = []
        total = 0.0
        while len(times) < repeat or total < min_seconds:
            t = time.perf_counter()
            once()
            times.append(time.perf_counter() - t)
            total += times[-1]
        return {"median_s": float(np.median(times)), "min_s": float(np.min(times)),
                "max_s": float(np.max(times)), "repeat": len(times), "warmup": warm}

    # -- which engine runs the devices --------------------------------------------------
    def use_executor(self, executor) -> None:
        """Run the next calls through ``executor`` instead of the worker threads.

        ``executor`` has the thread executor's interface (``run(inputs, trace=None)``,
        ``close(timeout=None)``, ``broken``), e.g. a
        :class:`~tvm_pesto.run.ray.executor.RayExecutor`. The current executor is closed
        first; :meth:`close` stops the new one, and a call after it uses threads again.
        """
        for attr in ("run", "close"):
            if not callable(getattr(executor, attr, None)):
                raise ExecutionError(f"{type(executor).__name__} is not an executor: it has no {attr}(); give one "
                                     "with run(inputs, trace=None) and close(timeout=None)")
        self.close()
        self._executor = executor

    def use_ray(self, address: str | None = None, session=None, bundle: str | None = None,
                timeout_s: float | None = None):
        """Run the devices as Ray actors (:func:`tvm_pesto.run.ray.executor.use_ray`): a local
        Ray on 127.0.0.1, or the cluster at ``address``.

        Returns
        -------
        RayExecutor
        """
        return use_ray(self, address=address, session=session, bundle=bundle,
                       timeout_s=DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s)

    def close(self, timeout: float | None = None):
        """Stop and join the worker threads (see :meth:`Executor.close`), or the executor
        :meth:`use_executor` set; the next call starts new worker threads."""
        ex, self._executor = self._executor, None
        if ex is not None:
            ex.close(timeout)

    def __del__(self):
        try:
            self.close(timeout=1.0)  # a finalizer must not hang on a step that does not end
        except Exception:  # noqa: BLE001
            pass


def _host_tensor(a) -> bool:
    """Whether ``a`` is a TVM tensor in host memory (a view of it is a numpy array)."""
    return isinstance(a, tvm.runtime.Tensor) and a.device.dlpack_device_type() == 1  # kDLCPU


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` whose data is aligned to :data:`ALIGN` bytes (numpy aligns to 16).

    Examples
    --------
    >>> c = _aligned_copy(np.arange(5, dtype="float32"))
    >>> c.ctypes.data % ALIGN, c.tolist()
    (0, [0.0, 1.0, 2.0, 3.0, 4.0])
    """
    buf = np.empty(a.nbytes + ALIGN, np.uint8)
    start = -buf.ctypes.data % ALIGN
    out = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    np.copyto(out, a, casting="no")
    return out


def _host_copy(a: np.ndarray, dev):
    """A copy of ``a`` as a TVM tensor on the host device ``dev``. On ``cpu(0)`` (the device a
    numpy array's DLPack names) a view of an aligned numpy copy; on another CPU index (which
    TVM's kernels check against their arguments) a tensor of that device filled through a view.

    Examples
    --------
    >>> import tvm
    >>> [str(_host_copy(np.ones(3, "float32"), tvm.cpu(i)).device) for i in (0, 1)]
    ['cpu:0', 'cpu:1']
    """
    if dev.index == 0:
        return tvm_ffi.from_dlpack(_aligned_copy(a), require_alignment=ALIGN)
    t = tvm.runtime.empty(a.shape, str(a.dtype), dev)
    np.copyto(np.from_dlpack(t), a, casting="no")
    return t


def _as_tensor(a: np.ndarray, dev):
    """A library's output ``a`` as a TVM tensor on the host device ``dev``: a view when it
    can be one (``cpu(0)``, data aligned as TVM's kernels expect, :data:`ALIGN`), else a copy."""
    a = np.ascontiguousarray(a)
    if dev.index == 0 and a.ctypes.data % ALIGN == 0:  # checked first: a refused view costs 20 us
        try:
            return tvm_ffi.from_dlpack(a, require_alignment=ALIGN)
        except (ValueError, RuntimeError):  # a dtype without a DLPack view
            pass
    try:
        return _host_copy(a, dev)
    except (TypeError, BufferError, RuntimeError, ValueError):  # a dtype without a DLPack view
        return tvm.runtime.tensor(a, device=dev)


def _direct(program):
    """``(step, f, result)`` when ``program`` is one call of a unit with a direct call on
    numpy arrays (:func:`tvm_pesto.run.libraries.loaders.direct_call`) and nothing moves between
    devices; else None. ``result(args, outs)`` is the program's output from its inputs and
    the unit's outputs, its steps resolved once here instead of on every call."""
    calls = program.calls()
    if len(calls) != 1 or not calls[0].extern or program.state or any(s.kind == "copy" for s in program.steps):
        return None
    fn = direct_call(calls[0].extern)
    if fn is None:
        return None
    if callable(prepare := getattr(fn, "prepare", None)):
        prepare()  # the library's set-up for this call now, not in the model's first call
    step = calls[0]
    env = {name: (lambda args, outs, k=k: args[k]) for k, name in enumerate(program.inputs)}
    env[step.out] = lambda args, outs: outs[0] if len(outs) == 1 else tuple(outs)
    for s in program.steps:
        if s.kind == "item":
            whole = env[s.args[0]]
            env[s.out] = ((lambda args, outs, i=s.index: outs[i]) if s.args[0] == step.out
                          else (lambda args, outs, g=whole, i=s.index: g(args, outs)[i]))
        elif s.kind == "tuple":
            env[s.out] = lambda args, outs, gs=tuple(env[a] for a in s.args): tuple(g(args, outs) for g in gs)
        elif s.kind == "alias":
            env[s.out] = env[s.args[0]]
    return step, fn, _resolve(program.output, env)


def _resolve(out, env):
    """``f(args, outs)``: the value of output ``out`` (a name or a nested tuple of names)."""
    if isinstance(out, tuple):
        parts = tuple(_resolve(o, env) for o in out)
        return lambda args, outs: tuple(g(args, outs) for g in parts)
    return env[out]


__all__ = ["PlacedRuntime"]
