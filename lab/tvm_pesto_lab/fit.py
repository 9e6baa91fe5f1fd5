"""Fit the XGBoost cost model (:class:`tvm_pesto.costs.xgb.CostModel`) on training rows.

Deterministic: a fixed seed and one thread, so the same rows give the same model file.
``tvm-pesto cost-model train`` reads the rows (:mod:`tvm_pesto_lab.dataset`), fits and saves.
"""
from __future__ import annotations

import numpy as np

from tvm_pesto.costs.predict.features import FEATURE_NAMES, device_key, feature_matrix
from tvm_pesto.costs.predict.xgb import MODEL_FORMAT, TARGETS, CostModel, target_base, target_offset
from tvm_pesto.errors import CostError

#: XGBoost parameters of the bundled model (fixed seed, one thread: deterministic).
DEFAULT_PARAMS = {
    "objective": "reg:squarederror", "eta": 0.08, "max_depth": 6, "min_child_weight": 1.0, "subsample": 0.85,
    "colsample_bytree": 0.85, "lambda": 1.0, "seed": 0, "nthread": 1, "tree_method": "hist",
}
#: Boosting rounds. With the shipped data and recipe (cost_models/README.md, "How the data were
#: made"; `tvm-pesto cost-model eval`, Zen 1 VM, 2026-12-02): 300 rounds 14.3 % held-out MAPE and
#: 15.7 % on the families never trained on, 600 rounds 13.4 / 15.2, 1000 rounds 13.2 / 14.8; the
#: model file grows from 1.8 to 6.2 MB; prediction time is dominated by the featurizing either
#: way.
DEFAULT_ROUNDS = 1000
#: ``log_work_miss`` learns from the time less the modelled misses, but never from less than
#: this share of the measured time (a row whose misses the model over-counts still teaches
#: that its work is not free).
MISS_LABEL_FLOOR = 0.1


def _target_values(rows, target: str, work_floor_s: float = 0.0) -> np.ndarray:
    """The trees' labels: ``log(max(time - offset, MISS_LABEL_FLOOR * time) / base)``
    (:func:`~tvm_pesto.costs.predict.xgb.target_base`, :func:`~tvm_pesto.costs.predict.xgb.target_offset`)."""
    t = np.array([r["time_s"] for r in rows], dtype=np.float64)
    rest = np.maximum(t - target_offset(rows, target), MISS_LABEL_FLOOR * t)
    return np.log(rest / target_base(rows, target, work_floor_s))


def train(rows, target: str = "log_time", rounds: int = DEFAULT_ROUNDS, params: dict | None = None,
          meta: dict | None = None, overheads: dict | None = None, work_floor_s: float = 0.0) -> CostModel:
    """Fit a model on ``rows`` (deterministic: fixed seed, one thread).

    Parameters
    ----------
    rows : list of dict
        Training rows (see :class:`tvm_pesto_lab.dataset.Dataset`).
    target : {"log_time", "log_ratio", "log_work", "log_work_miss"}
        What the trees predict: ``log(time)``, ``log(time / roofline)``, ``log(time / work)``
        or ``log((time - misses) / work)`` (:func:`~tvm_pesto.costs.predict.xgb.target_base`,
        :func:`~tvm_pesto.costs.predict.xgb.target_offset`).
    overheads : dict, optional
        Device key -> list of measured VM call overheads (seconds).
    work_floor_s : float
        The least base of a target that scales with the work (``floor_s`` of
        :func:`~tvm_pesto.costs.predict.xgb.target_base`; kept as ``meta["work_floor_s"]`` when
        above 0): subgraphs of less work learn their time as ``log_time`` does.

    Examples
    --------
    >>> import itertools, os, tempfile
    >>> from tvm_pesto.costs.store.jsonl import open_log
    >>> from tvm_pesto.costs.predict.xgb import default_model_path
    >>> from tvm_pesto_lab.dataset import load_dataset
    >>> head = os.path.join(tempfile.mkdtemp(), "head.jsonl")   # the bundled training log's first lines
    >>> with open_log(default_model_path().parent / "profile-cpu.jsonl") as f, open(head, "w") as out:
    ...     out.writelines(itertools.islice(f, 200))
    >>> model = train(load_dataset([head]).rows, rounds=20)
    >>> model.meta["rounds"], model.meta["n_rows"] > 1
    (20, True)
    """
    import xgboost as xgb  # an optional dependency (pip install xgboost-cpu)

    if target not in TARGETS:
        raise CostError(f"unknown target {target!r}; use one of {', '.join(TARGETS)}")
    if len(rows) < 2:
        raise CostError(f"only {len(rows)} usable training row(s); profile more models with `tvm-pesto profile`")
    X = feature_matrix(rows)
    if work_floor_s < 0:
        raise CostError(f"work floor {work_floor_s} s is negative; give 0 (none) or a time in seconds")
    y = _target_values(rows, target, work_floor_s)
    p = dict(DEFAULT_PARAMS)
    p.update(params or {})
    booster = xgb.train(p, xgb.DMatrix(X, label=y, feature_names=list(FEATURE_NAMES)), num_boost_round=int(rounds))
    devs = sorted({(r["device"]["kind"], r["device"]["model"]) for r in rows})
    m = {
        "format": MODEL_FORMAT, "target": target, "feature_names": list(FEATURE_NAMES), "rounds": int(rounds),
        "params": p, "n_rows": len(rows), "device_models": [list(d) for d in devs],
        "devices": sorted({device_key(r["device"]) for r in rows}),
        "backends": sorted({r["backend"] for r in rows}),
        "ops": sorted({op for r in rows for op in r["desc"].get("ops", [])}),
        "train_models": sorted({r["model"] for r in rows}),
        "overhead_s": {k: float(np.median(v)) for k, v in sorted((overheads or {}).items()) if v},
    }
    if work_floor_s > 0:
        m["work_floor_s"] = float(work_floor_s)
    m.update(meta or {})
    return CostModel(booster, m)


__all__ = ["DEFAULT_PARAMS", "DEFAULT_ROUNDS", "train"]
