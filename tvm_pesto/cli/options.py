"""Options that several ``tvm-pesto`` verbs share (``main``, ``profile`` and the ``bench`` verbs).

Examples
--------
>>> import click
>>> from tvm_pesto.cli.options import deterministic_option
>>> cmd = deterministic_option(True)(click.command()(lambda deterministic: None))
>>> [p.opts + p.secondary_opts for p in cmd.params]
[['--deterministic', '--wall-clock']]
"""
from __future__ import annotations

import click

DETERMINISTIC_HELP = ("--deterministic: work budgets (MIP node limits, counted simulations) and fixed seeds, so "
                      "the same input gives the same plan on any machine; --wall-clock: budgets in seconds")


def deterministic_option(default: bool):
    """The ``--deterministic/--wall-clock`` switch of a verb (the ``deterministic``
    parameter), with its default: on for verbs that compare plans (``place``, the
    benchmarks), off for ``run`` and ``demo``."""
    return click.option("--deterministic/--wall-clock", "deterministic", default=default, show_default=True,
                        help=DETERMINISTIC_HELP)


MS_DB_HELP = ("MetaSchedule database for the tvm-ms backend (a --work-dir of tvm-pesto tune); the same as setting "
              "TVM_PESTO_MS_DB")


def ms_db_option():
    """The ``--ms-db DIR`` option of a verb that builds or measures candidates: it points
    the ``tvm-ms`` backend at a tuning database when the command line is read
    (:func:`tvm_pesto.backends.tvm_cpu.set_tuning_database`), so the verb takes no
    parameter for it."""

    def use(ctx, param, value):
        if value is not None:
            from ..backends.tvm_cpu import set_tuning_database
            from ..errors import PestoError

            try:
                set_tuning_database(value)
            except PestoError as e:
                raise click.BadParameter(str(e), ctx=ctx, param=param) from None
        return value

    return click.option("--ms-db", default=None, metavar="DIR", expose_value=False, callback=use, help=MS_DB_HELP)


__all__ = ["DETERMINISTIC_HELP", "MS_DB_HELP", "deterministic_option", "ms_db_option"]
