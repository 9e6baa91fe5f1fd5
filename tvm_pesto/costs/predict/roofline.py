"""The roofline cost source: FLOPs and bytes over a device's peak, for any device.

``max(FLOPs / (eff * peak), bytes / (eff * bandwidth)) + launch``, with ``eff`` by op
category. It knows nothing about libraries: every backend's candidate of the same ops
gets the same estimate (plus one launch per call, so fewer, larger calls win ties). Use it
for devices that are not on this machine and have no trained cost model.
"""
from __future__ import annotations

import numpy as np

from ...graph.flops import op_category
from .caches import LINE_BYTES, l2_sets_of, l2_ways_of, strided_reduction
from .features import TIME_FLOOR_S, _dtype_size, _prod, dominant_kind

# A kernel launch / dispatch costs at least this much, even when it does no work.
LAUNCH_S = {"gpu": 5e-6, "cpu": 2e-6}
# Fraction of peak a well-scheduled kernel reaches, by op category.
EFFICIENCY = {"anchor": 0.6, "default": 0.5}
#: Backends whose code is TVM's unscheduled loop nest (``tvm-ms`` where its database has no
#: schedule: the untuned share of its work).
UNTUNED_TVM = ("tvm", "tvm-ms")


def node_seconds(node, device) -> float:
    """The roofline estimate for one (possibly merged) op-graph node on ``device``."""
    cat = op_category(node.op.split("+")[0])
    eff = EFFICIENCY.get(cat, EFFICIENCY["default"])
    nbytes = node.bytes_read + node.bytes_written
    return max(node.flops / (eff * device.peak_flops), nbytes / (eff * device.mem_bandwidth)) \
        + LAUNCH_S.get(device.kind, 2e-6)


def work_s(desc: dict, dev: dict) -> float:
    """The work of a subgraph description (:func:`~tvm_pesto.costs.predict.features.describe_group`)
    on a device descriptor, in seconds: ``max(FLOPs / peak, bytes / bandwidth)``, floored at
    :data:`~tvm_pesto.costs.predict.features.TIME_FLOOR_S`, where a gather whose dominant op is
    ``take`` reads the rows it writes, not its whole table (a token embedding of 30,522 rows
    reads 128 of them), and a group with a ``take`` elsewhere reads its output's bytes in
    place of its weights (the table). What the ``log_work`` target of the learned model is relative to:
    it grows with the subgraph, so a subgraph far larger than any training row is priced
    from its work, not at the largest label.

    Examples
    --------
    >>> dev = {"peak_flops": 1e11, "mem_bandwidth": 1e10}
    >>> mm = {"flops": 2e9, "bytes_read": 4e6, "bytes_written": 1e6, "dominant": {"op": "relax.matmul"}}
    >>> work_s(mm, dev)                               # compute-bound: FLOPs / peak
    0.02
    >>> emb = {"flops": 0.0, "bytes_read": 30522 * 768 * 4 + 512, "bytes_written": 128 * 768 * 4, "dtype": "float32",
    ...        "dominant": {"op": "relax.take", "inputs": [[30522, 768], [128]], "outputs": [[128, 768]]}}
    >>> round(work_s(emb, dev) * 1e6, 1)               # 128 rows read and written, not the table
    78.7
    """
    br, bw = float(desc["bytes_read"]), float(desc["bytes_written"])
    dom = desc.get("dominant") or {}
    ins, outs = dom.get("inputs") or [], dom.get("outputs") or []
    if dom.get("op") == "relax.take" and ins and outs:
        size = _dtype_size(desc)
        br = max(br - _prod(ins[0]) * size, 0.0) + _prod(outs[0]) * size
    elif "relax.take" in desc.get("ops", ()):  # the table is the group's weight; the gather reads what it writes
        br = max(br - float(desc.get("param_bytes", 0)), 0.0) + bw
    return max(float(desc["flops"]) / dev["peak_flops"], (br + bw) / dev["mem_bandwidth"], TIME_FLOOR_S)


def miss_s(desc: dict, dev: dict, backend: str, tuned: float = 0.0) -> float:
    """Seconds an unscheduled TVM reduction spends fetching the cache lines it misses: where
    the dominant matmul's or NCHW conv2d's strided operand maps more of its reduction's lines
    to one L2 set than the set has ways (the descriptor's ``l2_sets`` and ``l2_ways``, where it
    has them; else 1,024 sets of 8 ways: :func:`~tvm_pesto.costs.predict.caches.strided_reduction`),
    no line survives to the next output, and every strided access (a matmul's
    ``batch * M * N * K``, a convolution's ``out_elems * C_in / groups * kh``: a kernel row's
    ``kw`` taps share a line) brings one :data:`~tvm_pesto.costs.predict.caches.LINE_BYTES`
    line from memory, at the device's bandwidth. 0 for other ops, for tuned code
    (``1 - tuned`` of it for ``tvm-ms``) and for library backends (their kernels block the
    loops).

    The ``log_work_miss`` target adds it to the work: a subgraph past every training row's
    size (gpt2's untuned 768x3072 matmul at size full: 2.4 s of misses, 2.5 s measured, where
    the rows of size small have none) is priced from what it must fetch, not at the largest
    label's speed.

    Examples
    --------
    >>> dev = {"peak_flops": 1e11, "mem_bandwidth": 8e9}
    >>> mm = {"dtype": "float32", "dominant": {"op": "relax.matmul", "inputs": [[128, 768], [768, 3072]],
    ...                                          "outputs": [[128, 3072]]}}
    >>> round(miss_s(mm, dev, "tvm"), 3)                # 128 * 3072 * 768 lines of 64 bytes at 8 GB/s
    2.416
    >>> miss_s(mm, dev, "onnxruntime"), miss_s(mm, dev, "tvm-ms", tuned=1.0)
    (0.0, 0.0)
    >>> small = dict(mm, dominant=dict(mm["dominant"], inputs=[[128, 240], [240, 320]], outputs=[[128, 320]]))
    >>> miss_s(small, dev, "tvm")                       # its 240 lines spread over the L2 sets
    0.0
    >>> qkv = dict(mm, dominant=dict(mm["dominant"], inputs=[[128, 768], [768, 2304]], outputs=[[128, 2304]]))
    >>> round(miss_s(qkv, dev, "tvm"), 3), miss_s(qkv, dict(dev, l2_sets=2048, l2_ways=16), "tvm")
    (1.812, 0.0)
    """
    share = 1.0 - min(max(float(tuned), 0.0), 1.0)
    dom = desc.get("dominant") or {}
    if backend not in UNTUNED_TVM or share <= 0.0 or not dom.get("outputs"):
        return 0.0
    ins, attrs = [list(s) for s in dom.get("inputs") or []], dom.get("attrs") or {}
    kind = dominant_kind(dom["op"], attrs, ins)
    if kind not in ("matmul", "conv2d") or \
            strided_reduction(kind, ins, attrs, _dtype_size(desc), l2_sets_of(dev))[3] <= l2_ways_of(dev):
        return 0.0
    if kind == "matmul":
        accesses = _prod(dom["outputs"][0]) * float(ins[1][-2])
    else:
        groups = max(int(attrs.get("groups", 1) or 1), 1)
        accesses = _prod(dom["outputs"][0]) * max(int(ins[0][1]) // groups, 1) * float(ins[1][2])
    return share * accesses * LINE_BYTES / float(dev["mem_bandwidth"])


def roofline_costs(graph, cluster) -> np.ndarray:
    """``[nodes, devices]`` seconds for every node of ``graph``."""
    return np.array([[node_seconds(nd, dev) for dev in cluster.devices] for nd in graph.nodes]).reshape(
        graph.num_nodes, cluster.num_devices)


def roofline_candidate_costs(cs, cluster) -> np.ndarray:
    """``[candidates, devices]`` seconds; ``inf`` where the candidate's backend does not run
    on the device's kind."""
    # lazy: loads TVM's compiler, which importing this module does not
    from ...backends import get_backend

    graph = cs.rg.graph
    out = np.empty((len(cs), cluster.num_devices))
    for i, c in enumerate(cs):
        node = graph.merged(c.nodes)
        bk = get_backend(c.backend)
        for j, dev in enumerate(cluster.devices):
            out[i, j] = node_seconds(node, dev) if bk.supports_device(dev) else np.inf
    return out
