"""Run a placed program: one worker thread per device, events for cross-device values.

TVM releases the GIL while a compiled function runs, so threads pinned to each device's
cores run concurrently (measured by lab/scripts/bench_executor.py; docs/architecture.md). Every copy runs on the producing
device's thread right after the value is made (push), like a transfer started at the
producer's finish in the simulator.

Faults. Each run has its own state (:class:`_Run`: values, events, errors), so an abandoned
run cannot disturb a later one. When a step fails on one device, that worker records the
error and aborts the run: every event is set and the abort flag raised, so a worker blocked
on a value that will never come wakes up and abandons the run without reading the missing
value (no second error hides the first). The caller waits in slices of :attr:`Executor.poll_s`,
checking that every worker it waits on is alive: a worker thread that has gone is reported as
an :class:`~tvm_pesto.errors.ExecutionError` naming its device, and the executor is marked
broken. An interrupt (Ctrl-C) in the caller aborts the run the same way, waits up to
:attr:`Executor.abandon_timeout_s` for the workers to finish or abandon their current step,
and propagates. :meth:`Executor.close` stops and joins the worker threads; a closed (or
broken) executor refuses to run. :class:`~tvm_pesto.run.runtime.PlacedRuntime` makes a new
one, with new threads, on its next call.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import numpy as np
import tvm

from ...cluster.device_thread import enter_device_thread
from ...errors import ExecutionError
from ..program import Program
from .streams import StreamSet


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


_CLOSED = "it is closed"


class _Abandoned(Exception):
    """Raised inside a worker that gives up a run another device (or the caller) aborted."""


class _Run:
    """The state of one run: values, cross-device events, who is still working, the errors."""

    __slots__ = ("env", "events", "trace", "t0", "aborted", "errors", "pending", "lock", "finished")

    def __init__(self, env: dict, events: dict, trace, devices=()):
        self.env = env
        self.events = events
        self.trace = trace
        self.t0 = time.perf_counter()
        self.aborted = False
        self.errors: list = []  # (device, step, exception), first failure first
        self.pending = set(devices)  # devices whose job has not ended
        self.lock = threading.Lock()
        self.finished = threading.Event() if devices else None

    def fail(self, d, step, exc) -> None:
        with self.lock:
            self.errors.append((d, step, exc))
        self.abort()

    def abort(self, devices=()) -> None:
        """Stop the run: wake every waiting worker; ``devices`` will never start their job."""
        self.aborted = True  # before the events: a woken worker must see it
        for ev in self.events.values():
            ev.set()
        for d in devices:
            self.ended(d)

    def ended(self, d) -> None:
        with self.lock:
            self.pending.discard(d)
            if not self.pending:
                self.finished.set()

    def still_pending(self) -> tuple:
        with self.lock:
            return tuple(self.pending)


class _Worker(threading.Thread):
    def __init__(self, device, streams=None):
        super().__init__(name=f"pesto-{device.name}", daemon=True)
        self.device = device
        self.streams = streams
        self.jobs: queue.Queue = queue.Queue()
        self.busy = False  # running a job now
        self.exit_error: BaseException | None = None  # why the thread ended, when it did not stop on request
        self.pinning_error: str | None = None  # why the thread could not be pinned to the device's cores
        self.entered = threading.Event()  # set once the thread tried to pin itself

    def run(self):
        try:
            try:
                self.pinning_error = enter_device_thread(self.device)
            finally:
                self.entered.set()
            if self.streams is not None and self.device.kind == "gpu":
                self.streams.bind(self.device.index)  # this thread's kernels go to the device's stream
            while True:
                job = self.jobs.get()
                if job is None:
                    return
                self.busy = True
                try:
                    job()
                finally:
                    self.busy = False
        except BaseException as e:
            self.exit_error = e
            raise


class Executor:
    """Runs a :class:`Program` over per-device VirtualMachines.

    Parameters
    ----------
    program : Program
        Which segment runs where and what moves between devices.
    vms : dict
        Device index -> ``VirtualMachine`` (or any object whose ``[func]`` is callable).
    cluster : Cluster
        The devices; each one that runs a step gets a worker thread pinned to its cores.

    Notes
    -----
    A failure in any step raises :class:`~tvm_pesto.errors.ExecutionError` in the caller,
    naming the device, the step and the original error (chained as ``__cause__``); the other
    workers abandon the run. A worker thread that is gone raises the same error and leaves the
    executor broken (:attr:`broken` says why): it then refuses to run. After :meth:`close` it
    refuses too; make a new executor (``PlacedRuntime`` does so on its next call). The error
    carries ``device`` (the failing device's index) and ``step`` (the failing
    :class:`~tvm_pesto.run.program.Step`, None for a worker gone). A worker that could not
    pin itself to its device's cores still runs; :attr:`pinning_errors` says which and why.
    """

    #: seconds between the caller's checks that the workers it waits on are alive
    poll_s = 0.1
    #: seconds an aborted run waits for workers to finish or abandon their current step
    abandon_timeout_s = 5.0
    #: seconds :meth:`close` waits for the worker threads to end
    close_timeout_s = 10.0

    def __init__(self, program: Program, vms: dict, cluster):
        self.program = program
        self.vms = vms
        self.cluster = cluster
        self.broken: str | None = None  # why this executor cannot run any more (closed, a worker gone)
        self.tvm_devs = [dev.tvm_device() for dev in cluster.devices]
        steps = program.steps
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
        self.input_device = dict(zip(program.inputs, program.input_devices))
        # Light steps (tuples, items, aliases) that only assemble the result run in the
        # caller after the workers: a worker that waited there for another device's values
        # could block steps of its own that the other device needs (a module with state
        # returns values of both devices).
        self.post = _result_steps(program)
        post = {id(s) for s in self.post}
        # Per-device step lists; copies and light steps go right after their producer.
        per_dev: dict[int, list] = {d: [] for d in range(cluster.num_devices)}
        self.pre: list = []  # steps the caller runs before the workers (input copies)
        for s in steps:
            if s.kind == "call":
                per_dev[s.device].append(s)
        for s in steps:
            if s.kind == "call" or id(s) in post:
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
        # Values another device's worker waits for: only these get an event per run (a worker
        # runs its own list in order, and the caller's steps run before or after the workers).
        self.cross = sorted({a for d, lst in self.per_dev.items() for s in lst for a in s.args
                             if owner.get(a) is not None and owner[a] != d})
        # GPUs: one stream per device, cross-device copies ordered by stream events.
        self.streams = None
        if any(cluster.devices[d].kind == "gpu" for d in self.per_dev):
            self.streams = StreamSet(self.tvm_devs)
        self.workers = {d: _Worker(cluster.devices[d], self.streams) for d in self.per_dev}
        for w in self.workers.values():
            w.start()
        self.single = len(self.per_dev) == 1 and not any(s.kind == "copy" for s in steps)

    @property
    def closed(self) -> bool:
        return self.broken == _CLOSED

    @property
    def pinning_errors(self) -> dict[int, str]:
        """Device index -> why its worker thread could not be pinned to the device's cores
        (it runs on any core: run times may differ from the plan's); empty when all were."""
        out = {}
        for d, w in self.workers.items():
            w.entered.wait(self.close_timeout_s)
            if w.pinning_error is not None:
                out[d] = w.pinning_error
        return out

    def busy_devices(self) -> list[int]:
        """Devices whose worker is running a job or has one queued."""
        return [d for d, w in self.workers.items() if w.is_alive() and (w.busy or not w.jobs.empty())]

    def close(self, timeout: float | None = None):
        """Stop the worker threads and wait for them to end (at most ``timeout`` seconds,
        default :attr:`close_timeout_s`); a second call does nothing.

        Raises
        ------
        ExecutionError
            When a worker is still running a step after ``timeout`` (the message names it).
        """
        if self.closed:
            return
        self.broken = _CLOSED
        for w in self.workers.values():
            w.jobs.put(None)
        limit = self.close_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        me = threading.current_thread()
        for w in self.workers.values():
            if w is not me:  # close() from a worker (a finalizer run there): it ends after this job
                w.join(max(0.0, deadline - time.monotonic()))
        left = [d for d, w in self.workers.items() if w.is_alive() and w is not me]
        if left:  # the streams stay: a running step may still use them
            raise ExecutionError(f"closing the executor: {self._where_all(left)} still running a step after "
                                 f"{limit:g} s; their threads end when the step "
                                 "returns (a step cannot be interrupted)")
        if self.streams is not None:
            self.streams.close()

    # -- describing faults ------------------------------------------------------------
    def _where(self, d) -> str:
        if d is None:
            return "the calling thread"
        return f"device {d} ({self.cluster.devices[d].name})"

    def _where_all(self, ds) -> str:
        return ", ".join(self._where(d) for d in ds)

    def _failure(self, d, s, e, others=()) -> ExecutionError:
        text = str(e).strip()
        first = text.splitlines()[0] if text else "(no message)"
        if s.kind == "call":
            what = f"in segment {s.func}"
        elif s.kind == "copy":
            what = f"copying {s.args[0].split(':', 1)[-1]} to {self._where(s.device)}"
        else:
            what = f"in its {s.kind} step {s.out.split(':', 1)[-1]}"
        also = "".join(f"; also failed: {self._where(d2)} with {type(e2).__name__}" for d2, _, e2 in others)
        err = ExecutionError(f"{self._where(d)} failed {what}: {type(e).__name__}: {first}{also} (the other "
                             "devices stopped; the original error, with its traceback, is this error's __cause__)")
        err.device, err.step = d, s
        return err

    def _gone(self, ds) -> ExecutionError:
        why = [f"{type(e).__name__}: {e}" for e in (self.workers[d].exit_error for d in ds) if e is not None]
        self.broken = f"the worker thread of {self._where_all(ds)} is gone"
        err = ExecutionError(f"{self.broken} ({'; '.join(why) if why else 'it ended'}) while the run waited on "
                             "it; the run was abandoned. Call the module again: it starts new worker threads "
                             "(an Executor used directly: make a new one)")
        err.device, err.step = ds[0], None
        return err

    # -- running ----------------------------------------------------------------------
    def _exec(self, s, run, on=0):
        env, events, trace = run.env, run.events, run.trace
        if s.kind == "call":
            args = []
            for a in s.args:
                ev = events.get(a)
                if ev is not None:
                    ev.wait()
                    if run.aborted:
                        raise _Abandoned
                args.append(env[a])
            ts = time.perf_counter()
            env[s.out] = self.vms[s.device][s.func](*args)
            te = time.perf_counter()
            if trace is not None:
                trace.append(TraceEvent(s.device, s.func, "compute", ts - run.t0, te - run.t0))
        else:
            for a in s.args:
                ev = events.get(a)
                if ev is not None:
                    ev.wait()
                    if run.aborted:
                        raise _Abandoned
            ts = time.perf_counter()
            if s.kind == "copy" and self.streams is not None:
                src = self.owner.get(s.args[0])
                src = self.input_device.get(s.args[0], 0) if src is None else src
                env[s.out] = self.streams.copy(env[s.args[0]], src, s.device)
            elif s.kind == "copy":
                env[s.out] = _copy(env[s.args[0]], self.tvm_devs[s.device])
            elif s.kind == "item":
                env[s.out] = env[s.args[0]][s.index]
            elif s.kind == "tuple":
                env[s.out] = tuple(env[a] for a in s.args)
            else:
                env[s.out] = env[s.args[0]]
            if trace is not None and s.kind == "copy":
                trace.append(TraceEvent(on, f"copy->{s.device}", "copy", ts - run.t0, time.perf_counter() - run.t0))
        ev = events.get(s.out)
        if ev is not None:
            ev.set()

    def _local(self, steps, run, d):
        """Run ``steps`` in the calling thread; a failing step raises ExecutionError."""
        for s in steps:
            try:
                self._exec(s, run, 0 if d is None else d)
            except Exception as e:  # noqa: BLE001 - any error of a segment, explained
                raise self._failure(d, s, e) from e

    def _job(self, d, lst, run):
        def job():
            try:
                for s in lst:
                    if run.aborted:
                        return
                    try:
                        self._exec(s, run, d)
                    except _Abandoned:
                        return
                    except BaseException as e:  # noqa: BLE001 - reported to the caller
                        run.fail(d, s, e)
                        return
            finally:
                self.workers[d].busy = False  # before the caller can see the run end
                run.ended(d)
        return job

    def _wait(self, run):
        """Wait until every worker of ``run`` ended its job; raise when one of them is gone."""
        while not run.finished.wait(self.poll_s):
            gone = [d for d in run.still_pending() if not self.workers[d].is_alive()]
            if gone:
                raise self._gone(gone)

    def _settle(self, run):
        """After an abort: wait (at most :attr:`abandon_timeout_s`) for the live workers to
        finish or abandon their current step."""
        deadline = time.monotonic() + self.abandon_timeout_s
        while not run.finished.wait(self.poll_s):
            if time.monotonic() > deadline or not any(self.workers[d].is_alive() for d in run.still_pending()):
                return

    def run(self, inputs: list, trace: list | None = None):
        """Run once on ``inputs`` (tvm tensors, each on its ``program.input_devices``
        device); returns the output value(s).

        Raises
        ------
        ExecutionError
            When a step fails (the message names the device, the segment and the original
            error, chained as ``__cause__``), a worker thread is gone, or the executor is
            closed or broken.
        KeyboardInterrupt
            Propagated after the workers finished or abandoned their current step.
        """
        if self.broken is not None:
            raise ExecutionError(f"this executor cannot run: {self.broken}; make a new one "
                                 "(a PlacedRuntime does on its next call)")
        env = dict(zip(self.program.inputs, inputs))
        local = _Run(env, {}, trace)
        self._local(self.pre, local, None)
        if self.single:
            (d, lst), = self.per_dev.items()
            self._local(lst, local, d)
            self._local(self.post, local, None)
        else:
            events = {k: threading.Event() for k in self.cross}
            run = _Run(env, events, trace, self.per_dev)
            run.t0 = local.t0
            jobs = [(d, self._job(d, lst, run)) for d, lst in self.per_dev.items()]
            submitted = 0
            try:
                for d, job in jobs:
                    self.workers[d].jobs.put(job)
                    submitted += 1
                self._wait(run)
            except BaseException:  # an interrupt, or a worker gone: stop the others, then propagate
                run.abort([d for d, _ in jobs[submitted:]])
                self._settle(run)
                raise
            if run.errors:
                d, s, e = run.errors[0]  # independent failures at the same time: the first leads
                raise self._failure(d, s, e, run.errors[1:]) from e
            self._local(self.post, run, None)
        if self.streams is not None:
            self.streams.synchronize()
        return _assemble(self.program.output, env)


def _result_steps(program: Program) -> list:
    """The light steps whose values only the result (or other such steps) uses, in
    program order."""
    users: dict[str, list] = {}
    for s in program.steps:
        for a in s.args:
            users.setdefault(a, []).append(s)
    result: set[int] = set()
    for s in reversed(program.steps):
        if s.kind in ("tuple", "item", "alias") and all(id(u) in result for u in users.get(s.out, [])):
            result.add(id(s))
    return [s for s in program.steps if id(s) in result]


def _assemble(out, env):
    if isinstance(out, tuple):
        return tuple(_assemble(o, env) for o in out)
    return env[out]


def to_numpy(value):
    """``value`` (a TVM tensor or a tuple of them) as numpy arrays, copied out of TVM's memory.

    Examples
    --------
    >>> import numpy as np, tvm
    >>> to_numpy((tvm.runtime.tensor(np.arange(3, dtype="float32")),))
    (array([0., 1., 2.], dtype=float32),)
    """
    if isinstance(value, tvm.runtime.Tensor):
        if value.device.dlpack_device_type() == 1:  # host memory: a view's copy is the cheapest copy
            try:
                return np.from_dlpack(value).copy()
            except (TypeError, BufferError, RuntimeError):  # a dtype numpy has no DLPack form of
                pass
        return value.numpy()
    if isinstance(value, (tuple, list)) or type(value).__name__ == "Array":
        return tuple(to_numpy(v) for v in value)
    return np.asarray(value)


def max_abs_err(a, b) -> float:
    """The largest absolute difference between two outputs (tuples compared element-wise);
    infinite where their structure or shapes differ (nothing is broadcast).

    Examples
    --------
    >>> import numpy as np
    >>> max_abs_err((np.ones(2), np.zeros(3)), (np.ones(2), np.full(3, 0.5)))
    0.5
    >>> max_abs_err(np.ones((1, 3)), np.ones(3)), max_abs_err((np.ones(2),), (np.ones(2), np.ones(2)))
    (inf, inf)
    """
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        if not (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list))) or len(a) != len(b):
            return float("inf")
        return max((max_abs_err(x, y) for x, y in zip(a, b)), default=0.0)
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float("inf") if a.shape != b.shape else float(np.max(np.abs(a - b))) if a.size else 0.0

