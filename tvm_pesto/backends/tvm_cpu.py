"""TVM itself as a backend: LLVM code from the default Relax pipeline (with operator fusion).

``tvm`` is the native backend: its candidates (TVM-like fusion groups, their sub-chains and
single ops) stay as Relax ops in ``main`` and are compiled with the placed module, so it
runs everything no other backend takes. Without MetaSchedule the kernels are naive
(unscheduled TIR), so it is slow on convolutions and matmuls.

``tvm-ms`` reads a MetaSchedule tuning database (a work directory with
``database_workload.json`` and ``database_tuning_record.json``) and builds each candidate
with the tuned schedules applied; it is called like the external backends
(``R.call_dps_packed``). It is unavailable when no database is given. A database with
records tuned for another target than the device's is refused when a candidate is built
(:func:`tvm_pesto.costs.tuning_db.check_database_target`): the build error names both
targets, and the candidate stays on another backend.

Examples
--------
>>> from tvm_pesto.backends.tvm_cpu import TvmBackend
>>> TvmBackend().available()
(True, '')
"""
from __future__ import annotations

import os

import tvm
from tvm import relax

from ..errors import BuildError
from .base import Backend, output_types


def _compile(func: relax.Function, target: dict, database: str | None = None):
    if database is not None:
        from ..costs.tuning_db import check_database_target
        from ..errors import CostError

        try:
            check_database_target(database, target)  # MetaSchedule itself would apply any target's records
        except CostError as e:
            raise BuildError(str(e)) from None
    tgt = tvm.target.Target(target)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    try:
        if database is not None:
            from tvm.s_tir import meta_schedule as ms  # noqa: F401 - registers the passes

            with tgt, tvm.transform.PassContext(opt_level=3):
                mod = relax.transform.LegalizeOps()(mod)
                mod = relax.transform.MetaScheduleApplyDatabase(database)(mod)
        return tvm.compile(mod, target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise BuildError(f"TVM could not compile the subgraph for {target}: {msg}") from e


class TvmBackend(Backend):
    """TVM-native code, compiled with the device's own segment for its target (LLVM on a
    CPU, CUDA with dlight schedules on a GPU); the fallback for every op on every device."""

    name = "tvm"
    device_kinds = ("cpu", "gpu")
    graph_level = False
    native = True  # candidates stay as Relax ops in the placed module
    max_ops = 8

    def patterns(self):
        return []  # candidates come from fusion groups (tvm_pesto.candidates), not patterns

    def supports_op(self, call) -> bool:
        return True

    def available(self) -> tuple[bool, str]:
        try:
            tvm.get_global_func("target.build.llvm")
        except Exception:  # noqa: BLE001
            return False, "this TVM build has no LLVM code generator (target.build.llvm is missing)"
        return True, ""

    def _database(self):
        return None

    def make_callable(self, func: relax.Function, device):
        from ..run.loaders import vm_runner

        ex = _compile(func, dict(getattr(device, "target", {"kind": "llvm"})), self._database())
        dev = device.tvm_device() if hasattr(device, "tvm_device") else tvm.cpu(0)
        return vm_runner(relax.VirtualMachine(ex, dev)["main"], len(func.params), len(output_types(func)))

    def export_artifact(self, func: relax.Function, device, out_dir: str, stem: str) -> dict:
        """The subgraph compiled (with the tuning database) and exported as a shared library."""
        import os

        fname = f"{stem}.so"
        _compile(func, dict(getattr(device, "target", {"kind": "llvm"})), self._database()).export_library(
            os.path.join(out_dir, fname))
        return {"kind": "tvm-vm", "files": [fname]}


class TvmMetaScheduleBackend(TvmBackend):
    """TVM with a MetaSchedule tuning database applied (``tvm-ms``)."""

    name = "tvm-ms"
    device_kinds = ("cpu",)
    native = False
    tvm_groups = True  # candidates: TVM fusion groups, sub-chains and single ops

    def __init__(self, database: str | None = None):
        super().__init__()
        self.database = database if database is not None else os.environ.get("TVM_PESTO_MS_DB")

    def _database(self):
        return self.database

    def available(self) -> tuple[bool, str]:
        ok, why = super().available()
        if not ok:
            return ok, why
        if not self.database:
            return False, ("no MetaSchedule tuning database given; set TVM_PESTO_MS_DB to a work directory "
                           "written by tvm.s_tir.meta_schedule.tune_tir/tune_relax")
        need = ("database_workload.json", "database_tuning_record.json")
        missing = [f for f in need if not os.path.isfile(os.path.join(self.database, f))]
        if missing:
            return False, f"tuning database {self.database!r} lacks {', '.join(missing)}"
        try:
            from tvm.s_tir import meta_schedule  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return False, f"MetaSchedule cannot be imported ({type(e).__name__}: {e}); pip install psutil cloudpickle"
        return True, ""
