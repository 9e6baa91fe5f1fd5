"""Whole-model calibration of the ``xgb`` cost model: a correction fitted on the product's path.

The model's labels are isolated subgraph timings (profiler records, measured under load);
the costs the planner needs are the fused groups' shares of a whole-model run on this
machine, which is what the ``measured`` cost source gives (each group timed alone, then
scaled so the groups add up to the measured whole model,
:func:`tvm_pesto.costs.measure.measured.calibrate_native`). Per backend and device (kind/model/cores)
the correction is affine in the prediction with a fixed cost per call, under the floor
both cost sources put under every group::

    measured ~= max(a * predicted + b, floor)     (one call per fused group: b is seconds per call)

fitted by robust least squares (``soft_l1``) on the *relative* residuals
``max(a*p + b, floor) / m - 1`` with ``a >= 0``, then both scaled so the fitted groups add up to the measured ones
(:func:`fit_affine`), from the per-group pairs that
``tvm-pesto cost-model eval --flow`` measures. Summed over a model, the correction reads
``a * sum(predicted) + b * calls``.

A calibration is stored next to its model file (``default.json.gz`` ->
``default.calibration.json``), and one fitted on this machine
(:mod:`tvm_pesto.costs.calibrate.machine`) under the measurement cache's folder
(:func:`machine_calibration_path`), which the ``xgb`` source prefers: format name and version, the model file's SHA-256 (a
calibration of another model file is not applied), the models and cluster it was fitted
on, and the load average while its labels were measured. The ``xgb`` cost source applies it
(:func:`tvm_pesto.costs.predict.xgb.predict_candidate_costs`, ``calibrate=True``); a backend or
device without an entry is left as predicted.

Examples
--------
>>> import numpy as np
>>> p = np.array([1e-6, 4e-6, 2e-5, 1e-4])
>>> a, b = fit_affine(p, 0.5 * p + 2e-6)
>>> round(a, 6), round(b * 1e6, 6)
(0.5, 2.0)
>>> cal = Calibration({("tvm", "cpu/host-cpu/1"): (a, b)})
>>> cal.apply(np.array([1e-5]), ["tvm"], "cpu/host-cpu/1").round(9).tolist()
[7e-06]
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...cluster.host import cpu_identity
from ...errors import CostError
from ...jsonio import write_json
from ..store.cache import default_cache_path

FORMAT = "tvm-pesto-xgb-calibration"
VERSION = 1
SUFFIX = ".calibration.json"
#: Environment variable naming the calibration file to apply (``none``: raw predictions).
CALIBRATION_ENV = "TVM_PESTO_CALIBRATION"
METHOD = ("measured ~= max(a * predicted + b per call, floor); robust (soft_l1) least squares of the relative "
          "residuals, a >= 0, scaled to the measured sum, on raw (uncalibrated) predictions")
#: Relative residual beyond which a group counts linearly, not squared (``soft_l1`` loss): views
#: predicted a microsecond above the floor they are measured at must not pull every group down.
ROBUST_SCALE = 0.2
#: Fewest fused groups a (backend, device) entry is fitted from.
MIN_PAIRS = 3


def fit_affine(pred, meas, floor: float = 0.0) -> tuple[float, float]:
    """``(a, b)`` minimising the robust (``soft_l1``, scale :data:`ROBUST_SCALE`) sum of the
    relative residuals ``max(a * pred + b, floor) / meas - 1`` with ``a >= 0``, then scaled
    together so that ``sum(max(a * pred + b, floor)) == sum(meas)``.

    The model fitted is the one applied: the ``xgb`` source floors every cost at
    :data:`tvm_pesto.costs.predict.xgb.MIN_COST_S` (pass it as ``floor``), as the ``measured``
    source floors its labels, so a negative ``b`` (predictions that carry too much per-call time) can send
    the smallest groups to the floor where they were measured. Started from the linear
    least-squares solution without the floor (closed form), then refined with
    :func:`scipy.optimize.least_squares` (deterministic).

    Raises
    ------
    CostError
        With fewer than :data:`MIN_PAIRS` pairs, non-positive or non-finite values, or all
        predictions equal (nothing to fit a slope on).

    Examples
    --------
    >>> import numpy as np
    >>> a, b = fit_affine(np.array([1.0, 2.0, 3.0]), np.array([3.0, 5.0, 7.0]))
    >>> round(a, 9), round(b, 9)
    (2.0, 1.0)
    """
    from scipy.optimize import least_squares, lsq_linear

    floor = float(floor)
    p = np.asarray(pred, dtype=np.float64)
    m = np.asarray(meas, dtype=np.float64)
    if p.shape != m.shape or p.ndim != 1:
        raise CostError(f"calibration needs one prediction per measurement; got shapes {p.shape} and {m.shape}")
    if len(p) < MIN_PAIRS:
        raise CostError(f"calibration needs at least {MIN_PAIRS} measured groups, got {len(p)}; "
                        "measure more models (tvm-pesto cost-model eval --flow)")
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(m)) and np.all(p > 0) and np.all(m > 0)):
        raise CostError("calibration needs positive, finite predicted and measured seconds; "
                        "drop groups a backend cannot run (inf) before fitting")
    if np.ptp(p) == 0:
        raise CostError("all predictions are equal, so no slope can be fitted; calibrate on more varied groups")
    A = np.stack([p / m, 1.0 / m], axis=1)
    scale = np.linalg.norm(A, axis=0)
    lin = lsq_linear(A / scale, np.ones(len(p)), bounds=([0.0, -np.inf], [np.inf, np.inf]), method="bvls")
    x0 = lin.x / scale
    if x0[0] <= 0:  # start from the median ratio rather than from a flat line
        x0 = np.array([float(np.median(m / p)), 0.0])
    b_scale = float(np.median(m))

    def residuals(x):
        return np.maximum(x[0] * p + x[1] * b_scale, floor) / m - 1.0

    start = np.array([x0[0], x0[1] / b_scale])
    res = least_squares(residuals, start, bounds=([0.0, -np.inf], [np.inf, np.inf]), method="trf",
                        x_scale=[max(x0[0], 1e-12), 1.0], loss="soft_l1", f_scale=ROBUST_SCALE)
    best = res.x if res.cost <= 0.5 * float(np.sum(residuals(start) ** 2)) else start
    a, b = float(best[0]), float(best[1] * b_scale)
    # relative residuals weigh the many small groups; the planner adds groups up, so the
    # fit is scaled to give the measured total (a no-op when the fit is exact)
    fitted = float(np.sum(np.maximum(a * p + b, floor)))
    scale = float(m.sum() / fitted) if fitted > 0 else 1.0
    return a * scale, b * scale


@dataclass
class Calibration:
    """Affine corrections per (backend, device key), and where they came from.

    Attributes
    ----------
    entries : dict
        ``(backend, device_key) -> (a, b)``; ``device_key`` is
        :func:`tvm_pesto.costs.predict.features.device_key` of the device descriptor.
    meta : dict
        ``model`` (file name), ``model_sha256``, ``models`` fitted on, ``cluster``,
        ``label_load`` (load average of the labels), ``n_groups`` per entry, ...
    path : str, optional
        The file it was read from.
    """

    entries: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    path: str | None = None

    def lookup(self, backend: str, device_key: str) -> tuple[float, float] | None:
        return self.entries.get((backend, device_key))

    def apply(self, values, backends, device_key: str) -> np.ndarray:
        """``a * v + b`` for each value whose backend has an entry on this device (others
        unchanged); no clipping (the caller floors the result)."""
        out = np.array(values, dtype=np.float64, copy=True)
        for bk in set(backends):
            ab = self.lookup(bk, device_key)
            if ab is None:
                continue
            sel = np.array([x == bk for x in backends], dtype=bool)
            out[sel] = ab[0] * out[sel] + ab[1]
        return out

    def to_json(self) -> dict:
        counts = self.meta.get("n_groups", {})
        rows = [{"backend": bk, "device": dk, "a": a, "b": b, "n_groups": counts.get(f"{bk}|{dk}")}
                for (bk, dk), (a, b) in sorted(self.entries.items())]
        meta = {k: v for k, v in self.meta.items() if k != "n_groups"}
        return {"format": FORMAT, "version": VERSION, "method": METHOD, **meta, "entries": rows}

    def save(self, path) -> str:
        self.path = write_json(str(path), self.to_json())
        return self.path

    @classmethod
    def from_json(cls, data, path: str | None = None) -> Calibration:
        """Read :meth:`to_json` output.

        Raises
        ------
        CostError
            For another format or version, or a malformed entry (the message names the file).
        """
        where = f"calibration file {path}" if path else "calibration"
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CostError(f"{where} is not a tvm-pesto xgb calibration (format {FORMAT!r}); delete it or refit "
                            "with `tvm-pesto cost-model eval --flow --save-calibration`")
        if data.get("version") != VERSION:
            raise CostError(f"{where} has version {data.get('version')!r}, this tvm-pesto reads version {VERSION}; "
                            "refit with `tvm-pesto cost-model eval --flow --save-calibration`")
        entries, counts = {}, {}
        for i, e in enumerate(data.get("entries") or []):
            try:
                key = (str(e["backend"]), str(e["device"]))
                a, b = float(e["a"]), float(e["b"])
            except (KeyError, TypeError, ValueError) as err:
                raise CostError(f"{where}: entry {i} lacks backend/device/a/b ({type(err).__name__}: {err}); "
                                "delete the file or refit it") from err
            if not (np.isfinite(a) and np.isfinite(b) and a >= 0):
                raise CostError(f"{where}: entry {i} has a={a}, b={b} (a must be finite and >= 0); refit it")
            entries[key] = (a, b)
            counts[f"{key[0]}|{key[1]}"] = e.get("n_groups")
        meta = {k: v for k, v in data.items() if k not in ("format", "version", "method", "entries")}
        meta["n_groups"] = counts
        return cls(entries, meta, path)


def fit_calibration(pairs, meta: dict | None = None, floor: float = 0.0) -> Calibration:
    """Fit one entry per (backend, device key) from ``pairs``.

    Parameters
    ----------
    pairs : iterable of (backend, device_key, predicted_s, measured_s)
        One per fused group (raw, uncalibrated predictions).
    meta : dict, optional
        Stored with the calibration (models, cluster, label load, ...).
    floor : float
        The floor the cost source puts under every cost (see :func:`fit_affine`).

    Raises
    ------
    CostError
        When no (backend, device) has :data:`MIN_PAIRS` usable groups.
    """
    by: dict = {}
    for bk, dk, p, m in pairs:
        if np.isfinite(p) and np.isfinite(m) and p > 0 and m > 0:
            by.setdefault((str(bk), str(dk)), []).append((float(p), float(m)))
    entries, counts = {}, {}
    for key, pm in sorted(by.items()):
        if len(pm) < MIN_PAIRS:
            continue
        arr = np.array(pm)
        entries[key] = fit_affine(arr[:, 0], arr[:, 1], floor)
        counts[f"{key[0]}|{key[1]}"] = len(pm)
    if not entries:
        raise CostError(f"no backend and device has {MIN_PAIRS} measured groups with finite predictions to "
                        "calibrate on; measure more (or larger) models")
    m = {"fitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "floor_s": float(floor), **(meta or {}),
         "n_groups": counts}
    return Calibration(entries, m)


def calibration_path(model_path) -> Path:
    """Where the calibration of a model file lives: ``NAME.json`` (or ``NAME.json.gz``) ->
    ``NAME.calibration.json``.

    Examples
    --------
    >>> calibration_path("cost_models/default.json.gz").name
    'default.calibration.json'
    >>> calibration_path("mine.json").name
    'mine.calibration.json'
    """
    p = Path(model_path)
    name = p.name.removesuffix(".gz")
    return p.with_name(name.removesuffix(".json") + SUFFIX)


def file_sha256(path) -> str:
    """SHA-256 of a file's bytes (hex)."""
    return _sha256(str(Path(path).resolve()), Path(path).stat().st_mtime)


@functools.lru_cache(maxsize=8)
def _sha256(path: str, mtime: float) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def machine_info() -> dict:
    """What tells this machine apart: the CPU (brand string, ``vendor/family/model/stepping``
    and vector extensions, :func:`~tvm_pesto.cluster.host.cpu_identity`: VMs of two CPU
    generations can share a brand string such as ``AMD EPYC``), logical cores, architecture
    and host name."""
    ident = cpu_identity()
    return {"cpu": ident["name"], "cpu_id": ident["id"], "isa": list(ident["isa"]), "cores": os.cpu_count(),
            "arch": platform.machine(), "host": platform.node()}


def machine_key(info: dict | None = None) -> str:
    """12 hex digits of :func:`machine_info` (or ``info``).

    Examples
    --------
    >>> len(machine_key()), machine_key() == machine_key()
    (12, True)
    """
    text = json.dumps(info if info is not None else machine_info(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def machine_calibration_path(model_path) -> Path:
    """Where this machine's calibration of the model file ``model_path`` lives: the
    measurement cache's folder (``~/.cache/tvm-pesto``, or ``$TVM_PESTO_CACHE``), under
    ``calibration/``, named by the model file's SHA-256 and :func:`machine_key`."""
    return default_cache_path().parent / "calibration" / f"{file_sha256(model_path)[:12]}-{machine_key()}.json"


def load_machine_calibration(model) -> Calibration | None:
    """This machine's calibration of ``model``'s file (:func:`machine_calibration_path`), or
    None when there is none.

    Raises
    ------
    CostError
        When the file cannot be read.
    """
    if model is None or not getattr(model, "path", None):
        return None
    p = machine_calibration_path(model.path)
    return _load_file(str(p.resolve()), p.stat().st_mtime) if p.is_file() else None


def load_calibration(model) -> Calibration | None:
    """The calibration of ``model`` (a :class:`~tvm_pesto.costs.predict.xgb.CostModel`): the file
    named by ``$TVM_PESTO_CALIBRATION`` (``none`` for raw predictions; the CLI's
    ``tvm-pesto --calibration PATH|none``), else this machine's
    (:func:`machine_calibration_path`, fitted by :func:`tvm_pesto.calibrate_machine`), else
    the one stored next to the model file, or None when there is none. A calibration fitted for another version of the model file
    (SHA-256 differs) is not applied: a warning says so, once per file version.

    Raises
    ------
    CostError
        When the file cannot be read (not JSON, another format or version), or
        ``$TVM_PESTO_CALIBRATION`` names a file that does not exist.
    """
    env = os.environ.get(CALIBRATION_ENV, "").strip()
    if env.lower() in ("none", "off"):
        return None
    if model is None or not getattr(model, "path", None):
        return None
    mine = machine_calibration_path(model.path)
    p = Path(env) if env else (mine if mine.is_file() else calibration_path(model.path))
    if env and not p.is_file():
        raise CostError(f"calibration file {env} (from ${CALIBRATION_ENV} or --calibration) does not exist; "
                        "give a file written by `tvm-pesto cost-model eval --flow --save-calibration`, or none for "
                        "raw predictions")
    if not p.is_file():
        return None
    cal = _load_file(str(p.resolve()), p.stat().st_mtime)
    want = cal.meta.get("model_sha256")
    if want and want != file_sha256(model.path):
        _warn_stale(str(p), p.stat().st_mtime, str(model.path))
        return None
    return cal


@functools.lru_cache(maxsize=8)
def _load_file(path: str, mtime: float) -> Calibration:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CostError(f"calibration file {path} is not readable JSON ({type(e).__name__}: {e}); delete it or "
                        "refit with `tvm-pesto cost-model eval --flow --save-calibration`") from e
    return Calibration.from_json(data, path)


@functools.lru_cache(maxsize=8)
def _warn_stale(path: str, mtime: float, model_path: str) -> None:
    warnings.warn(f"calibration {path} was fitted for another version of {model_path} (SHA-256 differs), so it is "
                  "not applied; refit with `tvm-pesto cost-model eval --flow --save-calibration`", RuntimeWarning,
                  stacklevel=4)


__all__ = ["Calibration", "FORMAT", "METHOD", "MIN_PAIRS", "VERSION", "calibration_path", "file_sha256",
           "fit_affine", "fit_calibration", "load_calibration", "load_machine_calibration", "machine_calibration_path",
           "machine_info", "machine_key"]
