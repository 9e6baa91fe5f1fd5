"""The final choice as one stage: the flow's placement in, the kept module out.

:func:`final_choice` places the module again on the one-device shape (as the user asked for
the first, :class:`~tvm_pesto.placing.Request`), lists the options
(:func:`~tvm_pesto.choose.options.make_options`), builds and times them
(:func:`~tvm_pesto.choose.trial.choose`) and certifies the kept one
(:func:`~tvm_pesto.choose.claim.certify`, solving each shape again on measured costs with a
:class:`Resolver`). The flow's solves and these share one :class:`~tvm_pesto.solve.budget.Solving`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..builder.placed import PlacedModule, build_placement
from ..errors import PestoError
from ..models import random_inputs
from ..placing import Request
from ..plan.placement import Placement
from ..solve import budget
from .claim import certify_kept
from .decision import HeldConstraints, unmeasured
from .trial import choose
from .options import Option, make_options, one_device_cluster, skip_reason


@dataclass
class Resolver:
    """Solves a core shape again as the flow solved it (``request``), on a cost table priced
    by what the options measured, within what ``solving`` has left: the first of at most two
    shapes gets half of it, the second the rest."""

    analysis: object
    request: Request
    solving: budget.Solving
    solved: int = 0

    def __call__(self, option: Option, table) -> Placement:
        self.solved += 1
        return _solve(self.analysis, self.request, self.solving, option.cluster, parts=3 - self.solved,
                      costs=dataclasses.replace(option.placement.costs, table=table))


def one_device_costs(pl: Placement, request: Request):
    """The cost source of the one-device shape's solve: ``screened`` where the flow measured
    every candidate as ``costs="auto"`` chose (its one-core regions are sampled on the wider
    device and the rest scaled, :mod:`~tvm_pesto.costs.measure.screen`: the whole-model
    options, what the choice times, are measured either way), else what ``request`` asked."""
    auto = pl.costs.auto
    return "screened" if request.costs == "auto" and auto is not None and auto.source == "measured" else None


def _solve(analysis, request: Request, solving: budget.Solving, cluster, parts: int, costs=None) -> Placement:
    """``request`` placed on ``cluster`` within ``1 / parts`` of what ``solving`` has left, spent there."""
    pl = request.place(analysis, cluster, costs=costs, time_limit_s=solving.next_s(parts), leave_whole=True)
    solving.spend(pl.plan.solve_s)
    return pl


def build_option(option: Option) -> PlacedModule:
    """The built module of one option."""
    return build_placement(option.placement, option.cluster)


def final_choice(mod, pl: Placement, cluster, request: Request, inputs=None, measure_final: bool | None = None,
                 progress=None, solving: budget.Solving | None = None) -> PlacedModule:
    """Build ``pl`` (the flow's placement of ``mod`` on ``cluster``, as ``request`` asked) and,
    where the options can be measured on ``cluster`` (:func:`skip_reason`), its alternatives;
    the fastest, measured, with ``.decision`` set. ``solving`` is the budget ``pl`` was solved
    under: the solves here share what it left. Under constraints (``pl.constraints``) every
    option honours them, and one that names a device leaves the one-device shape out;
    ``decision.constraints`` says so."""
    why = skip_reason(cluster, measure_final)
    if why is None and inputs is None:
        try:
            inputs = random_inputs(mod)
        except PestoError as e:
            why = f"no inputs to time it on ({e})"
    nc = pl.constraints  # a device pin or memory cap binds the cluster asked for: no other core shape
    wide = nc is None or not nc.constraints.on_devices
    cluster = cluster if nc is None else nc.cluster  # its memory caps applied
    held = None if nc is None else HeldConstraints(list(pl.holds_under), wide and why is None)
    if why is not None:
        placed = build_placement(pl, cluster, progress)
        placed.decision = unmeasured(why, pl, cluster)
        placed.decision.constraints = held
        return placed
    solving = solving or budget.Solving(budget.SOLVE_S, measured=True)
    solving.spend(pl.plan.solve_s)
    # the one-device flow, then at most two priced solves: the first gets a third of what is left
    one = (_solve(pl.analysis, request, solving, one_device_cluster(), parts=3, costs=one_device_costs(pl, request))
           if cluster.num_devices > 1 and wide else None)
    opts = make_options(pl, cluster, one, wide=wide)
    placed, decision = choose(opts, build_option, list(inputs), progress=progress)
    certify_kept(opts, decision, Resolver(pl.analysis, request, solving))
    decision.constraints = held
    placed.decision = decision
    return placed


__all__ = ["Resolver", "build_option", "final_choice", "one_device_costs"]
