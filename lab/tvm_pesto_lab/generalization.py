"""The cost model on what it never met: architecture families held out, and sizes past its rows.

``tvm-pesto cost-model eval --holdout family`` trains the model's recipe (its target, rounds
and parameters, or those given) without one architecture family at a time
(:func:`~tvm_pesto_lab.families.model_family`: every model of it, at every size, and every
row sharing a structural key with them) and scores that family; ``--train-size small
--eval-size full`` trains on the rows of one size and scores those of the other. Each fold
is scored on all its rows (every candidate of every backend) and on its *fusion groups*:
the ``tvm`` rows no other ``tvm`` row of the same model and device contains (TVM's fused
groups, what the product's ``xgb`` source prices for a plan on TVM alone), with the group
sums a whole model adds up to.

Examples
--------
>>> import numpy as np
>>> dev = {"kind": "cpu", "model": "x", "cores": 1}
>>> rows = [{"model": "m", "backend": "tvm", "device": dev, "nodes": n, "time_s": t}
...         for n, t in (([0, 1], 2.0), ([0], 1.0), ([2], 1.0))]
>>> fusion_groups(rows)                          # [0] is a piece of the group [0, 1]
[0, 2]
>>> s = score(rows, np.array([2.0, 1.0, 4.0]))
>>> s.n, round(s.sum_ratio, 2), s.within_3x, round(s.ratio_max, 1)
(3, 1.75, 0.6666666666666666, 4.0)
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np

from tvm_pesto.costs.predict.features import device_key
from tvm_pesto.errors import CostError
from .dataset import base_model, model_size
from .families import TRAINING_ONLY, check_families, model_family
from .fit import train
from .metrics import backend_choice, error_metrics

#: A prediction within this factor of its measurement counts as in band (``within_3x``).
BAND = 3.0


@dataclass
class Score:
    """Predictions against measurements over some rows.

    ``mape``, ``median_ape``, ``p90_ape`` in percent; ``spearman`` rank correlation;
    ``sum_ratio`` Σ predicted / Σ measured; ``ratio_min``/``ratio_max`` the extremes of
    predicted / measured; ``within_3x`` the share of rows predicted within :data:`BAND` of
    their measurement; ``top1_backend`` the share of subgraphs measured on several backends
    whose fastest the predictions pick (None: no such subgraph).
    """

    n: int = 0
    mape: float | None = None
    median_ape: float | None = None
    p90_ape: float | None = None
    spearman: float | None = None
    sum_ratio: float | None = None
    ratio_min: float | None = None
    ratio_max: float | None = None
    within_3x: float | None = None
    top1_backend: float | None = None


def score(rows, pred) -> Score:
    """:class:`Score` of predicted seconds ``pred`` against the rows' ``time_s``."""
    if not rows:
        return Score()
    pred = np.asarray(pred, dtype=np.float64)
    meas = np.array([r["time_s"] for r in rows], dtype=np.float64)
    m = error_metrics(meas, pred)
    ratio = pred / meas
    top1 = backend_choice(rows, pred)["top1_backend_accuracy"] if all("key" in r for r in rows) else None
    return Score(n=len(rows), mape=m["mape"], median_ape=m["median_ape"], p90_ape=m["p90_ape"],
                 spearman=m["spearman"], sum_ratio=float(pred.sum() / meas.sum()), ratio_min=float(ratio.min()),
                 ratio_max=float(ratio.max()),
                 within_3x=float(np.mean((ratio >= 1 / BAND - 1e-12) & (ratio <= BAND + 1e-12))), top1_backend=top1)


def fusion_groups(rows) -> list[int]:
    """Indices of the rows that are TVM fusion groups: ``tvm`` rows with op-graph ``nodes``
    that no other ``tvm`` row of the same model and device contains (the ``tvm`` candidates
    are the fusion groups, their pieces and single ops)."""
    sets: dict = defaultdict(list)
    for i, r in enumerate(rows):
        if r.get("backend") == "tvm" and r.get("nodes"):
            sets[(r.get("model", ""), device_key(r["device"]))].append((i, frozenset(r["nodes"])))
    out = []
    for members in sets.values():
        for i, s in members:
            if not any(s < t for _, t in members):
                out.append(i)
    return sorted(out)


@dataclass
class FoldScore:
    """One held-out part: its models, what it was trained on, and its scores.

    ``rows``: every row of the part; ``groups``: its fusion groups (:func:`fusion_groups`);
    ``groups_by_size``: the groups per model size; ``group_sums``: Σ predicted / Σ
    measured fusion groups per model (each device's groups together)."""

    name: str
    models: list = field(default_factory=list)
    train_rows: int = 0
    seconds: float = 0.0
    rows: Score = field(default_factory=Score)
    groups: Score = field(default_factory=Score)
    groups_by_size: dict = field(default_factory=dict)
    group_sums: dict = field(default_factory=dict)


def score_fold(name: str, test, pred, train_rows: int = 0, seconds: float = 0.0) -> FoldScore:
    """:class:`FoldScore` of predictions ``pred`` on the rows ``test``."""
    pred = np.asarray(pred, dtype=np.float64)
    gi = fusion_groups(test)
    g_rows, g_pred = [test[i] for i in gi], pred[gi] if gi else np.zeros(0)
    by_size: dict = defaultdict(list)
    by_model: dict = defaultdict(list)
    for k, r in enumerate(g_rows):
        by_size[model_size(r["model"])].append(k)
        by_model[r["model"]].append(k)
    sums = {m: float(g_pred[ks].sum() / sum(g_rows[k]["time_s"] for k in ks)) for m, ks in sorted(by_model.items())}
    return FoldScore(name=name, models=sorted({r["model"] for r in test}), train_rows=train_rows, seconds=seconds,
                     rows=score(test, pred), groups=score(g_rows, g_pred),
                     groups_by_size={s: score([g_rows[k] for k in ks], g_pred[ks]) for s, ks in sorted(by_size.items())},
                     group_sums=sums)


@dataclass(frozen=True)
class Recipe:
    """How each fold's model is trained: ``target``, boosting ``rounds``, XGBoost ``params``
    (``nthread`` set from ``threads``), the VM call ``overheads`` per device and the target's
    ``work_floor_s`` (:func:`~tvm_pesto_lab.fit.train`)."""

    target: str
    rounds: int
    params: dict | None = None
    threads: int = 1
    overheads: dict | None = None
    work_floor_s: float = 0.0

    def fit(self, rows):
        p = dict(self.params or {})
        p["nthread"] = int(self.threads)
        return train(rows, target=self.target, rounds=self.rounds, params=p, overheads=self.overheads,
                     work_floor_s=self.work_floor_s)


def _fold(name: str, train_rows, test, recipe: Recipe) -> tuple[FoldScore, np.ndarray]:
    """The fold's score, and its predictions."""
    t0 = time.perf_counter()
    if len(train_rows) < 2:
        raise CostError(f"holding out {name} leaves {len(train_rows)} training row(s); give more logs")
    pred = recipe.fit(train_rows).predict_rows(test)
    return score_fold(name, test, pred, len(train_rows), time.perf_counter() - t0), pred


def _without(rows, test) -> list:
    """The rows not in ``test`` and sharing no structural key with it (no shape leaks)."""
    ids = {id(r) for r in test}
    keys = {r["key"] for r in test}
    return [r for r in rows if id(r) not in ids and r["key"] not in keys]


@dataclass
class Generalization:
    """What ``eval --holdout family`` or ``--train-size A --eval-size B`` found.

    ``mode``: ``family`` or ``size``; ``folds``: a :class:`FoldScore` per held-out family
    (for ``size``, per family of the scored rows, from the one model trained on the other
    size); ``pooled``: every fold's rows and groups together."""

    mode: str
    target: str
    rounds: int
    threads: int
    work_floor_s: float = 0.0
    train_size: str | None = None
    eval_size: str | None = None
    rows: int = 0
    seconds: float = 0.0
    folds: dict = field(default_factory=dict)
    pooled: FoldScore | None = None

    def to_json(self) -> dict:
        return asdict(self)


def _pool(folds: dict, parts: dict) -> FoldScore:
    test = [r for name in folds for r in parts[name][0]]
    pred = np.concatenate([parts[name][1] for name in folds]) if folds else np.zeros(0)
    return score_fold("pooled", test, pred, seconds=sum(f.seconds for f in folds.values()))


def holdout_families(rows, recipe: Recipe, families=None, progress=None) -> Generalization:
    """Train without each architecture family in turn and score it (see the module).

    ``families``: the families to hold out (default: every family of the rows but
    :data:`~tvm_pesto_lab.families.TRAINING_ONLY`)."""
    t0 = time.perf_counter()
    by_family: dict = defaultdict(list)
    for r in rows:
        by_family[model_family(r["model"])].append(r)
    present = sorted(f for f in by_family if f not in TRAINING_ONLY)
    names = check_families(families, present) if families else present
    if not names:
        raise CostError("the rows hold no model of an architecture family (only sweeps and tuning databases); "
                        "profile models first (tvm-pesto profile zoo)")
    out = Generalization(mode="family", target=recipe.target, rounds=recipe.rounds, threads=recipe.threads,
                         work_floor_s=recipe.work_floor_s, rows=len(rows))
    parts = {}
    for k, name in enumerate(names):
        test = by_family[name]
        out.folds[name], pred = _fold(name, _without(rows, test), test, recipe)
        parts[name] = (test, pred)
        if progress:
            progress(k + 1, len(names))
    out.pooled = _pool(out.folds, parts)
    out.seconds = time.perf_counter() - t0
    return out


def train_on_size(rows, recipe: Recipe, train_size: str = "small", eval_size: str = "full",
                  progress=None) -> Generalization:
    """Train on the rows of models of ``train_size`` (sweeps and tuning databases count as
    ``small``) and score the rows of ``eval_size``, per family."""
    if train_size == eval_size:
        raise CostError(f"--train-size and --eval-size are both {train_size}; give two sizes (small, full)")
    t0 = time.perf_counter()
    test = [r for r in rows if model_size(r["model"]) == eval_size]
    if not test:
        raise CostError(f"no rows of size {eval_size} to score; profile models at that size first "
                        f"(tvm-pesto profile MODEL --size {eval_size})")
    train_rows = [r for r in _without(rows, test) if model_size(r["model"]) == train_size]
    model = recipe.fit(train_rows)
    pred = model.predict_rows(test)
    fit_s = time.perf_counter() - t0
    out = Generalization(mode="size", target=recipe.target, rounds=recipe.rounds, threads=recipe.threads,
                         work_floor_s=recipe.work_floor_s, train_size=train_size, eval_size=eval_size, rows=len(rows))
    by_family: dict = defaultdict(list)
    for i, r in enumerate(test):
        by_family[model_family(r["model"])].append(i)
    for name, idx in sorted(by_family.items()):
        out.folds[name] = score_fold(name, [test[i] for i in idx], pred[idx], len(train_rows))
    out.pooled = score_fold("pooled", test, pred, len(train_rows), fit_s)
    if progress:
        progress(1, 1)
    out.seconds = time.perf_counter() - t0
    return out


__all__ = ["BAND", "FoldScore", "Generalization", "Recipe", "Score", "fusion_groups", "holdout_families", "score",
           "score_fold", "train_on_size"]
