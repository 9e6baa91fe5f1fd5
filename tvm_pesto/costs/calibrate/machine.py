"""This machine's calibration of the ``xgb`` cost model: the bundled model, fitted here.

The bundled model and its calibration (:mod:`tvm_pesto.costs.predict.calibration`) were trained and
fitted on the machines the labels came from. Another machine, even one that reads the same
CPU model, caches and core count, can run the same kernels at another speed, and its
predictions are then off by a factor per backend (docs/cost_model.md, "Calibration"). A tree
model cannot learn a dependence on a machine it never saw, so the correction is measured: a few small zoo models' units are timed
here through the ``measured`` source (the TVM fusion groups, every library candidate that
covers exactly one of them, each library backend's largest candidate) and an affine
correction per backend and device is fitted on the raw predictions, as the bundled one was
(:func:`~tvm_pesto.costs.predict.calibration.fit_calibration`).

The fit is kept per model file and machine
(:func:`~tvm_pesto.costs.predict.calibration.machine_calibration_path`), where
:func:`~tvm_pesto.costs.predict.calibration.load_calibration` finds it ahead of the bundled one.
:func:`tvm_pesto.calibrate_machine` (``tvm-pesto cost-model calibrate``) fits it; with
:data:`MACHINE_ENV` unset or ``auto``, :func:`tvm_pesto.place` and
:func:`tvm_pesto.estimate_costs` fit it before their first ``xgb`` or ``hybrid`` costs for a
local CPU device size that has none (once per machine and device size, announced on
stderr); ``off`` never fits one (a fit made earlier still applies).
``$TVM_PESTO_CALIBRATION`` (the CLI's ``--calibration``) overrides both.

:func:`calibrate_machine` makes the units (the flow's candidates of :data:`MACHINE_MODELS`,
:func:`tvm_pesto.candidates.flow.make_candidates`); :func:`fit_machine_calibration` measures
and fits any units it is given.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ...cluster import as_cluster
from ...errors import CostError
from .. import candidate_costs
from ..predict.calibration import (CALIBRATION_ENV, Calibration, file_sha256, fit_calibration, load_machine_calibration,
                          machine_calibration_path, machine_info, machine_key)
from ..predict.features import device_descriptor, device_key
from ..predict.xgb import MIN_COST_S, CostModel, load_model, predict_candidate_costs
from ..store.cache import MeasureCache

#: Environment variable: ``auto`` (default) fits this machine's calibration on first use,
#: ``off`` never does.
MACHINE_ENV = "TVM_PESTO_MACHINE_CALIBRATION"
#: Models timed for the fit: an MLP-Mixer (matmuls, layer norms, GELU, transposes) and a
#: MobileNetV2 (convolutions, depthwise convolutions, batch norm, clip), both small.
MACHINE_MODELS = ("mlp_mixer", "mobilenet_v2")


def auto_enabled() -> bool:
    """Whether the first ``xgb`` costs fit this machine's calibration (:data:`MACHINE_ENV`).

    Raises
    ------
    CostError
        When :data:`MACHINE_ENV` holds anything but ``auto`` or ``off``.
    """
    v = os.environ.get(MACHINE_ENV, "auto").strip().lower() or "auto"
    if v not in ("auto", "off"):
        raise CostError(f"${MACHINE_ENV} is {v!r}; set it to auto (fit this machine's calibration on first use) "
                        "or off (use the calibration bundled with the model)")
    return v == "auto"


def local_device_keys(model, cluster) -> list[str]:
    """Device keys of ``cluster``'s devices on this machine that ``model`` predicts for
    (:meth:`~tvm_pesto.costs.predict.xgb.CostModel.covers_size`: its CPU kind may be one the model never
    saw, which is what the fit is for; CPUs only: no accelerator is in the training data)."""
    keys = []
    for dev in cluster.devices:
        dd = device_descriptor(dev)
        local = dev.present and not dev.remote and dev.kind == "cpu"
        if local and model.covers_size(dd) and device_key(dd) not in keys:
            keys.append(device_key(dd))
    return keys


def needs_fit(model, cluster) -> bool:
    """Whether the first ``xgb`` costs on ``cluster`` should fit this machine's calibration:
    :func:`auto_enabled`, no file named in ``$TVM_PESTO_CALIBRATION``, and a local device
    size of ``cluster`` without an entry."""
    if not auto_enabled() or os.environ.get(CALIBRATION_ENV, "").strip() or not getattr(model, "path", None):
        return False
    keys = local_device_keys(model, cluster)
    have = load_machine_calibration(model)
    fitted = {dk for _, dk in have.entries} if have is not None else set()
    return any(k not in fitted for k in keys)


def calibration_units(cs, groups):
    """The candidates of ``cs`` that calibrate and evaluate the ``xgb`` source: those whose
    nodes are one of ``groups`` (the fusion groups), of every backend, and each library
    backend's largest candidate."""
    groups = {frozenset(g) for g in groups}
    largest: dict[str, frozenset] = {}
    for c in cs:
        if c.backend != "tvm" and len(c.nodes) > len(largest.get(c.backend, ())):
            largest[c.backend] = frozenset(c.nodes)
    return cs.subset(lambda c: frozenset(c.nodes) in groups or frozenset(c.nodes) == largest.get(c.backend))


def unit_pairs(cs, groups, cluster, model, keys, cache) -> list:
    """(backend, device key, raw predicted, measured) of one model's calibration units: the
    candidates of ``cs`` whose nodes are one of ``groups`` (the fusion groups) and each
    library backend's largest candidate, on the first device of each key in ``keys``."""
    sub = calibration_units(cs, groups)
    measured = candidate_costs(sub, cluster, "measured", cache=cache, in_run=False).table  # a loop's, as predicted
    raw, _ = predict_candidate_costs(sub, cluster, model, calibration=False)
    out, seen = [], set()
    for j, dev in enumerate(cluster.devices):
        dk = device_key(device_descriptor(dev))
        if dk not in keys or dk in seen:
            continue
        seen.add(dk)
        for i, c in enumerate(sub):
            if np.isfinite(measured[i, j]) and np.isfinite(raw[i, j]):
                out.append((c.backend, dk, float(raw[i, j]), float(measured[i, j])))
    return out


def fit_machine_calibration(units, cluster, model, save: bool = True, announce: bool = False):
    """Time the calibration units of some models here and fit this machine's calibration.

    Entries for device sizes fitted earlier (another cluster) are kept; this fit's replace
    theirs for the same backend and device.

    Parameters
    ----------
    units : dict
        Model name -> ``(candidate set, fusion groups)``, or a callable giving that dict
        (called after the announcement, so building the models counts in the time said).
    cluster : Cluster
        Devices of this machine; each distinct device size is fitted once.
    model : CostModel
    save : bool
        Write it where :func:`~tvm_pesto.costs.predict.calibration.load_calibration` finds it.
    announce : bool
        Say on stderr what is being measured and where it goes (the automatic fit does).

    Raises
    ------
    CostError
        When no device of ``cluster`` is a local CPU the model covers, or no unit could be
        both measured and predicted.
    """
    keys = local_device_keys(model, cluster)
    if not keys:
        trained = ", ".join("/".join(map(str, d)) for d in model.meta.get("device_models", []))
        raise CostError(f"cluster {cluster.name} has no device of this machine that the cost model covers (it was "
                        f"trained on {trained}); calibrate on local CPU devices, e.g. cpu:2")
    path = machine_calibration_path(model.path) if model.path else None
    if announce:
        print(f"tvm-pesto: fitting the xgb cost model to this machine ({', '.join(keys)}; once, about 30 s): timing "
              f"small zoo models' units; kept in {path}. ${MACHINE_ENV}=off skips it.", file=sys.stderr, flush=True)
    t0, before = time.perf_counter(), os.getloadavg()[0]
    units = units() if callable(units) else units
    with tempfile.TemporaryDirectory(prefix="pesto-machine-") as tmp:  # fresh labels, not the user's cache
        cache = MeasureCache(Path(tmp) / "measurements.jsonl")
        pairs = [p for cs, groups in units.values() for p in unit_pairs(cs, groups, cluster, model, keys, cache)]
    if not pairs:
        raise CostError(f"no unit of {', '.join(units)} was both measured and predicted on {cluster.name}; check "
                        "that they build here (tvm-pesto run mlp_mixer)")
    loads = [before, os.getloadavg()[0]]
    meta = {"model": Path(model.path).name if model.path else None,
            "model_sha256": file_sha256(model.path) if model.path else None, "machine": machine_info(),
            "machine_key": machine_key(), "cluster": cluster.name, "models": list(units),
            "label_source": "measured here (TVM fusion groups scaled to the whole model)",
            "label_load": {"max_1min": float(max(loads)), "cores": os.cpu_count()},
            "seconds": round(time.perf_counter() - t0, 2)}
    cal = fit_calibration(pairs, meta=meta, floor=MIN_COST_S)
    old = load_machine_calibration(model) if save and path is not None else None
    if old is not None:
        kept = {k: v for k, v in old.entries.items() if k[1] not in keys}
        counts = {k: v for k, v in old.meta.get("n_groups", {}).items() if k.split("|", 1)[1] not in keys}
        earlier = old.meta.get("earlier_fits", []) + [{k: old.meta.get(k) for k in ("fitted_at", "cluster")}]
        cal = Calibration({**kept, **cal.entries},
                          {**cal.meta, "n_groups": {**counts, **cal.meta["n_groups"]}, "earlier_fits": earlier})
    if save and path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        cal.save(path)
    return cal


def calibrate_machine(cluster="cpu:2", model=None, models=None, announce: bool = False):
    """Fit the ``xgb`` cost model's calibration to this machine and keep it where the
    ``xgb`` source finds it (:func:`tvm_pesto.calibrate_machine` is this function).

    Parameters
    ----------
    cluster : Cluster or str
        Devices of this machine (``cpu:N``); each distinct device size gets its entries.
    model : CostModel or path, optional
        The cost model (default: the bundled one).
    models : sequence of str, optional
        Zoo models (size ``small``) whose units are timed (default: :data:`MACHINE_MODELS`).
    announce : bool
        Say on stderr what is measured and where it is kept.

    Returns
    -------
    Calibration
        ``path`` is the file written; ``meta`` has the machine, load and seconds.

    Examples
    --------
    >>> cal = calibrate_machine("cpu:2")     # times zoo models: minutes  # doctest: +SKIP
    >>> sorted(cal.entries)[0]                                                # doctest: +SKIP
    ('onnxruntime', 'cpu/host-cpu/1@...')
    """
    # lazy: candidates and the zoo load TVM's compiler and PyTorch, which the measuring and fitting
    # above (and run.dispatch, which imports this module) do without
    from ...candidates.flow import make_candidates
    from ...graph.analysis import analyze
    from ...zoo import load

    cluster = as_cluster(cluster)
    cm = model if isinstance(model, CostModel) else load_model(model)
    names = list(models or MACHINE_MODELS)

    def units():
        out = {}
        for name in names:
            a = analyze(load(name, "small").mod)
            out[name] = (make_candidates(a, cluster, "all"), a.groups)
        return out

    return fit_machine_calibration(units, cluster, cm, announce=announce)


__all__ = ["MACHINE_ENV", "MACHINE_MODELS", "auto_enabled", "calibrate_machine", "calibration_units",
           "fit_machine_calibration", "local_device_keys", "needs_fit", "unit_pairs"]
