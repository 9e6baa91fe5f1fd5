"""The learned cost model: XGBoost on subgraph/backend/device features.

The model predicts either ``log(time)`` or ``log(time / roofline)`` (the ``target`` it was
trained for) of a subgraph on a backend and device, from :mod:`tvm_pesto.costs.predict.features`.
It is trained off line, from profiler logs and MetaSchedule databases, by the cost-model lab
(:mod:`tvm_pesto_lab.fit`, ``tvm-pesto cost-model train``); this module loads and applies it.

A model is one XGBoost JSON file (``Booster.save_model``) whose ``pesto_meta`` attribute
holds the target, the feature names, the devices and backends it was trained on, the
measured VM call overhead per device, the logs and the held-out split.

The cost source ``xgb`` (:func:`predict_costs`) predicts every fused group on every device
the model covers (same device kind and model name as in training) and falls back to the
roofline estimate, column by column, for the others (GPU presets on this CPU machine).

Examples
--------
>>> import tvm_pesto
>>> from tvm_pesto.candidates.examples import tiny_mlp
>>> from tvm_pesto.cluster import parse_cluster
>>> from tvm_pesto.costs.predict.xgb import predict_costs
>>> a = tvm_pesto.analyze(tiny_mlp()[0])
>>> table = predict_costs(a, parse_cluster("cpu:2"))
>>> table.shape == (len(a.groups), 2)   # seconds per fused group and device
True
"""
from __future__ import annotations

import functools
import gzip
import json
import math
import os
from pathlib import Path

import numpy as np

from ...errors import BuildError, CostError
from ...package_data import data_dirs
from ..table import MIN_COST_S
from .calibration import Calibration, load_calibration
from .features import (FEATURE_NAMES, describe_group, device_descriptor, device_key, device_size_key, feature_matrix,
                       roofline_s)
from .gpu_check import apply_check_logs
from .roofline import miss_s, node_seconds, work_s

#: Version of the model file's ``pesto_meta``; a file of another is refused (retrain it).
MODEL_FORMAT = 1
#: What a model's trees predict: ``log(time)``, ``log(time / roofline)``
#: (:func:`~tvm_pesto.costs.predict.features.roofline_s`), ``log(time / work)``
#: (:func:`~tvm_pesto.costs.predict.roofline.work_s`) or ``log((time - misses) / work)``
#: (:func:`~tvm_pesto.costs.predict.roofline.miss_s`), see :func:`target_base` and :func:`target_offset`.
TARGETS = ("log_time", "log_ratio", "log_work", "log_work_miss")
DEFAULT_MODEL_NAME = "default.json.gz"


# -- model -----------------------------------------------------------------------------------
def target_base(rows, target: str, floor_s: float = 0.0) -> np.ndarray:
    """Seconds per row that a model's ``target`` is the log of time relative to: 1 for
    ``log_time``, the roofline time for ``log_ratio``, the work for ``log_work`` and
    ``log_work_miss`` (they grow with the subgraph, so the trees' prediction scales with it
    past the largest label). ``floor_s`` (a model's ``work_floor_s``; 0: none) keeps the base
    of the last three at least that long: a subgraph of less work is priced as ``log_time``
    prices it (its time is its fixed costs), a larger one as the target does.

    Examples
    --------
    >>> dev = {"peak_flops": 1e11, "mem_bandwidth": 1e10}
    >>> rows = [{"desc": {"flops": 2e9, "bytes_read": 4e6, "bytes_written": 1e6, "dominant": {"op": "relax.matmul"}},
    ...          "device": dev}]
    >>> [float(target_base(rows, t)[0]) for t in TARGETS]
    [1.0, 0.02, 0.02, 0.02]
    >>> float(target_base(rows, "log_work", floor_s=0.1)[0]), float(target_base(rows, "log_time", floor_s=0.1)[0])
    (0.1, 1.0)
    """
    if target == "log_time":
        return np.ones(len(rows))
    if target == "log_ratio":
        base = np.array([roofline_s(r["desc"], r["device"]) for r in rows], dtype=np.float64)
    elif target in ("log_work", "log_work_miss"):
        base = np.array([work_s(r["desc"], r["device"]) for r in rows], dtype=np.float64)
    else:
        raise CostError(f"unknown target {target!r}; use one of {', '.join(TARGETS)}")
    return np.maximum(base, float(floor_s)) if len(base) else base


def target_offset(rows, target: str) -> np.ndarray:
    """Seconds per row a model's prediction adds to ``exp(trees) * target_base``: the cache
    misses of an unscheduled TVM reduction (:func:`~tvm_pesto.costs.predict.roofline.miss_s`)
    for ``log_work_miss``, 0 for the other targets. The trees learn the rest of the time
    (training subtracts the misses from the label), so a regime no training row reached is
    priced by what it fetches.

    Examples
    --------
    >>> dev = {"peak_flops": 1e11, "mem_bandwidth": 8e9}
    >>> dom = {"op": "relax.matmul", "inputs": [[128, 768], [768, 3072]], "outputs": [[128, 3072]]}
    >>> rows = [{"desc": {"dtype": "float32", "dominant": dom}, "device": dev, "backend": b} for b in ("tvm", "torch")]
    >>> target_offset(rows, "log_work_miss").round(3).tolist(), target_offset(rows, "log_work").tolist()
    ([2.416, 0.0], [0.0, 0.0])
    """
    if target != "log_work_miss":
        return np.zeros(len(rows))
    return np.array([miss_s(r["desc"], r["device"], r.get("backend", ""), float(r.get("tuned", 0.0)))
                     for r in rows], dtype=np.float64)


def _from_target(rows, y: np.ndarray, target: str, floor_s: float = 0.0) -> np.ndarray:
    return np.exp(y) * target_base(rows, target, floor_s) + target_offset(rows, target)


class CostModel:
    """A trained XGBoost cost model with its metadata.

    Examples
    --------
    >>> from tvm_pesto.cluster import parse_cluster
    >>> from tvm_pesto.costs.predict.features import describe_group, device_descriptor
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> from tvm_pesto.graph.opgraph import TensorSpec as T
    >>> g = OpGraph([OpNode("mm", "relax.matmul", {}, (T((64, 32)), T((32, 16))), (T((64, 16)),))], [])
    >>> dev = device_descriptor(parse_cluster("cpu:1").devices[0])
    >>> m = CostModel.load(default_model_path())
    >>> seconds = m.predict_rows([{"desc": describe_group(g, [0]), "device": dev, "backend": "tvm"}])
    >>> seconds.shape, bool(seconds[0] > 0)
    ((1,), True)
    """

    def __init__(self, booster, meta: dict, path: str | None = None):
        self.booster = booster
        self.meta = meta
        self.path = path

    @property
    def target(self) -> str:
        return self.meta["target"]

    @property
    def work_floor_s(self) -> float:
        """The floor of the target's base (:func:`target_base`; 0 for a model saved without one)."""
        return float(self.meta.get("work_floor_s", 0.0))

    def covers(self, dev: dict) -> bool:
        """Whether the model was trained on this device: its kind, model, number of cores and,
        for a CPU, its kind of CPU (:func:`~tvm_pesto.costs.predict.features.device_key`). A model
        trained on one-core devices does not cover a two-core one (its rows never saw a
        kernel spread over two threads), nor one trained on one kind of CPU another kind (their
        vector units and caches differ, and so do their kernels' times). Models saved before the ``devices`` list was kept are judged
        by kind and model only.

        Examples
        --------
        >>> cm = load_model()
        >>> cm.meta["devices"]
        ['cpu/host-cpu/1@AuthenticAMD/23/1', 'cpu/host-cpu/1@AuthenticAMD/25/17', ...]
        >>> cm.covers({"kind": "cpu", "model": "host-cpu", "cores": 1,
        ...            "cpu_kind": "GenuineIntel/6/143"})
        False
        """
        if "devices" in self.meta:
            return device_key(dev) in self.meta["devices"]
        return [dev["kind"], dev["model"]] in [list(x) for x in self.meta.get("device_models", [])]

    def covers_size(self, dev: dict) -> bool:
        """Whether the model was trained on a device of this kind, model and number of cores,
        on any kind of CPU (:func:`~tvm_pesto.costs.predict.features.device_size_key`). The ``xgb``
        source predicts for such a device (the CPU's peak FLOP/s is a feature; this machine's
        calibration, :mod:`tvm_pesto.costs.calibrate.machine`, corrects the rest) and says so: its column
        is ``xgb-other-cpu`` where :meth:`covers` is false."""
        if "devices" in self.meta:
            return device_size_key(dev) in {k.split("@", 1)[0] for k in self.meta["devices"]}
        return self.covers(dev)

    def unseen_ops(self, desc: dict) -> list[str]:
        """The ops of a subgraph description that no training row had (sorted; empty for a
        model saved before the ops were kept). A tree model prices such a subgraph by what
        its other features resemble, which can be off by an order of magnitude (the cost table
        lists such ops as ``unseen_ops``; docs/cost_model.md, "Ops never trained on")."""
        seen = self._seen_ops
        return sorted(set(desc.get("ops", [])) - seen) if seen else []

    @functools.cached_property
    def _seen_ops(self) -> frozenset:
        return frozenset(self.meta.get("ops") or ())

    def overhead_s(self, dev: dict) -> float:
        """VM call overhead measured on this device in the training runs: of this device
        (:func:`~tvm_pesto.costs.predict.features.device_key`), else the median over the devices of its
        size (any CPU kind), else over its kind and model; 0 if unknown."""
        ov = self.meta.get("overhead_s", {})
        if device_key(dev) in ov:
            return float(ov[device_key(dev)])
        size = device_size_key(dev)
        for match in (lambda k: k.split("@", 1)[0] == size,
                      lambda k: k.split("@", 1)[0].rsplit("/", 1)[0] == size.rsplit("/", 1)[0]):
            same = [v for k, v in ov.items() if match(k)]
            if same:
                return float(np.median(same))
        return 0.0

    def predict_rows(self, rows) -> np.ndarray:
        """Predicted seconds (as measured: including the VM call overhead) for each row."""
        import xgboost as xgb

        if not rows:
            return np.zeros(0)
        X = feature_matrix(rows)
        y = self.booster.predict(xgb.DMatrix(X, feature_names=list(FEATURE_NAMES)))
        return _from_target(rows, y.astype(np.float64), self.target, self.work_floor_s)

    def save(self, path) -> None:
        """Write the model (XGBoost JSON with a ``pesto_meta`` attribute; gzipped when the
        name ends in ``.gz``, as the bundled model is: 1.5 MiB instead of 6)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        self.booster.set_attr(pesto_meta=json.dumps(self.meta, sort_keys=True))
        if p.suffix == ".gz":
            p.write_bytes(gzip.compress(bytes(self.booster.save_raw("json")), mtime=0))
        else:
            self.booster.save_model(str(p))
        self.path = str(p)

    @classmethod
    def load(cls, path) -> "CostModel":
        """Read a model written by :meth:`save`.

        Raises
        ------
        CostError
            If the file is missing or not a tvm-pesto cost model.
        """
        import xgboost as xgb

        p = Path(path)
        if not p.is_file():
            raise CostError(f"cost model {p} does not exist; train one with `tvm-pesto cost-model train LOGS -o {p}`")
        b = xgb.Booster()
        try:
            raw = p.read_bytes()
            b.load_model(bytearray(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw))  # gzipped or not
            meta = json.loads(b.attr("pesto_meta") or "null")
        except Exception as e:  # noqa: BLE001
            raise CostError(f"{p} is not a readable XGBoost model ({type(e).__name__}: {e}); retrain it") from e
        if not isinstance(meta, dict) or meta.get("format") != MODEL_FORMAT:
            raise CostError(f"{p} is not a tvm-pesto cost model (format {MODEL_FORMAT}); retrain it with "
                            "`tvm-pesto cost-model train`")
        if list(meta.get("feature_names", [])) != list(FEATURE_NAMES):
            raise CostError(f"{p} was trained on different features than this tvm-pesto computes; retrain it")
        b.set_param({"nthread": 1})
        return cls(b, meta, str(p))


# -- finding the bundled model ---------------------------------------------------------------
def model_dirs() -> list[Path]:
    """Folders searched for bundled models: the installed package's ``cost_models`` first,
    then the source checkout's top-level ``cost_models``
    (:func:`tvm_pesto.package_data.data_dirs`)."""
    return data_dirs("cost_models")


def default_model_path() -> Path:
    """``$TVM_PESTO_COST_MODEL`` or the bundled ``cost_models/default.json.gz``.

    Raises
    ------
    CostError
        When no bundled model is found.
    """
    env = os.environ.get("TVM_PESTO_COST_MODEL")
    if env:
        return Path(env)
    for d in model_dirs():
        if (d / DEFAULT_MODEL_NAME).is_file():
            return d / DEFAULT_MODEL_NAME
    raise CostError("no bundled cost model (cost_models/default.json.gz) was found; train one with "
                    "`tvm-pesto cost-model train LOGS -o cost_models/default.json.gz` or set TVM_PESTO_COST_MODEL")


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, mtime: float) -> CostModel:
    return CostModel.load(path)


def load_model(path=None) -> CostModel:
    """The model at ``path`` (default: :func:`default_model_path`), cached per file version."""
    p = Path(path) if path is not None else default_model_path()
    if not p.is_file():
        raise CostError(f"cost model {p} does not exist; train one with `tvm-pesto cost-model train`")
    return _load_cached(str(p.resolve()), p.stat().st_mtime)


# -- cost source ------------------------------------------------------------------------------
def predict_candidate_costs(cs, cluster, model=None, calibration=True, applied: dict | None = None,
                            unseen: dict | None = None, gpu_check: dict | None = None) -> tuple[np.ndarray, list[str]]:
    """``[candidates, devices]`` predicted seconds, and which source made each column.

    A device the model covers (its kind, model and core count were in the training data)
    gets the model's prediction for every candidate whose backend it was trained on (with
    the training runs' VM call overhead subtracted, as measured costs have it), never below
    its FLOPs at the device's peak (a tree model cannot extrapolate to subgraphs far larger
    than it saw; bytes over bandwidth is no floor on a CPU: views and cache-resident tensors
    are measured below it), plus, for a library unit, that call overhead once (at size full
    most library candidates sit on the floor, and a cover of 47 units would tie with the
    whole model in one); a device it
    does not cover, or an untrained backend without a trained ``cost_proxy`` (a backend
    predicted as another until the model learns it: ``openvino`` and
    ``onnxruntime-parallel`` as ``onnxruntime``), gets the roofline estimate
    (:func:`tvm_pesto.costs.predict.roofline.node_seconds`); ``inf`` where the backend does not run
    on the device. Column sources: ``"xgb"``, ``"roofline"``, or ``"xgb+roofline"`` when
    only some candidates of a covered device fell back; ``"xgb-other-cpu"`` (``+roofline``) for
    a CPU device of a size the model was trained on but of a CPU kind it never saw
    (:meth:`CostModel.covers_size`).

    ``calibration``: ``True`` applies the calibration
    :func:`~tvm_pesto.costs.predict.calibration.load_calibration` finds (the file
    ``$TVM_PESTO_CALIBRATION`` names, this machine's, or the one stored next to the model
    file), if any (:mod:`tvm_pesto.costs.predict.calibration`: ``a * predicted + b`` per backend and
    device, on the floored prediction, floored again); ``False`` gives the raw predictions; a
    :class:`~tvm_pesto.costs.predict.calibration.Calibration` applies that one. ``applied``, when
    given, is filled with device index -> ``{backend: {"a", "b", "file"}}`` for the
    corrections used. ``unseen``, when given, is filled with candidate index -> the ops of it
    the model never trained on (:meth:`CostModel.unseen_ops`), for the predicted candidates
    that have any. A GPU's roofline column takes the device check's timings of that GPU
    (:func:`~tvm_pesto.costs.predict.gpu_check.apply_check_logs`; ``gpu_check``, when given, is filled
    with what they changed).

    Examples
    --------
    >>> import tvm_pesto
    >>> from tvm_pesto.candidates import placement_candidates
    >>> from tvm_pesto.cluster import parse_cluster
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> cs = placement_candidates(tvm_pesto.analyze(tiny_mlp()[0]).rg)
    >>> table, src = predict_candidate_costs(cs, parse_cluster("2xV100-nvlink"))
    >>> table.shape == (len(cs), 2), src
    (True, ['roofline', 'roofline'])
    """
    cm = model if isinstance(model, CostModel) else _maybe_load(model, cluster)
    trained = set(cm.meta.get("backends", ["tvm"])) if cm is not None else set()
    cal = calibration if isinstance(calibration, Calibration) else (load_calibration(cm) if calibration else None)
    out = np.zeros((len(cs), cluster.num_devices))
    sources = []
    memo = _CandidateMemo(cs, cm, unseen)
    for j, dev in enumerate(cluster.devices):
        dd = device_descriptor(dev)
        idx, rows, floors, fell_back = _model_rows(cs, j, dev, dd, cm, trained, memo, out)
        if rows:
            out[idx, j] = _predict_column(cm, cal, rows, floors, dd, j, applied)
        if not rows:
            sources.append("roofline")
        else:  # rows only come from a model that covers the device's size
            name = "xgb" if cm.covers(dd) else "xgb-other-cpu"
            sources.append(f"{name}+roofline" if fell_back else name)
    if any(d.kind == "gpu" for d in cluster.devices):
        out, sources, found = apply_check_logs(cs, cluster, out, sources)
        if gpu_check is not None:
            gpu_check.update(found)
    return out, sources


class _CandidateMemo:
    """What :func:`predict_candidate_costs` works out once per candidate (its merged node and
    description) or once per candidate and target (its ``tuned`` feature), whichever device
    asks first. A description also records, in ``unseen`` when given, the candidate's ops
    the model ``cm`` never trained on."""

    def __init__(self, cs, cm: CostModel | None, unseen: dict | None):
        self.graph, self.rg, self.cm, self.unseen = cs.rg.graph, cs.rg, cm, unseen
        self.merged_nodes: dict[int, object] = {}
        self.descs: dict[int, dict] = {}
        self.shares: dict[tuple, float | None] = {}  # (candidate, target) -> tuned share (None: cannot be lowered)

    def merged(self, i: int, cand):
        if i not in self.merged_nodes:
            self.merged_nodes[i] = self.graph.merged(cand.nodes)
        return self.merged_nodes[i]

    def desc(self, i: int, cand) -> dict:
        if i not in self.descs:
            self.descs[i] = describe_group(self.graph, cand.nodes)
            new_ops = self.cm.unseen_ops(self.descs[i]) if self.unseen is not None else []
            if new_ops:
                self.unseen[i] = new_ops
        return self.descs[i]

    def share(self, i: int, cand, dev) -> float | None:
        """:func:`tuned_share`, or None where the backend cannot lower the candidate."""
        tk = (i, repr(sorted(dev.target.items())))
        if tk not in self.shares:
            try:
                self.shares[tk] = tuned_share(self.rg, cand, dev)
            except BuildError:  # the backend cannot lower it, so it cannot build it either
                self.shares[tk] = None
        return self.shares[tk]


def _model_rows(cs, j: int, dev, dd: dict, cm, trained: set, memo: _CandidateMemo, out: np.ndarray):
    """The model's input rows for the candidates it predicts on device ``j`` (``dev``, with
    descriptor ``dd``); the other candidates' entries of ``out[:, j]``: ``inf`` where the
    backend does not run on the device or cannot lower the candidate, the roofline estimate
    where the model does not cover the device or the backend.

    Returns ``(indices, rows, floors, fell_back)``: the predicted candidates, their rows, their
    FLOPs at the device's peak, and how many candidates fell back to the roofline.
    """
    # lazy: loads TVM's compiler, which importing this module does not
    from ...backends import get_backend

    covered = cm is not None and cm.covers_size(dd)
    call_s = cm.overhead_s(dd) if covered else 0.0
    idx, rows, floors, fell_back = [], [], [], 0
    for i, c in enumerate(cs):
        bk = get_backend(c.backend)
        if not bk.supports_device(dev):
            out[i, j] = math.inf
            continue
        merged = memo.merged(i, c)
        as_backend = c.backend if c.backend in trained else bk.cost_proxy
        if covered and as_backend in trained:
            desc = memo.desc(i, c)
            tuned = memo.share(i, c, dev)
            if tuned is None:
                out[i, j] = math.inf
                continue
            idx.append(i)
            rows.append({"desc": desc, "device": dd, "backend": as_backend, "tuned": tuned})
            # a library unit is also one call: covers that tie at the floor prefer fewer calls
            floors.append(merged.flops / dev.peak_flops + (0.0 if getattr(bk, "native", False) else call_s))
        else:
            out[i, j] = node_seconds(merged, dev)
            fell_back += 1
    return idx, rows, floors, fell_back


def _predict_column(cm: CostModel, cal, rows: list, floors: list, dd: dict, j: int, applied: dict | None) -> np.ndarray:
    """Seconds of ``rows`` on device ``j`` (descriptor ``dd``): the model's prediction less the
    training runs' call overhead, calibrated by ``cal`` when given, never below ``floors``
    (nor :data:`~tvm_pesto.costs.table.MIN_COST_S`); the corrections used go to ``applied[j]``."""
    floors = np.maximum(np.asarray(floors), MIN_COST_S)
    pred = np.maximum(cm.predict_rows(rows) - cm.overhead_s(dd), floors)
    if cal is not None:  # fitted on these raw (floored) predictions against measured groups
        bks = [r["backend"] for r in rows]
        pred = np.maximum(cal.apply(pred, bks, device_key(dd)), floors)
        if applied is not None:
            used = {b: cal.lookup(b, device_key(dd)) for b in sorted(set(bks))}
            applied[j] = {b: {"a": ab[0], "b": ab[1], "file": cal.path, "fitted_at": cal.meta.get("fitted_at")}
                          for b, ab in used.items() if ab}
    return pred


def tuned_share(rg, cand, device) -> float:
    """The ``tuned`` feature of candidate ``cand`` on ``device``: for ``tvm-ms``, the share of
    its work the backend's MetaSchedule database holds schedules for; 0 for other backends."""
    if cand.backend != "tvm-ms":
        return 0.0
    # lazy: loads TVM's compiler, which importing this module does not
    from ...backends import get_backend
    from ...candidates.generate import candidate_function

    func = candidate_function(rg, list(cand.nodes), lift_constants=True).func
    return get_backend("tvm-ms").tuned_fraction(func, dict(device.target))


def predict_costs(analysis, cluster, model=None) -> np.ndarray:
    """``[groups, devices]`` predicted seconds for the fused groups of ``analysis``: the
    ``tvm`` candidates of placement alone, through :func:`predict_candidate_costs`.

    Examples
    --------
    >>> import tvm_pesto
    >>> from tvm_pesto.cluster import parse_cluster
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> a = tvm_pesto.analyze(tiny_mlp()[0])
    >>> predict_costs(a, parse_cluster("2xV100-nvlink")).shape == (len(a.groups), 2)   # GPU preset: roofline
    True
    """
    # lazy: loads TVM's compiler, which importing this module does not
    from ...candidates.generate import placement_candidates

    return predict_candidate_costs(placement_candidates(analysis.rg, analysis.groups), cluster, model)[0]


def _maybe_load(model, cluster):
    """Load the model; with no model found, None when no device could use it anyway."""
    try:
        return load_model(model)
    except CostError:
        if model is not None or any(dev.kind == "cpu" for dev in cluster.devices):
            raise
        return None


__all__ = ["CostModel", "DEFAULT_MODEL_NAME", "MODEL_FORMAT", "TARGETS", "default_model_path", "load_model", "target_base",
           "target_offset",
           "model_dirs", "predict_candidate_costs", "predict_costs", "tuned_share"]
