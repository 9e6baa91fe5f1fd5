"""The result of a cost source: seconds per (candidate, device), and where they came from."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Floor of every cost in seconds, measured or predicted: a group measured at or below the VM
#: call overhead (a view, a reshape) costs this, so costs stay positive (log targets, the simulator).
MIN_COST_S = 2e-7


@dataclass
class CostTable:
    """Seconds per (candidate, device) and where they came from.

    Attributes
    ----------
    table : ndarray, shape (candidates, devices)
        ``inf`` where a candidate cannot run on a device.
    columns : list of str
        The source that really produced each device's column (``measured``, ``xgb``,
        ``roofline``, ``xgb+roofline``, ``xgb-other-cpu``: predicted for a CPU kind the model
        was not trained on, ``hybrid``).
    measured, cached, predicted : int
        Candidates measured in this call, found in the measurement cache, predicted.
    infeasible : dict
        Candidate index -> why its backend could not build or run it.
    native_scale : dict
        ``measured``: device index -> the factor its TVM-native costs were scaled by so that
        the fusion groups add up to the whole model's measured time
        (:func:`~tvm_pesto.costs.measure.measured.calibrate_native`); empty when not calibrated.
    prediction_fit : dict
        ``xgb``/``hybrid``: device index -> ``{backend: {"a", "b", "file", "fitted_at"}}``, the
        fit ``a * predicted + b`` the predictions carry (:mod:`tvm_pesto.costs.predict.calibration`);
        empty when none was applied.
    hybrid : dict
        ``hybrid``: what it measured and corrected: ``bias`` (``"device:backend"`` -> the
        median measured / predicted its remaining predictions were scaled by), ``budget``
        (measurements allowed) and ``rounds`` (what each round measured); empty otherwise.
    seconds : float
        Wall time spent measuring.
    saved_s : float
        ``hybrid``: an estimate of the measuring time the predictions saved.
    unseen : dict
        ``xgb``/``hybrid``: candidate index -> the ops of it the cost model never trained on
        (its prediction is a guess from the other features; ``hybrid`` measures those first).
    gpu_check : dict
        Device index -> what the device check's GPU timings changed in its roofline column
        (:func:`tvm_pesto.costs.predict.gpu_check.apply_check_logs`); empty when none applied.
    auto : AutoChoice or None
        With ``costs="auto"``: the source it took and why (:class:`tvm_pesto.costs.auto.AutoChoice`).
    screened : dict
        ``screened``: the core count its scaled regions came from (``from``), how many
        (``scaled``) and each backend's fit (:meth:`~tvm_pesto.costs.measure.screen.Screen.summary`);
        empty when nothing was scaled.
    from_memory : dict
        Device index -> what :func:`~tvm_pesto.costs.in_run.weights_from_memory` added to its
        library candidates (their weights from memory in the model's run); empty when nothing.
    """

    table: np.ndarray
    columns: list[str]
    measured: int = 0
    cached: int = 0
    predicted: int = 0
    infeasible: dict = field(default_factory=dict)
    native_scale: dict = field(default_factory=dict)
    prediction_fit: dict = field(default_factory=dict)
    hybrid: dict = field(default_factory=dict)
    seconds: float = 0.0
    saved_s: float = 0.0
    unseen: dict = field(default_factory=dict)
    gpu_check: dict = field(default_factory=dict)
    auto: object = None
    screened: dict = field(default_factory=dict)
    from_memory: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        """One word for the whole table: the columns' source when they agree, else ``mixed``."""
        kinds = sorted(set(self.columns))
        return kinds[0] if len(kinds) == 1 else "mixed"

    def summary(self) -> dict:
        return {"source": self.source, "columns": list(self.columns), "measured": self.measured,
                "cached": self.cached, "predicted": self.predicted, "infeasible": len(self.infeasible),
                "measure_s": self.seconds, "saved_s": self.saved_s,
                "native_scale": {str(k): v for k, v in self.native_scale.items()},
                "prediction_fit": {str(k): v for k, v in self.prediction_fit.items()}, "hybrid": dict(self.hybrid),
                "unseen_ops": self.unseen_op_counts(), "unseen_candidates": len(self.unseen),
                "gpu_check": {str(k): v for k, v in self.gpu_check.items()},
                "auto": None if self.auto is None else self.auto.to_json(), "screened": dict(self.screened),
                "from_memory": {str(k): v for k, v in self.from_memory.items()}}

    def unseen_op_counts(self) -> dict:
        """Op name -> how many candidates hold it that the cost model never trained on."""
        counts: dict = {}
        for ops in self.unseen.values():
            for op in ops:
                counts[op] = counts.get(op, 0) + 1
        return dict(sorted(counts.items()))
