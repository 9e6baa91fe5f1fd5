"""The Ray executor's schedule: a placed :class:`~tvm_pesto.run.program.Program` cut into
tasks, one per segment call, each with what it receives and what it sends.

Pure data, no Ray: :func:`schedule` is what :class:`~tvm_pesto.run.ray.executor.RayExecutor`
binds to its actors in order, and it prints as plain dataclasses.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import ExecutionError
from ..program import Program


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
    loc: dict[str, int] = dict(zip(program.inputs, program.input_devices))
    for s in steps:
        missing = [a for a in s.args if a not in loc]
        if missing:
            raise ExecutionError(f"the program's step {s.out} reads {missing[0]}, which no earlier step makes; "
                                 "export the placed model again")
        loc[s.out] = s.device if s.kind in ("call", "copy") else (loc[s.args[0]] if s.args else 0)
    cut = _Cutter(program, loc)
    for k, s in enumerate(steps):
        if s.kind != "call":
            continue
        d = s.device
        cut.tasks.setdefault(d, [])
        cut.have.setdefault(d, {})
        task = Task(d, len(cut.tasks[d]))
        cut.tasks[d].append(task)
        cut.order.append((d, task.index))
        for a in s.args:
            cut.ensure(a, d, task)
        task.ops.append(("step", k))
        cut.have[d][s.out] = task.index
    return Schedule(cut.tasks, cut.order, cut.resolve_out(program.output))


class _Cutter:
    """The state of :func:`schedule` while it cuts a program: the tasks so far per device,
    their bind order, and on which device each value is available after which task."""

    def __init__(self, program: Program, loc: dict[str, int]):
        self.steps = program.steps
        self.made = {s.out: k for k, s in enumerate(self.steps)}
        self.inputs = {key: i for i, key in enumerate(program.inputs)}
        self.loc = loc  # value -> the device that holds it
        self.tasks: dict[int, list[Task]] = {}
        self.have: dict[int, dict[str, int]] = {}  # device -> key -> index of the task after which it is there
        self.order: list[tuple[int, int]] = []

    def ready_at(self, key, d):
        """Index of the task of ``d`` after which ``key`` can be computed on ``d`` from
        values already there (None when it needs values from elsewhere)."""
        if key in self.have.get(d, {}):
            return self.have[d][key]
        s = self.steps[self.made[key]] if key in self.made else None
        if s is None or s.kind in ("call", "copy") or self.loc[key] != d:
            return None
        at = [self.ready_at(a, d) for a in s.args]
        return None if any(a is None for a in at) else max(at, default=-1)

    def materialize(self, key, d, at):
        """Append to task ``at`` of ``d`` the light steps that compute ``key`` there."""
        if key in self.have.get(d, {}):
            return
        s = self.steps[self.made[key]]
        for a in s.args:
            self.materialize(a, d, at)
        self.tasks[d][at].ops.append(("step", self.made[key]))
        self.have[d][key] = at

    def fetch(self, key, d, task):
        """Make ``key`` (held by another device) available in ``task``: received from the
        task that makes it, or computed here from its arguments."""
        a = self.loc[key]
        at = self.ready_at(key, a) if self.tasks.get(a) else None
        if at is not None and at >= 0:
            self.materialize(key, a, at)
            self.tasks[a][at].send(key)
            pos = task.source(("task", a, at))
            task.ops.append(("recv", pos, key))
            self.have[d][key] = task.index
            return
        s = self.steps[self.made[key]]
        if s.kind == "call":
            raise ExecutionError(f"segment output {key} of device {a} is needed on device {d} before it is made; "
                                 "export the placed model again")
        for arg in s.args:
            self.ensure(arg, d, task)
        task.ops.append(("step", self.made[key]))
        self.have[d][key] = task.index

    def ensure(self, key, d, task):
        """Make ``key`` available on device ``d`` by the time ``task`` runs its call."""
        if key in self.have[d]:
            return
        if key in self.inputs:  # every device reads the caller's inputs directly
            task.ops.append(("recv", task.source(("input", self.inputs[key])), key))
            self.have[d][key] = task.index
            return
        s = self.steps[self.made[key]]
        if s.kind == "copy" or (s.kind == "alias" and self.loc[key] == d):
            self.ensure(s.args[0], d, task)
            task.ops.append(("step", self.made[key]))
        elif self.loc[key] != d:
            self.fetch(key, d, task)
            return
        elif s.kind == "call":
            raise ExecutionError(f"segment output {key} is read on device {d} before its call; export the placed "
                                 "model again")
        else:
            for a in s.args:
                self.ensure(a, d, task)
            task.ops.append(("step", self.made[key]))
        self.have[d][key] = task.index

    def resolve(self, key):
        """How the caller gets ``key`` (see :class:`Schedule`'s ``output``)."""
        if key in self.inputs:
            return ("input", self.inputs[key])
        s = self.steps[self.made[key]]
        if s.kind in ("copy", "alias"):
            return self.resolve(s.args[0])
        a = self.loc[key]
        at = self.ready_at(key, a) if self.tasks.get(a) else None
        if at is not None and at >= 0:
            self.materialize(key, a, at)
            self.tasks[a][at].send(key)
            return ("task", a, at, key)
        if s.kind == "item":
            return ("item", self.resolve(s.args[0]), s.index)
        if s.kind == "tuple":
            return ("tuple", [self.resolve(x) for x in s.args])
        raise ExecutionError(f"the program's output {key} is never made; export the placed model again")

    def resolve_out(self, out):
        """:meth:`resolve` over a (nested tuple of) output key(s)."""
        return ("tuple", [self.resolve_out(o) for o in out]) if isinstance(out, tuple) else self.resolve(out)


__all__ = ["Schedule", "Task", "schedule"]
