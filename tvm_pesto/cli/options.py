"""Options that several ``tvm-pesto`` verbs share (``main`` and the ``bench`` verbs).

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


__all__ = ["DETERMINISTIC_HELP", "deterministic_option"]
