"""Accuracy of a cost model: error and rank metrics, backend choice, noise floor, splits.

Units: ``mape``, ``median_ape`` and ``p90_ape`` are percentages; ``within_10pct``,
``top1_backend_accuracy`` and ``mean_regret`` are fractions (0.9 = 90 %); ``spearman`` and
``kendall`` are rank correlations in [-1, 1].

Splits hold out whole *models* (every subgraph of a zoo model; a subgraph whose structure
also occurs in a training model is removed from training, so no shape leaks), or whole
*op kinds* (every row whose dominant op is of that kind).

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
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..errors import CostError
from .features import device_key, dominant_kind

UNITS = {"mape": "percent", "median_ape": "percent", "p90_ape": "percent", "within_10pct": "fraction",
         "top1_backend_accuracy": "fraction", "mean_regret": "fraction (chosen/best - 1)",
         "spearman": "rank correlation", "kendall": "rank correlation"}


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


def noise_floor(rows) -> dict:
    """How noisy the measurements are.

    ``cv_*``: coefficient of variation (std/mean) of each record's repeats (back to back,
    in one run). ``rerun_*``: |t2 - t1| / t1 between two runs that measured the same
    subgraph on the same backend and device (two profiling passes, or a shape shared by
    two models): the error a perfect model would show against a single measurement.
    ``load_*``: 1-minute load average when the records were written.
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
    """Evaluate a saved model on its own split: ``heldout`` (models it never saw) and ``seen``.

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
    held = set(model.meta.get("heldout_models", []))
    train_models = set(model.meta.get("train_models", []))
    test = [r for r in ds.rows if r["model"] in held]
    seen = [r for r in ds.rows if r["model"] in train_models and r["model"] not in held]
    res: dict = {"model": model.path, "target": model.target, "heldout_models": sorted(held), "label": label,
                 "units": UNITS, "logs": list(logs), "skipped_lines": [list(s) for s in ds.skipped],
                 "rows": len(ds.rows), "records_without_description": ds.no_desc, "infeasible_records": ds.infeasible}
    p_test = model.predict_rows(test)
    p_seen = model.predict_rows(seen)
    res["heldout"] = metrics(test, p_test) if test else {"n": 0}
    res["seen"] = metrics(seen, p_seen) if seen else {"n": 0}
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


__all__ = ["UNITS", "backend_choice", "cross_validate", "evaluate_model", "is_zoo_model", "metrics", "noise_floor",
           "plot_predictions", "relabel", "split_by_model"]
