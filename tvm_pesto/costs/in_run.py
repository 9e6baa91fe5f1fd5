"""A library unit's seconds inside the model's run, after the rest of the model ran.

A candidate is measured by calling it over and over, and the cost model learns from such
measurements: from the second call on, its weights, its library's code and its data
structures sit in the core's caches. In the model's run the rest of the model runs between
two of its calls and takes them out. Measured with ``lab/scripts/cold_units.py`` (Xeon, 2
vCPUs): inception_v3 at size small, 95.5 MB of weights, placed on ``cpu:1`` with every
candidate measured: its 60 ONNX Runtime units (46.7 MB of weights) took 4.2 ms a run in a
loop each and 10.3 ms in the model's run; the plan was simulated at 7.96 ms and ran 18.2 ms.

Each library candidate ``c`` on a CPU device gets the seconds the device's cold-call grid
(:class:`tvm_pesto.cluster.cold.ColdFigure`, fitted on first use on this machine by
:mod:`tvm_pesto.costs.calibrate.cold`) gives a unit of ``w(c)`` bytes of weights after
``passed(c)`` bytes went by since its last call (:func:`cold_extra_s`): ``w(c)`` its weights,
``passed(c)`` the weights and outputs of the rest of the model. A candidate of the whole
model gets nothing (nothing else runs between its calls: its loop is the model's run). TVM's
native groups are left as they are (their measured costs are scaled so that they add up to
the whole model's run, :func:`tvm_pesto.costs.measure.measured.calibrate_native`), as is a
roofline column (it reads every byte from memory already).

Examples
--------
>>> import numpy as np
>>> from tvm_pesto.costs.in_run import cold_extra_s
>>> grid = {"flush_bytes": [4e6, 64e6], "unit_bytes": [1e4, 8e6], "extra_s": [[5e-5, 6e-5], [1e-4, 6e-4]]}
>>> passed = np.array([64e6, 64e6, 64e6, 2e6, 0.0])
>>> w = np.array([1e4, 8e6, 16e6, 1e4, 1e6])     # ... a small unit after 2 MB, the whole model
>>> np.round(cold_extra_s(grid, passed, w) * 1e6, 1).tolist()   # microseconds added
[100.0, 600.0, 1100.6, 25.0, 0.0]
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..backends import get_backend
from ..cluster.cold import cold_figures
from .table import CostTable


def cold_extra_s(grid, passed, weights) -> np.ndarray:
    """Seconds a unit of ``weights`` bytes takes more after ``passed`` bytes went by than in
    its loop, from ``grid`` (a :class:`~tvm_pesto.cluster.cold.ColdFigure` or its dict):
    linear in ``log(passed)`` between the grid's flush sizes, in proportion to ``passed``
    below the first (nothing passed, nothing added) and as at the last above it; linear in
    the weights between the unit sizes, as the smallest below them and along the last two's
    slope above them."""
    g = grid if isinstance(grid, dict) else dataclasses.asdict(grid)
    flush, units = np.asarray(g["flush_bytes"], float), np.asarray(g["unit_bytes"], float)
    extra = np.asarray(g["extra_s"], float)
    s = np.maximum(np.asarray(passed, float), 0.0)
    w = np.asarray(weights, float)
    lf = np.log(np.clip(s, flush[0], flush[-1]))
    at = np.stack([np.interp(lf, np.log(flush), extra[:, j]) for j in range(len(units))], axis=-1)
    at *= np.minimum(1.0, s / flush[0])[..., None]
    hi = np.clip(np.searchsorted(units, w), 1, len(units) - 1)
    lo = hi - 1
    t = np.maximum((w - units[lo]) / (units[hi] - units[lo]), 0.0)
    a, b = np.take_along_axis(at, lo[..., None], -1)[..., 0], np.take_along_axis(at, hi[..., None], -1)[..., 0]
    return np.maximum(a + t * np.maximum(b - a, 0.0), 0.0)


def weights_from_memory(ct: CostTable, cs, cluster) -> CostTable:
    """``ct`` (of the candidates ``cs``, a :class:`~tvm_pesto.candidates.CandidateSet`) with
    each library candidate's seconds on each CPU device raised by what a call costs after the
    rest of the model ran (:func:`cold_extra_s` with the device's grid,
    :func:`tvm_pesto.cluster.cold.cold_figures`); roofline columns, TVM's native candidates
    and infinite costs are left. The table's ``from_memory`` says what was added per device."""
    nodes = cs.rg.graph.nodes
    native = {b: get_backend(b).native for b in {c.backend for c in cs}}
    lib = np.array([not native[c.backend] for c in cs], dtype=bool)
    if not lib.any():
        return ct
    node_w = np.array([n.param_bytes for n in nodes], dtype=float)
    node_m = np.array([n.memory_bytes for n in nodes], dtype=float)
    idx = [list(c.nodes) for c in cs]
    w = np.array([node_w[i].sum() for i in idx], dtype=float)
    passed = float(node_m.sum()) - np.array([node_m[i].sum() for i in idx], dtype=float)
    table, info = ct.table.copy(), {}
    for d, fig in enumerate(cold_figures(cluster)):
        if fig is None or "roofline" in ct.columns[d]:
            continue
        add = np.where(lib & np.isfinite(table[:, d]), cold_extra_s(fig, passed, w), 0.0)
        if add.any():
            table[:, d] += add
            info[d] = {"model_bytes": float(node_m.sum()), "grid": fig.source, "fitted_at": fig.fitted_at,
                       "candidates": int((add > 0).sum()), "added_s_max": float(add.max())}
    return dataclasses.replace(ct, table=table, from_memory=info) if info else ct


__all__ = ["cold_extra_s", "weights_from_memory"]
