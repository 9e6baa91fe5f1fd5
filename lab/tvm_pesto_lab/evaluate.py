"""Accuracy of a cost model on the profiler's records: held-out models and families, splits,
cross-validation, and a predicted-versus-measured plot.

Splits hold out whole *models* (every subgraph of a zoo model; a subgraph whose structure
also occurs in a training model is removed from training, so no shape leaks), or whole
*op kinds* (every row whose dominant op is of that kind). The metrics are
:mod:`tvm_pesto_lab.metrics`'; :mod:`tvm_pesto_lab.flow_eval` scores the model on the
product's own path instead (whole models' fused groups, measured now).

Examples
--------
>>> rows = [{"model": "a", "key": "k1"}, {"model": "b", "key": "k1"}, {"model": "b", "key": "k2"}]
>>> train, test = split_by_model(rows, ["a"])
>>> [r["key"] for r in train], [r["key"] for r in test]   # k1 is held out with model a
(['k2'], ['k1'])
>>> model_origin("resnet50"), model_origin("vit"), model_origin("corpus:resnet18:full"), model_origin("my_model")
('zoo', 'outside', 'corpus', 'given')
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from tvm_pesto.costs.predict.features import dominant_kind
from tvm_pesto.errors import CostError
from tvm_pesto.zoo import MODELS
from tvm_pesto.zoo.outside import MODELS as OUTSIDE
from .dataset import base_model, load_dataset
from .families import corpus_arch
from .fit import DEFAULT_ROUNDS, train
from .metrics import UNITS, metrics, noise_floor


def is_zoo_model(name: str) -> bool:
    """Whether a row's model name is a zoo model (not a sweep or a tuning database)."""
    return base_model(name) in MODELS


def model_origin(name: str) -> str:
    """``zoo``, ``outside`` (:mod:`tvm_pesto.zoo.outside`), ``corpus`` (``corpus:NAME``,
    :mod:`tvm_pesto.zoo.corpus`) or ``given`` for a model name (of any size)."""
    base = base_model(name)
    if base in MODELS:
        return "zoo"
    return "outside" if base in OUTSIDE else "corpus" if corpus_arch(base) is not None else "given"


def split_by_model(rows, heldout) -> tuple[list, list]:
    """``(train, test)``: test = rows of the held-out models, at every size (``gpt2`` holds
    out ``gpt2:full`` too); train = the other rows minus any whose structural key occurs in
    the test rows."""
    held = {base_model(h) for h in heldout}
    test = [r for r in rows if base_model(r["model"]) in held]
    keys = {r["key"] for r in test}
    train = [r for r in rows if base_model(r["model"]) not in held and r["key"] not in keys]
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
        ``model``: each zoo model (at every size) is a fold (sweeps always train); ``op_kind``: each
        dominant op kind with at least 10 rows is a fold.

    Returns
    -------
    dict
        ``folds`` (metrics per held-out group) and ``pooled`` (metrics over all held-out
        predictions together).
    """
    rounds = rounds or DEFAULT_ROUNDS
    if by == "model":
        names = sorted({base_model(r["model"]) for r in rows if is_zoo_model(r["model"])}) if folds is None \
            else list(folds)  # a model's every size is one fold
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
    import matplotlib  # an optional dependency, and slow to import

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


def model_logs(model, logs=None, tuning_dbs=()) -> tuple[list, list]:
    """``(logs, tuning_dbs)``: those given, or (when no log is given) the model's own
    (``meta["logs"]`` and ``meta["tuning_dbs"]``, relative to the model file).

    Raises
    ------
    CostError
        No log is given and the model lists none.
    """
    if logs:
        return list(logs), list(tuning_dbs or ())
    base = Path(model.path).parent if model.path else Path(".")
    logs = [str(base / p) for p in model.meta.get("logs", [])]
    tuning_dbs = [str(base / p) for p in model.meta.get("tuning_dbs", [])]
    if not logs and not tuning_dbs:
        raise CostError(f"cost model {model.path} lists no training logs; pass logs to evaluate on (--logs)")
    return logs, tuning_dbs


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

    >>> from tvm_pesto.costs.predict.xgb import load_model       # doctest: +SKIP
    >>> evaluate_model(load_model())["heldout"]["mape"]   # doctest: +SKIP
    """
    logs, tuning_dbs = model_logs(model, logs, tuning_dbs)
    ds = load_dataset(logs, tuning_dbs)
    ds.rows = relabel(ds.rows, label)
    held_all = {base_model(m) for m in model.meta.get("heldout_models", [])}
    families = {m for m in held_all if model_origin(m) == "outside"}  # architectures no zoo model has
    # trained on, scored by the recipe without them
    recipe = {base_model(m) for m in model.meta.get("eval_heldout_models", [])}
    held = (held_all - families) | recipe
    train_models = set(model.meta.get("train_models", []))
    test = [r for r in ds.rows if base_model(r["model"]) in held]
    seen = [r for r in ds.rows if r["model"] in train_models and base_model(r["model"]) not in held_all]
    res: dict = {"model": model.path, "target": model.target, "heldout_models": sorted(held),
                 "heldout_families": sorted(families), "label": label,
                 "units": UNITS, "logs": list(logs), "skipped_lines": [list(s) for s in ds.skipped],
                 "rows": len(ds.rows), "records_without_description": ds.no_desc, "infeasible_records": ds.infeasible}
    scorer = model
    if recipe:
        t0 = time.perf_counter()
        train_rows, _ = split_by_model(ds.rows, sorted(held_all | recipe))
        scorer = train(train_rows, target=model.target, rounds=int(model.meta.get("rounds", 300)),
                       params=model.meta.get("params"), overheads=ds.overheads, work_floor_s=model.work_floor_s)
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
        fam = [r for r in ds.rows if base_model(r["model"]) in families]
        p_fam = model.predict_rows(fam)
        res["heldout_family"] = {"pooled": metrics(fam, p_fam) if fam else {"n": 0}}
        for m in sorted({r["model"] for r in fam} | families):  # each family, and each at a size of its own
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


__all__ = ["cross_validate", "evaluate_model", "is_zoo_model", "model_logs", "model_origin", "plot_predictions", "relabel",
           "row_kind", "split_by_model"]
