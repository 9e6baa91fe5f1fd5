"""Stage 6, the final choice: the flow's plan against the plans a user could run instead, measured.

A plan slower than the library a user already has is a defect. Before :func:`tvm_pesto.build`
returns (and in ``tvm-pesto run``) these options are built and timed against each other in
blocks (:func:`tvm_pesto.costs.measure.blocks.time_blocks`, about :data:`~tvm_pesto.choose.trial.BUDGET_S` s in all); the fastest is kept:

* ``plan``: the flow's plan on the cluster asked for;
* ``one-device``: on ``cpu:N`` with N > 1, the flow's plan on the same cores as one device
  (``cpu:1``, every core in it: the libraries' own intra- and inter-op threads use them);
* ``library:<backend>``: the whole model as one unit of each library backend that can run
  every op, on that device, and as TVM's fusion groups (``library:tvm``: what
  ``tvm.compile`` of the module runs): what a user of that library runs today;
* ``library:<backend>+tvm``: a library that cannot take the whole model (an op its exporter
  lacks) around the ops it cannot run, those in TVM's fusion groups on the same device, where
  it runs at least :data:`~tvm_pesto.choose.options.AROUND_SHARE` of the ops;
* ``library:<backend> on <device>``: on ``cpu:N`` with N > 1, the same on the first device
  of the cluster asked for (for ``cpu:2``, one core: the library with one thread).

The options are built and called in turn: the flow's plan, its one-device plan, then the
libraries from the fastest predicted. A library option predicted :data:`~tvm_pesto.choose.trial.PREDICTED_SLOW` times the best library option's
prediction (each a measured whole-model call; a flow's plan is a simulation), or
:data:`~tvm_pesto.choose.trial.PREDICTED_SLOW_MEASURED` times the least quick call of an option built before it,
is not built or run, and its entry says why. An option whose first output is not TVM's (:func:`~tvm_pesto.choose.trial.wrong_numerics`)
is left out with the error: it computes another model, however fast. Where TVM's build was not
built for its prediction, it is built for its output alone unless the options' outputs agree and two
of them share no library (:func:`~tvm_pesto.choose.trial.outputs_agree`); an option left unbuilt for
what a wrong one measured is weighed again without it.

Which core shape the flow predicts faster is the plan's ``shape``; the measurement decides.
Options within :data:`~tvm_pesto.choose.trial.RUNOFF` of the fastest are timed again (:data:`~tvm_pesto.choose.trial.RUNOFF_BUDGET_S`).
Every option is compared by its best block (the least block median over every pass, the
statistic ``tvm-pesto bench peers`` judges each variant by): a block slower than another of
the same option is the machine's doing. A shared machine can run slow for seconds at a time,
a library's threads slower than one thread then, so an option timed only in a slow spell is
left its best, not its median, and the runoff's later blocks give it the chance of a fast one. A whole-model library call (:func:`~tvm_pesto.choose.options.library_call`)
within :data:`~tvm_pesto.choose.trial.PREFER_LIBRARY` of a fastest plan of several units is kept (a user's own library
call, no slower within what a shared machine tells apart), and among library calls that close, the one on fewer
threads (a core left to the rest of the machine). The :class:`~tvm_pesto.choose.decision.Decision`
lists each option's predicted and measured seconds and which one was kept.

The kept option is then certified (:func:`~tvm_pesto.choose.claim.certify`) against every plan of both core shapes:
each shape is solved again by the flow's solver on its cost table priced by measurement
(:func:`~tvm_pesto.choose.claim.priced_table`), and the least of those bounds and of the measured times bounds every
plan: ``decision.claim`` gives it with the kept option's gap, and a kept option other than
the flow's plan carries that claim as its own (``decided_by`` ``measured-ilp (=
library:openvino)``). The flow's solves and these share one solving budget
(:class:`~tvm_pesto.solve.budget.Solving`). Where a shape's flow proved no bound there is no
claim and ``decided_by`` says ``measured (...)``. Only clusters of this machine's CPU cores
are measured (``cpu:N``); other clusters keep the flow's plan, and ``decision.measured``
is False, ``decision.why`` says why.

``$TVM_PESTO_MEASURE_FINAL`` (``1``, default; ``0``) sets the default of ``measure_final``.

The stage is :func:`~tvm_pesto.choose.final.final_choice`; :mod:`~tvm_pesto.choose.options`
lists the options, :mod:`~tvm_pesto.choose.trial` times them, :mod:`~tvm_pesto.choose.claim`
certifies the kept one and :mod:`~tvm_pesto.choose.decision` holds the decision's records.
"""
from __future__ import annotations

from .claim import FLOW_OPTIONS, certify, certify_kept
from .decision import Claim, Decision, OptionResult, decision_table, unmeasured
from .trial import choose
from .options import MEASURE_ENV, Option, library_call, make_options, skip_reason, whole_model_placement

# the stage itself, :mod:`tvm_pesto.choose.final`, builds modules (TVM's compiler): imported by name
__all__ = ["Claim", "Decision", "FLOW_OPTIONS", "MEASURE_ENV", "Option", "OptionResult", "certify", "certify_kept", "choose", "decision_table",
           "library_call", "make_options", "skip_reason", "unmeasured", "whole_model_placement"]
