"""Seconds to build each candidate: what a build budget (``max_build_s``) spends.

Before a plan runs, each of its library units is built: ONNX Runtime creates a session
(milliseconds), OpenVINO compiles the region (tens of milliseconds), TorchInductor
generates and compiles C++ (seconds per region). Every build that measuring
(:mod:`~tvm_pesto.costs.measure.measured`) or the builder makes is appended to ``builds.jsonl``
beside the measurement cache (:func:`record`); :func:`estimate` predicts a candidate's
build seconds from its backend's builds on this CPU kind (a line in the number of ops,
least squares; through the origin while fewer than :data:`MIN_FIT` builds of two sizes are
recorded, or where the line would start below 0). A backend with no build recorded here uses
its ``build_s_guess`` (seconds fixed, per op) until it has one.

A candidate costs nothing to build when it is TVM-native (its code is compiled with its
device's module, which every plan has) or when this process built the same subgraph for a
device of the same size already (the builder reuses that unit: a cached build).

Examples
--------
>>> import tempfile, os
>>> log = os.path.join(tempfile.mkdtemp(), "builds.jsonl")
>>> for ops, s in [(8, 0.3), (14, 1.1), (56, 7.5)]:
...     append_record(log, {"backend": "inductor", "ops": ops, "build_s": s, "cpu": "X/1/2"})
>>> a, b = fit_backend(list(read_builds(log, "X/1/2")))
>>> round(a + b * 30, 1)   # seconds for a 30-op region, on the line through the three builds
3.9
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...backends import get_backend
from ...candidates.generate import candidate_function
from ...cluster.host import cpu_identity
from ..store.cache import default_cache_path
from ..store.jsonl import append_record, read_records, rewrite_records

#: Builds of a backend (of at least two sizes) before its line is fitted by least squares.
MIN_FIT = 3
#: The newest builds per backend that a fit uses.
MAX_RECORDS = 200
#: Once the log is larger than this, it is compacted to the newest :data:`MAX_RECORDS` builds
#: of each backend and CPU kind (all a fit reads), so it never grows without bound.
COMPACT_BYTES = 1 << 20

_recorded: set = set()  # (log, global name) of the units this process recorded


def default_log_path() -> Path:
    """``builds.jsonl`` in the measurement cache's folder (``$TVM_PESTO_CACHE``)."""
    return default_cache_path().parent / "builds.jsonl"


def record(unit, ops: int, path: str | os.PathLike | None = None) -> None:
    """Append what building ``unit`` (a :class:`~tvm_pesto.backends.base.BuiltUnit` of
    ``ops`` ops) took, once per unit, log and process; a log that cannot be written is skipped
    (the estimate then keeps its guess)."""
    path = Path(path or default_log_path())
    if (str(path), unit.name) in _recorded or unit.build_s <= 0:
        return
    _recorded.add((str(path), unit.name))
    rec = {"backend": unit.backend, "ops": int(ops), "build_s": float(unit.build_s),
           "cores": int(getattr(unit.device, "cores", 0) or 0), "cpu": cpu_identity()["kind"]}
    try:
        append_record(path, rec)
        if path.stat().st_size > COMPACT_BYTES:
            rewrite_records(path, newest)
    except OSError:
        pass


def newest(recs: list) -> list:
    """The newest :data:`MAX_RECORDS` of ``recs`` per (CPU kind, backend), in their order.

    Examples
    --------
    >>> recs = [{"cpu": "X", "backend": "b", "n": k} for k in range(MAX_RECORDS + 2)] + [{"cpu": "Y", "backend": "b"}]
    >>> kept = newest(recs)
    >>> len(kept), kept[0]["n"], kept[-1]
    (201, 2, {'cpu': 'Y', 'backend': 'b'})
    """
    seen: dict = {}
    keep = []
    for rec in reversed(recs):
        if not isinstance(rec, dict):
            continue
        key = (rec.get("cpu"), rec.get("backend"))
        if seen.get(key, 0) < MAX_RECORDS:
            seen[key] = seen.get(key, 0) + 1
            keep.append(rec)
    return keep[::-1]


def read_builds(path, cpu: str):
    """The build records in ``path`` taken on CPU kind ``cpu`` (unreadable lines skipped)."""
    if not Path(path).exists():
        return
    for _, rec, _ in read_records(path):
        if isinstance(rec, dict) and rec.get("cpu") == cpu and {"backend", "ops", "build_s"} <= set(rec):
            yield rec


def fit_backend(recs: list[dict]) -> tuple[float, float]:
    """``(seconds fixed, seconds per op)`` through a backend's builds (both at least 0)."""
    ops = np.array([max(1, int(r["ops"])) for r in recs[-MAX_RECORDS:]], dtype=float)
    s = np.array([float(r["build_s"]) for r in recs[-MAX_RECORDS:]])
    if len(recs) >= MIN_FIT and len(set(ops.tolist())) >= 2:
        b, a = np.polyfit(ops, s, 1)
        if a >= 0 and b >= 0:
            return float(a), float(b)
    return 0.0, float(ops @ s / (ops @ ops))  # through the origin


def fitted(path=None) -> dict[str, tuple[float, float]]:
    """Backend -> ``(seconds fixed, seconds per op)`` from this CPU kind's builds in ``path``."""
    by: dict[str, list] = {}
    for rec in read_builds(path or default_log_path(), cpu_identity()["kind"]):
        by.setdefault(rec["backend"], []).append(rec)
    return {b: fit_backend(recs) for b, recs in by.items()}


def estimate(cs, cluster, path=None) -> np.ndarray:
    """Seconds to build each candidate of ``cs`` on each device of ``cluster``, shape
    (candidates, devices): 0 where it is TVM-native or built by this process already."""
    lines = fitted(path)
    out = np.zeros((len(cs), cluster.num_devices))
    funcs: dict = {}
    for i, c in enumerate(cs):
        bk = get_backend(c.backend)
        if getattr(bk, "native", False):
            continue
        a, b = lines.get(c.backend, bk.build_s_guess)
        for d, dev in enumerate(cluster.devices):
            if not bk.supports_device(dev):
                continue
            if bk.has_built() and i not in funcs:  # extracting and hashing the subgraph only then
                funcs[i] = candidate_function(cs.rg, c.nodes, lift_constants=False).func
            out[i, d] = 0.0 if i in funcs and bk.is_built(funcs[i], dev) else a + b * len(c.nodes)
    return out


__all__ = ["COMPACT_BYTES", "MAX_RECORDS", "MIN_FIT", "default_log_path", "estimate", "fit_backend", "fitted", "newest",
           "read_builds", "record"]
