"""Build a placed module: one compiled module per device, run together by the executor."""
from __future__ import annotations

import json
import os
import time

import numpy as np
import tvm
from tvm import relax

from .. import __version__
from ..backends.gpu import tvm_cuda
from ..backends.registry import built_unit, get_backend, unit_backend
from ..errors import BuildError
from ..report import build_report, write_report
from ..run.bundle.format import BUNDLE_FORMAT, BUNDLE_VERSION, MANIFEST, sha256
from ..run.runtime import PlacedRuntime
from .program import read_program, split_by_device
from .rewrite import apply_plan, unit_segments


def compile_for(mod: tvm.IRModule, target: dict, what: str, database=None):
    """``tvm.compile`` with the target's default pipeline (so ops fuse); errors explained.

    CUDA targets go through :func:`tvm_pesto.backends.gpu.tvm_cuda.compile_cuda` (dlight
    GPU schedules, a MetaSchedule database when given).
    """
    if target.get("kind") == "cuda":
        return tvm_cuda.compile_cuda(mod, target, database=database, what=what)
    tgt = tvm.target.Target(target)
    try:
        return tvm.compile(mod, target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    except Exception as e:  # noqa: BLE001 - TVM raises many types; explain at our boundary
        first = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise BuildError(f"TVM failed to build {what} for target {target}: {first}") from e


def extern_calls(mod: tvm.IRModule) -> list[str]:
    """Names of the global functions ``mod``'s functions call with ``R.call_dps_packed``."""
    names: list[str] = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_dps_packed":
            n = str(e.args[0].global_symbol)
            if n not in names:
                names.append(n)

    for gv in mod.get_global_vars():
        fn = mod[gv]
        if isinstance(fn, relax.Function):
            relax.analysis.post_order_visit(fn.body, visit)
    return names


class PlacedModule(PlacedRuntime):
    """A model split across devices and backends, built and ready to run.

    ``plan`` says what was decided (``plan.units``: backend and ops per unit;
    ``plan.order``: per device); ``placement`` (when built by :func:`tvm_pesto.build`)
    holds the candidates, costs and the simulation; ``placed_mod`` is the rewritten
    IRModule, ``device_mods`` the per-device modules, ``executables`` their builds.
    :meth:`export` writes a bundle that :func:`tvm_pesto.load` runs without the compiler.

    ``units`` maps the global name of each library unit (ONNX Runtime, torch, ...; not the
    global functions a user's module calls itself) to what its backend built
    (:class:`~tvm_pesto.backends.base.BuiltUnit`), taken when the model is made: the model
    holds its units' callables and sources itself, so it runs and exports after
    :func:`tvm_pesto.backends.release_all` (which drops only the backends' references).

    Raises
    ------
    BuildError
        When a library unit ``placed_mod`` calls is not built in this process (released
        before the model was made: apply the plan again), or a device's module fails to build.
    """

    def __init__(self, placed_mod, cluster, plan=None, placement=None, progress=None):
        self.placed_mod = placed_mod
        self.plan = plan
        self.placement = placement
        self.device_mods = split_by_device(placed_mod)
        self.units = {g: built_unit(g) for m in self.device_mods.values() for g in extern_calls(m)
                      if unit_backend(g) is not None}
        self.executables = {}
        vms = {}
        for k, (d, m) in enumerate(self.device_mods.items()):
            dev = cluster.devices[d]
            self.executables[d] = compile_for(m, dev.target, f"the module of device {d} ({dev.name})")
            if dev.present:
                if dev.kind == "gpu":
                    tvm_cuda.use_available_jit()
                vms[d] = relax.VirtualMachine(self.executables[d], dev.tvm_device())
            if progress:
                progress(k + 1, len(self.device_mods))
        super().__init__(read_program(placed_mod), vms, cluster)

    @property
    def build_seconds(self) -> dict[str, float]:
        """Seconds each library backend took to build this model's units (its compile or
        session creation; the TVM device modules are not counted), by backend name.

        A unit its backend had built before (the same subgraph in an earlier build of this
        process) counts with the seconds that first build took."""
        out: dict[str, float] = {}
        for u in self.units.values():
            out[u.backend] = out.get(u.backend, 0.0) + u.build_s
        return out

    @property
    def problem(self):
        return self.placement.problem if self.placement is not None else None

    @property
    def sim(self):
        return self.placement.sim if self.placement is not None else None

    def unit_segments(self) -> dict[str, tuple[int, ...]]:
        """Segment function name (``dev<d>_seg<k>``, as the executor's trace names it) -> the
        plan's units it runs, cut as :func:`~tvm_pesto.builder.rewrite.apply_plan` cut them.

        Raises
        ------
        BuildError
            When the model holds no placement (built from a given plan: its graph is not kept).
        """
        if self.placement is None:
            raise BuildError("this model holds no placement (it was built from a given plan), so its segments' "
                             "units are not known; build it with tvm_pesto.build(mod, cluster)")
        return unit_segments(self.placement.analysis.rg, self.placement.plan)

    def report(self, path: str, inputs=None, trace=None, measured_s: float | None = None,
               model: str | None = None) -> list[str]:
        """Write where every node ran and why into the folder ``path``: ``report.html`` (one
        self-contained page: the graph laid out by dagre, each node coloured by backend and
        outlined by device; the simulated and measured Gantt charts; the final choice's
        options; per unit its predicted and measured time; per node what each backend would
        have cost it), ``report.json`` and ``nodes.csv`` (:mod:`tvm_pesto.report`).

        The measured times come from ``trace`` (one :meth:`run_traced` run), else from a
        traced run on ``inputs``, else from the last traced run; ``measured_s`` is the time per
        run to show (default: the final choice's measurement of the kept option).

        Returns
        -------
        list of str
            The files written, by name.

        Examples
        --------
        >>> import os, tempfile, tvm_pesto
        >>> from tvm_pesto.candidates.examples import tiny_cnn
        >>> mod, (x,) = tiny_cnn()
        >>> placed = tvm_pesto.build(mod, "cpu:2", costs="roofline", measure_final=False)
        >>> placed.report(os.path.join(tempfile.mkdtemp(), "r"), inputs=[x])
        ['nodes.csv', 'report.html', 'report.json']
        """
        if trace is None and inputs is not None:
            self(*inputs)  # warm: the first call of a build pays its caches and allocations
            trace = self.run_traced(*inputs)[1]
        elif trace is None:
            trace = self.last_trace
        return write_report(build_report(self, trace, measured_s, model), path)

    def export(self, path: str) -> str:
        """Write a bundle that runs this model in another process with TVM's runtime only.

        The folder gets one shared library per device (``device<d>.so``), every non-TVM
        backend's artifact (the ONNX model of an ``onnxruntime`` unit, the ``torch.export``
        program of a ``torch`` unit, the library of a ``tvm-ms`` unit), the program (which
        segment runs where, what moves between devices), the plan, the cluster, and a
        manifest with a SHA-256 checksum per file. Load it with :func:`tvm_pesto.load`.

        Returns
        -------
        str
            ``path``.

        Raises
        ------
        BuildError
            When a backend of the plan cannot export its units, the module calls a global
            function no backend built, or the libraries cannot be written (the message names
            the part).
        """
        os.makedirs(path, exist_ok=True)
        files: list[str] = []
        libs = {}
        for d, ex in self.executables.items():
            fname = f"device{d}.so"
            try:
                ex.export_library(os.path.join(path, fname))
            except Exception as e:  # noqa: BLE001 - TVM's linker error, explained
                raise BuildError(f"exporting the module of device {d} failed: {type(e).__name__}: "
                                 f"{str(e).strip().splitlines()[-1] if str(e).strip() else ''}") from e
            libs[str(d)] = fname
            files.append(fname)
        artifacts = []
        for d, m in self.device_mods.items():
            for gname in extern_calls(m):
                unit = self.units.get(gname)
                if unit is None:
                    raise BuildError(f"the module of device {d} calls {gname!r}, a global function no backend "
                                     "built; a bundle cannot carry it: run the model in this process, or make "
                                     "that function a backend (tvm_pesto.backends.register_backend)")
                meta = get_backend(unit.backend).artifact(unit, path, f"extern{len(artifacts)}")
                meta["device"] = int(d)
                artifacts.append(meta)
                files.extend(meta["files"])
        docs = {"program.json": self.program.to_dict(), "cluster.json": self.cluster.to_dict(),
                "plan.json": self.plan.to_dict(self.problem.graph if self.problem is not None else None)
                if self.plan is not None else {}}
        for name, data in docs.items():
            with open(os.path.join(path, name), "w") as f:
                json.dump(data, f, indent=1, default=_jsonable)
            files.append(name)
        manifest = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "tvm_pesto": __version__,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "libraries": libs,
                    "artifacts": artifacts, "files": {f: sha256(os.path.join(path, f)) for f in files}}
        with open(os.path.join(path, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
        return path


def _jsonable(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def build_placement(pl, cluster, progress=None) -> PlacedModule:
    """The :class:`PlacedModule` of a placement (:class:`~tvm_pesto.plan.placement.Placement`) on ``cluster``."""
    return PlacedModule(apply_plan(pl.analysis.rg, pl.plan, cluster), cluster, pl.plan, pl, progress=progress)


__all__ = ["PlacedModule", "build_placement", "compile_for", "extern_calls"]
