"""Run a placed program: one worker thread per device, events for cross-device values.

TVM releases the GIL while a compiled function runs, so threads pinned to each device's
cores run concurrently (measured: see docs/executor.md). Every copy runs on the producing
device's thread right after the value is made (push), like a transfer started at the
producer's finish in the simulator.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import tvm

from ..cluster.device_thread import enter_device_thread
from ..errors import ExecutionError
from .program import Program


def _copy(value, dev):
    if isinstance(value, tvm.runtime.Tensor):
        return value.copyto(dev)
    if isinstance(value, (tuple, list)) or type(value).__name__ == "Array":
        return tuple(_copy(v, dev) for v in value)
    raise ExecutionError(f"cannot move a {type(value).__name__} between devices")


@dataclass
class TraceEvent:
    device: int
    name: str
    kind: str
    start: float
    end: float


class _Worker(threading.Thread):
    def __init__(self, device, streams=None):
        super().__init__(name=f"pesto-{device.name}", daemon=True)
        self.device = device
        self.streams = streams
        self.jobs: queue.Queue = queue.Queue()

    def run(self):
        enter_device_thread(self.device)
        if self.streams is not None and self.device.kind == "gpu":
            self.streams.bind(self.device.index)  # this thread's kernels go to the device's stream
        while True:
            job = self.jobs.get()
            if job is None:
                return
            job()


class Executor:
    """Runs a :class:`Program` over per-device VirtualMachines."""

    def __init__(self, program: Program, vms: dict, cluster):
        self.program = program
        self.vms = vms
        self.cluster = cluster
        self.tvm_devs = [dev.tvm_device() for dev in cluster.devices]
        steps = program.steps
        producer = {}
        for s in steps:
            producer[s.out] = s
        # The device whose thread produces each key (None: inputs, produced by the caller).
        owner: dict[str, int | None] = {k: None for k in program.inputs}
        for s in steps:
            if s.kind == "call":
                owner[s.out] = s.device
            elif s.kind == "copy":
                owner[s.out] = owner.get(s.args[0])
            else:
                owner[s.out] = owner.get(s.args[0]) if s.args else None
        self.owner = owner
        # Per-device step lists; copies and light steps go right after their producer.
        per_dev: dict[int, list] = {d: [] for d in range(cluster.num_devices)}
        self.pre: list = []  # steps the caller runs before the workers (input copies)
        self.post: list = []  # steps the caller runs after (final assembly)
        placed = set()
        for s in steps:
            if s.kind == "call":
                per_dev[s.device].append(s)
                placed.add(s.out)
        for s in steps:
            if s.kind == "call":
                continue
            o = owner.get(s.out)
            if o is None:
                self.pre.append(s)
            else:
                per_dev[o].append(s)
        # Order each device list by the program order, then pull copies forward to right
        # after the step that makes their input.
        index = {s.out: k for k, s in enumerate(steps)}
        for d in per_dev:
            per_dev[d].sort(key=lambda s: index[s.out])
            ordered = [s for s in per_dev[d] if s.kind == "call"]
            for s in per_dev[d]:
                if s.kind == "call":
                    continue
                pos = {t.out: k for k, t in enumerate(ordered)}
                at = max((pos[a] for a in s.args if a in pos), default=-1)
                ordered.insert(at + 1, s)
            per_dev[d] = ordered
        self.per_dev = {d: lst for d, lst in per_dev.items() if lst}
        # GPUs: one stream per device, cross-device copies ordered by stream events.
        self.streams = None
        if any(cluster.devices[d].kind == "gpu" for d in self.per_dev):
            from .streams import StreamSet

            self.streams = StreamSet(self.tvm_devs)
        self.workers = {d: _Worker(cluster.devices[d], self.streams) for d in self.per_dev}
        for w in self.workers.values():
            w.start()
        self.single = len(self.per_dev) == 1 and not any(s.kind == "copy" for s in steps)

    def close(self):
        for w in self.workers.values():
            w.jobs.put(None)
        if self.streams is not None:
            self.streams.close()

    def _exec(self, s, env, events, trace, t0, on=0):
        if s.kind == "call":
            args = []
            for a in s.args:
                ev = events.get(a)
                if ev is not None:
                    ev.wait()
                args.append(env[a])
            ts = time.perf_counter()
            env[s.out] = self.vms[s.device][s.func](*args)
            te = time.perf_counter()
            if trace is not None:
                trace.append(TraceEvent(s.device, s.func, "compute", ts - t0, te - t0))
        else:
            for a in s.args:
                ev = events.get(a)
                if ev is not None:
                    ev.wait()
            ts = time.perf_counter()
            if s.kind == "copy" and self.streams is not None:
                src = self.owner.get(s.args[0])
                env[s.out] = self.streams.copy(env[s.args[0]], 0 if src is None else src, s.device)
            elif s.kind == "copy":
                env[s.out] = _copy(env[s.args[0]], self.tvm_devs[s.device])
            elif s.kind == "item":
                env[s.out] = env[s.args[0]][s.index]
            elif s.kind == "tuple":
                env[s.out] = tuple(env[a] for a in s.args)
            else:
                env[s.out] = env[s.args[0]]
            if trace is not None and s.kind == "copy":
                trace.append(TraceEvent(on, f"copy->{s.device}", "copy", ts - t0, time.perf_counter() - t0))
        ev = events.get(s.out)
        if ev is not None:
            ev.set()

    def run(self, inputs: list, trace: list | None = None):
        """Run once on ``inputs`` (tvm tensors on device 0); returns the output value(s)."""
        env = dict(zip(self.program.inputs, inputs))
        t0 = time.perf_counter()
        for s in self.pre:
            self._exec(s, env, {}, trace, t0)
        if self.single:
            (d, lst), = self.per_dev.items()
            for s in lst:
                self._exec(s, env, {}, trace, t0, d)
        else:
            events = {s.out: threading.Event() for lst in self.per_dev.values() for s in lst}
            errors: list = []
            done = threading.Semaphore(0)

            def job_for(d, lst):
                def job():
                    try:
                        for s in lst:
                            self._exec(s, env, events, trace, t0, d)
                    except BaseException as e:  # noqa: BLE001
                        errors.append(e)
                        for ev in events.values():
                            ev.set()  # unblock the other devices
                    finally:
                        done.release()
                return job

            for d, lst in self.per_dev.items():
                self.workers[d].jobs.put(job_for(d, lst))
            for _ in self.per_dev:
                done.acquire()
            if errors:
                raise ExecutionError(f"a device failed while running the placed module: "
                                     f"{type(errors[0]).__name__}: {errors[0]}") from errors[0]
        if self.streams is not None:
            self.streams.synchronize()
        return _assemble(self.program.output, env)


def _assemble(out, env):
    if isinstance(out, tuple):
        return tuple(_assemble(o, env) for o in out)
    return env[out]


def to_numpy(value):
    if isinstance(value, tvm.runtime.Tensor):
        return value.numpy()
    if isinstance(value, (tuple, list)) or type(value).__name__ == "Array":
        return tuple(to_numpy(v) for v in value)
    return np.asarray(value)
