"""Keep a multi-device plan only when its predicted gain beats the costs' error.

A plan that splits a model over devices is predicted from costs with an error; when it is
predicted only a little faster than running everything on one device, the split is a coin
toss that pays transfers, hand-offs and contention for nothing (an encoder on ``cpu:2``:
predicted 8 % faster, measured 2-24 % slower). :func:`split_decision` compares the split
with the best single-device plan and keeps the split only when it is predicted faster by
more than the margin of the cost source (:data:`SPLIT_MARGIN`).

Examples
--------
>>> split_margin("xgb"), split_margin("measured")
(0.15, 0.07)
>>> split_decision(0.9, 1.0, 0.15)["keep_split"]     # 10 % faster: inside the xgb error
False
>>> split_decision(0.8, 1.0, 0.15)["keep_split"]
True
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import InfeasibleError, PestoError
from ..plan.simulate import HOME_DEVICE, simulate
from .joint.decide import restate

#: The least predicted gain (a share of the single-device time) a split must show, by cost
#: source: ``measured`` 7 %: about how far the same kernels drift over half an hour on a
#: shared machine; ``xgb`` 15 %: the whole-model error the cost model is held to (``run
#: --costs xgb`` within 15 % of its simulation, cost_models/README.md); ``xgb-other-cpu``
#: 20 %: a CPU kind the model never saw, corrected by this machine's calibration alone;
#: ``roofline`` 50 %: it ignores everything but FLOPs and bytes; a ``given`` table is the caller's, trusted.
SPLIT_MARGIN = {"measured": 0.07, "hybrid": 0.07, "xgb": 0.15, "xgb+roofline": 0.25, "xgb-other-cpu": 0.2,
                "xgb-other-cpu+roofline": 0.25, "roofline": 0.5, "mixed": 0.15, "given": 0.0}


#: Seconds of joint search for the single-device plan (it chooses covers only).
SINGLE_SEARCH_S = 1.0
#: With wall-clock budgets, the share of ``place``'s time limit kept from the plan's solve for
#: the single-device plans the split check solves after it (the rest of the limit, shared).
SINGLE_SHARE = 0.15


def split_margin(source: str) -> float:
    """The margin of cost source ``source`` (:data:`SPLIT_MARGIN`; 0.15 for one it lacks)."""
    return SPLIT_MARGIN.get(source, 0.15)


def check_margin(margin) -> float:
    """``margin`` as a float in [0, 1), or :class:`~tvm_pesto.errors.PestoError` naming it."""
    try:
        m = float(margin)
    except (TypeError, ValueError):
        m = float("nan")
    if not 0.0 <= m < 1.0:
        raise PestoError(f"split margin {margin!r} is not a share in [0, 1); give e.g. 0.1 (a split must be "
                         "predicted 10 % faster than one device) or 0 to keep every split")
    return m


def single_device_table(table: np.ndarray, device: int) -> np.ndarray:
    """``table`` with every device but ``device`` made unusable (``inf``)."""
    out = np.full_like(table, np.inf)
    out[:, device] = table[:, device]
    return out


def best_single_device(table: np.ndarray) -> int | None:
    """The device whose cheapest candidates add up least (a lower bound of its one-device
    time): the one to try the single-device plan on; None when no column is usable."""
    fin = np.where(np.isfinite(table), table, np.nan)
    usable = np.isfinite(table).any(axis=0)
    if not usable.any():
        return None
    score = np.where(usable, np.nansum(fin, axis=0) / np.maximum(np.isfinite(table).sum(axis=0), 1), np.inf)
    return int(np.argmin(score))


def one_device_bound(table: np.ndarray, proved: dict, bound_all: float | None) -> float | None:
    """A lower bound on every plan that runs the whole model on one device: each device's
    bound is the one ``proved`` on it (device -> seconds, e.g. the relaxed joint ILP's on the
    table masked to that device), or on a device with the same cost column (the same
    problem; copies of inputs to a device away from home only add time), else
    ``bound_all`` (a bound on every plan); devices that run no candidate are skipped.

    Examples
    --------
    >>> t = np.array([[1.0, 1.0, np.inf], [1.0, 1.0, np.inf]])   # devices 0 and 1 alike; 2 runs nothing
    >>> one_device_bound(t, {0: 2.0}, 1.5)
    2.0
    >>> one_device_bound(np.array([[1.0, 3.0]]), {1: 3.0}, 0.5)   # device 0 unproved: the bound on all plans
    0.5
    """
    out = None
    for d in range(table.shape[1]):
        col = table[:, d]
        if not np.isfinite(col).any():
            continue
        same = [b for e, b in proved.items() if b is not None and np.array_equal(table[:, e], col)]
        b = min(same) if same else bound_all
        if b is None:
            return None
        out = b if out is None else min(out, b)
    return out


def margin_bound(bound_all: float | None, bound_one: float | None, margin: float) -> float | None:
    """The least value of the objective the split margin decides by (a plan on several
    devices counts its makespan / (1 - ``margin``), a one-device plan its makespan) that any
    plan can have: ``bound_all`` bounds every plan, ``bound_one`` every one-device plan.

    Examples
    --------
    >>> round(margin_bound(0.85, 1.2, 0.15), 9)     # every split counts at least 1.0: one device may win
    1.0
    >>> margin_bound(None, 1.2, 0.15) is None        # nothing proved over the splits
    True
    """
    if bound_all is None:
        return None
    split_b = bound_all / (1.0 - margin)
    return split_b if bound_one is None else min(split_b, bound_one)


def split_decision(split_s: float, single_s: float | None, margin: float) -> dict:
    """Whether to keep a split predicted to take ``split_s`` against ``single_s`` on one
    device (None: no single device can run the model, so the split stays)."""
    keep = single_s is None or split_s < single_s * (1.0 - margin)
    return {"keep_split": bool(keep), "split_s": float(split_s),
            "single_s": None if single_s is None else float(single_s), "margin": float(margin),
            "gain": None if single_s is None else float(1.0 - split_s / single_s)}


def keep_split_if_worth(ct, jp, plan, problem, sim, margin: float, solve):
    """The split plan, or the best single-device plan when the split's predicted gain is
    within ``margin`` (this module); the decision goes to ``plan.info``.
    The single-device plans tried: the device whose kernels add up least, and the home
    device (a plan elsewhere copies the inputs there and the result back, which its run
    time, ``SimResult.run_s``, counts). A plan on one device away from home is replaced by
    the home device's when that one is predicted faster at all. The kept plan's claim
    (``bound_s``, ``mip_gap``, ``status``) is under the rule that decided it: a split counts
    its makespan / (1 - margin) (:func:`margin_bound`)."""
    best = best_single_device(ct.table)
    one, proved = None, {}
    # the device whose kernels add up least, and the home device (no input or result copies)
    devices = list(dict.fromkeys(x for x in (best, HOME_DEVICE)
                                 if x is not None and np.isfinite(ct.table[:, x]).any()))
    for k, d in enumerate(devices):
        try:  # the one-device plan searches covers only: a short search is enough
            _, p1, _ = solve(dataclasses.replace(ct, table=single_device_table(ct.table, d)),
                             search=SINGLE_SEARCH_S, share=1.0 / (len(devices) - k))
            prob1 = jp.contract(jp.cover_of(p1))  # the real costs, not the masked ones
            cand = (p1, prob1, simulate(prob1, p1), d)
        except InfeasibleError:  # this device cannot hold the whole model
            continue
        proved[d] = p1.info.get("bound_s")
        if one is None or cand[2].run_s < one[2].run_s:
            one = cand
    # run times: the home device's copies and the executor's dispatch included; a plan on one
    # device away from home is no split (no coin toss): the faster of the two is kept
    split_plan = len(set(plan.assignment.tolist())) > 1
    decision = split_decision(sim.run_s, one[2].run_s if one else None, margin if split_plan else 0.0)
    decision["device"] = None if one is None else jp.cluster.devices[one[3]].name
    if one is None:
        plan.info["split"] = decision
        return jp, plan, problem, sim
    # the claim under the rule that decided: a split counts its makespan / (1 - margin)
    bound_all = plan.info.get("bound_s")
    bound_one = one_device_bound(ct.table, proved, bound_all)
    bound = margin_bound(bound_all, bound_one, decision["margin"])
    keep = decision["keep_split"]
    kept = (jp, plan, problem, sim) if keep else (jp, one[0], one[1], one[2])
    kept[1].info["split"] = decision
    if "decided_by" in plan.info:
        by = plan.info["decided_by"] if keep else f"split-margin: {one[0].info.get('decided_by')}"
        scale = 1.0 - decision["margin"] if keep else 1.0  # the bound in the kept plan's makespan
        restate(kept[1].info, None if bound is None else bound * scale, kept[3].makespan, by)
        kept[1].info.update(bound_all_s=bound_all, bound_one_device_s=bound_one, split_margin=decision["margin"],
                            heuristics=plan.info.get("heuristics"))  # on the whole problem, as the bound
    return kept


__all__ = ["SINGLE_SEARCH_S", "SINGLE_SHARE", "SPLIT_MARGIN", "best_single_device", "check_margin",
           "keep_split_if_worth", "margin_bound", "one_device_bound", "single_device_table", "split_decision", "split_margin"]
