"""MetaSchedule's loggers next to the handlers of the process that calls it.

Each MetaSchedule tuning call configures its loggers (``tvm.s_tir.meta_schedule`` and one
per task) with :func:`logging.config.dictConfig`, listing the handlers already on
``tvm.s_tir.meta_schedule`` by name. A handler it did not create itself, named or not (a
notebook's, an application's, pytest's log capture), makes that call fail: an unnamed one
with ``AttributeError: 'NoneType' object has no attribute 'format'``, a named one with
``ValueError: Unable to configure logger``. :func:`foreign_handlers_set_aside` takes such
handlers off MetaSchedule's loggers for the call and puts them back afterwards. (The same
``dictConfig`` also closes every handler of the process; file handlers in append mode, the
default, reopen on their next record.)

Examples
--------
>>> import logging
>>> ms_logger = logging.getLogger(MS_LOGGER)
>>> mine = logging.StreamHandler()
>>> ms_logger.addHandler(mine)
>>> with foreign_handlers_set_aside():    # here: get_loggers_from_work_dir(work_dir, names)
...     mine in ms_logger.handlers
False
>>> mine in ms_logger.handlers
True
>>> ms_logger.removeHandler(mine)
"""
from __future__ import annotations

import contextlib
import logging

#: MetaSchedule logs to this logger and its children (and to ``work_dir/logs``).
MS_LOGGER = "tvm.s_tir.meta_schedule"


def _metaschedule_loggers() -> list[logging.Logger]:
    """``tvm.s_tir.meta_schedule`` and the loggers below it that exist now."""
    return [lg for name, lg in list(logging.root.manager.loggerDict.items())
            if isinstance(lg, logging.Logger) and (name == MS_LOGGER or name.startswith(MS_LOGGER + "."))]


def _is_foreign(handler: logging.Handler) -> bool:
    """A handler MetaSchedule did not create: its handlers are named ``tvm.s_tir.meta_schedule.*``."""
    name = handler.get_name()
    return not (isinstance(name, str) and name.startswith(MS_LOGGER + "."))


@contextlib.contextmanager
def foreign_handlers_set_aside():
    """Take the handlers MetaSchedule did not create off its loggers for the block, and put
    them back (after MetaSchedule's own, in their order) when it ends, also on an error.

    Wrap the call that configures MetaSchedule's loggers
    (``tvm.s_tir.meta_schedule.logging.get_loggers_from_work_dir``, which ``tune_tir`` and
    ``tune_relax`` call first); handlers added inside the block are left as they are.
    """
    aside = []
    for lg in _metaschedule_loggers():
        for h in [h for h in lg.handlers if _is_foreign(h)]:
            lg.removeHandler(h)
            aside.append((lg, h))
    try:
        yield
    finally:
        for lg, h in aside:
            lg.addHandler(h)  # a no-op where it is already there


__all__ = ["MS_LOGGER", "foreign_handlers_set_aside"]
