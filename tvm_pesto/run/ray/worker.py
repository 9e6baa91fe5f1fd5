"""The Ray side of :mod:`tvm_pesto.run.ray.executor`: the actor of one device
(:class:`DeviceWorker`), how values travel between actors (:func:`to_wire`, :func:`from_wire`),
and :func:`start_actors`, which asks Ray for one actor per device, pinned to its cores (or one
GPU) on its host's node.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import numpy as np

from ...cluster.cluster import Cluster
from ...cluster.device_thread import enter_device_thread
from ...errors import ExecutionError, error_line
from ..bundle.format import check_files, load_library, register_artifacts
from ..program import Program, Step
from .session import import_ray


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
    index : int
        The device's index in the cluster.
    manifest : dict, optional
        The bundle manifest; ``files`` maps each of this device's files to its bytes.
    program : dict, optional
        :meth:`Program.to_dict`, and ``tasks`` this device's :class:`Task` list.
    """

    def __init__(self, cluster: dict, index: int, manifest: dict | None = None, files: dict | None = None,
                 program: dict | None = None, tasks: list | None = None):
        self.cluster = Cluster.from_dict(cluster)
        self.index = int(index)
        self.device = self.cluster.devices[self.index]  # the cluster's Device
        self.tvm_device = self.device.tvm_device()
        self.pinned: set = set()
        self._pin()
        self.vm = None
        self.steps: list[Step] = []
        self.tasks = tasks or []
        self.env: dict = {}
        self.trace: list = []
        self.bufs: dict = {}
        if manifest is not None:
            self.dir = tempfile.mkdtemp(prefix=f"tvm-pesto-ray-dev{self.index}-")
            for name, data in (files or {}).items():
                path = os.path.join(self.dir, name)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            try:
                check_files(self.dir, manifest, list(files or {}))
                register_artifacts(self.dir, manifest, self.cluster, self.index)
                self.vm = load_library(self.dir, manifest, self.cluster, self.index)
            finally:  # loaded (mapped, or read by their libraries): the files are not needed any more
                shutil.rmtree(self.dir, ignore_errors=True)
            self.steps = Program.from_dict(program).steps

    def load_program(self, program: dict, tasks: list) -> None:
        """Run another program over the library already loaded: its steps and this
        device's tasks replace the ones given at the start (between compiled graphs)."""
        self.steps, self.tasks, self.env, self.trace = Program.from_dict(program).steps, tasks, {}, []

    def _pin(self):
        """Pin the calling thread to the device's cores (when this machine has them) and
        size TVM's pool: Ray runs the compiled graph in a thread of its own."""
        me = threading.get_ident()
        if me in self.pinned:
            return
        self.pinned.add(me)
        if self.device.cpu_ids and not set(self.device.cpu_ids) <= os.sched_getaffinity(0):
            return  # another machine's cores: leave the thread where Ray put it
        enter_device_thread(self.device)

    def ready(self) -> dict:
        """Where the actor runs (process id, node address, cores it may use)."""
        import ray

        return {"pid": os.getpid(), "node": ray.util.get_node_ip_address(),
                "cores": sorted(os.sched_getaffinity(0)), "device": self.index}

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
                        env[key] = from_wire(value, self.tvm_device)
                    else:
                        env[key] = from_wire(value["v"][key], self.tvm_device)
                        # on the receiving device, from when it could take the value to when it holds it
                        self.trace.append(("copy", self.index, f"copy<-{src[1]}", max(value["t"], began),
                                           time.perf_counter()))
                    continue
                step = self.steps[op[1]]
                if step.kind == "call":
                    args_ = [env[a] for a in step.args]
                    ts = time.perf_counter()
                    env[step.out] = self.vm[step.func](*args_)
                    self.trace.append(("compute", self.index, step.func, ts, time.perf_counter()))
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
            raise StepFailed(self.index, where, error_line(e)) from None
        out = {"v": sends, "t": time.perf_counter()}
        if k == len(self.tasks) - 1:
            out["trace"], self.env = self.trace, {}
        return out

    # -- link benchmark: the executor's own send and receive -------------------------------
    def bench_alloc(self, sizes) -> int:
        import tvm

        self._pin()
        self.bufs = {int(n): tvm.runtime.tensor(np.ones(max(int(n) // 4, 1), dtype="float32"), device=self.tvm_device)
                     for n in sizes}
        return len(self.bufs)

    def bench_send(self, msg: dict) -> dict:
        self._pin()
        return {"n": msg["n"], "acc": msg["acc"], "t": time.perf_counter(), "v": to_wire(self.bufs[msg["n"]])}

    def bench_recv(self, msg: dict) -> dict:
        self._pin()
        from_wire(msg["v"], self.tvm_device)
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


def start_actors(cluster, devices, make_args, timeout_s: float):
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


__all__ = ["DeviceWorker", "StepFailed", "from_wire", "start_actors", "to_wire"]
