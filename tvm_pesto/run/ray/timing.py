"""Time small programs over the Ray executor: what :func:`tvm_pesto.costs.calibrate.dispatch.measure_ray_dispatch`
reads the Ray executor's dispatch from.

The programs' libraries (one per device, compiled by the caller) are written as a bundle, as
:meth:`~tvm_pesto.builder.placed.PlacedModule.export` writes a placed model's, and each
program runs through a :class:`~tvm_pesto.run.ray.executor.RayExecutor` of its own: its
actors load the library from the bundle's bytes, the compiled graph is bound in program
order, and every run goes through :meth:`RayExecutor.run`, as a placed module's call does.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import numpy as np

from ..bundle.format import BUNDLE_FORMAT, BUNDLE_VERSION, MANIFEST, sha256
from .executor import RayExecutor
from .session import RaySession
from .tasks import schedule


def write_bundle(path: str, executables: dict) -> str:
    """Write ``executables`` (device -> compiled module) as a bundle of libraries only (no
    artifacts, no program) in ``path``; returns ``path``."""
    libs, files = {}, {}
    for d, ex in executables.items():
        name = f"device{int(d)}.so"
        ex.export_library(os.path.join(path, name))
        libs[str(int(d))] = name
        files[name] = sha256(os.path.join(path, name))
    with open(os.path.join(path, MANIFEST), "w") as f:
        json.dump({"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "libraries": libs, "artifacts": [],
                   "files": files}, f)
    return path


def time_ray_programs(programs: dict, runs: dict, cluster, executables: dict, session=None, warmup: int = 20,
                      min_s: float = 0.2, min_runs: int = 50, rounds: int = 5) -> dict:
    """Median seconds per run over the Ray executor, per label of ``runs`` (label ->
    ``(program name, inputs)``; ``programs`` maps names to
    :class:`~tvm_pesto.run.program.Program`): one program at a time, each compiled in turn
    over the same actors, started once for every device the programs use
    (:meth:`~tvm_pesto.run.ray.executor.RayExecutor.rebind`: one graph at a time, so no
    other graph's loop polls beside the one timed); a program's
    labels run in ``rounds`` interleaved rounds, after ``warmup`` runs each, of at least
    ``min_runs / rounds`` runs and ``min_s / rounds`` seconds per label and round.
    Without ``session``, a local Ray is started for them (or the one this process is
    connected to used) and stopped after.

    Raises
    ------
    ExecutionError
        When Ray cannot start the actors or a run fails.
    """
    own = RaySession() if session is None else None
    session = own or session
    tmp = tempfile.mkdtemp(prefix="tvm-pesto-dispatch-")
    times: dict = {}
    try:
        bundle = write_bundle(tmp, executables)
        todo = [name for name in programs if any(p == name for p, _ in runs.values())]
        if not todo:
            return times
        # the actors of every device the programs use, started once; each program rebinds them
        ex = RayExecutor(programs[max(todo, key=lambda n: len(schedule(programs[n]).tasks))], cluster, bundle,
                         session)
        try:
            ex.start()
            for name in todo:
                ex.rebind(programs[name])
                mine = {label: inputs for label, (pname, inputs) in runs.items() if pname == name}
                per: dict = {label: [] for label in mine}
                for label, inputs in mine.items():
                    for _ in range(warmup):
                        ex.run(inputs)
                for _ in range(rounds):
                    for label, inputs in mine.items():
                        ts: list = []
                        while len(ts) < min_runs / rounds or sum(ts) < min_s / rounds:
                            t = time.perf_counter()
                            ex.run(inputs)
                            ts.append(time.perf_counter() - t)
                        per[label] += ts
                times.update({label: float(np.median(v)) for label, v in per.items()})
        finally:
            ex.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if own is not None:
            own.close()
    return times


__all__ = ["time_ray_programs", "write_bundle"]
