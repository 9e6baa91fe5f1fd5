"""Accuracy metrics of a cost model's predictions: error and rank metrics, backend choice,
and the noise floor of the measurements they are judged against.

Units: ``mape``, ``median_ape`` and ``p90_ape`` are percentages; ``within_10pct``,
``top1_backend_accuracy`` and ``mean_regret`` are fractions (0.9 = 90 %); ``spearman`` and
``kendall`` are rank correlations in [-1, 1].

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

from collections import defaultdict

import numpy as np

from tvm_pesto.costs.predict.features import device_key
from .dataset import model_size

UNITS = {"mape": "percent", "median_ape": "percent", "p90_ape": "percent", "within_10pct": "fraction",
         "top1_backend_accuracy": "fraction", "mean_regret": "fraction (chosen/best - 1)",
         "spearman": "rank correlation", "kendall": "rank correlation",
         "sum_ratio": "ratio (sum of predicted / sum of measured group seconds)", "load": "load average (1, 5, 15 min)"}



def _rank_corr(a, b) -> tuple[float | None, float | None]:
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None, None
    from scipy.stats import kendalltau, spearmanr  # lazy: scipy.stats takes a second to import

    return float(spearmanr(a, b).statistic), float(kendalltau(a, b).statistic)


def error_metrics(meas: np.ndarray, pred: np.ndarray) -> dict:
    """``n``, ``mape``, ``median_ape``, ``p90_ape``, ``within_10pct``, ``spearman`` and
    ``kendall`` of predicted seconds ``pred`` against measured ``meas`` (see :data:`UNITS`)."""
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
    """All metrics of predictions ``pred`` (seconds) against the rows' measured ``time_s``:
    pooled, and ``per_device``, ``per_backend`` and ``per_size`` (the model's size,
    :func:`~tvm_pesto_lab.dataset.model_size`)."""
    pred = np.asarray(pred, dtype=np.float64)
    meas = np.array([r["time_s"] for r in rows], dtype=np.float64)
    out = error_metrics(meas, pred)
    per_dev: dict = defaultdict(list)
    per_bk: dict = defaultdict(list)
    per_size: dict = defaultdict(list)
    for i, r in enumerate(rows):
        per_dev[device_key(r["device"])].append(i)
        per_bk[r["backend"]].append(i)
        per_size[model_size(r.get("model", ""))].append(i)
    out["per_device"] = {k: error_metrics(meas[v], pred[v]) for k, v in sorted(per_dev.items())}
    out["per_backend"] = {k: error_metrics(meas[v], pred[v]) for k, v in sorted(per_bk.items())}
    out["per_size"] = {k: {**error_metrics(meas[v], pred[v]), **backend_choice([rows[i] for i in v], pred[v])}
                       for k, v in sorted(per_size.items())}
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


__all__ = ["BUSY_EXTRA_LOAD", "UNITS", "backend_choice", "error_metrics", "metrics", "noise_floor"]
