"""Run a placed program on a stream of microbatches, pipelined over its devices.

The :class:`~tvm_pesto.run.thread.executor.Executor` runs one input at a time: every device waits
for the whole run to end before the next input starts. :func:`run_pipeline` streams ``K``
microbatches instead. Each device's worker (the executor's pinned thread for that device)
runs its steps for microbatch 0, then for microbatch 1, and so on, as soon as their inputs
are there; a value another device needs goes through a FIFO queue between the two devices
(one per value), filled by the producing device right after it made (and copied) the value
and emptied by the consumer in microbatch order. So while a later stage works on microbatch
``m``, an earlier one already works on ``m + 1``: with a stage plan (contiguous stages, an
acyclic stage graph, :mod:`tvm_pesto.plan.stage`) the stream takes about
``latency + (K - 1) * bottleneck`` instead of ``K * latency``
(:func:`tvm_pesto.plan.objective.time_per_sample`). Queues hold at most ``depth`` values
(back-pressure), so at most ``depth`` microbatches are in flight between two stages.

Outputs are the same as running the microbatches one by one: every step computes the same
function of the same values; only the time it starts changes.

Examples
--------
>>> import tvm_pesto
>>> from tvm_pesto.candidates.examples import tiny_cnn
>>> from tvm_pesto.run.thread.pipeline import microbatch_inputs, run_pipeline
>>> mod, inputs = tiny_cnn()
>>> placed = tvm_pesto.build(mod, "cpu:2", costs="roofline")
>>> outs, facts = run_pipeline(placed, microbatch_inputs(inputs, 4))
>>> len(outs), facts["time_per_sample_s"] > 0
(4, True)
"""
from __future__ import annotations

import queue
import threading
import time

import numpy as np

from ...errors import ExecutionError, error_line
from .executor import Executor, _copy, to_numpy


class _Failed(Exception):
    """Internal: another worker failed; stop this one."""


def _value(step, env):
    """The value of an ``item``, ``tuple`` or ``alias`` step."""
    if step.kind == "item":
        return env[step.args[0]][step.index]
    if step.kind == "tuple":
        return tuple(env[a] for a in step.args)
    return env[step.args[0]]


def run_pipeline(runtime, batches: list, depth: int = 2, poll_s: float = 0.1, trace: list | None = None):
    """Run ``runtime`` (a :class:`~tvm_pesto.run.runtime.PlacedRuntime`, e.g. a built
    :class:`~tvm_pesto.builder.placed.PlacedModule`) on each input list of ``batches``,
    pipelined (module docstring).

    Parameters
    ----------
    runtime : PlacedRuntime
        Its ``program``, ``vms`` and ``cluster`` are used.
    batches : list of list
        One list of inputs per microbatch (numpy arrays or TVM tensors, as for a call).
    depth : int
        Capacity of each queue between two devices.
    trace : list, optional
        Filled with ``(device, microbatch, step name, start_s, end_s)`` per call.

    Returns
    -------
    (list, dict)
        The outputs of each microbatch (numpy, like a call on numpy inputs) and facts:
        ``wall_s``, ``microbatches``, ``time_per_sample_s``, ``devices``.

    Raises
    ------
    ExecutionError
        When a step fails (the message names the device, the microbatch and the step), or a
        device of the program is not on this machine.
    """
    if not batches:
        raise ExecutionError("run_pipeline needs at least one microbatch of inputs")
    program, vms, cluster = runtime.program, runtime.vms, runtime.cluster
    missing = [d for d in sorted({s.device for s in program.calls()}) if d not in vms]
    if missing:
        raise ExecutionError(f"devices {missing} are not on this machine; the plan can be simulated, not run here")
    ex = Executor(program, vms, cluster)  # the per-device step lists and their pinned workers
    try:
        return _stream(ex, batches, depth, poll_s, trace)
    finally:
        ex.close()


def _microbatch_envs(ex: Executor, batches) -> list[dict]:
    """The inputs of each microbatch on their devices, and the caller's copies of them."""
    program = ex.program
    inputs = []
    for args in batches:
        args = list(args)
        if len(args) != len(program.inputs):
            raise ExecutionError(f"a microbatch has {len(args)} inputs; the module takes {len(program.inputs)}")
        env = {key: _on(x, ex.tvm_devs[d]) for key, x, d in zip(program.inputs, args, program.input_devices)}
        for s in ex.pre:
            env[s.out] = _copy(env[s.args[0]], ex.tvm_devs[s.device]) if s.kind == "copy" else _value(s, env)
        inputs.append(env)
    return inputs


def _crossing_queues(per_dev: dict, depth: int):
    """A queue of ``depth`` slots for every (value, consuming device) that crosses devices,
    and per value the queues its producer puts it in."""
    where = {s.out: d for d, lst in per_dev.items() for s in lst}
    queues: dict[tuple[str, int], queue.Queue] = {}
    for d, lst in per_dev.items():
        for s in lst:
            for a in s.args:
                src = where.get(a)
                if src is not None and src != d:
                    queues.setdefault((a, d), queue.Queue(maxsize=depth))
    sends: dict[str, list[queue.Queue]] = {}
    for (a, _d), q in queues.items():
        sends.setdefault(a, []).append(q)
    return queues, sends


def _stream(ex: Executor, batches, depth, poll_s, trace):
    program = ex.program
    k = len(batches)
    inputs = _microbatch_envs(ex, batches)
    per_dev = ex.per_dev
    queues, sends = _crossing_queues(per_dev, depth)
    post = list(getattr(ex, "post", []))  # light steps the executor leaves to the caller, after the workers
    outputs_of = _keys(program.output) | {a for st in post for a in st.args}
    results: list[dict] = [dict() for _ in range(k)]
    failed = threading.Event()
    errors: list = []
    lock = threading.Lock()
    done = threading.Semaphore(0)
    t0 = time.perf_counter()

    def put(q, item):
        while True:
            if failed.is_set():
                raise _Failed
            try:
                q.put(item, timeout=poll_s)
                return
            except queue.Full:
                continue

    def get(q):
        while True:
            if failed.is_set():
                raise _Failed
            try:
                return q.get(timeout=poll_s)
            except queue.Empty:
                continue

    def job_for(d, steps):
        def job():
            m, s = 0, None
            try:
                for m in range(k):
                    env = dict(inputs[m])
                    for s in steps:
                        for a in s.args:
                            q = queues.get((a, d))
                            if q is not None and a not in env:
                                env[a] = get(q)
                        if s.kind == "call":
                            ts = time.perf_counter()
                            env[s.out] = ex.vms[s.device][s.func](*[env[a] for a in s.args])
                            if trace is not None:
                                trace.append((d, m, s.func, ts - t0, time.perf_counter() - t0))
                        elif s.kind == "copy":
                            env[s.out] = _copy(env[s.args[0]], ex.tvm_devs[s.device])
                        else:
                            env[s.out] = _value(s, env)
                        for q in sends.get(s.out, ()):
                            put(q, env[s.out])
                        if s.out in outputs_of:
                            with lock:
                                results[m][s.out] = env[s.out]
            except _Failed:
                pass
            except BaseException as e:  # noqa: BLE001 - reported to the caller
                with lock:
                    errors.append((d, m, s, e))
                failed.set()
            finally:
                done.release()
        return job

    for d, steps in per_dev.items():
        ex.workers[d].jobs.put(job_for(d, steps))
    for _ in per_dev:
        while not done.acquire(timeout=poll_s):
            gone = [d for d, w in ex.workers.items() if not w.is_alive()]
            if gone:
                failed.set()
                raise ExecutionError(f"the worker thread of device {gone[0]} is gone; the pipelined run was "
                                     "abandoned: call it again")
    wall = time.perf_counter() - t0
    if errors:
        d, m, s, e = errors[0]
        what = f"segment {s.func}" if s is not None and s.kind == "call" else f"step {getattr(s, 'out', '?')}"
        raise ExecutionError(f"device {d} ({ex.cluster.devices[d].name}) failed in {what} on microbatch {m}: "
                             f"{error_line(e)} "
                             "(the other devices stopped)") from e
    outs = []
    for m in range(k):  # the caller's own steps, then the outputs
        env = dict(inputs[m])
        env.update(results[m])
        for st in post:
            env[st.out] = _copy(env[st.args[0]], ex.tvm_devs[st.device]) if st.kind == "copy" else _value(st, env)
        outs.append(to_numpy(_assemble(program.output, env)))
    return outs, {"wall_s": wall, "microbatches": k, "time_per_sample_s": wall / k, "devices": sorted(per_dev)}


def _on(x, dev):
    """``x`` (numpy or a TVM tensor) as a TVM tensor on ``dev``."""
    import tvm

    if isinstance(x, tvm.runtime.Tensor):
        return x if x.device == dev else _copy(x, dev)
    return tvm.runtime.tensor(np.asarray(x, order="C"), device=dev)


def _keys(out) -> set:
    if isinstance(out, tuple):
        return set().union(*(_keys(o) for o in out)) if out else set()
    return {out}


def _assemble(out, env):
    if isinstance(out, tuple):
        return tuple(_assemble(o, env) for o in out)
    return env[out]


def microbatch_inputs(example_inputs, k: int, seed: int = 0) -> list[list[np.ndarray]]:
    """``k`` input lists shaped like ``example_inputs``: the examples, then perturbed
    copies (floats: plus Gaussian noise of the examples' scale; integers: rolled along the
    last axis), so the microbatches differ and a mix-up shows in the outputs."""
    rng = np.random.default_rng(seed)
    out = []
    for m in range(k):
        batch = []
        for x in example_inputs:
            x = np.asarray(x)
            if m == 0:
                batch.append(x.copy())
            elif np.issubdtype(x.dtype, np.floating):
                scale = float(np.abs(x).mean()) or 1.0
                batch.append((x + rng.normal(0.0, 0.1 * scale, x.shape)).astype(x.dtype))
            else:
                batch.append(np.roll(x, m, axis=-1) if x.ndim else x.copy())
        out.append(batch)
    return out


__all__ = ["microbatch_inputs", "run_pipeline"]
