"""TVM itself as a backend: LLVM code from the default Relax pipeline (with operator fusion).

``tvm`` is the native backend: its candidates (TVM-like fusion groups, their sub-chains and
single ops) stay as Relax ops in ``main`` and are compiled with the placed module, so it
runs everything no other backend takes. Without MetaSchedule the kernels are naive
(unscheduled TIR), so it is slow on convolutions and matmuls.

``tvm-ms`` reads a MetaSchedule tuning database (a work directory with
``database_workload.json`` and ``database_tuning_record.json``, written by
``tvm-pesto tune``, :func:`tvm_pesto.costs.tune.tune.tune_model`) and builds each candidate
with the tuned schedules applied; it is called like the external backends
(``R.call_dps_packed``). A candidate is legalised and fused by :func:`fuse_for_tuning`
(the passes of TVM's default CPU pipeline), the database's schedules are applied to the
fused PrimFuncs it holds, and the rest of the default pipeline follows; fused kernels the
database does not hold stay unscheduled, as in ``tvm``. The database comes from
``--ms-db DIR`` or ``TVM_PESTO_MS_DB`` (:func:`set_tuning_database`); without one the
backend is unavailable. A database with
records tuned for another target than the device's is refused when a candidate is built
(:func:`tvm_pesto.backends.ms_database.check_database_target`): the build error names both
targets, and the candidate stays on another backend. So is one tuned over TVM RPC
(``tvm-pesto tune --rpc-tracker``) for any device but one of the same RPC key.

Examples
--------
>>> from tvm_pesto.backends.tvm_cpu import TvmBackend
>>> TvmBackend().available()
(True, '')
"""
from __future__ import annotations

import functools
import hashlib
import os

import tvm
from tvm import relax

from ..errors import BuildError, CostError, error_line
from ..graph.subgraph import structural_key
from ..run.libraries.loaders import vm_runner
from .base import Backend, output_types
from .ms_database import RECORD_FILE, WORKLOAD_FILE, check_database_target, open_database, rpc_target
from .registry import get_backend


#: Environment variable naming the ``tvm-ms`` backend's MetaSchedule database.
MS_DB_ENV = "TVM_PESTO_MS_DB"

#: The ``backend_stamp`` of ``tvm`` measurements: groups timed with the model's own weights
#: bound (:mod:`tvm_pesto.costs.measure.timing`), after calls on constants alone were folded.
TIMING_STAMP = "weights-bound"


def fuse_for_tuning(mod: tvm.IRModule, tgt) -> tvm.IRModule:
    """``mod`` after the library-dispatch, legalisation and fusion passes of TVM's default
    CPU pipeline (``relax.backend.cpu_generic``): its PrimFuncs are the kernels the ``tvm``
    backend compiles, so they are what MetaSchedule tunes and what ``tvm-ms`` looks up.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> fused = fuse_for_tuning(tiny_mlp()[0], tvm.target.Target({"kind": "llvm"}))
    >>> sorted(gv.name_hint for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc))[:3]
    ['fused_matmul1_add1', 'fused_matmul2_multiply', 'fused_matmul_add_gelu']
    """
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    with tgt:
        passes = cpu.library_dispatch_passes(tgt) + cpu.legalize_passes(tgt)
        return tvm.transform.Sequential(passes)(mod)


@functools.lru_cache(maxsize=4)
def _read_database(path: str, stamp: tuple):
    """The database at ``path`` as MetaSchedule reads it, once per version of its files."""
    return open_database(path)


def _database(path: str):
    stats = [os.stat(os.path.join(path, f)) for f in (WORKLOAD_FILE, RECORD_FILE)]
    return _read_database(os.path.abspath(path), tuple((st.st_mtime_ns, st.st_size) for st in stats))


def apply_tuning_database(mod: tvm.IRModule, tgt, database: str) -> tvm.IRModule:
    """``mod`` fused (:func:`fuse_for_tuning`) with the database's schedules applied to the
    kernels it holds (``tirx.is_scheduled``); the others stay unscheduled.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> from tvm_pesto.costs.predict.xgb import default_model_path
    >>> database = default_model_path().parent / "ms-small"   # a bundled database (zoo models' kernels)
    >>> tuned = apply_tuning_database(tiny_mlp()[0], tvm.target.Target({"kind": "llvm"}), database)
    >>> kernels = [f for f in tuned.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    >>> len(kernels), sum(bool(f.attrs and "tirx.is_scheduled" in f.attrs) for f in kernels)   # none is in it
    (8, 0)
    """
    with tgt, tvm.transform.PassContext(opt_level=3), _database(database):
        return relax.transform.MetaScheduleApplyDatabase()(fuse_for_tuning(mod, tgt))


def _tuned_pipeline(tgt, database: str):
    """TVM's default CPU pipeline with the database's schedules applied after fusion."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    @tvm.transform.module_pass(opt_level=0, name="PestoTunedPipeline")
    def pipeline(mod, _ctx):
        mod = apply_tuning_database(mod, tgt, database)
        with tgt:
            return tvm.transform.Sequential(cpu.dataflow_lower_passes(tgt) + cpu.finalize_passes(tgt))(mod)

    return pipeline


def _compile(func: relax.Function, target: dict, database: str | None = None, rpc_key: str = ""):
    if database is not None:
        try:  # MetaSchedule itself would apply any target's records; a remote device's are tagged
            check_database_target(database, rpc_target(target, rpc_key))
        except CostError as e:
            raise BuildError(str(e)) from None
    tgt = tvm.target.Target(target)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    try:
        pipeline = relax.get_default_pipeline(tgt) if database is None else _tuned_pipeline(tgt, database)
        return tvm.compile(mod, target=tgt, relax_pipeline=pipeline)
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

    def measure_stamp(self) -> str | None:
        """How a measurement of this backend was made (:data:`TIMING_STAMP`): records of the
        earlier method (weights replaced by random values) are measured again."""
        return TIMING_STAMP

    def make_callable(self, func: relax.Function, device):
        ex = _compile(func, dict(getattr(device, "target", {"kind": "llvm"})), self._database(),
                      getattr(device, "rpc_key", ""))
        dev = device.tvm_device() if hasattr(device, "tvm_device") else tvm.cpu(0)
        return vm_runner(relax.VirtualMachine(ex, dev)["main"], len(func.params), len(output_types(func)))

    def export_artifact(self, func: relax.Function, device, out_dir: str, stem: str) -> dict:
        """The subgraph compiled (with the tuning database) and exported as a shared library."""
        fname = f"{stem}.so"
        _compile(func, dict(getattr(device, "target", {"kind": "llvm"})), self._database(),
                 getattr(device, "rpc_key", "")).export_library(os.path.join(out_dir, fname))
        return {"kind": "tvm-vm", "files": [fname]}


class TvmMetaScheduleBackend(TvmBackend):
    """TVM with a MetaSchedule tuning database applied (``tvm-ms``)."""

    name = "tvm-ms"
    build_s_guess = (0.2, 0.05)  # one TVM compile per unit, with the tuning database's schedules
    device_kinds = ("cpu",)
    native = False
    tvm_groups = True  # candidates: TVM fusion groups, sub-chains and single ops

    def __init__(self, database: str | None = None):
        super().__init__()
        self.database = database if database is not None else os.environ.get(MS_DB_ENV)
        self._tuned: dict[tuple, float] = {}  # (structure, database stamp, target) -> tuned share

    def _database(self):
        return self.database

    def tuned_fraction(self, func: relax.Function, target: dict) -> float:
        """The share of ``func``'s work (estimated TIR FLOPs, one per kernel at least) in the
        fused kernels the database holds schedules for: 1.0 when every kernel is tuned, 0.0
        when the candidate runs unscheduled TVM code only (or there is no database).

        One lowering per candidate structure, database version and target (remembered).

        Examples
        --------
        >>> from tvm_pesto.candidates.examples import tiny_mlp
        >>> TvmMetaScheduleBackend(database=None).tuned_fraction(tiny_mlp()[0]["main"], {"kind": "llvm"})
        0.0
        """
        if not self.database:
            return 0.0
        key = (structural_key(func), database_stamp(self.database), repr(sorted(target.items())))
        if key not in self._tuned:
            self._tuned[key] = _tuned_share(func, target, self.database)
        return self._tuned[key]

    def measure_stamp(self) -> str | None:
        """Which database a measurement of this backend was made with
        (:func:`database_stamp`); a profiler log re-measures a record of another one."""
        return database_stamp(self.database) if self.database else None

    def available(self) -> tuple[bool, str]:
        ok, why = super().available()
        if not ok:
            return ok, why
        if not self.database:
            return False, ("no MetaSchedule tuning database given; set TVM_PESTO_MS_DB to a work directory "
                           "written by tvm-pesto tune MODEL --trials N --work-dir DIR (or by "
                           "tvm.s_tir.meta_schedule.tune_tir/tune_relax), or pass --ms-db DIR")
        need = ("database_workload.json", "database_tuning_record.json")
        missing = [f for f in need if not os.path.isfile(os.path.join(self.database, f))]
        if missing:
            return False, f"tuning database {self.database!r} lacks {', '.join(missing)}"
        try:
            from tvm.s_tir import meta_schedule  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return False, f"MetaSchedule cannot be imported ({type(e).__name__}: {e}); pip install psutil cloudpickle"
        return True, ""


def _tuned_share(func: relax.Function, target: dict, database: str) -> float:
    from tvm.s_tir.analysis import estimate_tir_flops

    tgt = tvm.target.Target(target)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    try:
        fused = apply_tuning_database(mod, tgt, database)
    except Exception as e:  # noqa: BLE001 - TVM raises many types from deep inside
        raise BuildError(f"TVM could not lower the subgraph to look it up in tuning database {database!r}: "
                         f"{error_line(e)}") from e
    tuned = total = 0.0
    for gv, f in fused.functions.items():
        if not isinstance(f, tvm.tirx.PrimFunc):
            continue
        try:
            work = max(float(estimate_tir_flops(tvm.IRModule({gv: f}))), 1.0)
        except Exception:  # noqa: BLE001 - a kernel TVM cannot count weighs as one FLOP
            work = 1.0
        total += work
        if f.attrs is not None and f.attrs.get("tirx.is_scheduled", False):
            tuned += work
    return tuned / total if total > 0 else 0.0


def database_stamp(path) -> str:
    """A short name for one version of a database: its folder, record count and a hash of
    its record file (``"ms_work:120:3f9a0c1b"``); ``"<folder>:missing"`` without one.

    Examples
    --------
    >>> database_stamp("/nonexistent/ms")
    'ms:missing'
    """
    path = os.path.abspath(os.fspath(path))
    rec = os.path.join(path, RECORD_FILE)
    try:
        st = os.stat(rec)
    except OSError:
        return f"{os.path.basename(path)}:missing"
    return _stamp_of(rec, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _stamp_of(rec_file: str, mtime_ns: int, size: int) -> str:
    h = hashlib.blake2b(digest_size=4)
    lines = 0
    with open(rec_file, "rb") as f:
        for line in f:
            h.update(line)
            lines += bool(line.strip())
    return f"{os.path.basename(os.path.dirname(rec_file))}:{lines}:{h.hexdigest()}"


def set_tuning_database(path) -> str:
    """Make ``path`` the ``tvm-ms`` backend's MetaSchedule database, in this process (the
    shared backend instance) and for processes started later that inherit the environment
    (``TVM_PESTO_MS_DB``). Candidates built before keep the schedules they were built with.

    Returns the absolute path.

    Raises
    ------
    BuildError
        When ``path`` is not a folder holding both database files.

    Examples
    --------
    >>> from tvm_pesto.backends import get_backend
    >>> from tvm_pesto.costs.predict.xgb import default_model_path
    >>> set_tuning_database(default_model_path().parent / "ms-small")   # a bundled database
    '.../ms-small'
    >>> get_backend("tvm-ms").available()
    (True, '')
    >>> get_backend("tvm-ms").database = None; del os.environ[MS_DB_ENV]   # none again
    >>> set_tuning_database("no_such_folder")
    Traceback (most recent call last):
    ...
    tvm_pesto.errors.BuildError: '.../no_such_folder' is not a MetaSchedule database: ...
    """
    path = os.path.abspath(os.fspath(path))
    missing = [f for f in (WORKLOAD_FILE, RECORD_FILE) if not os.path.isfile(os.path.join(path, f))]
    if missing:
        raise BuildError(f"{path!r} is not a MetaSchedule database: it lacks {', '.join(missing)}; write one with "
                         f"tvm-pesto tune MODEL --trials N --work-dir {path}")
    os.environ[MS_DB_ENV] = path
    get_backend("tvm-ms").database = path
    return path
