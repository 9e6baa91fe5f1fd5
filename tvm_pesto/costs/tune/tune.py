"""Tune a model's kernels with MetaSchedule into a database (``tvm-pesto tune``).

:func:`tune_model` legalises and fuses the model as the ``tvm`` backend compiles it
(:func:`tvm_pesto.backends.tvm_cpu.fuse_for_tuning`), extracts one MetaSchedule task per
distinct fused PrimFunc, and tunes the tasks one after the other into a JSON database in
``work_dir``. That database is what the ``tvm-ms`` backend applies (``--ms-db DIR`` or
``TVM_PESTO_MS_DB``) and what the cost model reads as tuned rows
(:func:`tvm_pesto_lab.tuning_rows.read_tuning_db`).

Budget
    ``trials`` is the number of measured schedules over all tasks. It is split evenly over
    the tasks, heaviest first (FLOPs times occurrences; the first ``trials % n`` tasks get
    one more); ``max_tasks`` tunes only the heaviest ones.
Resuming
    MetaSchedule itself, given an existing work directory, loads its records and appends
    to them (workloads are not duplicated), but spends its whole ``max_trials_global``
    again: two runs of 8 trials leave 16 records. :func:`tune_model` therefore counts each
    task's records already in the database and asks MetaSchedule only for the rest of the
    task's share, so running the same command twice measures nothing the second time,
    and raising ``trials`` tunes only the difference. (MetaSchedule may spend fewer trials
    than asked when a task's search space is small.)
Measuring
    Schedules are built and timed in this process
    (:class:`tvm_pesto.costs.tune.ms_measure.InProcessMeasurer`):
    MetaSchedule's LocalBuilder/LocalRunner start worker processes that each import TVM,
    which takes tens of seconds on a loaded machine. Timing runs in a thread pinned to the
    device's cores with a TVM pool of the device's size, as the profiler measures.
Remote devices
    A ``device`` measured over TVM RPC (``Device.rpc_key``,
    :func:`tvm_pesto.costs.measure.remote.remote_cluster`) has its schedules built here and timed on
    a server of its key, one RPC session per search round (the faults of
    :mod:`tvm_pesto.costs.measure.remote` stop tuning with a :class:`TuningError`; the records so far
    stay). Its records are tuned for the target tagged ``rpc:KEY``
    (:func:`tvm_pesto.backends.ms_database.rpc_target`), so such a database is never resumed,
    applied or read as a local device's, nor a local one as the remote device's.

Examples
--------
>>> from tvm_pesto.costs.tune.tune import tune_model                                   # doctest: +SKIP
>>> res = tune_model(mod, {"kind": "llvm", "num-cores": 2}, "ms_work", trials=64)  # doctest: +SKIP
>>> res.trials_spent, [t.name for t in res.tasks][:2]                             # doctest: +SKIP
(64, ['fused_conv2d_add_relu', 'fused_conv2d1_add1_relu1'])
"""
from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ...errors import CostError, TuningError
from ..predict.features import device_descriptor
from .ms_logging import MS_LOGGER, foreign_handlers_set_aside
from .ms_measure import InProcessMeasurer, cpu_intrinsics_only
from .tuning_db import device_for_target, write_device_file

#: Search strategies: MetaSchedule's evolutionary search (with an XGBoost cost model), or
#: replaying random samples of the design space (no cost model; fast per trial).
STRATEGIES = ("evolutionary", "replay")


@dataclass
class TaskResult:
    """One tuning task: a distinct fused PrimFunc of the model.

    ``weight`` is how often the model calls it, ``budget`` its share of the trials,
    ``existing`` its records before this run, ``spent`` the trials this run measured,
    ``best_before_s``/``best_s`` the best valid time in the database before/after this
    run (None without one), ``baseline_s`` the kernel without a schedule (when measured).
    """

    name: str
    weight: int
    flops: float
    budget: int = 0
    existing: int = 0
    spent: int = 0
    best_before_s: float | None = None
    best_s: float | None = None
    baseline_s: float | None = None


@dataclass
class TuneResult:
    """What :func:`tune_model` did (``asdict`` gives the ``--json`` content)."""

    work_dir: str
    target: dict
    strategy: str
    trials: int
    trials_spent: int = 0
    records_before: int = 0
    records_after: int = 0
    seconds: float = 0.0
    tasks: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def tuning_tasks(mod, target: dict) -> list:
    """MetaSchedule tasks of ``mod`` after the ``tvm`` backend's legalisation and fusion,
    heaviest first (FLOPs times occurrences).

    Returns ``[(ExtractedTask, flops)]``.
    """
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    # lazy: loads TVM's compiler, which importing this module does not
    from ...backends.tvm_cpu import fuse_for_tuning

    tgt = tvm.target.Target(target)
    try:
        tasks = ms.relax_integration.extract_tasks(fuse_for_tuning(mod, tgt), tgt)
    except Exception as e:  # noqa: BLE001 - any failure of TVM's passes
        raise TuningError(f"could not extract tuning tasks: TVM's legalisation/fusion failed ({_last_line(e)}); "
                          "check that the model builds with tvm-pesto run --backends tvm") from e
    out = []
    for t in tasks:
        if t.dispatched[0].attrs is not None and t.dispatched[0].attrs.get("tirx.is_scheduled", False):
            continue  # already scheduled by the frontend: nothing to tune
        try:
            flops = float(estimate_tir_flops(t.dispatched[0]))
        except Exception:  # noqa: BLE001 - the estimator has gaps; such a task sorts last
            flops = 0.0
        out.append((t, flops))
    out.sort(key=lambda tf: (-tf[1] * int(tf[0].weight), tf[0].task_name))
    return out


def split_trials(trials: int, n: int, max_tasks: int | None = None) -> list[int]:
    """Trials per task: ``trials`` split evenly over the first ``max_tasks`` of ``n`` tasks.

    Examples
    --------
    >>> split_trials(10, 4)
    [3, 3, 2, 2]
    >>> split_trials(10, 4, max_tasks=2)
    [5, 5, 0, 0]
    """
    k = n if not max_tasks else min(int(max_tasks), n)
    return [trials // k + (1 if i < trials % k else 0) if i < k else 0 for i in range(n)]


def check_budget(trials: int, max_tasks: int | None = None, strategy: str = "evolutionary") -> None:
    """Raise :class:`TuningError` for a budget :func:`tune_model` cannot spend.

    Examples
    --------
    >>> check_budget(0)
    Traceback (most recent call last):
    ...
    tvm_pesto.errors.TuningError: --trials must be at least 1 (measured schedules over all tasks), not 0
    """
    if int(trials) < 1:
        raise TuningError(f"--trials must be at least 1 (measured schedules over all tasks), not {trials}")
    if strategy not in STRATEGIES:
        raise TuningError(f"unknown search strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
    if max_tasks is not None and int(max_tasks) < 1:
        raise TuningError(f"--max-tasks must be at least 1, not {max_tasks}")


def tune_model(mod, target: dict, work_dir, trials: int, *, max_tasks: int | None = None,
               strategy: str = "evolutionary", trials_per_iter: int = 32, device=None, min_repeat_ms: int = 20,
               measure_baseline: bool = False, seed: int = 0, progress=None) -> TuneResult:
    """Tune the kernels of ``mod`` for ``target`` into the MetaSchedule database ``work_dir``.

    Parameters
    ----------
    mod : tvm.IRModule
        A static Relax module (:func:`tvm_pesto.models.load_model`).
    target : dict
        Target JSON dict of the device the database is for, e.g. ``{"kind": "llvm", "num-cores": 2}``.
    work_dir : path-like
        The database folder (created; an existing database is resumed, see the module docstring).
    trials : int
        Measured schedules over all tasks (the total, counting records already there).
    max_tasks : int, optional
        Tune only this many tasks, the heaviest.
    strategy : {"evolutionary", "replay"}
    trials_per_iter : int
        Schedules measured per search round.
    device : Device, optional
        Where schedules are timed (a thread pinned to its cores, or a remote device's RPC
        server); default: the calling thread's cores.
    min_repeat_ms : int
        Least milliseconds a timing repeat runs (short kernels are looped).
    measure_baseline : bool
        Also time each task's kernel without a schedule (``TaskResult.baseline_s``).
    progress : callable(done, total, label), optional
        Trials measured so far out of this run's budget, and the task being tuned.

    Returns
    -------
    TuneResult

    Raises
    ------
    TuningError
        ``trials`` < 1, an unknown strategy, a work directory that cannot be written or
        holds another target's records, a model with nothing to tune, MetaSchedule failing
        on a task (the message names the task and its log; records so far stay), or, for a
        remote device, a tracker that refuses, a key no server is registered under or an
        RPC session that ends early.
    """
    check_budget(trials, max_tasks, strategy)
    t0 = time.perf_counter()
    target = _rpc_target(target, device)
    work_dir = _prepare_work_dir(work_dir, target, device)

    import tvm
    from tvm.s_tir import meta_schedule as ms

    try:  # first: a remote device's tracker and key are checked before the tasks are extracted
        measurer = InProcessMeasurer(device, min_repeat_ms=min_repeat_ms)
    except CostError as e:
        raise TuningError(f"cannot tune over TVM RPC: {e}") from None
    try:
        tasks = tuning_tasks(mod, target)
        if not tasks:
            raise TuningError("the model has no kernel to tune (no unscheduled TIR function after legalisation); "
                              "nothing for tvm-ms to gain")
        tgt = tvm.target.Target(target)
        budgets = split_trials(int(trials), len(tasks), max_tasks)
        db = _open_database(work_dir)
        res = TuneResult(work_dir=work_dir, target=dict(target), strategy=strategy, trials=int(trials),
                         records_before=len(db))
        plan = _plan_tasks(tasks, budgets, db, res)
        todo = sum(max(tr.budget - tr.existing, 0) for _, tr in plan)
        cores = int(getattr(device, "cores", 0) or 0) or _calling_thread_cores()
        counter = _TrialCounter(progress, todo)
        with cpu_intrinsics_only(str(target.get("kind", "llvm")) == "llvm"), _quiet_console():
            _tune_plan(_Tuning(ms, tgt, work_dir, db, measurer, counter, cores), plan, strategy=strategy,
                       trials_per_iter=trials_per_iter, seed=seed, measure_baseline=measure_baseline)
    finally:
        measurer.close()
    res.trials_spent = sum(tr.spent for tr in res.tasks)
    res.records_after = len(db)
    res.seconds = time.perf_counter() - t0
    return res


def _prepare_work_dir(work_dir, target: dict, device) -> str:
    """The absolute database folder, checked writable and free of another target's records,
    with the device file saying whose timings the records are (none for a remote device: its
    records are tagged)."""
    work_dir = _writable_dir(work_dir)
    _check_target(work_dir, target)
    if device is None or not device.remote:  # whose timings the records are (a remote device's are tagged)
        try:
            write_device_file(work_dir, device_descriptor(device) if device is not None else device_for_target(target))
        except CostError as e:
            raise TuningError(str(e)) from None
    return work_dir


def _plan_tasks(tasks: list, budgets: list[int], db, res: TuneResult) -> list:
    """``[(task, TaskResult)]``: each task with its budget and what the database holds for it
    so far (also appended to ``res.tasks``)."""
    plan = []
    for (task, flops), budget in zip(tasks, budgets):
        tr = TaskResult(name=task.task_name, weight=int(task.weight), flops=flops, budget=budget)
        tmod = task.dispatched[0]
        tr.existing = _records_of(db, tmod)
        tr.best_before_s = tr.best_s = _best_s(db, tmod)
        res.tasks.append(tr)
        plan.append((task, tr))
    return plan


@dataclass(frozen=True)
class _Tuning:
    """What every task of one :func:`tune_model` run is tuned with: MetaSchedule's module,
    the target, the database folder and the database, the measurer, the trial counter and
    the tuning threads."""

    ms: object
    tgt: object
    work_dir: str
    db: object
    measurer: object
    counter: object
    cores: int


def _tune_plan(t: _Tuning, plan: list, *, strategy: str, trials_per_iter: int, seed: int,
               measure_baseline: bool) -> None:
    """Tune the tasks of ``plan`` one after the other, each for what its budget has left,
    filling in their :class:`TaskResult` (see :func:`tune_model`)."""
    tgt, work_dir, db, measurer, counter = t.tgt, t.work_dir, t.db, t.measurer, t.counter
    for k, (task, tr) in enumerate(plan):
        where = f"task {k + 1}/{len(plan)} {tr.name!r}"
        if measure_baseline:
            try:
                tr.baseline_s = _time_unscheduled(task.dispatched[0], tgt, measurer)
            except CostError as e:
                raise _rpc_stopped(e, where, db, work_dir) from None
        left = tr.budget - tr.existing
        if left <= 0:
            continue
        counter.label = f"task {k + 1}/{len(plan)} {tr.name}"
        counter.report()
        before = len(db)
        try:
            _tune_one(t, task, left, min(int(trials_per_iter), left), strategy, seed + k)
        except Exception as e:  # noqa: BLE001 - anything MetaSchedule raises, explained
            if measurer.error is not None:
                raise _rpc_stopped(measurer.error, where, db, work_dir) from e
            raise TuningError(
                f"MetaSchedule failed while tuning {where} ({_last_line(e)}); the records measured so far "
                f"({len(db)}) stay in {work_dir}. See {os.path.join(work_dir, 'logs')} for the task's log; "
                "rerun the same command to resume "
                "(finished tasks are not tuned again), or try --strategy replay") from e
        tr.spent = len(db) - before
        tr.best_s = _best_s(db, task.dispatched[0])


def _rpc_target(target: dict, device) -> dict:
    # lazy: loads TVM's compiler, which importing this module does not
    from ...backends.ms_database import rpc_target

    return rpc_target(dict(target), getattr(device, "rpc_key", ""))


def _rpc_stopped(err, where: str, db, work_dir: str) -> TuningError:
    """The error for a remote measurement that stopped tuning (a :class:`CostError` of
    :mod:`tvm_pesto.costs.measure.remote`)."""
    return TuningError(f"tuning over TVM RPC stopped at {where}: {err}. The records measured so far ({len(db)}) "
                       f"stay in {work_dir}: rerun the same command to resume")


def _tune_one(t: _Tuning, task, max_trials, per_iter, strategy, seed):
    """One task through MetaSchedule's task scheduler (round-robin over that one task)."""
    from tvm.s_tir.meta_schedule.logging import get_loggers_from_work_dir

    ms, work_dir, cores = t.ms, t.work_dir, t.cores
    logging.getLogger(MS_LOGGER).setLevel(logging.WARNING)  # console handler level; files get everything
    with foreign_handlers_set_aside():  # the caller's handlers on its logger would make it fail
        (logger,) = get_loggers_from_work_dir(work_dir, [task.task_name])
    if strategy == "evolutionary":
        from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig

        # One XGBoost thread: its OpenMP workers spin, and on a shared 2-core machine two
        # of them made 100 boosting rounds on two samples take 1.7 s instead of 0.01 s.
        search = "evolutionary"
        cost_model = ms.cost_model.XGBModel(config=XGBConfig(nthread=1), num_tuning_cores=cores)
    else:
        search, cost_model = ms.search_strategy.ReplayTrace(), "random"
    ctx = ms.TuneContext(mod=task.dispatched[0], target=t.tgt, space_generator="post-order-apply",
                         search_strategy=search, task_name=task.task_name, logger=logger,
                         rand_state=seed, num_threads=cores).clone()
    callbacks = ms.measure_callback.MeasureCallback.create("default") + [t.counter.callback()]
    ms.tune.tune_tasks(tasks=[ctx], task_weights=[float(task.weight)], work_dir=work_dir,
                       max_trials_global=max_trials, num_trials_per_iter=per_iter, builder=t.measurer.builder,
                       runner=t.measurer.runner, database=t.db, cost_model=cost_model, measure_callbacks=callbacks,
                       task_scheduler="round-robin")


class _TrialCounter:
    """Counts measured schedules for the progress callback (a MetaSchedule measure callback)."""

    def __init__(self, progress, total: int):
        self.progress, self.total, self.done, self.label = progress, total, 0, ""

    def report(self):
        if self.progress is not None:
            self.progress(self.done, self.total, self.label)

    def callback(self):
        from tvm.ir.utils import derived_object
        from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback

        counter = self

        @derived_object
        class _Count(PyMeasureCallback):
            def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
                counter.done += len(measure_candidates)
                counter.report()

        return _Count()


@contextlib.contextmanager
def _quiet_console():
    """Restore MetaSchedule's logger level afterwards. MetaSchedule prints its task tables
    to stdout at INFO through a console handler whose level is the logger's level when it
    configures its loggers (:func:`_tune_one` sets WARNING first); the files in
    ``work_dir/logs`` get everything."""
    lg = logging.getLogger(MS_LOGGER)
    level = lg.level
    try:
        yield
    finally:
        lg.setLevel(level)


def _writable_dir(work_dir) -> str:
    path = os.path.abspath(os.fspath(work_dir))
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".pesto-probe-"):
            pass
    except OSError as e:
        raise TuningError(f"cannot write the tuning database in {path!r} ({e.strerror or e}); pick a --work-dir "
                          "you can write to") from None
    return path


def _check_target(work_dir: str, target: dict) -> None:
    # lazy: loads TVM's compiler, which importing this module does not
    from ...backends.ms_database import check_database_target

    try:
        check_database_target(work_dir, target)
    except CostError as e:
        raise TuningError(f"{e} (tune into a new --work-dir for this target)") from None


def _open_database(work_dir: str):
    # lazy: loads TVM's compiler, which importing this module does not
    from ...backends.ms_database import open_database

    try:
        return open_database(work_dir)
    except CostError as e:
        raise TuningError(str(e)) from None


def _workload(db, tmod):
    return db.commit_workload(tmod) if db.has_workload(tmod) else None


def _records_of(db, tmod) -> int:
    """Records (valid or failed) of the task's workload: the trials already spent on it."""
    w = _workload(db, tmod)
    if w is None:
        return 0
    return sum(1 for r in db.get_all_tuning_records() if r.workload.same_as(w))


def _best_s(db, tmod) -> float | None:
    # lazy: loads TVM's compiler, which importing this module does not
    from ...backends.ms_database import FAILED_S

    w = _workload(db, tmod)
    if w is None:
        return None
    top = db.get_top_k(w, 1)
    if not top or top[0].run_secs is None:
        return None
    secs = [float(s) for s in top[0].run_secs]
    return float(np.mean(secs)) if secs and max(secs) < FAILED_S else None


def _time_unscheduled(tmod, tgt, measurer) -> float | None:
    """Seconds of the task's kernel as the ``tvm`` backend builds it (no schedule)."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    try:
        rt = measurer.build_module(tmod, tgt)
        return float(np.mean(measurer.time_module(rt, ArgInfo.from_prim_func(tmod["main"]))))
    except CostError:
        raise  # a remote session that ended: tuning cannot go on either
    except Exception:  # noqa: BLE001 - a baseline is a report figure, not needed to tune
        return None


def _calling_thread_cores() -> int:
    # lazy: loads TVM's compiler, which importing this module does not
    from ...backends.base import calling_thread_cores

    return calling_thread_cores()


def _last_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[-1][:300]}" if text else type(e).__name__


__all__ = ["STRATEGIES", "TaskResult", "TuneResult", "check_budget", "split_trials", "tune_model", "tuning_tasks"]
