"""A library unit's seconds inside the model's run, where its weights come from memory.

A candidate is measured by calling it over and over, and the cost model learns from such
measurements: from the second call on, its weights sit in the core's caches. In the model's
run the rest of the model runs between two of its calls, and when the model's weights are
more than the caches hold, the unit's weights come from memory on every call. Measured with
``lab/scripts/cold_units.py`` (Xeon, 2 vCPUs): inception_v3 at size small, 95.5 MB of
weights, placed on ``cpu:1`` with every candidate measured: its 60 ONNX Runtime units (46.7 MB
of weights) took 4.2 ms a run in a loop each and 10.3 ms in the model's run; the plan was
simulated at 7.96 ms and ran 18.2 ms.

Each library candidate ``c`` on a CPU device gets

    ``w(c) * (hot(w(c)) - hot(W)) / bandwidth``,   ``hot(x) = min(1, C / x)``

seconds more: ``w(c)`` its weights, ``W`` the model's, ``C`` the bytes the device's caches
keep (:func:`cache_bytes`) and ``bandwidth`` what the weights come from memory at
(:data:`STREAM_BPS`). A candidate of the whole model (``w(c) = W``) gets nothing: its own
loop already streams its weights (a unit larger than the caches, the part the caches do not
hold); a model whose weights the caches hold gets nothing either. TVM's native groups are
left as they are (their measured costs are scaled so that they add up to the whole model's
run, :func:`tvm_pesto.costs.measure.measured.calibrate_native`), as is a roofline column
(it reads every byte from memory already).

Examples
--------
>>> import numpy as np
>>> from tvm_pesto.costs.in_run import from_memory_s
>>> w = np.array([1e6, 40e6, 100e6])                    # a small unit, a large one, the whole model
>>> np.round(from_memory_s(w, 100e6, cache=8e6, bandwidth=8e9) * 1e3, 3)   # ms added
array([0.115, 0.6  , 0.   ])
>>> from_memory_s(w, 4e6, cache=8e6, bandwidth=8e9).tolist()   # the model fits: nothing
[0.0, 0.0, 0.0]
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..backends import get_backend
from .table import CostTable

#: Bytes of a model's weights a device's caches keep through its run, where the device's
#: level-2 cache is smaller, and the bytes per second its units' weights come from memory at,
#: whatever its cores: fitted with ``lab/scripts/cold_units.py`` (Xeon, 2 vCPUs, every
#: candidate measured, one device of both cores) to the seconds a plan's ONNX Runtime units
#: took in the model's run over their loops: inception_v3 at size small (95.5 MB of weights)
#: 6.0 ms, these figures 5.3; mobilenetv3_large_100 (22.0 MB) 1.15, these 1.02; resnet18
#: (21.7 MB, three units of 7 MB, convolutions whose compute hides part of the reads) 0.40,
#: these 1.65; lcnet_050 (7.5 MB) ran as fast in its run as in a loop.
CACHE_BYTES = 8 << 20
STREAM_BPS = 8e9


def cache_bytes(device) -> float:
    """The bytes of a model's weights ``device``'s caches keep through its run: the level-2
    cache of one of its cores, or :data:`CACHE_BYTES` where that is more (a virtual machine's
    last level, as its ``sysfs`` says, is the host's, shared with every other guest)."""
    l2 = int(getattr(device, "l2_sets", 0) or 0) * int(getattr(device, "l2_ways", 0) or 0) * 64
    return float(max(l2, CACHE_BYTES))


def from_memory_s(weights, model_bytes: float, cache: float, bandwidth: float) -> np.ndarray:
    """Seconds each unit of ``weights`` bytes adds in the model's run over its measurement in a
    loop: ``weights * (hot(weights) - hot(model_bytes)) / bandwidth`` (see the module)."""
    w = np.asarray(weights, dtype=float)
    if model_bytes <= cache or bandwidth <= 0:
        return np.zeros_like(w)
    hot = np.minimum(1.0, cache / np.maximum(w, 1.0))
    return np.maximum(w * (hot - cache / model_bytes), 0.0) / bandwidth


def weights_from_memory(ct: CostTable, cs, cluster) -> CostTable:
    """``ct`` (of the candidates ``cs``, a :class:`~tvm_pesto.candidates.CandidateSet`) with
    each library candidate's seconds on each CPU device raised by what its weights cost from
    memory in the model's run (:func:`from_memory_s`); roofline columns, TVM's native
    candidates and infinite costs are left. The table's ``from_memory`` says what was added
    per device."""
    node_w = np.array([n.param_bytes for n in cs.rg.graph.nodes], dtype=float)
    native = {b: get_backend(b).native for b in {c.backend for c in cs}}
    lib = np.array([not native[c.backend] for c in cs], dtype=bool)
    if not lib.any():
        return ct
    w = np.array([node_w[list(c.nodes)].sum() for c in cs], dtype=float)
    table, info = ct.table.copy(), {}
    for d, dev in enumerate(cluster.devices):
        if dev.kind != "cpu" or "roofline" in ct.columns[d]:
            continue
        cache, bw = cache_bytes(dev), min(float(dev.mem_bandwidth), STREAM_BPS)
        add = np.where(lib & np.isfinite(table[:, d]), from_memory_s(w, float(node_w.sum()), cache, bw), 0.0)
        if add.any():
            table[:, d] += add
            info[d] = {"model_bytes": float(node_w.sum()), "cache_bytes": cache, "bandwidth_Bps": bw,
                       "candidates": int((add > 0).sum()), "added_s_max": float(add.max())}
    return dataclasses.replace(ct, table=table, from_memory=info) if info else ct


__all__ = ["CACHE_BYTES", "STREAM_BPS", "cache_bytes", "from_memory_s", "weights_from_memory"]
