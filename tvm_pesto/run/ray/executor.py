"""Run a placed program on Ray: one actor per device, one compiled graph in the plan's order.

The same :class:`~tvm_pesto.run.program.Program` the thread executor runs, run by Ray
Compiled Graphs (``ray.dag``) instead of threads: each device that runs a segment gets a
Ray actor (:class:`~tvm_pesto.run.ray.worker.DeviceWorker`) that loads its library and backend artifacts from the
bundle :meth:`~tvm_pesto.builder.placed.PlacedModule.export` writes (TVM's runtime only),
pinned to the device's cores (a GPU device's actor asks Ray for ``num_gpus=1``).
:func:`schedule` cuts the program into *tasks*, one per segment call, each with what it
receives and what it sends; :class:`RayExecutor` binds them to the actors in program order
(Ray runs each actor's tasks in bind order, so every device follows the plan's order) and
compiles the graph once. A value another device needs travels over a Ray channel (shared
memory inside a host, Ray's transfer between hosts) as the producing task's output, as
soon as that task ends: the simulator's "a transfer starts when its producer finishes".
Tensors travel as NumPy arrays (a DLPack view of the TVM tensor on the sending side, a copy
into a TVM tensor on the device on the receiving side). GPU tensors travel through host
memory: NCCL between GPU actors is not wired up.

Ray itself. :class:`RaySession` connects to an existing cluster (``address=``) or starts a
local one with this machine's cores. A local head that tvm-pesto starts listens on
127.0.0.1 only (Ray 2.60 has no public switch for that: it rewrites a loopback node
address to the machine's IP, so the session turns that rewrite off while ``ray.init``
runs). A Ray cluster runs any task submitted to it, so it belongs on a trusted network
only (docs/distributed.md).

Faults. A failing segment raises :class:`~tvm_pesto.errors.ExecutionError` naming the
device and the segment; the graph stays usable. An actor that dies, or a run that returns
nothing within :attr:`RayExecutor.timeout_s`, raises an ``ExecutionError`` naming the
devices, after the executor killed its actors and tore the graph down (killing first, so
the teardown does not wait on an actor blocked in a channel); the next run starts new
actors. :meth:`RayExecutor.close` does the same, and shuts Ray down when the session
started it.

Examples
--------
Not run as doctests: they start a local Ray cluster (``tests/test_ray_executor.py`` runs them).

>>> placed = tvm_pesto.build(mod, "cpu:2")      # doctest: +SKIP
>>> ex = use_ray(placed)                         # local Ray on 127.0.0.1  # doctest: +SKIP
>>> placed(x)                                    # doctest: +SKIP
>>> placed.close()                               # actors killed, Ray stopped  # doctest: +SKIP

While it waits on a channel, a Ray compiled graph's reader (the caller in ``run``, an actor
waiting for its input) polls: on a machine with no core to spare, that polling competes
with the devices' work. The caller therefore sleeps through most of a run before it reads the
result (:meth:`RayExecutor._wait_s`: nine tenths of the shortest recent time to the last
result, as the actors stamp it on this machine's clock).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np

from ...cluster.linkbench import fit_links
from ...errors import ExecutionError, error_line
from ..bundle.format import device_files, read_manifest
from ..program import Program
from ..thread.executor import TraceEvent
from .session import RaySession, import_ray
from .tasks import Schedule, Task, schedule
from .worker import StepFailed, from_wire, start_actors, to_wire

#: Seconds a run may take before the executor gives up on it (kills its actors).
DEFAULT_TIMEOUT_S = 300.0
#: Seconds to wait for Ray to start the actors (a cluster without room never starts them).
START_TIMEOUT_S = 120.0
#: The caller sleeps through this share of a run before it reads the result, less the time a
#: sleeping thread takes to wake, judged on the last this many runs (:meth:`RayExecutor._wait_s`).
WAIT_SHARE = 0.9
WAKE_S = 150e-6
RECENT_RUNS = 5


# -- the executor ----------------------------------------------------------------------------
class RayExecutor:
    """Runs a :class:`Program` over Ray actors, one per device, with one compiled graph.

    Parameters
    ----------
    program : Program
    cluster : Cluster
    bundle : str
        A bundle folder written by :meth:`PlacedModule.export` for this program.
    session : RaySession, optional
        Default: a new one (a local Ray on 127.0.0.1, or the one already connected).
    timeout_s : float
        Seconds one run may take; a run past it is abandoned and the actors killed.

    Notes
    -----
    Same interface as :class:`~tvm_pesto.run.thread.executor.Executor` (``run``, ``close``,
    ``broken``, ``closed``); the actors and the graph start on the first run.
    """

    def __init__(self, program: Program, cluster, bundle: str, session: RaySession | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, start_timeout_s: float = START_TIMEOUT_S):
        self.program = program
        self.cluster = cluster
        self.bundle = bundle
        self.manifest = read_manifest(bundle)
        self.owns_session = session is None  # close() ends only a session this executor started
        self.session = session if session is not None else RaySession()
        self.owned_bundle: str | None = None  # a temporary bundle close() removes
        self.timeout_s = float(timeout_s)
        self.start_timeout_s = float(start_timeout_s)
        self.plan = schedule(program)
        self.broken: str | None = None
        self.actors: dict = {}
        self.actor_info: dict = {}
        self.graph = None
        self._leaves: list = []
        self._ready: list = []  # seconds from the start of each recent run until its last result was sent
        self._check_libraries(self.plan)
        self._files = {d: self._read_files(d) for d in self.plan.tasks}

    @property
    def closed(self) -> bool:
        return self.broken is not None

    @property
    def devices(self) -> list[int]:
        return sorted(self.plan.tasks)

    def _where(self, ds) -> str:
        return ", ".join(f"device {d} ({self.cluster.devices[d].name})" for d in ds)

    # -- starting and stopping ----------------------------------------------------------------
    def start(self) -> None:
        """Start the actors and compile the graph (the first :meth:`run` does it too)."""
        if self.broken is not None:
            raise ExecutionError(f"this Ray executor cannot run: {self.broken}; make a new one")
        if self.graph is not None:
            return
        ray = import_ray()
        prog, specs = self.program.to_dict(), self._specs()
        self.actors, self.actor_info = start_actors(
            self.cluster, self.devices,
            lambda d: (self.cluster.to_dict(), d, self.manifest, self._files[d], prog, specs[d]),
            self.start_timeout_s)
        self._compile()
        self._ray = ray

    def _check_libraries(self, plan: Schedule) -> None:
        for d in plan.tasks:
            if str(d) not in self.manifest.get("libraries", {}):
                raise ExecutionError(f"the bundle in {self.bundle!r} has no library for device {d}; "
                                     "export the model again")

    def _read_files(self, d: int) -> dict:
        """Device ``d``'s bundle files, by name, as bytes (what its actor loads)."""
        out = {}
        for f in device_files(self.manifest, d):
            with open(os.path.join(self.bundle, f), "rb") as fh:
                out[f] = fh.read()
        return out

    def _specs(self) -> dict:
        """Each device's tasks as its actor takes them."""
        return {d: [{"ops": t.ops, "sources": t.sources, "sends": t.sends} for t in ts]
                for d, ts in self.plan.tasks.items()}

    def rebind(self, program: Program) -> None:
        """Run ``program`` from now on, on the actors already started where it uses no other
        device (its libraries are this bundle's): the graph is torn down and compiled again
        for it, and no actor starts (seconds each). Before the first run, or with a device
        not started, the next run starts actors as usual."""
        if self.broken is not None:
            raise ExecutionError(f"this Ray executor cannot run: {self.broken}; make a new one")
        plan = schedule(program)
        self._check_libraries(plan)
        kept = self.graph is not None and set(plan.tasks) <= set(self.actors)
        if kept:
            try:
                self.graph.teardown()
                self.graph = None
            except Exception:  # noqa: BLE001 - a dead actor's channels: start over on the next run
                kept = False
        if not kept and (self.actors or self.graph is not None):
            self._stop()
        self.program, self.plan = program, plan
        self._files = {d: self._files.get(d) or self._read_files(d) for d in plan.tasks}
        self._ready = []
        if kept:
            ray, prog, specs = import_ray(), program.to_dict(), self._specs()
            try:
                ray.get([self.actors[d].load_program.remote(prog, specs[d]) for d in plan.tasks],
                        timeout=self.start_timeout_s)
            except Exception as e:  # noqa: BLE001 - a dead or stuck actor: explained, the next run starts new ones
                self._stop()
                raise ExecutionError(f"the actors of {self._where(self.devices)} did not take the new program "
                                     f"({error_line(e)}); they were killed and the next run "
                                     "starts new ones") from None
            self._compile()

    def _compile(self) -> None:
        """Bind the plan's tasks to the started actors and compile the graph (the actors are
        killed when it fails)."""
        from ray.dag import InputNode, MultiOutputNode

        try:
            nodes = {}
            with InputNode() as inp:
                for d, k in self.plan.order:
                    task = self.plan.tasks[d][k]
                    args = [nodes[(d, k - 1)]] if k > 0 else []
                    for src in task.sources:
                        args.append(inp[src[1]] if src[0] == "input" else nodes[(src[1], src[2])])
                    if not args:  # a first task that reads nothing still hangs off the input (ignored)
                        args.append(inp[0] if self.program.inputs else inp)
                    nodes[(d, k)] = self.actors[d].run.bind(k, *args)
                leaves = [(d, len(ts) - 1) for d, ts in self.plan.tasks.items()]
                for key in _task_leaves(self.plan.output):
                    if key not in leaves:
                        leaves.append(key)
                self._leaves = leaves
                dag = MultiOutputNode([nodes[key] for key in leaves])
            self.graph = dag.experimental_compile(_submit_timeout=self.start_timeout_s)
        except BaseException:
            self._stop()
            raise

    def _stop(self) -> None:
        """Kill the actors, then tear the graph down (fast: nothing waits on a live loop)."""
        ray = import_ray()
        for a in self.actors.values():
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - an actor already gone
                pass
        graph, self.graph, self.actors = self.graph, None, {}
        if graph is not None:
            try:
                graph.teardown()
            except Exception:  # noqa: BLE001 - channels of killed actors
                pass

    def close(self, timeout: float | None = None) -> None:
        """Kill the actors, tear the graph down, and shut Ray down if the session started it;
        a second call does nothing."""
        if self.broken is not None:
            return
        self.broken = "it is closed"
        if self.actors or self.graph is not None:
            self._stop()
        if self.owns_session:
            self.session.close()
        if self.owned_bundle:
            shutil.rmtree(self.owned_bundle, ignore_errors=True)

    # -- running --------------------------------------------------------------------------------
    def _dead(self) -> list[int]:
        """Devices whose actor is gone (asked with a short ping each)."""
        ray = import_ray()
        dead = []
        for d, a in self.actors.items():
            try:
                ray.get(a.ready.remote(), timeout=2.0)
            except ray.exceptions.GetTimeoutError:
                pass  # alive, still in the graph's loop
            except ray.exceptions.RayError:
                dead.append(d)
        return dead

    def run(self, inputs: list, trace: list | None = None):
        """Run once on ``inputs`` (TVM tensors or arrays, in program order); returns the
        output value(s) as TVM tensors on the host.

        Raises
        ------
        ExecutionError
            When a segment fails (the message names the device and the segment; the graph
            stays usable), an actor dies or the run takes longer than :attr:`timeout_s`
            (the message names the devices; the actors are killed and the next run starts
            new ones), or the executor is closed.
        """
        self.start()
        ray = self._ray
        arrays = [to_wire(x) if not isinstance(x, np.ndarray) else x for x in inputs] or [0]
        t0 = time.perf_counter()
        try:
            ref = self.graph.execute(*arrays)
            time.sleep(self._wait_s())
            res = ray.get(ref, timeout=self.timeout_s)
        except BaseException as e:
            failed = getattr(e, "cause", None)
            if isinstance(failed, StepFailed) or isinstance(e, StepFailed):
                f = failed if isinstance(failed, StepFailed) else e
                err = ExecutionError(f"{self._where([f.device])} failed {f.where}: {f.text} (the other devices "
                                     "stopped; the graph stays usable)")
                err.device, err.step = f.device, f.where
                raise err from None
            if isinstance(e, (ray.exceptions.GetTimeoutError, ray.exceptions.RayChannelTimeoutError)):
                self._stop()
                err = ExecutionError(f"the run returned nothing within {self.timeout_s:g} s (segments on "
                                     f"{self._where(self.devices)}); its actors were killed and the next run starts "
                                     "new ones (raise timeout_s for a model this slow)")
                err.device, err.step = None, None
                raise err from None
            if isinstance(e, ray.exceptions.RayError):
                dead = self._dead()
                self._stop()
                who = f"the actor of {self._where(dead)} died" if dead else f"Ray failed ({type(e).__name__})"
                err = ExecutionError(f"{who} during the run; the executor killed its actors and tore the graph "
                                     "down: the next run starts new ones")
                err.device, err.step = (dead[0] if dead else None), None
                raise err from e
            self._stop()  # an interrupt: nothing may keep running behind the caller's back
            raise
        elapsed = time.perf_counter() - t0
        leaves = dict(zip(self._leaves, res))
        ready = max(float(v.get("t", 0.0)) for v in leaves.values()) - t0
        # the actors' clock is this machine's (one host) when their results are sent within the run
        self._ready = (self._ready + [ready])[-RECENT_RUNS:] if 0.0 < ready <= elapsed else []
        if trace is not None:
            for d, ts in self.plan.tasks.items():
                for kind, dev, name, s, e in leaves[(d, len(ts) - 1)].get("trace", []):
                    trace.append(TraceEvent(int(dev), name, kind, s - t0, e - t0))
        return _assemble(self.plan.output, leaves, inputs)

    def _wait_s(self) -> float:
        """Seconds the caller sleeps after it starts a run, before it reads the result: Ray's
        reader spins while it waits, on a core the devices' work (or other jobs, pushed off
        the devices' cores) could use. :data:`WAIT_SHARE` of the shortest time from the start
        of a run to its last result of the last :data:`RECENT_RUNS` runs (timed by the actors
        on this machine's clock), less :data:`WAKE_S`; none before that many runs, or when the
        actors' clock is another machine's."""
        if len(self._ready) < RECENT_RUNS:
            return 0.0
        return max(WAIT_SHARE * min(self._ready) - WAKE_S, 0.0)


def _task_leaves(out) -> list:
    if out[0] == "task":
        return [(out[1], out[2])]
    if out[0] == "item":
        return _task_leaves(out[1])
    if out[0] == "tuple":
        return [k for o in out[1] for k in _task_leaves(o)]
    return []


def _assemble(out, leaves: dict, inputs):
    import tvm

    kind = out[0]
    if kind == "input":
        return inputs[out[1]]
    if kind == "task":
        return from_wire(leaves[(out[1], out[2])]["v"][out[3]], tvm.cpu(0))
    if kind == "item":
        return _assemble(out[1], leaves, inputs)[out[2]]
    return tuple(_assemble(o, leaves, inputs) for o in out[1])


def use_ray(runtime, address: str | None = None, session: RaySession | None = None, bundle: str | None = None,
            timeout_s: float = DEFAULT_TIMEOUT_S) -> RayExecutor:
    """Make ``runtime`` (a built :class:`PlacedModule` or a loaded bundle) run on Ray.

    A built module is exported to a temporary bundle first (the actors load their libraries
    from it). The runtime's calls, ``benchmark`` and ``run_traced`` then go through the
    returned executor; ``runtime.close()`` stops it (and Ray, when its session started it).

    Examples
    --------
    >>> ex = use_ray(tvm_pesto.build(mod, "cpu:2"))    # starts a local Ray cluster  # doctest: +SKIP
    """
    if bundle is None:
        bundle = getattr(runtime, "bundle_path", None)
    temporary = None
    if bundle is None:
        if not hasattr(runtime, "export"):
            raise ExecutionError("the Ray executor loads its libraries from a bundle: give bundle=, or a built "
                                 "PlacedModule (which is exported for it)")
        bundle = temporary = runtime.export(tempfile.mkdtemp(prefix="tvm-pesto-bundle-"))
    own = session is None
    session = session if session is not None else RaySession(address)
    ex = RayExecutor(runtime.program, runtime.cluster, bundle, session, timeout_s=timeout_s)
    ex.owns_session, ex.owned_bundle = own, temporary
    runtime.use_executor(ex)
    return ex


# -- links over Ray ---------------------------------------------------------------------------
def measure_ray_links(cluster, session: RaySession | None = None, sizes=(1 << 10, 1 << 16, 1 << 20, 1 << 22),
                      repeat: int = 12, warmup: int = 8) -> dict:
    """Fit the ``a + b·bytes`` link model of Ray transfers between the devices' actors and
    write it into ``cluster`` (:func:`tvm_pesto.cluster.linkbench.fit_links`).

    One actor per device, as the executor makes them; one compiled graph that moves a
    tensor of each size over every ordered pair in turn, timed from the sending task's end
    (its output written to the channel by Ray) to the receiving task holding it as a TVM
    tensor on its device: the executor's own send and receive.

    Returns
    -------
    dict
        ``"src->dst" -> {"latency_s", "bandwidth_Bps", "points"}``.
    """
    ray = import_ray()
    from ray.dag import InputNode

    session = session if session is not None else RaySession()
    d = cluster.num_devices
    pairs = [(i, j) for i in range(d) for j in range(d) if i != j]
    if not pairs:
        return {}
    actors, _ = start_actors(cluster, list(range(d)), lambda k: (cluster.to_dict(), k), START_TIMEOUT_S)
    graph = None
    try:
        ray.get([a.bench_alloc.remote(list(sizes)) for a in actors.values()])
        with InputNode() as inp:
            x = inp
            for i, j in pairs:
                x = actors[j].bench_recv.bind(actors[i].bench_send.bind(x))
        graph = x.experimental_compile(_buffer_size_bytes=int(max(sizes)) + (1 << 16))
        times = {p: {n: [] for n in sizes} for p in pairs}
        for n in sizes:
            for r in range(warmup + repeat):
                acc = ray.get(graph.execute({"n": int(n), "acc": []}), timeout=60)["acc"]
                if r >= warmup:
                    for p, t in zip(pairs, acc):
                        times[p][n].append(t)
    finally:
        for a in actors.values():
            ray.kill(a)
        if graph is not None:
            try:
                graph.teardown()
            except Exception:  # noqa: BLE001 - channels of killed actors
                pass
    return fit_links(cluster, {p: {n: float(np.median(v)) for n, v in per.items()} for p, per in times.items()},
                     "ray")


__all__ = ["RayExecutor", "RaySession", "Schedule", "Task", "measure_ray_links", "schedule", "use_ray"]
