"""Accuracy of the ``xgb`` cost source on the product's own path, not the profiler's records.

:func:`flow_eval` scores each model's fused groups predicted by the ``xgb`` source against
the ``measured`` source (groups timed now, scaled to the whole model's measured time), per
model, raw and with a whole-model calibration fitted on the *other* models
(:mod:`tvm_pesto.costs.predict.calibration`). The library backends' units (the flow's candidates of
ONNX Runtime, OpenVINO, Inductor, ... that cover one fused group, and each backend's
largest) are scored per backend beside them (``library.<backend>``, and per model under
``flow.<model>.library``). ``tvm-pesto cost-model eval --flow`` runs it.

Examples
--------
>>> import numpy as np
>>> m = _flow_errors(np.array([1e-3, 2e-3]), np.array([1.1e-3, 1.8e-3]))
>>> round(m["mape"], 1), round(m["sum_ratio"], 3)
(10.0, 0.967)
>>> _meets(m)   # per-group MAPE <= 25 %, sum within 10 %
{'mape': True, 'sum': True}
"""
from __future__ import annotations

import itertools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tvm_pesto.candidates import placement_candidates
from tvm_pesto.candidates.flow import backend_names, make_candidates
from tvm_pesto.cluster import as_cluster
from tvm_pesto.costs import candidate_costs
from tvm_pesto.costs.calibrate import machine
from tvm_pesto.costs.store.cache import MeasureCache
from tvm_pesto.costs.predict.calibration import METHOD, file_sha256, fit_calibration, load_calibration
from tvm_pesto.costs.predict.features import device_descriptor, device_key
from tvm_pesto.costs.table import MIN_COST_S
from tvm_pesto.costs.predict.xgb import CostModel, load_model, predict_candidate_costs
from tvm_pesto.errors import CostError
from tvm_pesto.graph.analysis import Analysis, analyze
from .evaluate import model_origin
from .families import model_module, model_names
from .metrics import UNITS, error_metrics

#: Labels measured while the 1-minute load average was above this are flagged (``high_load``):
#: on this 2-core machine a measurement pins one core, so more than 1.0 means another job.
MAX_LABEL_LOAD = 1.0
#: The issue's targets: per-group MAPE (percent) and the sum of a model's groups within 10 %.
FLOW_TARGETS = {"group_mape_pct": 25.0, "sum_ratio_tolerance": 0.10}
#: What the figures under ``flow.<model>`` are, with and without calibration.
_CALIBRATION_NOTES = {
    True: "flow.<model> figures are the xgb source's as estimate_costs gives them (calibration applied); raw ones "
          "under flow.<model>.raw, leave-one-model-out ones under calibrated_heldout",
    False: "calibration off (--no-calibration): flow.<model> figures are raw",
}


def flow_models(names=None, size: str = "small") -> dict:
    """``name -> Relax module``: every zoo model and every model of :mod:`tvm_pesto.zoo.outside`
    (the default), or those named (corpus models too, ``corpus:NAME``:
    :func:`~tvm_pesto_lab.families.model_names`).

    Raises
    ------
    CostError
        For a name of no such model (the message lists them).
    """
    names = model_names(list(names) if names else ["zoo", "outside"])
    return {n: model_module(n, size) for n in names}


def _loadavg() -> list[float]:
    return [float(x) for x in os.getloadavg()]


def _flow_errors(meas: np.ndarray, pred: np.ndarray) -> dict:
    """:func:`~tvm_pesto_lab.metrics.error_metrics` plus the sums, and the MAPE of the groups
    measured above the floor."""
    out = error_metrics(meas, pred)
    above = meas > 1.5 * MIN_COST_S  # at the floor: nothing measurable after the VM call overhead (views)
    out.update(sum_pred_s=float(pred.sum()), sum_meas_s=float(meas.sum()),
               sum_ratio=float(pred.sum() / meas.sum()) if meas.sum() > 0 else None,
               n_at_floor=int((~above).sum()), mape_above_floor=error_metrics(meas[above], pred[above])["mape"])
    return out


def _label_noise(runs: list) -> dict:
    """How far repeated measurements of the same groups are from the first run."""
    first = runs[0]
    apes = [np.abs(r / first - 1.0) for r in runs[1:]]
    sums = [float(r.sum() / first.sum()) for r in runs[1:]]
    mape = float(100 * np.mean(np.concatenate(apes)))
    return {"runs": len(runs), "rerun_mape": mape, "rerun_sum_ratio": sums,
            "above_target": bool(mape > FLOW_TARGETS["group_mape_pct"]
                                 or any(abs(x - 1.0) > FLOW_TARGETS["sum_ratio_tolerance"] for x in sums))}


def _meets(m: dict) -> dict:
    ok_mape = m.get("mape") is not None and m["mape"] <= FLOW_TARGETS["group_mape_pct"]
    ok_sum = m.get("sum_ratio") is not None and abs(m["sum_ratio"] - 1.0) <= FLOW_TARGETS["sum_ratio_tolerance"]
    return {"mape": bool(ok_mape), "sum": bool(ok_sum)}


def _target_summary(per: dict, key: str | None) -> dict:
    ms = {n: (r if key is None else r.get(key)) for n, r in per.items()}
    ms = {n: m for n, m in ms.items() if m and m.get("n")}
    met = {n: _meets(m) for n, m in ms.items()}
    return {"models": len(ms), "mape_met": sorted(n for n, v in met.items() if v["mape"]),
            "sum_met": sorted(n for n, v in met.items() if v["sum"]),
            "all_met": bool(ms) and all(v["mape"] and v["sum"] for v in met.values())}


@dataclass(frozen=True)
class FlowEvalSettings:
    """How :func:`flow_eval` labels, judges and calibrates.

    Attributes
    ----------
    calibrate : bool
        Also score each model with a calibration fitted on the other models' labels of
        this run only (leave one model out), and fit the one ``save_calibration`` writes.
    max_load : float
        1-minute load average above which a model's labels are flagged ``high_load``.
    strict : bool
        Refuse (raise) instead of flagging.
    save_calibration : path, optional
        Write the calibration fitted on *all* the models there (see
        :func:`tvm_pesto.costs.calibration.calibration_path` for where the ``xgb`` source
        looks for it).
    label_runs : int
        Measure each model's labels this many times, each run into a fresh log; a group's
        label is the median over the runs, and ``label_noise`` says how far the runs were
        from the first: what a perfect cost model would score against one run. On a
        shared VM whose speed drifts it can exceed the targets (a fresh cache only).
    backends : str or list
        Library backends whose units are scored (measured once): ``"all"`` (every available
        one but ``inductor``, the flow's default) or names (``"tvm"``: none).
    """

    calibrate: bool = True
    max_load: float = MAX_LABEL_LOAD
    strict: bool = False
    save_calibration: object = None
    label_runs: int = 1
    backends: object = "all"


def flow_eval(modules: dict, cluster="cpu:2", model=None, cache=None, settings: FlowEvalSettings = FlowEvalSettings(),
              progress=None) -> dict:
    """Score the ``xgb`` cost source against measurements on the product's path.

    For each model: its fused groups (the ``tvm`` candidates of placement, as
    :func:`tvm_pesto.estimate_costs` costs them) measured by the ``measured`` source (timed
    now on ``cluster``'s devices, scaled to the whole model's measured time) and predicted
    by the ``xgb`` source as :func:`tvm_pesto.estimate_costs` gives them: with the
    calibration the source applies on this machine (this machine's fit, fitted first if the
    model has none and ``$TVM_PESTO_MACHINE_CALIBRATION`` allows it, else the one
    stored next to the model file; ``in_fit`` says whether the model was among those it was
    fitted on), and raw (``raw``: no calibration). With ``calibrate``, each model is also
    scored with a calibration fitted on the *other* models' labels of this run only (leave
    one model out, so the score is not the fit).

    Parameters
    ----------
    modules : dict
        ``name -> tvm.IRModule`` (or :class:`tvm_pesto.graph.analysis.Analysis`), e.g. :func:`flow_models`.
    cluster : str or Cluster
        Devices on this machine that the model covers.
    model : path or CostModel, optional
        Default: the bundled model.
    cache : MeasureCache, optional
        Default: a fresh log in a temporary folder, so every label is measured now, under
        the load this reports (labels found in a given cache were measured earlier, under
        a load nobody recorded; ``labels_from_cache`` counts them).
    settings : FlowEvalSettings
        How the labels are measured and judged, and whether a calibration is fitted.
    progress : callable, optional
    Returns
    -------
    dict
        ``flow.<model>``: ``mape`` (percent), ``median_ape``, ``p90_ape``, ``within_10pct``,
        ``sum_ratio`` (sum predicted / sum measured), ``spearman``, ``kendall``, ``n_groups``
        of the predictions the product uses, ``calibrated`` (whether a calibration was
        applied: ``calibration`` at the top level says which file), ``in_fit``, ``load``
        (before/after the measurement and the labels' 1-minute value), ``high_load``;
        ``raw`` (the same figures without calibration); ``calibrated_heldout`` (with the
        leave-one-model-out calibration); ``pooled`` over all groups (``applied``, ``raw``,
        ``calibrated_heldout``); ``targets`` (which models meet per-group MAPE <= 25 % and
        sum within 10 %, for each of the three).
        With ``label_runs`` > 1, ``flow.<model>.label_noise``: ``runs``, ``rerun_mape``
        (percent, each later run against the first, mean over groups and runs),
        ``rerun_sum_ratio`` (each later run's sum over the first's) and ``above_target``
        (the runs themselves differ by more than a target allows: the model's figures
        cannot be judged against the targets on this machine); ``label_noise`` the same
        over all groups, with ``above_target_models``.
        ``library.<backend>``: those error figures (``raw`` uncalibrated) over the ``models``'
        units of that backend; ``flow.<model>.library.<backend>`` one model's.

    Raises
    ------
    CostError
        For no models, a device the model does not cover, or (``strict``) labels measured
        above ``max_load``.

    Examples
    --------
    Measuring both models' fused groups on this machine takes minutes:

    >>> res = flow_eval(flow_models(["vgg11", "vit"]), "cpu:2")     # doctest: +SKIP
    >>> res["flow"]["vit"]["mape"], res["flow"]["vit"]["calibrated_heldout"]["mape"]  # doctest: +SKIP
    """
    calibrate, max_load, strict, label_runs, backends = (settings.calibrate, settings.max_load, settings.strict,
                                                         settings.label_runs, settings.backends)
    _check_args(modules, max_load, label_runs, cache)
    backend_names(backends)  # an unknown name fails here, before anything is measured
    cl = as_cluster(cluster)
    cm = model if isinstance(model, CostModel) else load_model(model)
    cols = _covered_columns(cl, cm)
    applied = _applied_calibration(cl, cm) if calibrate else None
    fresh = cache is None
    run = {"cluster": cl, "model": cm, "cols": cols, "applied": applied, "fresh": fresh, "progress": progress,
           "backends": backends, "label_runs": label_runs, "max_load": max_load, "strict": strict}
    load_start = _loadavg()
    scored = _score_models(modules, run, cache)
    per = {n: s["rec"] for n, s in scored.items()}
    res: dict = {"kind": "flow", "model": cm.path, "cluster": cl.name, "devices": sorted(cols),
                 "cost_source": "xgb", "label_source": "measured (fused groups scaled to the whole model's time)",
                 "units": UNITS, "max_load": max_load, "cores": os.cpu_count(), "strict": bool(strict),
                 "fresh_cache": fresh, "load": {"start": load_start, "end": _loadavg()},
                 "high_load_models": sorted(n for n, r in per.items() if r["high_load"]),
                 "targets_required": dict(FLOW_TARGETS), "flow": per}
    _summarise(res, scored, max_load, label_runs)
    _calibration_figures(res, scored, run, calibrate, settings.save_calibration)
    return res


def _score_models(modules: dict, run: dict, cache) -> dict:
    """Every model scored (:func:`_score_model`) into ``cache``, or, without one, into fresh
    logs in one temporary folder, removed afterwards (each label run gets its own)."""
    with tempfile.TemporaryDirectory(prefix="pesto-flow-") as scratch:
        logs = itertools.count()
        run["fresh_log"] = lambda: MeasureCache(Path(scratch) / f"measurements-{next(logs)}.jsonl")
        run["cache"] = run["fresh_log"]() if cache is None else cache
        return {name: _score_model(name, mod, run) for name, mod in modules.items()}


def _calibration_figures(res: dict, scored: dict, run: dict, calibrate: bool, save_calibration) -> None:
    """``res["calibration"]``; with ``calibrate``, the leave-one-model-out figures, and the
    calibration fitted on all the models saved to ``save_calibration`` when given."""
    applied, per = run["applied"], res["flow"]
    res["calibration"] = {"fitted": False, "applied": None if applied is None else applied.path,
                          "note": _CALIBRATION_NOTES[bool(calibrate)]}
    if calibrate:
        pairs = {n: s["pairs"] for n, s in scored.items()}
        _flow_calibrate(res, per, pairs, {n: s["cells"] for n, s in scored.items()}, run["cluster"], run["model"])
        if save_calibration is not None:
            _save_calibration(res, per, pairs, run["cluster"], run["model"], save_calibration)


def _check_args(modules, max_load, label_runs, cache) -> None:
    if not modules:
        raise CostError("no models to evaluate; name zoo models or models outside the zoo (see flow_models)")
    if not max_load > 0:
        raise CostError(f"max_load must be a positive load average, got {max_load!r}")
    if not isinstance(label_runs, int) or label_runs < 1:
        raise CostError(f"label_runs must be a whole number of runs >= 1, got {label_runs!r}")
    if label_runs > 1 and cache is not None:
        raise CostError("label_runs > 1 measures every run afresh, so it cannot reuse a measurement log; drop the "
                        "cache (--cache) or measure once (--label-runs 1)")


def _covered_columns(cl, cm) -> dict[str, int]:
    """Device key -> the first column of that device; every device must be one the model covers."""
    cols: dict[str, int] = {}
    for j, dev in enumerate(cl.devices):
        dd = device_descriptor(dev)
        if not cm.covers_size(dd):
            raise CostError(f"cost model {cm.path} was not trained on device {dev.name} ({device_key(dd)}) nor on "
                            f"one of its size, so the flow evaluation would score roofline estimates; use a cluster "
                            f"of devices it covers ({', '.join(cm.meta.get('devices', []))})")
        cols.setdefault(device_key(dd), j)
    return cols


def _applied_calibration(cl, cm):
    """The calibration the xgb source applies here, as estimate_costs would: this machine's,
    fitted first when it has none (:func:`tvm_pesto.costs.machine.needs_fit`)."""
    if machine.needs_fit(cm, cl):
        machine.calibrate_machine(cl, cm, announce=True)
    return load_calibration(cm)


def _measure_labels(name, cs, run: dict, before: list):
    """The measured cost table of ``cs`` (median over ``label_runs`` fresh runs), every run's
    table, and the load average after (``before``: the load average before the model)."""
    mct = candidate_costs(cs, run["cluster"], "measured", cache=run["cache"], progress=run["progress"], in_run=False)
    runs = [mct.table.copy()]
    for _ in range(1, run["label_runs"]):
        again = candidate_costs(cs, run["cluster"], "measured", cache=run["fresh_log"](), progress=run["progress"],
                                in_run=False)
        runs.append(again.table)
    if run["label_runs"] > 1:
        mct.table = np.median(np.stack(runs), axis=0)
    after = _loadavg()
    label_load = max(before[0], after[0])
    if run["strict"] and label_load > run["max_load"]:
        raise CostError(f"load average rose to {label_load:.2f} (above {run['max_load']}) while measuring {name}; "
                        "run on a quieter machine, or raise --max-load / drop --strict")
    return mct, runs, after


def _score_model(name, mod, run: dict) -> dict:
    """One model's fused groups measured and predicted: its record under ``flow.<name>``, the
    (backend, device key, raw predicted, measured) pairs, the cells scored and the labels."""
    cl, cm, applied = run["cluster"], run["model"], run["applied"]
    before = _loadavg()
    if run["strict"] and before[0] > run["max_load"]:
        raise CostError(f"load average {before[0]:.2f} is above {run['max_load']} before measuring {name}: the "
                        "labels would be slowed by other jobs; run on a quieter machine, or raise --max-load / drop "
                        "--strict")
    a = mod if isinstance(mod, Analysis) else analyze(mod)
    cs = placement_candidates(a.rg, a.groups)
    mct, runs, after = _measure_labels(name, cs, run, before)
    raw, _ = predict_candidate_costs(cs, cl, cm, calibration=False)
    ps, cells = [], []  # (backend, device key, predicted, measured) and its (candidate, column)
    for dk, j in run["cols"].items():
        for i, c in enumerate(cs):
            if np.isfinite(mct.table[i, j]) and np.isfinite(raw[i, j]):
                ps.append((c.backend, dk, float(raw[i, j]), float(mct.table[i, j])))
                cells.append((i, j))
    if not ps:
        raise CostError(f"model {name}: no fused group was both measured and predicted; check that it builds "
                        "on this machine (tvm-pesto run)")
    raw_pred, meas = np.array([p[2] for p in ps]), np.array([p[3] for p in ps])
    at = tuple(np.array(cells).T)  # the (candidate, column) cells scored
    pred = raw_pred if applied is None else predict_candidate_costs(cs, cl, cm, calibration=applied)[0][at]
    label_load = max(before[0], after[0])
    rec = {"origin": model_origin(name), "n_groups": len(a.groups), "calibrated": applied is not None,
           **_flow_errors(meas, pred),
           "in_fit": applied is not None and name in (applied.meta.get("models") or []),
           "raw": {"calibrated": False, **_flow_errors(meas, raw_pred)},
           "load": {"before": before, "after": after, "label_1min": label_load,
                    "known": bool(run["fresh"] or mct.cached == 0)}, "high_load": bool(label_load > run["max_load"]),
           "measured": mct.measured, "labels_from_cache": mct.cached, "measure_s": float(mct.seconds),
           "whole_model_factor": {str(k): v for k, v in mct.native_scale.items()}}
    labels = [r[at] for r in runs] if run["label_runs"] > 1 else None
    if labels is not None:
        rec["label_noise"] = _label_noise(labels)
    lib = _library_pairs(a, run)
    rec["library"] = {b: {**_flow_errors(m, p), "raw": _flow_errors(m, r)} for b, (r, p, m) in lib.items()}
    return {"rec": rec, "pairs": ps, "cells": (cs, at), "applied": pred, "labels": labels, "library": lib}


def _library_pairs(a: Analysis, run: dict) -> dict:
    """``backend -> (raw predicted, applied predicted, measured)`` of the model's library units:
    the flow's candidates of other backends than TVM that cover one fusion group, and each
    backend's largest (:func:`~tvm_pesto.costs.machine.calibration_units`, the units the
    machine calibration is fitted on), measured once, on the scored devices."""
    cl, cm = run["cluster"], run["model"]
    units = machine.calibration_units(make_candidates(a, cl, run["backends"]), a.groups)
    units = units.subset(lambda c: c.backend != "tvm")
    if not len(units):
        return {}
    meas = candidate_costs(units, cl, "measured", cache=run["cache"], progress=run["progress"], in_run=False).table
    raw, _ = predict_candidate_costs(units, cl, cm, calibration=False)
    applied = raw if run["applied"] is None else predict_candidate_costs(units, cl, cm, calibration=run["applied"])[0]
    out: dict = {}
    for j in run["cols"].values():
        for i, c in enumerate(units):
            if np.isfinite(meas[i, j]) and np.isfinite(raw[i, j]) and meas[i, j] > 0:
                out.setdefault(c.backend, []).append((raw[i, j], applied[i, j], meas[i, j]))
    return {b: tuple(np.array(col, dtype=float) for col in zip(*v)) for b, v in sorted(out.items())}


def _summarise(res: dict, scored: dict, max_load: float, label_runs: int) -> None:
    """Load flags and notes, the label noise over all models, pooled figures and targets."""
    per = res["flow"]
    res["high_load"] = bool(res["high_load_models"])
    unknown = sorted(n for n, r in per.items() if not r["load"]["known"])
    if unknown:
        res["load_unknown_models"] = unknown  # labels from a given cache: measured earlier, load not recorded
    if res["high_load"]:
        res["load_note"] = (f"labels of {', '.join(res['high_load_models'])} were measured above load {max_load} on "
                            f"{os.cpu_count()} cores (the measurement itself keeps one core busy); other jobs slow "
                            "the labels, so judge those figures with it")
    if label_runs > 1:
        pooled = [np.concatenate([scored[n]["labels"][k] for n in per]) for k in range(label_runs)]
        above = sorted(n for n, r in per.items() if r["label_noise"]["above_target"])
        res["label_noise"] = {**_label_noise(pooled), "above_target_models": above}
    all_meas = np.concatenate([[p[3] for p in scored[n]["pairs"]] for n in per])
    all_raw = np.concatenate([[p[2] for p in scored[n]["pairs"]] for n in per])
    all_applied = np.concatenate([scored[n]["applied"] for n in per])
    res["pooled"] = {"applied": _flow_errors(all_meas, all_applied), "raw": _flow_errors(all_meas, all_raw)}
    backends = sorted({b for n in per for b in scored[n]["library"]})
    res["library"] = {}
    for b in backends:
        raw, applied, meas = (np.concatenate([scored[n]["library"][b][k] for n in per if b in scored[n]["library"]])
                              for k in range(3))
        res["library"][b] = {"models": sorted(n for n in per if b in scored[n]["library"]),
                             **_flow_errors(meas, applied), "raw": _flow_errors(meas, raw)}
    res["targets"] = {"applied": _target_summary(per, None), "raw": _target_summary(per, "raw")}


def _save_calibration(res: dict, per: dict, pairs: dict, cl, cm, path) -> None:
    """Fit the calibration on all the models' groups and write it to ``path``."""
    loads = [r["load"]["label_1min"] for r in per.values()]
    meta = {"model": Path(cm.path).name if cm.path else None,
            "model_sha256": file_sha256(cm.path) if cm.path else None,
            "cluster": cl.name, "models": sorted(per),
            "label_source": res["label_source"],
            "label_load": {"max_1min": float(max(loads)), "median_1min": float(np.median(loads)),
                           "per_model": {n: r["load"]["label_1min"] for n, r in per.items()},
                           "max_load": res["max_load"], "cores": os.cpu_count(),
                           "high_load_models": res["high_load_models"],
                           "load_unknown_models": res.get("load_unknown_models", [])}}
    cal = fit_calibration([p for n in per for p in pairs[n]], meta=meta, floor=MIN_COST_S)
    res["calibration"]["saved"] = cal.save(path)
    res["calibration"]["saved_entries"] = cal.to_json()["entries"]


def _measured_of(pairs) -> np.ndarray:
    return np.array([p[3] for p in pairs])


def _flow_calibrate(res, per, pairs, cands, cl, cm) -> None:
    """Leave-one-model-out calibration: fit on the other models' groups, score this one."""
    names = list(per)
    res["calibration"].update(fitted=True, method=METHOD, heldout="leave one model out (fit on the other models)")
    if len(names) < 2:
        res["calibration"]["note"] = "one model only: nothing to hold out, no calibrated figures"
        return
    all_p, all_m = [], []
    for name in names:
        others = [p for n in names if n != name for p in pairs[n]]
        try:
            cal = fit_calibration(others, meta={"models": [n for n in names if n != name]}, floor=MIN_COST_S)
        except CostError as e:
            per[name]["calibrated_heldout"] = {"calibrated": False, "error": str(e)}
            continue
        cs, cells = cands[name]
        pred, meas = predict_candidate_costs(cs, cl, cm, calibration=cal)[0][cells], _measured_of(pairs[name])
        all_p.append(pred)
        all_m.append(meas)
        per[name]["calibrated_heldout"] = {"calibrated": True, **_flow_errors(meas, pred),
                                           "fit_models": [n for n in names if n != name],
                                           "entries": cal.to_json()["entries"]}
    if all_p:
        res["pooled"]["calibrated_heldout"] = _flow_errors(np.concatenate(all_m), np.concatenate(all_p))
        res["targets"]["calibrated_heldout"] = _target_summary(per, "calibrated_heldout")


__all__ = ["FLOW_TARGETS", "FlowEvalSettings", "MAX_LABEL_LOAD", "flow_eval", "flow_models"]
