"""Accuracy of a cost model: error and rank metrics, backend choice, noise floor, splits.

Units: ``mape``, ``median_ape`` and ``p90_ape`` are percentages; ``within_10pct``,
``top1_backend_accuracy`` and ``mean_regret`` are fractions (0.9 = 90 %); ``spearman`` and
``kendall`` are rank correlations in [-1, 1].

Splits hold out whole *models* (every subgraph of a zoo model; a subgraph whose structure
also occurs in a training model is removed from training, so no shape leaks), or whole
*op kinds* (every row whose dominant op is of that kind).

:func:`flow_eval` scores the model on the product's own path instead of the profiler's
records: each model's fused groups predicted by the ``xgb`` source against the ``measured``
source (groups timed now, scaled to the whole model's measured time), per model, raw and
with a whole-model calibration fitted on the *other* models (:mod:`.calibration`).

Examples
--------
>>> import numpy as np
>>> dev = {"kind": "cpu", "model": "x", "cores": 1}
>>> rows = [{"time_s": t, "device": dev, "backend": "tvm"} for t in (1.0, 2.0, 4.0)]
>>> m = metrics(rows, np.array([1.05, 2.0, 3.0]))
>>> round(m["mape"], 2), round(m["within_10pct"], 3), m["spearman"]
(10.0, 0.667, 1.0)
"""
from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..errors import CostError
from .features import device_key, dominant_kind

UNITS = {"mape": "percent", "median_ape": "percent", "p90_ape": "percent", "within_10pct": "fraction",
         "top1_backend_accuracy": "fraction", "mean_regret": "fraction (chosen/best - 1)",
         "spearman": "rank correlation", "kendall": "rank correlation",
         "sum_ratio": "ratio (sum of predicted / sum of measured group seconds)", "load": "load average (1, 5, 15 min)"}


def _rank_corr(a, b) -> tuple[float | None, float | None]:
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None, None
    from scipy.stats import kendalltau, spearmanr

    return float(spearmanr(a, b).statistic), float(kendalltau(a, b).statistic)


def _errors(meas: np.ndarray, pred: np.ndarray) -> dict:
    ape = np.abs(pred - meas) / meas
    s, k = _rank_corr(meas, pred)
    return {"n": int(len(meas)), "mape": float(100 * ape.mean()) if len(ape) else None,
            "median_ape": float(100 * np.median(ape)) if len(ape) else None,
            "p90_ape": float(100 * np.percentile(ape, 90)) if len(ape) else None,
            "within_10pct": float(np.mean(ape <= 0.10 + 1e-9)) if len(ape) else None, "spearman": s, "kendall": k}


def backend_choice(rows, pred) -> dict:
    """Top-1 backend accuracy and mean regret over subgraphs measured on several backends.

    Subgraphs are matched by (device, model, op-graph nodes). The model "chooses" the
    backend with the smallest predicted time; regret is measured(chosen)/measured(best) - 1.

    Examples
    --------
    >>> dev = {"kind": "cpu", "model": "x", "cores": 1}
    >>> rows = [{"time_s": 1.0, "backend": "tvm", "device": dev, "model": "m", "nodes": [0]},
    ...         {"time_s": 2.0, "backend": "torch", "device": dev, "model": "m", "nodes": [0]}]
    >>> backend_choice(rows, [3.0, 2.5])["top1_backend_accuracy"], backend_choice(rows, [3.0, 2.5])["mean_regret"]
    (0.0, 1.0)
    """
    groups: dict = defaultdict(list)
    for i, r in enumerate(rows):
        if r.get("nodes"):
            groups[(device_key(r["device"]), r.get("model", ""), tuple(r["nodes"]))].append(i)
    hits, regrets = [], []
    by_backend: dict = defaultdict(int)
    for idx in groups.values():
        if len({rows[i]["backend"] for i in idx}) < 2:
            continue
        meas = np.array([rows[i]["time_s"] for i in idx])
        pr = np.array([pred[i] for i in idx])
        best, chosen = int(np.argmin(meas)), int(np.argmin(pr))
        hits.append(chosen == best or meas[chosen] == meas[best])
        regrets.append(float(meas[chosen] / meas[best] - 1.0))
        by_backend[rows[idx[best]]["backend"]] += 1
    if not hits:
        return {"top1_backend_accuracy": None, "mean_regret": None, "n_choices": 0, "best_backend_counts": {}}
    return {"top1_backend_accuracy": float(np.mean(hits)), "mean_regret": float(np.mean(regrets)),
            "p90_regret": float(np.percentile(regrets, 90)), "n_choices": len(hits),
            "best_backend_counts": dict(sorted(by_backend.items()))}


def metrics(rows, pred) -> dict:
    """All metrics of predictions ``pred`` (seconds) against the rows' measured ``time_s``."""
    pred = np.asarray(pred, dtype=np.float64)
    meas = np.array([r["time_s"] for r in rows], dtype=np.float64)
    out = _errors(meas, pred)
    per_dev: dict = defaultdict(list)
    per_bk: dict = defaultdict(list)
    for i, r in enumerate(rows):
        per_dev[device_key(r["device"])].append(i)
        per_bk[r["backend"]].append(i)
    out["per_device"] = {k: _errors(meas[v], pred[v]) for k, v in sorted(per_dev.items())}
    out["per_backend"] = {k: _errors(meas[v], pred[v]) for k, v in sorted(per_bk.items())}
    out.update(backend_choice(rows, pred))
    return out


#: Load above a device's own cores by more than this means another job ran while measuring.
BUSY_EXTRA_LOAD = 0.5


def noise_floor(rows) -> dict:
    """How noisy the measurements are.

    ``cv_*``: coefficient of variation (std/mean) of each record's repeats (back to back,
    in one run). ``rerun_*``: |t2 - t1| / t1 between two runs that measured the same
    subgraph on the same backend and device (two profiling passes, or a shape shared by
    two models): the error a perfect model would show against a single measurement.
    ``load_*``: 1-minute load average when the records were written; ``load_by_device``
    the same per device, with ``busy``: records written while the load was above the
    device's own cores plus :data:`BUSY_EXTRA_LOAD` (another job was running; the timing
    loop itself keeps the device's cores busy).
    """
    cvs = []
    for r in rows:
        reps = np.asarray(r.get("repeats") or [], dtype=np.float64)
        if len(reps) >= 2 and reps.mean() > 0:
            cvs.append(float(reps.std(ddof=1) / reps.mean()))
    same: dict = defaultdict(list)
    for r in rows:
        same[(r["key"], r["backend"], device_key(r["device"]))].extend(r.get("runs") or [r["time_s"]])
    rerun = []
    for ts in same.values():
        for a, b in zip(ts, ts[1:]):
            rerun.append(abs(b - a) / a)
    loads = [r["load"][0] for r in rows if isinstance(r.get("load"), (list, tuple)) and r["load"]]
    out = {"n_records": len(cvs)}
    if cvs:
        out.update(cv_median=float(np.median(cvs)), cv_mean=float(np.mean(cvs)), cv_p90=float(np.percentile(cvs, 90)))
    out["n_rerun_pairs"] = len(rerun)
    if rerun:
        out.update(rerun_mape=float(100 * np.mean(rerun)), rerun_median_ape=float(100 * np.median(rerun)),
                   rerun_within_10pct=float(np.mean(np.array(rerun) <= 0.10 + 1e-9)))
    if loads:
        out.update(load_median=float(np.median(loads)), load_max=float(np.max(loads)))
        per: dict = defaultdict(list)
        for r in rows:
            if isinstance(r.get("load"), (list, tuple)) and r["load"]:
                per[device_key(r["device"])].append((float(r["load"][0]), int(r["device"].get("cores", 1))))
        out["load_by_device"] = {k: {"n": len(v), "median": float(np.median([x for x, _ in v])),
                                     "max": float(max(x for x, _ in v)),
                                     "busy": int(sum(x > c + BUSY_EXTRA_LOAD for x, c in v))}
                                 for k, v in sorted(per.items())}
    return out


def is_zoo_model(name: str) -> bool:
    """Whether a row's model name is a zoo model (not a sweep or a tuning database)."""
    from ..zoo import MODELS

    return name.split(":")[0] in MODELS


def split_by_model(rows, heldout) -> tuple[list, list]:
    """``(train, test)``: test = rows of the held-out models; train = the other rows minus
    any whose structural key occurs in the test rows."""
    held = set(heldout)
    test = [r for r in rows if r["model"] in held]
    keys = {r["key"] for r in test}
    train = [r for r in rows if r["model"] not in held and r["key"] not in keys]
    return train, test


def row_kind(r) -> str:
    d = r["desc"]["dominant"]
    return dominant_kind(d["op"], d.get("attrs"), d.get("inputs"))


def cross_validate(rows, by: str = "model", target: str = "log_time", rounds: int | None = None,
                   folds=None, overheads=None) -> dict:
    """Leave-one-group-out evaluation.

    Parameters
    ----------
    by : {"model", "op_kind"}
        ``model``: each zoo model is a fold (sweeps always train); ``op_kind``: each
        dominant op kind with at least 10 rows is a fold.

    Returns
    -------
    dict
        ``folds`` (metrics per held-out group) and ``pooled`` (metrics over all held-out
        predictions together).
    """
    from .xgb import DEFAULT_ROUNDS, train

    rounds = rounds or DEFAULT_ROUNDS
    if by == "model":
        names = sorted({r["model"] for r in rows if is_zoo_model(r["model"])}) if folds is None else list(folds)
        parts = [(n, *split_by_model(rows, [n])) for n in names]
    elif by == "op_kind":
        kinds = defaultdict(list)
        for r in rows:
            kinds[row_kind(r)].append(r)
        names = sorted(k for k, v in kinds.items() if len(v) >= 10) if folds is None else list(folds)
        parts = [(k, [r for r in rows if row_kind(r) != k], kinds[k]) for k in names]
    else:
        raise CostError(f"unknown split {by!r}; use model or op_kind")
    out_rows, out_pred, per = [], [], {}
    for name, tr, te in parts:
        if not te or len(tr) < 2:
            continue
        m = train(tr, target=target, rounds=rounds, overheads=overheads)
        p = m.predict_rows(te)
        per[name] = metrics(te, p)
        out_rows.extend(te)
        out_pred.extend(p.tolist())
    pooled = metrics(out_rows, np.array(out_pred)) if out_rows else {}
    return {"by": by, "target": target, "folds": per, "pooled": pooled}


def plot_predictions(panels: dict, path) -> str:
    """Log-log scatter of predicted vs measured seconds, one panel per entry of ``panels``
    (``name -> (rows, pred)``); returns the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = max(len(panels), 1)
    fig, axes = plt.subplots(1, k, figsize=(5 * k, 4.6), squeeze=False)
    for ax, (name, (rows, pred)) in zip(axes[0], panels.items()):
        meas = np.array([r["time_s"] for r in rows])
        pred = np.asarray(pred)
        bks = sorted({r["backend"] for r in rows})
        for b in bks:
            sel = np.array([r["backend"] == b for r in rows])
            ax.scatter(meas[sel], pred[sel], s=9, alpha=0.6, label=b)
        if len(meas):
            lo, hi = float(min(meas.min(), pred.min())) / 1.5, float(max(meas.max(), pred.max())) * 1.5
            ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
            ax.plot([lo, hi], [lo * 1.1, hi * 1.1], "k:", lw=0.6)
            ax.plot([lo, hi], [lo / 1.1, hi / 1.1], "k:", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured (s)")
        ax.set_ylabel("predicted (s)")
        ape = np.abs(pred - meas) / meas if len(meas) else np.zeros(0)
        ax.set_title(f"{name}: n={len(meas)}, MAPE {100 * ape.mean() if len(ape) else math.nan:.1f}%")
        ax.legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def relabel(rows, label: str) -> list:
    """Rows with ``time_s`` set from their profiling passes: ``min`` (the fastest pass, as
    stored) or ``median`` (the median of the passes)."""
    if label == "min":
        return [dict(r, time_s=float(min(r["runs"]))) if r.get("runs") else r for r in rows]
    if label == "median":
        return [dict(r, time_s=float(np.median(r["runs"]))) if r.get("runs") else r for r in rows]
    raise CostError(f"unknown label {label!r}; use min or median")


def evaluate_model(model, cv: bool = False, plot: str | None = None, logs=None, tuning_dbs=(),
                   label: str = "min") -> dict:
    """Evaluate a saved model on its own split: ``heldout`` (zoo models it never saw),
    ``heldout_family`` (held-out models of :mod:`tvm_pesto.zoo.outside`: architecture
    families no zoo model has, pooled and per model) and ``seen``.

    Parameters
    ----------
    model : CostModel
        With ``meta["logs"]`` (paths relative to the model file) and ``meta["heldout_models"]``.
    cv : bool
        Also run leave-one-model-out (both targets) and leave-one-op-kind-out
        cross-validation on the same data.
    logs : list of path, optional
        Evaluate on these logs instead of the model's own.
    label : {"min", "median"}
        Measured time of a subgraph profiled in several passes: the fastest pass (as the
        model was trained) or the median of the passes.

    Examples
    --------
    Reading the model's logs and retraining it without its held-out models takes minutes:

    >>> from tvm_pesto.costs.xgb import load_model       # doctest: +SKIP
    >>> evaluate_model(load_model())["heldout"]["mape"]   # doctest: +SKIP
    """
    from .xgb import load_dataset

    base = Path(model.path).parent if model.path else Path(".")
    if logs is None:
        logs = [str(base / p) for p in model.meta.get("logs", [])]
        tuning_dbs = [str(base / p) for p in model.meta.get("tuning_dbs", [])]
        if not logs and not tuning_dbs:
            raise CostError(f"cost model {model.path} lists no training logs; pass logs to evaluate on")
    ds = load_dataset(logs, tuning_dbs)
    ds.rows = relabel(ds.rows, label)
    held_all = set(model.meta.get("heldout_models", []))
    families = {m for m in held_all if model_origin(m) == "outside"}  # architectures no zoo model has
    recipe = set(model.meta.get("eval_heldout_models", []))  # trained on, scored by the recipe without them
    held = (held_all - families) | recipe
    train_models = set(model.meta.get("train_models", []))
    test = [r for r in ds.rows if r["model"] in held]
    seen = [r for r in ds.rows if r["model"] in train_models and r["model"] not in held_all]
    res: dict = {"model": model.path, "target": model.target, "heldout_models": sorted(held),
                 "heldout_families": sorted(families), "label": label,
                 "units": UNITS, "logs": list(logs), "skipped_lines": [list(s) for s in ds.skipped],
                 "rows": len(ds.rows), "records_without_description": ds.no_desc, "infeasible_records": ds.infeasible}
    scorer = model
    if recipe:
        from .xgb import train

        t0 = time.perf_counter()
        train_rows, _ = split_by_model(ds.rows, sorted(held_all | recipe))
        scorer = train(train_rows, target=model.target, rounds=int(model.meta.get("rounds", 300)),
                       params=model.meta.get("params"), overheads=ds.overheads)
        res["heldout_scored_by"] = {
            "recipe": "the model's own target, rounds and parameters, retrained on its logs without "
                      f"{', '.join(sorted(recipe))} (and any row sharing a structural key with them); the "
                      "shipped model was trained on them",
            "train_rows": len(train_rows), "seconds": time.perf_counter() - t0}
    p_test = scorer.predict_rows(test)
    p_seen = model.predict_rows(seen)
    res["heldout"] = metrics(test, p_test) if test else {"n": 0}
    res["seen"] = metrics(seen, p_seen) if seen else {"n": 0}
    if families:
        fam = [r for r in ds.rows if r["model"] in families]
        p_fam = model.predict_rows(fam)
        res["heldout_family"] = {"pooled": metrics(fam, p_fam) if fam else {"n": 0}}
        for m in sorted(families):
            sel = [i for i, r in enumerate(fam) if r["model"] == m]
            res["heldout_family"][m] = metrics([fam[i] for i in sel], p_fam[sel]) if sel else {"n": 0}
    res["noise_floor"] = noise_floor(ds.rows)
    res["noise_floor_heldout"] = noise_floor(test)
    if plot:
        res["plot"] = plot_predictions({"held-out models": (test, p_test), "seen models": (seen, p_seen)}, plot)
    if cv:
        ov = _overheads(ds)
        res["cv"] = {t: cross_validate(ds.rows, "model", t, overheads=ov) for t in ("log_time", "log_ratio")}
        res["cv_op_kind"] = cross_validate(ds.rows, "op_kind", model.target, overheads=ov)
    return res


def _overheads(ds) -> dict:
    return ds.overheads


# -- the product's path: fused groups, xgb against measured ---------------------------------------
#: Labels measured while the 1-minute load average was above this are flagged (``high_load``):
#: on this 2-core machine a measurement pins one core, so more than 1.0 means another job.
MAX_LABEL_LOAD = 1.0
#: The issue's targets: per-group MAPE (percent) and the sum of a model's groups within 10 %.
FLOW_TARGETS = {"group_mape_pct": 25.0, "sum_ratio_tolerance": 0.10}


def model_origin(name: str) -> str:
    """``zoo``, ``outside`` (:mod:`tvm_pesto.zoo.outside`) or ``given`` for a flow model name."""
    from ..zoo import MODELS
    from ..zoo.outside import MODELS as OUTSIDE

    return "zoo" if name in MODELS else ("outside" if name in OUTSIDE else "given")


def flow_models(names=None, size: str = "small") -> dict:
    """``name -> Relax module``: every zoo model and every model of :mod:`tvm_pesto.zoo.outside`
    (the default), or those named.

    Raises
    ------
    CostError
        For a name that is neither (the message lists both).
    """
    from .. import zoo
    from ..zoo import outside

    zoo_names, out_names = zoo.list_models(), outside.list_models()
    names = list(names) if names else zoo_names + out_names
    mods = {}
    for n in names:
        if n in zoo_names:
            mods[n] = zoo.load(n, size).mod
        elif n in out_names:
            mods[n] = outside.relax_module(n, size)
        else:
            raise CostError(f"unknown model {n!r} for the flow evaluation; use a zoo model ({', '.join(zoo_names)}) "
                            f"or one outside the zoo ({', '.join(out_names)})")
    return mods


def _loadavg() -> list[float]:
    return [float(x) for x in os.getloadavg()]


def _flow_errors(meas: np.ndarray, pred: np.ndarray) -> dict:
    """:func:`_errors` plus the sums, and the MAPE of the groups measured above the floor."""
    from .measured import MIN_COST_S

    out = _errors(meas, pred)
    above = meas > 1.5 * MIN_COST_S  # at the floor: nothing measurable after the VM call overhead (views)
    out.update(sum_pred_s=float(pred.sum()), sum_meas_s=float(meas.sum()),
               sum_ratio=float(pred.sum() / meas.sum()) if meas.sum() > 0 else None,
               n_at_floor=int((~above).sum()), mape_above_floor=_errors(meas[above], pred[above])["mape"])
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


def flow_eval(modules: dict, cluster="cpu:2", model=None, cache=None, calibrate: bool = True,
              max_load: float = MAX_LABEL_LOAD, strict: bool = False, save_calibration=None,
              progress=None, label_runs: int = 1) -> dict:
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
        ``name -> tvm.IRModule`` (or :class:`tvm_pesto.api.Analysis`), e.g. :func:`flow_models`.
    cluster : str or Cluster
        Devices on this machine that the model covers.
    model : path or CostModel, optional
        Default: the bundled model.
    cache : MeasureCache, optional
        Default: a fresh log in a temporary folder, so every label is measured now, under
        the load this reports (labels found in a given cache were measured earlier, under
        a load nobody recorded; ``labels_from_cache`` counts them).
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
    import tempfile

    from ..api import Analysis, analyze, as_cluster, calibrate_machine
    from ..candidates import placement_candidates
    from . import candidate_costs
    from .cache import MeasureCache
    from .calibration import file_sha256, fit_calibration, load_calibration
    from .features import device_descriptor, device_key
    from .xgb import MIN_COST_S, CostModel, load_model, predict_candidate_costs

    if not modules:
        raise CostError("no models to evaluate; name zoo models or models outside the zoo (see flow_models)")
    if not max_load > 0:
        raise CostError(f"max_load must be a positive load average, got {max_load!r}")
    if not isinstance(label_runs, int) or label_runs < 1:
        raise CostError(f"label_runs must be a whole number of runs >= 1, got {label_runs!r}")
    if label_runs > 1 and cache is not None:
        raise CostError("label_runs > 1 measures every run afresh, so it cannot reuse a measurement log; drop the "
                        "cache (--cache) or measure once (--label-runs 1)")
    cl = as_cluster(cluster)
    cm = model if isinstance(model, CostModel) else load_model(model)
    cols: dict[str, int] = {}  # device key -> first column of that device
    for j, dev in enumerate(cl.devices):
        dd = device_descriptor(dev)
        if not cm.covers_size(dd):
            raise CostError(f"cost model {cm.path} was not trained on device {dev.name} ({device_key(dd)}) nor on "
                            f"one of its size, so the flow evaluation would score roofline estimates; use a cluster "
                            f"of devices it covers ({', '.join(cm.meta.get('devices', []))})")
        cols.setdefault(device_key(dd), j)
    applied = None  # the calibration the xgb source applies here, as estimate_costs would
    if calibrate:
        from .machine import needs_fit

        if needs_fit(cm, cl):
            calibrate_machine(cl, cm, announce=True)
        applied = load_calibration(cm)
    fresh = cache is None
    if fresh:
        cache = MeasureCache(Path(tempfile.mkdtemp(prefix="pesto-flow-")) / "measurements.jsonl")
    load_start = _loadavg()
    per, pairs, cands, run_labels, applied_of = {}, {}, {}, {}, {}
    for name, mod in modules.items():
        before = _loadavg()
        if strict and before[0] > max_load:
            raise CostError(f"load average {before[0]:.2f} is above {max_load} before measuring {name}: the labels "
                            "would be slowed by other jobs; run on a quieter machine, or raise --max-load / drop --strict")
        a = mod if isinstance(mod, Analysis) else analyze(mod)
        cs = placement_candidates(a.rg, a.groups)
        mct = candidate_costs(cs, cl, "measured", cache=cache, progress=progress)
        runs = [mct.table.copy()]
        for _ in range(1, label_runs):
            log = MeasureCache(Path(tempfile.mkdtemp(prefix="pesto-flow-")) / "measurements.jsonl")
            runs.append(candidate_costs(cs, cl, "measured", cache=log, progress=progress).table)
        if label_runs > 1:
            mct.table = np.median(np.stack(runs), axis=0)
        after = _loadavg()
        label_load = max(before[0], after[0])
        high = label_load > max_load
        if strict and high:
            raise CostError(f"load average rose to {label_load:.2f} (above {max_load}) while measuring {name}; run "
                            "on a quieter machine, or raise --max-load / drop --strict")
        raw, _ = predict_candidate_costs(cs, cl, cm, calibration=False)
        ps, cells = [], []  # (backend, device key, predicted, measured) and its (candidate, column)
        for dk, j in cols.items():
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
        rec = {"origin": model_origin(name), "n_groups": len(a.groups), "calibrated": applied is not None,
               **_flow_errors(meas, pred),
               "in_fit": applied is not None and name in (applied.meta.get("models") or []),
               "raw": {"calibrated": False, **_flow_errors(meas, raw_pred)},
               "load": {"before": before, "after": after, "label_1min": label_load,
                        "known": bool(fresh or mct.cached == 0)}, "high_load": bool(high),
               "measured": mct.measured, "labels_from_cache": mct.cached, "measure_s": float(mct.seconds),
               "whole_model_factor": {str(k): v for k, v in mct.calibration.items()}}
        if label_runs > 1:
            run_labels[name] = [r[at] for r in runs]
            rec["label_noise"] = _label_noise(run_labels[name])
        per[name], pairs[name], cands[name], applied_of[name] = rec, ps, (cs, at), pred
    res: dict = {"kind": "flow", "model": cm.path, "cluster": cl.name, "devices": sorted(cols),
                 "cost_source": "xgb", "label_source": "measured (fused groups scaled to the whole model's time)",
                 "units": UNITS, "max_load": max_load, "cores": os.cpu_count(), "strict": bool(strict),
                 "fresh_cache": fresh, "load": {"start": load_start, "end": _loadavg()},
                 "high_load_models": sorted(n for n, r in per.items() if r["high_load"]),
                 "targets_required": dict(FLOW_TARGETS), "flow": per}
    res["high_load"] = bool(res["high_load_models"])
    unknown = sorted(n for n, r in per.items() if not r["load"]["known"])
    if unknown:
        res["load_unknown_models"] = unknown  # labels from a given cache: measured earlier, load not recorded
    if res["high_load"]:
        res["load_note"] = (f"labels of {', '.join(res['high_load_models'])} were measured above load {max_load} on "
                            f"{os.cpu_count()} cores (the measurement itself keeps one core busy); other jobs slow "
                            "the labels, so judge those figures with it")
    if label_runs > 1:
        pooled = [np.concatenate([run_labels[n][k] for n in per]) for k in range(label_runs)]
        res["label_noise"] = {**_label_noise(pooled),
                              "above_target_models": sorted(n for n, r in per.items() if r["label_noise"]["above_target"])}
    all_meas = np.concatenate([[p[3] for p in pairs[n]] for n in per])
    all_raw = np.concatenate([[p[2] for p in pairs[n]] for n in per])
    all_applied = np.concatenate([applied_of[n] for n in per])
    res["pooled"] = {"applied": _flow_errors(all_meas, all_applied), "raw": _flow_errors(all_meas, all_raw)}
    res["targets"] = {"applied": _target_summary(per, None), "raw": _target_summary(per, "raw")}
    res["calibration"] = {"fitted": False, "applied": None if applied is None else applied.path,
                          "note": "flow.<model> figures are the xgb source's as estimate_costs gives them "
                                  "(calibration applied); raw ones under flow.<model>.raw, leave-one-model-out "
                                  "ones under calibrated_heldout" if calibrate
                          else "calibration off (--no-calibration): flow.<model> figures are raw"}
    if calibrate:
        _flow_calibrate(res, per, pairs, cands, cl, cm)
        if save_calibration is not None:
            loads = [r["load"]["label_1min"] for r in per.values()]
            meta = {"model": Path(cm.path).name if cm.path else None,
                    "model_sha256": file_sha256(cm.path) if cm.path else None,
                    "cluster": cl.name, "models": sorted(per),
                    "label_source": res["label_source"],
                    "label_load": {"max_1min": float(max(loads)), "median_1min": float(np.median(loads)),
                                   "per_model": {n: r["load"]["label_1min"] for n, r in per.items()},
                                   "max_load": max_load, "cores": os.cpu_count(),
                                   "high_load_models": res["high_load_models"],
                                   "load_unknown_models": unknown}}
            cal = fit_calibration([p for n in per for p in pairs[n]], meta=meta, floor=MIN_COST_S)
            res["calibration"]["saved"] = cal.save(save_calibration)
            res["calibration"]["saved_entries"] = cal.to_json()["entries"]
    return res


def _measured_of(pairs) -> np.ndarray:
    return np.array([p[3] for p in pairs])


def _flow_calibrate(res, per, pairs, cands, cl, cm) -> None:
    """Leave-one-model-out calibration: fit on the other models' groups, score this one."""
    from .calibration import METHOD, fit_calibration
    from .xgb import MIN_COST_S, predict_candidate_costs

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


__all__ = ["FLOW_TARGETS", "MAX_LABEL_LOAD", "UNITS", "backend_choice", "cross_validate", "evaluate_model",
           "flow_eval", "flow_models", "is_zoo_model", "metrics", "model_origin", "noise_floor",
           "plot_predictions", "relabel", "split_by_model"]
