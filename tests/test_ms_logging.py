"""Tuning with the caller's log handlers on MetaSchedule's loggers (issue 28): each
MetaSchedule call configures its loggers by the names of the handlers already there, and an
unnamed or foreign one (a notebook's, an app's, pytest's log capture) made ``tune_model``
and ``tune_in_process`` fail from their second call in a process. The handlers stay, and
keep receiving MetaSchedule's records.

One trial of one kernel per call (``replay`` search).
"""
from __future__ import annotations

import logging

import pytest
import tvm
from tvm import relax

from tvm_pesto.backends.ms_database import RECORD_FILE
from tvm_pesto.cluster import parse_cluster
from tvm_pesto.costs.tune.ms_logging import MS_LOGGER, foreign_handlers_set_aside
from tvm_pesto.costs.tune.tune import tune_model, tuning_tasks
from tvm_pesto_lab.tuning_rows import tune_in_process

CPU = parse_cluster("cpu:1").devices[0]
TARGET = dict(CPU.target)


def matmul_relu() -> tvm.IRModule:
    """relu(x @ w): one fused kernel."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 32), "float32"))
    w = relax.Var("w", relax.TensorType((32, 16), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(relax.op.matmul(x, w)))
        bb.emit_func_output(y)
    return bb.get()


class Collect(logging.Handler):
    """A handler that keeps its records."""

    def __init__(self, name=None):
        super().__init__()
        self.records = []
        if name is not None:
            self.set_name(name)

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def on_ms_logger():
    """An unnamed and a named handler of the caller's on ``tvm.s_tir.meta_schedule``; removed afterwards."""
    lg = logging.getLogger(MS_LOGGER)
    handlers = [Collect(), Collect("my-app")]
    for h in handlers:
        lg.addHandler(h)
    yield handlers
    for h in handlers:
        lg.removeHandler(h)


def test_tune_model_twice_keeps_the_callers_handlers(tmp_path, on_ms_logger):
    ms = logging.getLogger(MS_LOGGER)
    for k in range(2):
        res = tune_model(matmul_relu(), TARGET, tmp_path / f"db{k}", 1, strategy="replay", device=CPU,
                         min_repeat_ms=0)
        assert res.trials_spent == 1 and len((tmp_path / f"db{k}" / RECORD_FILE).read_text().splitlines()) == 1
        assert all(h in ms.handlers for h in on_ms_logger)
        # back on the logger while MetaSchedule tuned, not only after it: they got its records
        assert all(h.records for h in on_ms_logger)
        for h in on_ms_logger:
            h.records.clear()
    # a handler of the caller's on a task's logger (made by the first call) survives the next one
    (task_logger,) = [lg for name, lg in logging.root.manager.loggerDict.items()
                      if isinstance(lg, logging.Logger) and name.startswith(MS_LOGGER + ".logging.task_")
                      and name.endswith("fused_matmul_relu")]
    on_task = Collect()
    task_logger.addHandler(on_task)
    try:
        tune_model(matmul_relu(), TARGET, tmp_path / "db2", 1, strategy="replay", device=CPU, min_repeat_ms=0)
        assert on_task in task_logger.handlers
    finally:
        task_logger.removeHandler(on_task)


def test_tune_in_process_keeps_the_callers_handlers(tmp_path, on_ms_logger):
    ((task, _),) = tuning_tasks(matmul_relu(), TARGET)
    for k in range(2):
        tune_in_process(task.dispatched[0], TARGET, tmp_path / f"ms{k}", max_trials=1, num_trials_per_iter=1)
        assert len((tmp_path / f"ms{k}" / RECORD_FILE).read_text().splitlines()) == 1
        assert all(h in logging.getLogger(MS_LOGGER).handlers for h in on_ms_logger)


def test_handlers_are_put_back_in_their_order_after_an_error(on_ms_logger):
    ms = logging.getLogger(MS_LOGGER)
    own = Collect(MS_LOGGER + ".console")  # a handler MetaSchedule made: it stays for MetaSchedule to list
    ms.addHandler(own)
    try:
        with pytest.raises(RuntimeError, match="inside"), foreign_handlers_set_aside():
            assert own in ms.handlers and not any(h in ms.handlers for h in on_ms_logger)
            raise RuntimeError("inside")
        assert [h for h in ms.handlers if h in on_ms_logger] == on_ms_logger
    finally:
        ms.removeHandler(own)
