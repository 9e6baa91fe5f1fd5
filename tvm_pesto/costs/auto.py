"""Which source ``costs="auto"`` takes: measure everything when that is affordable.

``auto`` on devices that are all on this machine (or reachable over TVM RPC) measures every
candidate (``measured``) while measuring them is estimated to take at most
:data:`MEASURE_BUDGET_S` per distinct device size; a larger model (a real-size input, many
regions, large weights) takes ``hybrid`` instead: every candidate predicted by the cost model,
the close calls and the plan's units measured, the rest corrected by what was seen
(:mod:`tvm_pesto.costs.predict.hybrid`). A ResNet-50 at 224x224 measured in full spends about a
minute per device size timing some 500 library regions, most of them far from any plan; the
final choice times the whole-model options either way. Devices not on this machine are
predicted (``xgb``; ``roofline`` without xgboost).

The estimate (:func:`measuring_estimate_s`) counts what the ``measured`` source does, per
distinct candidate description (repeated layers share one): :data:`ENTRY_S` to build and
prepare each, and :data:`TIMED_CALLS` calls of its roofline time (warm-up calls, timed bursts
and the reference kernels' bursts beside them). It reads no clock and no cache, so the same
model, cluster and backends take the same source on every run and every machine.

Examples
--------
>>> import tvm_pesto
>>> from tvm_pesto.candidates import placement_candidates
>>> from tvm_pesto.candidates.examples import tiny_mlp
>>> from tvm_pesto.costs.auto import auto_source
>>> cs = placement_candidates(tvm_pesto.analyze(tiny_mlp()[0]).rg)
>>> choice = auto_source(cs, tvm_pesto.parse_cluster("cpu:2"))
>>> choice.source, choice.estimate_s < choice.budget_s
('measured', True)
>>> auto_source(cs, tvm_pesto.parse_cluster("2xV100-nvlink")).source   # not on this machine
'xgb'
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .predict.hybrid import candidate_keys
from .predict.roofline import roofline_candidate_costs

#: Estimated seconds of measuring per distinct device size up to which ``auto`` measures every
#: candidate. A build's whole budget is half a minute on a small model, and measuring every
#: candidate rarely changes what the final choice keeps on a CPU: with 30 s, the corpus's
#: ``resnet18`` at size small (42 ops, estimated 25 s per size) built in 45.2 s and kept ONNX
#: Runtime's whole model at 0.838 ms, with 10 s (``hybrid``) in 23.5 s, the same at 0.837 ms;
#: ``vit_tiny_patch16_224`` 23.8 -> 11.0 s, OpenVINO's whole model 0.287 / 0.289 ms (2-vCPU
#: Intel Xeon with AMX).
MEASURE_BUDGET_S = 10.0
#: Seconds to build, export and prepare one candidate for timing, before any call (ONNX export,
#: a session or compiled model, the timing wrapper), as measured on 2-core machines.
ENTRY_S = 0.06
#: Calls of a candidate's own length that measuring it makes: two warm-up calls, five timed
#: bursts of at least three calls, and the reference kernels' bursts of the same length.
TIMED_CALLS = 30


@dataclass(frozen=True)
class AutoChoice:
    """What ``costs="auto"`` took and why.

    Attributes
    ----------
    source : str
        ``measured``, ``hybrid``, ``xgb`` or ``roofline``.
    estimate_s : float or None
        Estimated seconds to measure every candidate on this machine's devices (None where
        no device is measured here).
    budget_s : float
        :data:`MEASURE_BUDGET_S` times the distinct device sizes measured.
    reason : str
        One line for the plan's report.
    """

    source: str
    estimate_s: float | None
    budget_s: float
    reason: str

    def to_json(self) -> dict:
        return {"source": self.source, "estimate_s": self.estimate_s, "budget_s": self.budget_s,
                "reason": self.reason}


def _measurable(dev) -> bool:
    return bool(dev.present or dev.remote)


def measuring_estimate_s(cs, cluster) -> float:
    """Estimated seconds for the ``measured`` source to time every candidate of ``cs`` on the
    devices of ``cluster`` that are measured here, once per distinct device size (see the
    module doc)."""
    sizes = {}
    for j, d in enumerate(cluster.devices):
        if _measurable(d):
            sizes.setdefault((str(d.target), d.cores), j)
    if not sizes or not len(cs):
        return 0.0
    roof = roofline_candidate_costs(cs, cluster)
    keys = candidate_keys(cs)
    total = 0.0
    for j in sizes.values():
        first: dict = {}
        for i, k in enumerate(keys):
            if np.isfinite(roof[i, j]):
                first.setdefault(k, float(roof[i, j]))
        total += sum(ENTRY_S + TIMED_CALLS * t for t in first.values())
    return total


def auto_source(cs, cluster, budget_s: float | None = None) -> AutoChoice:
    """The source ``costs="auto"`` takes for ``cs`` on ``cluster`` (see the module doc);
    ``budget_s`` per distinct device size, :data:`MEASURE_BUDGET_S` by default."""
    if any(d.remote for d in cluster.devices):  # the hybrid source measures only this machine's devices
        return AutoChoice("measured", None, 0.0, "devices measured over TVM RPC: every candidate measured")
    if not all(_measurable(d) for d in cluster.devices):
        try:
            import xgboost  # noqa: F401  # lazy: only to know whether the model can be read
        except ImportError:
            return AutoChoice("roofline", None, 0.0, "devices not on this machine, and no xgboost to predict them")
        return AutoChoice("xgb", None, 0.0, "devices not on this machine: predicted by the cost model")
    try:
        import xgboost  # noqa: F401  # lazy: only to know whether the model can be read
    except ImportError:
        return AutoChoice("measured", None, 0.0, "no xgboost to predict with: every candidate measured")
    sizes = {(str(d.target), d.cores) for d in cluster.devices}
    budget = (MEASURE_BUDGET_S if budget_s is None else budget_s) * len(sizes)
    est = measuring_estimate_s(cs, cluster)
    if est <= budget:
        return AutoChoice("measured", round(est, 1), budget,
                          f"measuring every candidate, estimated {est:.0f} s (within {budget:.0f} s)")
    return AutoChoice("hybrid", round(est, 1), budget,
                      f"measuring every candidate would take about {est:.0f} s (over {budget:.0f} s): "
                      "predicted, the close calls and the plan's units measured; --costs measured times every one")


__all__ = ["AutoChoice", "ENTRY_S", "MEASURE_BUDGET_S", "TIMED_CALLS", "auto_source", "measuring_estimate_s"]
