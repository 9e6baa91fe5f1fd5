"""Stage 3: costs. Seconds per (candidate, device), from one of several sources.

Sources: ``measured`` (:mod:`.measure.measured`: run on this machine's devices,
persistent cache), ``screened`` (the same, with a library's regions measured before on another
core count of this CPU sampled and the rest scaled, :mod:`.measure.screen`), ``xgb`` (:mod:`.predict.xgb`: the trained cost model), ``roofline``
(:mod:`.predict.roofline`: FLOPs and bytes over peak), ``hybrid`` (:mod:`.predict.hybrid`: predict all,
measure only the close calls and the critical path, correct the rest by what was seen). ``auto`` (:mod:`.auto`) measures when every device is on
this machine and measuring every candidate is affordable, takes ``hybrid`` when it is not, and
otherwise predicts (``xgb``, with roofline where the model does not cover a device). A GPU's roofline column takes the device check's timings of that GPU where they
exist (:mod:`.predict.gpu_check`). :func:`candidate_costs` is the one entry point; a new source is one module plus
one entry in :data:`SOURCES`. Every source but roofline times (or learned from) a candidate
called in a loop, its weights in the caches: its library candidates are priced as in the
model's run, after the rest of the model ran (:mod:`.in_run`, with the device's cold-call grid
fitted on first use, :mod:`.calibrate.cold`).

The sub-packages, each importing only those before it (and :mod:`.table`, the
:class:`CostTable` every source returns, and :mod:`.in_run`, which prices its library units
as in the model's run):

* :mod:`.store`: the measurement cache and the JSON-lines files it and the logs are kept in;
* :mod:`.measure`: timing candidates on this machine's devices or over TVM RPC, and their build seconds;
* :mod:`.predict`: the roofline, the learned model (features, model file, its calibration), the
  device check's GPU timings, and ``hybrid`` (which measures what it is unsure of);
* :mod:`.tune`: MetaSchedule tuning into a database (``tvm-pesto tune``);
* :mod:`.calibrate`: fitting the learned model's calibration on this machine (through
  :func:`candidate_costs`).

Examples
--------
>>> import tvm_pesto
>>> from tvm_pesto.candidates import placement_candidates
>>> from tvm_pesto.costs import candidate_costs
>>> from tvm_pesto.candidates.examples import tiny_mlp
>>> cs = placement_candidates(tvm_pesto.analyze(tiny_mlp()[0]).rg)
>>> ct = candidate_costs(cs, tvm_pesto.parse_cluster("2xV100-nvlink"), "roofline")
>>> ct.table.shape == (len(cs), 2), ct.columns
(True, ['roofline', 'roofline'])
"""
from __future__ import annotations

import dataclasses
import warnings

from ..errors import CostError, UnseenOpsWarning
from .auto import auto_source
from .in_run import weights_from_memory
from .predict.gpu_check import apply_check_logs
from .predict.hybrid import hybrid_costs
from .predict.roofline import roofline_candidate_costs, roofline_costs
from .predict.xgb import predict_candidate_costs
from .store.cache import MeasureCache
from .table import CostTable

SOURCES = ("auto", "measured", "roofline", "xgb", "hybrid", "screened")


def _measured(cs, cluster, cache, progress, calibrate: bool, screened: bool = False) -> CostTable:
    # lazy: measuring compiles with TVM's Relax compiler; predicting and the runtime side
    # (run.dispatch imports costs.store.cache, which runs this package first) load without it
    from .measure.measured import MeasureReport, calibrate_native, measure_cost_table

    for dev in cluster.devices:
        if not (dev.present or dev.remote):
            raise CostError(f"device {dev.name} is not on this machine, so it cannot be measured; "
                            "use --costs xgb or roofline, or measure it over TVM RPC (--rpc-tracker, --rpc-key)")
    cache = cache if cache is not None else MeasureCache()
    report = MeasureReport()
    table = measure_cost_table(cs, cluster, cache, report=report, progress=progress, screened=screened)
    factors = calibrate_native(cs, cluster, table, cache) if calibrate else {}
    return CostTable(table, ["measured"] * cluster.num_devices, measured=report.measured, cached=report.cached,
                     infeasible=dict(report.infeasible), native_scale=factors, seconds=report.seconds,
                     screened=dict(report.screened))


def _xgb(cs, cluster, calibrate: bool) -> CostTable:
    applied: dict = {}
    unseen: dict = {}
    found: dict = {}
    try:
        table, cols = predict_candidate_costs(cs, cluster, calibration=calibrate, applied=applied, unseen=unseen,
                                              gpu_check=found)
    except ImportError as e:  # the model file is read by xgboost
        raise CostError("the xgb cost source needs xgboost (pip install xgboost-cpu); "
                        "use --costs measured or roofline") from e
    ct = CostTable(table, cols, predicted=len(cs), prediction_fit=applied, unseen=unseen, gpu_check=found)
    if unseen:
        ops = ", ".join(op.removeprefix("relax.") for op in ct.unseen_op_counts())
        warnings.warn(f"the cost model never trained on {ops}: the xgb costs of {len(unseen)} candidates holding them "
                      "are guesses from their other features (an unseen conv2d_transpose was predicted 10x short); "
                      "costs='hybrid' measures them first, costs='measured' times every candidate",
                      UnseenOpsWarning, stacklevel=3)
    return ct


def _roofline(cs, cluster) -> CostTable:
    table, columns, found = roofline_candidate_costs(cs, cluster), ["roofline"] * cluster.num_devices, {}
    if any(d.kind == "gpu" for d in cluster.devices):
        table, columns, found = apply_check_logs(cs, cluster, table, columns)
    return CostTable(table, columns, predicted=len(cs), gpu_check=found)


def candidate_costs(cs, cluster, source: str = "auto", cache: MeasureCache | None = None, progress=None,
                    calibrate: bool = True, in_run: bool = True) -> CostTable:
    """Seconds of every candidate of ``cs`` on every device of ``cluster``.

    Parameters
    ----------
    cs : CandidateSet
    cluster : Cluster
    source : {"auto", "measured", "screened", "xgb", "roofline", "hybrid"}
        ``screened`` measures as ``measured`` does, but where the cache holds a library's
        regions on another core count of this CPU, it measures a sample of them and scales
        the rest (:mod:`.measure.screen`; the final choice's one-device shape, after the
        flow's measured one-core devices).
    cache : MeasureCache, optional
        Where measurements are looked up and appended (default: ``~/.cache/tvm-pesto``).
    progress : callable(done, total), optional
    calibrate : bool
        Measured TVM-native costs are scaled per device so that the fusion groups add up to
        the whole model's measured time (:func:`tvm_pesto.costs.measure.measured.calibrate_native`);
        ``xgb`` predictions get the whole-model calibration stored next to the model file,
        if there is one (:mod:`tvm_pesto.costs.predict.calibration`). The table's ``native_scale``
        and ``prediction_fit`` hold what was applied.
    in_run : bool
        Price each library candidate as it runs in the model, after the rest of the model ran
        (:func:`.in_run.weights_from_memory`). ``False`` gives the seconds of a call in a loop,
        as measured or predicted: what labels, calibrations and evaluations compare.

    Raises
    ------
    CostError
        For an unknown source, a device that cannot be measured here, or a missing model.
    """
    if source not in SOURCES:
        raise CostError(f"unknown cost source {source!r}; use one of {', '.join(SOURCES)}")
    if source == "auto":
        auto = auto_source(cs, cluster)
        return dataclasses.replace(candidate_costs(cs, cluster, auto.source, cache, progress, calibrate, in_run),
                                   auto=auto)
    priced = weights_from_memory if in_run else (lambda ct, *_: ct)
    if source in ("measured", "screened"):
        return priced(_measured(cs, cluster, cache, progress, calibrate, screened=source == "screened"), cs, cluster)
    if source == "xgb":
        return priced(_xgb(cs, cluster, calibrate), cs, cluster)
    if source == "hybrid":
        return hybrid_costs(cs, cluster, cache=cache, progress=progress)
    return _roofline(cs, cluster)


__all__ = ["CostTable", "MeasureCache", "SOURCES", "candidate_costs", "roofline_candidate_costs", "roofline_costs"]
