"""TVM itself as a backend: LLVM code from the default Relax pipeline (with operator fusion).

``tvm`` is the native backend: its candidates (TVM-like fusion groups, their sub-chains and
single ops) stay as Relax ops in ``main`` and are compiled with the placed module, so it
runs everything no other backend takes. Without MetaSchedule the kernels are naive
(unscheduled TIR), so it is slow on convolutions and matmuls.

``tvm-ms`` reads a MetaSchedule tuning database (a work directory with
``database_workload.json`` and ``database_tuning_record.json``) and builds each candidate
with the tuned schedules applied; it is called like the external backends
(``R.call_dps_packed``). It is unavailable when no database is given.

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
    """TVM-native code (default pipeline, fusion, LLVM); the fallback for every op."""

    name = "tvm"
    device_kinds = ("cpu",)
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
        target = dict(getattr(device, "target", {"kind": "llvm"}))
        ex = _compile(func, target, self._database())
        dev = device.tvm_device() if hasattr(device, "tvm_device") else tvm.cpu(0)
        vm = relax.VirtualMachine(ex, dev)
        n_in = len(func.params)
        n_out = len(output_types(func))
        main = vm["main"]

        def run(*args):
            res = main(*args[:n_in])
            outs = [res[k] for k in range(n_out)] if n_out > 1 else [res]
            for o, r in zip(args[n_in:], outs):
                r.copyto(o)

        return run


class TvmMetaScheduleBackend(TvmBackend):
    """TVM with a MetaSchedule tuning database applied (``tvm-ms``)."""

    name = "tvm-ms"
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
