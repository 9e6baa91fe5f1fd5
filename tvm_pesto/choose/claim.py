"""The claim of the final choice (:mod:`tvm_pesto.choose`): a bound on every plan of both
core shapes, from the flow's bounds and solves on costs priced by what the options measured.

The options are :class:`tvm_pesto.choose.options.Option` records (``name``, ``cluster``,
``placement``, ``predicted_s``); :func:`certify` gives the decision's :class:`~tvm_pesto.choose.decision.Claim` and
:func:`restate_kept` hands it to the kept option's plan; :func:`certify_kept` does both.
"""
from __future__ import annotations

import numpy as np

from ..errors import PestoError, error_line
from ..solve.joint.decide import OPTIMAL_GAP, restate
from .decision import Claim, Decision, ShapeClaim


def same_plan(option, cluster, placement) -> bool:
    """Whether ``placement`` on ``cluster`` runs what ``option`` runs: the same units of the
    same backends on the same devices of a cluster of the same name."""
    a, b = option.placement.plan, placement.plan
    return (option.cluster.name == cluster.name and len(a.units) == len(b.units)
            and all(u.backend == v.backend and tuple(u.nodes) == tuple(v.nodes) for u, v in zip(a.units, b.units))
            and list(map(int, a.assignment)) == list(map(int, b.assignment)))


#: The options that are the flow's plan on a core shape: each calibrates and bounds its shape.
FLOW_OPTIONS = ("plan", "one-device")


def shape_scale(shape, opts: list, ratio: dict) -> float:
    """The least ratio of measured seconds to predicted makespan (``ratio``) among the
    options measured on ``shape``'s cluster: the shape's most favourable calibration, so
    that one plan measured far over its prediction (a unit gone wrong) lifts no other
    plan's bound."""
    return min(ratio[o.name] for o in opts if o.cluster.name == shape.cluster.name and o.name in ratio)


def priced_table(shape, opts: list, ratio: dict) -> np.ndarray:
    """``shape``'s cost table priced by the final choice's measurements.

    ``ratio``: measured seconds / predicted makespan of each measured option. On ``shape``'s
    cluster, a one-unit option's candidate costs what it measured (on every device with as
    many cores); another candidate of a backend such a call measured costs that backend's
    least ratio times its prediction, and any other :func:`shape_scale` times its prediction.

    Examples
    --------
    Three candidates on one device; ONNX Runtime's whole-model call (candidate 1) was
    measured at twice its prediction, and the flow's plan (candidates 0 and 2) at 1.5
    times: candidate 1 is priced at its measurement, ONNX Runtime's region (candidate 2) at
    twice its prediction, TVM's op at 1.5 times.

    >>> from types import SimpleNamespace as NS
    >>> cpu1 = NS(name="cpu:1", devices=[NS(cores=2)])
    >>> cands = [NS(backend="tvm", nodes=(0,)), NS(backend="onnxruntime", nodes=(0, 1)),
    ...          NS(backend="onnxruntime", nodes=(1,))]
    >>> costs = NS(table=np.array([[1.0], [3.0], [2.0]]))
    >>> flow = NS(candidates=cands, costs=costs, plan=NS(units=[cands[0], cands[2]]),
    ...           backend_mix={"tvm": 1, "onnxruntime": 1})
    >>> lib = NS(plan=NS(units=[cands[1]], assignment=np.array([0])), backend_mix={"onnxruntime": 2})
    >>> opts = [NS(name="plan", cluster=cpu1, placement=flow), NS(name="library:onnxruntime", cluster=cpu1, placement=lib)]
    >>> priced_table(opts[0], opts, {"plan": 1.5, "library:onnxruntime": 2.0}).ravel().tolist()
    [1.5, 6.0, 4.0]
    """
    same = [o for o in opts if o.cluster.name == shape.cluster.name and o.name in ratio]
    base = shape.placement.costs.table
    cands = shape.placement.candidates
    by_backend: dict[str, float] = {}
    for o in same:  # the options that ran one backend alone calibrate that backend's candidates
        mix = set(o.placement.backend_mix)
        if len(mix) == 1:
            b = mix.pop()
            by_backend[b] = min(by_backend.get(b, np.inf), ratio[o.name])
    scale = shape_scale(shape, opts, ratio)
    table = base * np.array([by_backend.get(c.backend, scale) for c in cands])[:, None]
    index = {(c.backend, tuple(c.nodes)): i for i, c in enumerate(cands)}
    for o in same:
        units = o.placement.plan.units
        if len(units) != 1:
            continue
        i = index.get((units[0].backend, tuple(units[0].nodes)))
        if i is None:
            continue
        cores = shape.cluster.devices[int(o.placement.plan.assignment[0])].cores
        alike = [d for d, dev in enumerate(shape.cluster.devices) if dev.cores == cores]
        table[i, alike] = base[i, alike] * ratio[o.name]
    return table


def certify(opts: list, decision: Decision, resolve=None) -> Claim | None:
    """The claim for the kept option: a bound on every plan of both core shapes, and the gap.

    ``resolve(option, table) -> Placement`` solves a shape again on its cost table priced by
    measurement (:func:`priced_table`); its bound bounds every plan of the shape. Without
    ``resolve``, or where it cannot matter, the flow's bound times :func:`shape_scale` does.
    The least of the bounds and measured times is ``bound_s``; ``gap`` is the kept option's
    time against it; each shape says if it was ``solved_again`` and which plan (``plan_is``);
    ``holds_under`` names the user's constraints every option and bound was made under (the
    bound is over the plans that honour them).
    None when a shape proved no bound or the flow's plan was not measured; a priced solve that
    fails leaves no claim and ``decision.claim_error`` says why.

    Examples
    --------
    The flow's plan (bound 0.9 ms, predicted 1 ms) measured 2 ms, the library call
    (predicted 1 ms) 1.5 ms: the shape's most favourable ratio is 1.5, so no plan of the
    shape runs under 0.9 x 1.5 = 1.35 ms, and the library call is within 10 % of that:

    >>> from types import SimpleNamespace as NS
    >>> cpu1 = NS(name="cpu:1")
    >>> flow = NS(plan=NS(info={"bound_s": 0.9e-3}, solve_s=0.2), sim=NS(makespan=1e-3))
    >>> opts = [NS(name="plan", cluster=cpu1, placement=flow),
    ...         NS(name="library:onnxruntime", cluster=cpu1, placement=NS(sim=NS(makespan=1e-3)))]
    >>> from tvm_pesto.choose.decision import Decision, OptionResult
    >>> d = Decision(True, "library:onnxruntime", "cpu:1", [OptionResult("plan", "cpu:1", 1e-3, measured_s=2e-3),
    ...              OptionResult("library:onnxruntime", "cpu:1", 1e-3, measured_s=1.5e-3)])
    >>> c = certify(opts, d)
    >>> round(c.bound_s * 1e3, 3), round(c.gap, 3), c.status, c.decided_by
    (1.35, 0.1, 'feasible', 'measured-ilp (= library:onnxruntime)')
    """
    measured = decision.measured_s
    ratio = {o.name: measured[o.name] / float(o.placement.sim.makespan) for o in opts
             if o.name in measured and float(o.placement.sim.makespan) > 0}
    shapes = []
    for o in opts:
        if o.name not in FLOW_OPTIONS:
            continue
        if o.name not in ratio:
            return None  # the shape's own plan was not measured: nothing calibrates it
        flow_by, flow_s = o.placement.plan.info.get("decided_by"), float(o.placement.plan.solve_s)
        scale = shape_scale(o, opts, ratio)
        bound = o.placement.plan.info.get("bound_s")
        calibrated = None if bound is None else float(bound) * scale
        if resolve is None or (calibrated is not None and calibrated >= measured[decision.chosen] * (1 - 1e-9)):
            # the priced table costs at least scale x the flow's: this shape cannot beat the kept option
            if calibrated is None:
                return None  # a shape whose plans nothing bounds
            shapes.append(ShapeClaim(o.name, o.cluster.name, scale, calibrated, flow_by, 0.0, False, flow_by, flow_s))
            continue
        try:
            again = resolve(o, priced_table(o, opts, ratio))
        except PestoError as e:
            decision.claim_error = (f"the {o.cluster.name} shape could not be solved again on measured "
                                    f"costs: {error_line(e)}")
            return None
        bound = again.plan.info.get("bound_s")
        if bound is None:
            return None
        shapes.append(ShapeClaim(
            o.name, o.cluster.name, scale, float(bound), again.plan.info.get("decided_by"), float(again.plan.solve_s),
            True, flow_by, flow_s, priced_s=float(again.sim.makespan), priced_mix=again.backend_mix,
            priced_units=len(again.plan.units),
            plan_is=next((p.name for p in opts if p.name in measured and same_plan(p, o.cluster, again)), None)))
    if not shapes:
        return None
    chosen = decision.chosen
    kept_s = measured[chosen]
    bound = min([s.bound_s for s in shapes] + list(measured.values()))
    gap = max(0.0, (kept_s - bound) / kept_s)
    by = shapes[0].flow_decided_by if chosen == "plan" else f"measured-ilp (= {chosen})"
    return Claim(by, bound, kept_s, gap, "optimal" if gap <= OPTIMAL_GAP else "feasible", shapes,
                 sum(s.solve_s + s.flow_solve_s for s in shapes),
                 holds_under=list(getattr(opts[0].placement, "holds_under", None) or []))


def restate_kept(opts: list, chosen: str, claim: Claim) -> None:
    """Give the kept option's plan the measured claim (its bound in the plan's makespan)."""
    kept = next(o for o in opts if o.name == chosen)
    plan, span = kept.placement.plan, float(kept.placement.sim.makespan)
    restate(plan.info, claim.bound_s * span / claim.kept_s, span, claim.decided_by)
    plan.info["heuristics"] = opts[0].placement.plan.info.get("heuristics")
    plan.solve_s = claim.solve_s


def certify_kept(opts: list, decision: Decision, resolve=None) -> None:
    """Set ``decision.claim`` (:func:`certify`) and, where there is one, give it to the kept
    option's plan (:func:`restate_kept`)."""
    decision.claim = certify(opts, decision, resolve)
    if decision.claim:
        restate_kept(opts, decision.chosen, decision.claim)


__all__ = ["FLOW_OPTIONS", "certify", "certify_kept", "priced_table", "restate_kept", "same_plan", "shape_scale"]
