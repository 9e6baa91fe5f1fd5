"""Options that several ``tvm-pesto`` verbs share (``main``, ``profile``, ``tune`` and the ``bench`` verbs).

Examples
--------
>>> import click
>>> from tvm_pesto.cli.options import deterministic_option
>>> cmd = deterministic_option(True)(click.command()(lambda deterministic: None))
>>> [p.opts + p.secondary_opts for p in cmd.params]
[['--deterministic', '--wall-clock']]
"""
from __future__ import annotations

import dataclasses

import click

from ..constraints import Constraints
from ..errors import PestoError

DETERMINISTIC_HELP = ("--deterministic: work budgets (MIP node limits, counted simulations) and fixed seeds, so "
                      "the same input gives the same plan on any machine; --wall-clock: budgets in seconds")


def deterministic_option(default: bool):
    """The ``--deterministic/--wall-clock`` switch of a verb (the ``deterministic``
    parameter), with its default: on for verbs that compare plans (``place``, the
    benchmarks), off for ``run`` and ``demo``."""
    return click.option("--deterministic/--wall-clock", "deterministic", default=default, show_default=True,
                        help=DETERMINISTIC_HELP)


def split_margin_option():
    """The ``--split-margin SHARE`` option of a verb that places a model with the flow (the
    ``split_margin`` parameter, None when not given: :func:`tvm_pesto.api.place`'s default)."""
    return click.option("--split-margin", default=None, type=click.FloatRange(0.0, 1.0, max_open=True),
                        metavar="SHARE",
                        help="keep a multi-device plan only if it is predicted this much faster than one device "
                             "(default: the cost source's error, e.g. 0.15 for xgb; 0 keeps every split)")


def max_build_s_option():
    """The ``--max-build-s SECONDS`` option of a verb that places a model with the flow (the
    ``max_build_s`` parameter of :func:`tvm_pesto.api.place`; None when not given)."""
    return click.option("--max-build-s", default=None, type=click.FloatRange(min=0.0), metavar="SECONDS",
                        help="keep the plan's library builds within this many seconds (estimated from this "
                             "machine's earlier builds; builds already cached cost nothing); default: no budget")


def precision_option():
    """The ``--precision fp32|bf16`` option of a verb that places a model with the flow (the
    ``precision`` of :func:`tvm_pesto.api.place`); the verb passes ``--backends`` through
    :func:`backends_at`."""
    return click.option("--precision", default="fp32", show_default=True, type=click.Choice(["fp32", "bf16"]),
                        help="bf16: the backends that compute in bfloat16 on this CPU (openvino-bf16) compete too, "
                             "held to a bfloat16 tolerance of the float32 build's output")


def backends_at(backends, precision: str):
    """``--backends`` with ``--precision``'s backends added (:func:`~tvm_pesto.candidates.flow.with_precision`),
    as the comma-separated list the verbs take."""
    # lazy: loads the backend registry; the CLI imports a verb's code when the verb runs
    from ..candidates.flow import with_precision

    out = with_precision(backends, precision)
    return out if isinstance(out, str) else ",".join(out)


MS_DB_HELP = ("MetaSchedule database for the tvm-ms backend (a --work-dir of tvm-pesto tune); the same as setting "
              "TVM_PESTO_MS_DB")


def ms_db_option():
    """The ``--ms-db DIR`` option of a verb that builds or measures candidates: it points
    the ``tvm-ms`` backend at a tuning database when the command line is read
    (:func:`tvm_pesto.backends.tvm_cpu.set_tuning_database`), so the verb takes no
    parameter for it."""

    def use(ctx, param, value):
        if value is not None:
            # lazy: loads TVM's compiler; the CLI imports a verb's code when the verb runs
            from ..backends.tvm_cpu import set_tuning_database

            try:
                set_tuning_database(value)
            except PestoError as e:
                raise click.BadParameter(str(e), ctx=ctx, param=param) from None
        return value

    return click.option("--ms-db", default=None, metavar="DIR", expose_value=False, callback=use, help=MS_DB_HELP)


def rpc_options(what: str = "measure costs"):
    """The ``--rpc-tracker HOST:PORT --rpc-key KEY`` pair of a verb that measures on a
    remote device over TVM RPC (the ``rpc_tracker`` and ``rpc_key`` parameters, None when
    not given); the verb makes its cluster remote with
    :func:`tvm_pesto.costs.measure.remote.remote_cluster`, which checks them. ``what`` says what
    the verb does there (``profile``: time the candidates, ``tune``: time the schedules).

    Examples
    --------
    >>> import click
    >>> cmd = click.command()(rpc_options()(lambda rpc_tracker, rpc_key: None))
    >>> [p.opts for p in cmd.params]
    [['--rpc-tracker'], ['--rpc-key']]
    """

    def add(f):
        f = click.option("--rpc-key", default=None,
                         help="the key the remote device's RPC servers registered under")(f)
        return click.option("--rpc-tracker", default=None, metavar="HOST:PORT",
                            help=f"{what} on the remote device served under --rpc-key at this TVM RPC tracker")(f)

    return add


def constraint_options():
    """The ``--pin``, ``--forbid`` and ``--device-memory`` options of a verb that places a model
    with the flow (repeatable; the ``pin``, ``forbid`` and ``device_memory`` parameters, which
    :func:`constraints_of` reads)."""

    def add(f):
        f = click.option("--device-memory", "device_memory", multiple=True, metavar="DEVICE=SIZE",
                         help="at most SIZE (2GB, 512MiB) of weights and tensors on DEVICE (a name such as cpu1, or "
                              "an index); repeatable")(f)
        f = click.option("--forbid", multiple=True, metavar="PATTERN=BACKEND",
                         help="nodes matching PATTERN never run in BACKEND; repeatable")(f)
        return click.option("--pin", multiple=True, metavar="PATTERN=BACKEND[@DEVICE]",
                            help="nodes matching PATTERN (a glob over op names such as relax.nn.conv2d or conv2d, "
                                 "binding names such as lv3, node names such as lv3:conv2d) run in BACKEND (* for "
                                 "any), on DEVICE when given; repeatable")(f)

    return add


def constraints_of(options: dict) -> Constraints | None:
    """The :class:`~tvm_pesto.constraints.Constraints` of a verb's ``--pin``, ``--forbid`` and
    ``--device-memory`` (None when none is given).

    Examples
    --------
    >>> constraints_of({"pin": ("relax.nn.conv2d=tvm",), "forbid": (), "device_memory": ()}).pins[0].backend
    'tvm'
    """
    return Constraints.parse(options.get("pin"), options.get("forbid"), options.get("device_memory")) or None


def constraint_report(placement, constraints: Constraints | None) -> dict:
    """What a ``run`` or ``place`` JSON records of the constraints: ``constraints`` as
    spelled, the ``holds_under`` of ``placement``'s claim and its per-node table ``nodes``
    (:meth:`tvm_pesto.plan.placement.Placement.node_table`)."""
    return {"constraints": (constraints or Constraints()).to_dict(), "holds_under": placement.holds_under,
            "nodes": [dataclasses.asdict(r) for r in placement.node_table()]}


__all__ = ["DETERMINISTIC_HELP", "MS_DB_HELP", "deterministic_option", "ms_db_option", "rpc_options",
           "split_margin_option", "constraint_options", "constraint_report", "constraints_of"]
