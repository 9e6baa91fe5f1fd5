"""The Ray executor's schedule: a placed :class:`~tvm_pesto.run.program.Program` cut into
tasks, one per segment call, each with what it receives and what it sends.

Pure data, no Ray: :func:`schedule` is what :class:`~tvm_pesto.run.ray_executor.RayExecutor`
binds to its actors in order, and it prints as plain dataclasses.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ExecutionError
from .program import Program


@dataclass
class Task:
    """One segment call of a device, with the light steps around it.

    ``sources`` are the graph nodes it reads: ``("input", i)`` or ``("task", device,
    index)``; ``ops`` what it does, in order: ``("recv", source position, key)``,
    ``("step", step index)`` (call, item, tuple, alias or copy-as-alias); ``sends`` the
    keys its output carries to other devices or to the caller.
    """

    device: int
    index: int
    ops: list = field(default_factory=list)
    sources: list = field(default_factory=list)
    sends: list = field(default_factory=list)

    def source(self, src: tuple) -> int:
        if src not in self.sources:
            self.sources.append(src)
        return self.sources.index(src)

    def send(self, key: str) -> None:
        if key not in self.sends:
            self.sends.append(key)


@dataclass
class Schedule:
    """:func:`schedule`'s result: ``tasks[d]`` per device in program order, ``order`` the
    ``(device, index)`` of every task in program order (the bind order), ``output`` how
    the caller assembles the result: ``("input", i)``, ``("task", d, index, key)``,
    ``("item", part, i)`` or ``("tuple", [parts])``."""

    tasks: dict
    order: list
    output: object


def schedule(program: Program) -> Schedule:
    """Cut ``program`` into per-device tasks for the Ray executor.

    Every call step becomes a task on its device, bound in program order. A value a task
    needs from another device is received from the task that makes it, which sends it at
    its end; a value moved by a ``copy`` step is received directly by the device that uses
    it. Light steps (``item``, ``tuple``, ``alias``) run on the device that holds their
    arguments, so a device sends one field of a tuple, not the tuple.

    Raises
    ------
    ExecutionError
        When a step reads a value that no earlier step makes (a malformed program).
    """
    steps = program.steps
    made = {s.out: k for k, s in enumerate(steps)}
    inputs = {key: i for i, key in enumerate(program.inputs)}
    loc: dict[str, int] = dict(zip(program.inputs, program.input_devices))
    for s in steps:
        missing = [a for a in s.args if a not in loc]
        if missing:
            raise ExecutionError(f"the program's step {s.out} reads {missing[0]}, which no earlier step makes; "
                                 "export the placed model again")
        loc[s.out] = s.device if s.kind in ("call", "copy") else (loc[s.args[0]] if s.args else 0)
    tasks: dict[int, list[Task]] = {}
    have: dict[int, dict[str, int]] = {}  # device -> key -> index of the task after which it is there
    order: list[tuple[int, int]] = []

    def ready_at(key, d):
        """Index of the task of ``d`` after which ``key`` can be computed on ``d`` from
        values already there (None when it needs values from elsewhere)."""
        if key in have.get(d, {}):
            return have[d][key]
        s = steps[made[key]] if key in made else None
        if s is None or s.kind in ("call", "copy") or loc[key] != d:
            return None
        at = [ready_at(a, d) for a in s.args]
        return None if any(a is None for a in at) else max(at, default=-1)

    def materialize(key, d, at):
        """Append to task ``at`` of ``d`` the light steps that compute ``key`` there."""
        if key in have.get(d, {}):
            return
        s = steps[made[key]]
        for a in s.args:
            materialize(a, d, at)
        tasks[d][at].ops.append(("step", made[key]))
        have[d][key] = at

    def fetch(key, d, task):
        """Make ``key`` (held by another device) available in ``task``: received from the
        task that makes it, or computed here from its arguments."""
        a = loc[key]
        at = ready_at(key, a) if tasks.get(a) else None
        if at is not None and at >= 0:
            materialize(key, a, at)
            tasks[a][at].send(key)
            pos = task.source(("task", a, at))
            task.ops.append(("recv", pos, key))
            have[d][key] = task.index
            return
        s = steps[made[key]]
        if s.kind == "call":
            raise ExecutionError(f"segment output {key} of device {a} is needed on device {d} before it is made; "
                                 "export the placed model again")
        for arg in s.args:
            ensure(arg, d, task)
        task.ops.append(("step", made[key]))
        have[d][key] = task.index

    def ensure(key, d, task):
        """Make ``key`` available on device ``d`` by the time ``task`` runs its call."""
        if key in have[d]:
            return
        if key in inputs:  # every device reads the caller's inputs directly
            task.ops.append(("recv", task.source(("input", inputs[key])), key))
            have[d][key] = task.index
            return
        s = steps[made[key]]
        if s.kind == "copy" or (s.kind == "alias" and loc[key] == d):
            ensure(s.args[0], d, task)
            task.ops.append(("step", made[key]))
        elif loc[key] != d:
            fetch(key, d, task)
            return
        elif s.kind == "call":
            raise ExecutionError(f"segment output {key} is read on device {d} before its call; export the placed "
                                 "model again")
        else:
            for a in s.args:
                ensure(a, d, task)
            task.ops.append(("step", made[key]))
        have[d][key] = task.index

    for k, s in enumerate(steps):
        if s.kind != "call":
            continue
        d = s.device
        tasks.setdefault(d, [])
        have.setdefault(d, {})
        task = Task(d, len(tasks[d]))
        tasks[d].append(task)
        order.append((d, task.index))
        for a in s.args:
            ensure(a, d, task)
        task.ops.append(("step", k))
        have[d][s.out] = task.index

    def resolve(key):
        if key in inputs:
            return ("input", inputs[key])
        s = steps[made[key]]
        if s.kind in ("copy", "alias"):
            return resolve(s.args[0])
        a = loc[key]
        at = ready_at(key, a) if tasks.get(a) else None
        if at is not None and at >= 0:
            materialize(key, a, at)
            tasks[a][at].send(key)
            return ("task", a, at, key)
        if s.kind == "item":
            return ("item", resolve(s.args[0]), s.index)
        if s.kind == "tuple":
            return ("tuple", [resolve(x) for x in s.args])
        raise ExecutionError(f"the program's output {key} is never made; export the placed model again")

    def resolve_out(out):
        return ("tuple", [resolve_out(o) for o in out]) if isinstance(out, tuple) else resolve(out)

    return Schedule(tasks, order, resolve_out(program.output))


__all__ = ["Schedule", "Task", "schedule"]
