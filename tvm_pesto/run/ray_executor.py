"""Run a placed program on Ray: one actor per device, one compiled graph in the plan's order.

The same :class:`~tvm_pesto.run.program.Program` the thread executor runs, run by Ray
Compiled Graphs (``ray.dag``) instead of threads: each device that runs a segment gets a
Ray actor (:class:`DeviceWorker`) that loads its library and backend artifacts from the
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
import tempfile
import threading
import time

import numpy as np

from ..errors import ExecutionError
from .executor import TraceEvent
from .program import Program, Step
from .ray_session import RaySession, import_ray
from .ray_tasks import Schedule, Task, schedule

#: Seconds a run may take before the executor gives up on it (kills its actors).
DEFAULT_TIMEOUT_S = 300.0
#: Seconds to wait for Ray to start the actors (a cluster without room never starts them).
START_TIMEOUT_S = 120.0
#: The caller sleeps through this share of a run before it reads the result, less the time a
#: sleeping thread takes to wake, judged on the last this many runs (:meth:`RayExecutor._wait_s`).
WAIT_SHARE = 0.9
WAKE_S = 150e-6
RECENT_RUNS = 5


# -- values on the wire ----------------------------------------------------------------------
def to_wire(value):
    """A TVM tensor (or nested tuple of them) as NumPy arrays for a Ray channel: a DLPack
    view of a CPU tensor (no copy until Ray writes it), a host copy of a GPU tensor."""
    import tvm

    if isinstance(value, tvm.runtime.Tensor):
        return np.from_dlpack(value) if value.device.dlpack_device_type() == 1 else value.numpy()
    if isinstance(value, (tuple, list)) or type(value).__name__ == "Array":
        return tuple(to_wire(v) for v in value)
    raise ExecutionError(f"cannot send a {type(value).__name__} between devices")


def from_wire(value, dev):
    """The inverse of :func:`to_wire`: new TVM tensors on ``dev`` (Ray hands out read-only
    views of its buffers, which TVM cannot take over)."""
    import tvm

    if isinstance(value, np.ndarray):
        return tvm.runtime.tensor(np.ascontiguousarray(value), device=dev)
    if isinstance(value, (tuple, list)):
        return tuple(from_wire(v, dev) for v in value)
    raise ExecutionError(f"received a {type(value).__name__}, not an array; the sending device failed")


# -- the actor -----------------------------------------------------------------------------
class StepFailed(ExecutionError):
    """A task failed inside a device's actor (travels back through Ray, picklable)."""

    def __init__(self, device: int, where: str, text: str):
        super().__init__(device, where, text)
        self.device, self.where, self.text = device, where, text

    def __str__(self):
        return f"device {self.device} failed {self.where}: {self.text}"


class DeviceWorker:
    """The Ray actor of one device: loads the device's library and artifacts from bundle
    files sent as bytes, runs its tasks, and measures Ray transfers for the link model.

    Parameters
    ----------
    cluster : dict
        :meth:`Cluster.to_dict`.
    device : int
    manifest : dict, optional
        The bundle manifest; ``files`` maps each of this device's files to its bytes.
    program : dict, optional
        :meth:`Program.to_dict`, and ``tasks`` this device's :class:`Task` list.
    """

    def __init__(self, cluster: dict, device: int, manifest: dict | None = None, files: dict | None = None,
                 program: dict | None = None, tasks: list | None = None):
        from ..cluster.cluster import Cluster

        self.cluster = Cluster.from_dict(cluster)
        self.d = int(device)
        self.device = self.cluster.devices[self.d]
        self.dev = self.device.tvm_device()
        self.pinned: set = set()
        self._pin()
        self.vm = None
        self.steps: list[Step] = []
        self.tasks = tasks or []
        self.env: dict = {}
        self.trace: list = []
        self.bufs: dict = {}
        if manifest is not None:
            from .bundle import check_files, load_library, register_artifacts

            self.dir = tempfile.mkdtemp(prefix=f"tvm-pesto-ray-dev{self.d}-")
            for name, data in (files or {}).items():
                path = os.path.join(self.dir, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            try:
                check_files(self.dir, manifest, list(files or {}))
                register_artifacts(self.dir, manifest, self.cluster, self.d)
                self.vm = load_library(self.dir, manifest, self.cluster, self.d)
            finally:  # loaded (mapped, or read by their libraries): the files are not needed any more
                import shutil

                shutil.rmtree(self.dir, ignore_errors=True)
            self.steps = Program.from_dict(program).steps

    def _pin(self):
        """Pin the calling thread to the device's cores (when this machine has them) and
        size TVM's pool: Ray runs the compiled graph in a thread of its own."""
        me = threading.get_ident()
        if me in self.pinned:
            return
        self.pinned.add(me)
        from ..cluster.device_thread import enter_device_thread

        if self.device.cpu_ids and not set(self.device.cpu_ids) <= os.sched_getaffinity(0):
            return  # another machine's cores: leave the thread where Ray put it
        enter_device_thread(self.device)

    def ready(self) -> dict:
        """Where the actor runs (process id, node address, cores it may use)."""
        import ray

        return {"pid": os.getpid(), "node": ray.util.get_node_ip_address(),
                "cores": sorted(os.sched_getaffinity(0)), "device": self.d}

    def run(self, k: int, *args):
        """Task ``k`` of this device: receive, compute, send. ``args`` are the previous
        task's output (for ``k > 0``) and then the task's sources, in order."""
        self._pin()
        task = self.tasks[k]
        if k == 0:
            self.env, self.trace = {}, []
        received = args[1:] if k > 0 else args
        env = self.env
        step = None
        began = time.perf_counter()
        try:
            for op in task["ops"]:
                if op[0] == "recv":
                    _, pos, key = op
                    src = task["sources"][pos]
                    value = received[pos]
                    if src[0] == "input":
                        env[key] = from_wire(value, self.dev)
                    else:
                        env[key] = from_wire(value["v"][key], self.dev)
                        # on the receiving device, from when it could take the value to when it holds it
                        self.trace.append(("copy", self.d, f"copy<-{src[1]}", max(value["t"], began),
                                           time.perf_counter()))
                    continue
                step = self.steps[op[1]]
                if step.kind == "call":
                    args_ = [env[a] for a in step.args]
                    ts = time.perf_counter()
                    env[step.out] = self.vm[step.func](*args_)
                    self.trace.append(("compute", self.d, step.func, ts, time.perf_counter()))
                elif step.kind == "item":
                    env[step.out] = env[step.args[0]][step.index]
                elif step.kind == "tuple":
                    env[step.out] = tuple(env[a] for a in step.args)
                else:  # alias, or a copy whose value arrived already
                    env[step.out] = env[step.args[0]]
            sends = {key: to_wire(env[key]) for key in task["sends"]}
        except Exception as e:  # noqa: BLE001 - explained and sent back to the caller
            text = str(e).strip()
            where = (f"in segment {step.func}" if step is not None and step.kind == "call" else
                     f"in its {step.kind} step {step.out.split(':', 1)[-1]}" if step is not None else "receiving")
            raise StepFailed(self.d, where, f"{type(e).__name__}: {text.splitlines()[0] if text else ''}") from None
        out = {"v": sends, "t": time.perf_counter()}
        if k == len(self.tasks) - 1:
            out["trace"], self.env = self.trace, {}
        return out

    # -- link benchmark: the executor's own send and receive -------------------------------
    def bench_alloc(self, sizes) -> int:
        import tvm

        self._pin()
        self.bufs = {int(n): tvm.runtime.tensor(np.ones(max(int(n) // 4, 1), dtype="float32"), device=self.dev)
                     for n in sizes}
        return len(self.bufs)

    def bench_send(self, msg: dict) -> dict:
        self._pin()
        return {"n": msg["n"], "acc": msg["acc"], "t": time.perf_counter(), "v": to_wire(self.bufs[msg["n"]])}

    def bench_recv(self, msg: dict) -> dict:
        self._pin()
        from_wire(msg["v"], self.dev)
        return {"n": msg["n"], "acc": msg["acc"] + [time.perf_counter() - msg["t"]]}



def _actor_options(device, cluster) -> dict:
    """Ray resources and placement of a device's actor: its cores (or one GPU), on its
    host's node when the host names an address."""
    ray = import_ray()
    opts = {"num_cpus": max(1, int(device.cores)) if device.kind == "cpu" else 1,
            "num_gpus": 1 if device.kind == "gpu" else 0, "max_restarts": 0, "max_task_retries": 0}
    addr = cluster.hosts[device.host].address if cluster.hosts else ""
    if addr:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        match = [n for n in nodes if n.get("NodeManagerAddress") == addr or n.get("NodeName") == addr]
        if not match:
            raise ExecutionError(f"device {device.name} is on host {cluster.hosts[device.host].name} ({addr}), but "
                                 f"the Ray cluster has no live node there (nodes: "
                                 f"{', '.join(n.get('NodeManagerAddress', '?') for n in nodes)}); start a Ray "
                                 "worker on that host or fix the host's address")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(match[0]["NodeID"], soft=False)
    return opts


def _start_actors(cluster, devices, make_args, timeout_s: float):
    """One :class:`DeviceWorker` per device in ``devices``; waits until each is ready.

    Raises
    ------
    ExecutionError
        When the Ray cluster has too few CPUs or GPUs for the actors, an actor fails to
        start, or they are not all up within ``timeout_s``.
    """
    ray = import_ray()
    opts = {d: _actor_options(cluster.devices[d], cluster) for d in devices}
    total = ray.cluster_resources()
    for what, unit in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
        need = sum(o[what] for o in opts.values())
        if need > total.get(unit, 0):
            big = max(opts, key=lambda d: opts[d][what])
            raise ExecutionError(f"the actors need {need:g} {unit}(s) (device {big} ({cluster.devices[big].name}) "
                                 f"alone {opts[big][what]:g}) but the Ray cluster has {total.get(unit, 0):g} in all; "
                                 f"start Ray with more {unit}s, or use fewer or smaller devices")
    cls = ray.remote(DeviceWorker)
    actors = {d: cls.options(**opts[d]).remote(*make_args(d)) for d in devices}
    refs = {d: a.ready.remote() for d, a in actors.items()}
    info = {}
    try:
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        late = [d for d, r in refs.items() if r not in ready]
        if late:
            raise ExecutionError(
                f"Ray did not start the actors of {', '.join(f'device {d} ({cluster.devices[d].name})' for d in late)} "
                f"within {timeout_s:g} s (free: {ray.available_resources().get('CPU', 0):g} CPUs); the cluster is "
                "busy or slow to start workers: try again, or give it more room")
        for d, ref in refs.items():
            try:
                info[d] = ray.get(ref)
            except ray.exceptions.RayError as e:
                cause = getattr(e, "cause", None) or e
                raise ExecutionError(f"the actor of device {d} ({cluster.devices[d].name}) failed to start: "
                                     f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1]}") from None
    except BaseException:
        for a in actors.values():
            ray.kill(a)
        raise
    return actors, info


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
    Same interface as :class:`~tvm_pesto.run.executor.Executor` (``run``, ``close``,
    ``broken``, ``closed``); the actors and the graph start on the first run.
    """

    def __init__(self, program: Program, cluster, bundle: str, session: RaySession | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, start_timeout_s: float = START_TIMEOUT_S):
        from .bundle import device_files, read_manifest

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
        self._files = {d: {f: open(os.path.join(bundle, f), "rb").read() for f in device_files(self.manifest, d)}
                       for d in self.plan.tasks}
        for d in self.plan.tasks:
            if str(d) not in self.manifest.get("libraries", {}):
                raise ExecutionError(f"the bundle in {bundle!r} has no library for device {d}; export the model again")

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
        from ray.dag import InputNode, MultiOutputNode

        prog = self.program.to_dict()
        specs = {d: [{"ops": t.ops, "sources": t.sources, "sends": t.sends} for t in ts]
                 for d, ts in self.plan.tasks.items()}
        self.actors, self.actor_info = _start_actors(
            self.cluster, self.devices,
            lambda d: (self.cluster.to_dict(), d, self.manifest, self._files[d], prog, specs[d]),
            self.start_timeout_s)
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
        self._ray = ray

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
            import shutil

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
    from ..cluster.linkbench import fit_links

    ray = import_ray()
    from ray.dag import InputNode

    session = session if session is not None else RaySession()
    d = cluster.num_devices
    pairs = [(i, j) for i in range(d) for j in range(d) if i != j]
    if not pairs:
        return {}
    actors, _ = _start_actors(cluster, list(range(d)), lambda k: (cluster.to_dict(), k), START_TIMEOUT_S)
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


__all__ = ["DeviceWorker", "RayExecutor", "RaySession", "Schedule", "StepFailed", "Task", "from_wire",
           "measure_ray_links", "schedule", "to_wire", "use_ray"]
