"""Features of a (subgraph, backend, device) triple for the learned cost model.

A subgraph is first turned into a *description*: a small JSON-ready dict with its op
list, the shapes and attributes of its dominant op, its FLOPs and bytes. The profiler
stores that description in every log record, so a model can be (re)trained from the
logs alone, without the Relax IR. :func:`feature_vector` then maps a description, a
device descriptor, a backend name and a tuning flag to a fixed-length float vector
(:data:`FEATURE_NAMES`); the mapping is a pure function, so equal inputs give equal
features on every run and machine.

Examples
--------
>>> from tvm_pesto.graph import OpGraph, OpNode
>>> from tvm_pesto.graph.opgraph import TensorSpec as T
>>> g = OpGraph([OpNode("mm", "relax.matmul", {}, (T((64, 32)), T((32, 16))), (T((64, 16)),),
...                     flops=2 * 64 * 32 * 16, bytes_read=(64 * 32 + 32 * 16) * 4, bytes_written=64 * 16 * 4)], [])
>>> desc = describe_group(g, [0])
>>> desc["dominant"]["op"], desc["flops"]
('relax.matmul', 65536.0)
>>> dev = {"kind": "cpu", "model": "host-cpu", "peak_flops": 1e11, "mem_bandwidth": 1e10,
...        "memory_bytes": 8e9, "cores": 1}
>>> feature_vector(desc, dev, "tvm").shape == (len(FEATURE_NAMES),)
True
"""
from __future__ import annotations

import json
import math
import weakref
from typing import Iterable, Sequence

import numpy as np

from ...graph.flops import op_category
from ...graph.opgraph import OpGraph, dtype_bytes
from .caches import l2_sets_of, strided_reduction

#: Version of the description schema written into log records (2 added per-category totals).
DESC_VERSION = 2

#: Backends with a one-hot column (anything else sets ``backend=other``). The order is fixed:
#: appending is fine, reordering changes every trained model's input.
KNOWN_BACKENDS = ("tvm", "tvm-ms", "onnxruntime", "torch", "cublas", "cudnn", "cutlass", "tensorrt", "triton",
                  "openvino", "onnxruntime-parallel", "inductor")

CATEGORIES = ("anchor", "elementwise", "movement", "reduction", "softmax", "norm", "pool", "other")

DOMINANT_KINDS = (
    "conv2d", "depthwise_conv2d", "conv_other", "matmul", "attention", "softmax", "layer_norm", "batch_norm",
    "norm_other", "max_pool", "avg_pool", "adaptive_pool", "reduction", "elementwise", "reshape", "permute_dims",
    "concat", "split", "take", "strided_slice", "movement_other", "other",
)

#: Ops that evaluate exp, log, erf or tanh per element: TVM's untuned CPU code does not
#: vectorise them, so they cost far more per element than an add (a SiLU against a ReLU of
#: the same shape: ``python -m tvm_pesto_lab.unscheduled_kernels`` measures both).
TRANSCENDENTAL = frozenset({
    "exp", "log", "sigmoid", "tanh", "erf", "sin", "cos", "power", "nn.silu", "nn.gelu", "nn.gelu_tanh",
    "nn.softmax", "nn.log_softmax", "nn.softplus", "nn.selu", "nn.elu",
})

#: Dominant kinds that are convolutions (the ``conv_*`` features are theirs).
_CONV_KINDS = ("conv2d", "depthwise_conv2d", "conv_other")

#: Floor for time-like quantities (s) so logs stay finite.
TIME_FLOOR_S = 1e-9


def _names() -> tuple[str, ...]:
    n = ["n_ops"] + [f"count_{c}" for c in CATEGORIES] + [f"dom_{k}" for k in DOMINANT_KINDS]
    n += ["log2_flops", "log2_bytes_read", "log2_bytes_written", "log2_param_bytes", "log2_fusion_saved",
          "log2_member_bytes", "log2_in_elems", "log2_out_elems", "log2_intensity", "dtype_bytes",
          "conv_kh", "conv_kw", "conv_stride", "conv_dilation", "log2_conv_groups", "conv_depthwise",
          "log2_conv_cin", "log2_conv_cout", "log2_conv_out_hw", "conv_pad",
          "log2_mm_m", "log2_mm_n", "log2_mm_k", "log2_mm_batch", "mm_weight_const",
          "out_rank", "log2_out_last", "out_last_mult8", "log2_red_len",
          "n_outputs", "out_last_mult4", "out_last_pow2", "log2_out_last2", "n_anchor_ops"]
    n += ["log2_red_stride", "log2_red_lines", "log2_red_l1_conflict", "log2_red_l2_conflict",
          "log2_conv_gemm_k", "dom_n_inputs", "dom_broadcast", "n_transcendental", "log2_transcendental_elems"]
    n += [f"log2_flops_{c}" for c in CATEGORIES] + [f"log2_bytes_{c}" for c in CATEGORIES]
    n += [
          "log10_peak_flops", "log10_bandwidth", "log10_memory", "cores", "is_gpu",
          "log10_roofline_s", "log10_flop_s", "log10_byte_s"]
    n += [f"backend_{b}" for b in KNOWN_BACKENDS] + ["backend_other", "tuned"]
    return tuple(n)


#: Names of the feature vector's entries, in order.
FEATURE_NAMES: tuple[str, ...] = _names()


def _short(op: str) -> str:
    return op[len("relax."):] if op.startswith("relax.") else op


def _jsonable_attrs(attrs: dict) -> dict:
    out = {}
    for k, v in sorted((attrs or {}).items()):
        if isinstance(v, bool) or isinstance(v, (int, float)):
            out[k] = v
        elif isinstance(v, str):
            out[k] = v[:32]
        elif isinstance(v, (tuple, list)) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
            out[k] = [x for x in v][:8]
    return out


def _dominant(nodes: Sequence) -> int:
    """Index of the member doing the most work: FLOPs first, then anchor ops, then bytes."""
    def rank(i):
        nd = nodes[i]
        return (nd.flops, op_category(nd.op) == "anchor", nd.bytes_read + nd.bytes_written, -i)

    return max(range(len(nodes)), key=rank)


#: Per op graph: node set -> its description (and its JSON), worked out once per graph.
_DESCRIBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def describe_group(graph: OpGraph, node_ids: Iterable[int]) -> dict:
    """The description of the subgraph made of ``node_ids`` of ``graph`` (an op graph),
    worked out once per graph and node set (the flow describes each candidate for its
    prediction, its measurement keys and each core shape it places on): not to be changed.

    Bytes are counted as :meth:`OpGraph.contract` counts them: reads minus the tensors
    produced inside the group, writes of the tensors that leave it (or the last output).

    Returns
    -------
    dict
        ``ops``, ``dominant`` (``op``, ``attrs``, ``inputs``, ``outputs``), ``out_shapes``,
        ``dtype``, ``flops``, ``bytes_read``, ``bytes_written``, ``param_bytes`` and
        ``member_bytes`` (reads + writes of the members as separate kernels).

    Examples
    --------
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode("a", "relax.add", bytes_read=8, bytes_written=4),
    ...              OpNode("r", "relax.nn.relu", bytes_read=4, bytes_written=4)], [(0, 1, 4)])
    >>> d = describe_group(g, [0, 1])
    >>> d["bytes_read"], d["bytes_written"], d["member_bytes"]
    (8, 4, 20)
    """
    members = frozenset(int(v) for v in node_ids)
    if not members:
        raise ValueError("describe_group needs at least one node")
    memo = _DESCRIBED.setdefault(graph, {})
    if members not in memo:
        memo[members] = (_describe(graph, sorted(members, key=graph.topo_position().__getitem__)), None)
    return memo[members][0]


def description_json(graph: OpGraph, node_ids: Iterable[int]) -> str:
    """:func:`describe_group` as sorted JSON, worked out once per graph and node set: equal
    descriptions (repeated layers, repeated shapes) give equal strings.

    Examples
    --------
    >>> from tvm_pesto.graph import OpGraph, OpNode
    >>> g = OpGraph([OpNode("a", "relax.add", bytes_read=8, bytes_written=4),
    ...              OpNode("b", "relax.add", bytes_read=8, bytes_written=4)], [])
    >>> description_json(g, [0]) == description_json(g, [1])
    True
    """
    members = frozenset(int(v) for v in node_ids)
    desc = describe_group(graph, members)
    memo = _DESCRIBED[graph]
    if memo[members][1] is None:
        memo[members] = (desc, json.dumps(desc, sort_keys=True, default=str))
    return memo[members][1]


def _describe(graph: OpGraph, members: list[int]) -> dict:
    """:func:`describe_group` of ``members``, in topological order."""
    mset = set(members)
    nodes = [graph.nodes[v] for v in members]
    internal = sum(graph.dag.edges[u, v]["bytes"] for u in members for v in graph.dag.successors(u) if v in mset)
    outs = []
    for v in members:
        succ = list(graph.dag.successors(v))
        if not succ or any(s not in mset for s in succ):
            outs.extend(graph.nodes[v].outputs)
    if not outs:
        outs = list(nodes[-1].outputs)
    read = max(sum(nd.bytes_read for nd in nodes) - internal, 0)
    written = sum(t.nbytes for t in outs) if outs else nodes[-1].bytes_written
    dom = nodes[_dominant(nodes)]
    cats = [op_category(nd.op) for nd in nodes]
    dts = [t.dtype for t in dom.outputs] or [t.dtype for t in dom.inputs] or ["float32"]
    return {
        "v": DESC_VERSION,
        "ops": [nd.op for nd in nodes],
        "dominant": {
            "op": dom.op, "attrs": _jsonable_attrs(dom.attrs),
            "inputs": [list(t.shape) for t in dom.inputs][:6],
            "outputs": [list(t.shape) for t in dom.outputs][:4],
        },
        "out_shapes": [list(t.shape) for t in outs][:4],
        "dtype": dts[0],
        "flops": float(sum(nd.flops for nd in nodes)),
        "bytes_read": int(read),
        "bytes_written": int(written),
        "param_bytes": int(sum(nd.param_bytes for nd in nodes)),
        "member_bytes": int(sum(nd.bytes_read + nd.bytes_written for nd in nodes)),
        "cat_flops": [float(sum(nd.flops for nd, k in zip(nodes, cats) if k == c)) for c in CATEGORIES],
        "cat_bytes": [int(sum(nd.bytes_read + nd.bytes_written for nd, k in zip(nodes, cats) if k == c))
                      for c in CATEGORIES],
    }


def device_descriptor(device) -> dict:
    """The device fields the model uses, from a :class:`~tvm_pesto.cluster.Device`.

    Examples
    --------
    >>> from tvm_pesto.cluster import parse_cluster
    >>> device_descriptor(parse_cluster("h200").devices[0])["model"]
    'H200'
    """
    out = {
        "kind": str(device.kind), "model": str(device.model or device.name),
        "peak_flops": float(device.peak_flops), "mem_bandwidth": float(device.mem_bandwidth),
        "memory_bytes": float(device.memory_bytes), "cores": int(device.cores),
    }
    if getattr(device, "cpu_kind", ""):
        out["cpu_kind"] = str(device.cpu_kind)
    if getattr(device, "l2_sets", 0) and getattr(device, "l2_ways", 0):
        out["l2_sets"], out["l2_ways"] = int(device.l2_sets), int(device.l2_ways)
    return out


def device_size_key(dev: dict) -> str:
    """``kind/model/cores``: the device size, whatever CPU it runs on.

    Examples
    --------
    >>> device_size_key({"kind": "cpu", "model": "host-cpu", "cores": 1, "cpu_kind": "AuthenticAMD/23/1"})
    'cpu/host-cpu/1'
    """
    return f"{dev['kind']}/{dev['model']}/{int(dev['cores'])}"


def device_key(dev: dict) -> str:
    """``kind/model/cores`` and, where the descriptor has one, ``@cpu_kind``: how devices are
    told apart in training rows, reports, calibrations and coverage checks. A one-core device
    of two kinds of CPU are two devices (the same kernels run at different speeds on them).

    Examples
    --------
    >>> device_key({"kind": "cpu", "model": "host-cpu", "cores": 1, "cpu_kind": "AuthenticAMD/23/1"})
    'cpu/host-cpu/1@AuthenticAMD/23/1'
    >>> device_key({"kind": "gpu", "model": "H200", "cores": 132})
    'gpu/H200/132'
    """
    kind = dev.get("cpu_kind")
    return device_size_key(dev) + (f"@{kind}" if kind else "")


def roofline_s(desc: dict, dev: dict) -> float:
    """max(FLOPs / peak, bytes / bandwidth) in seconds, floored at :data:`TIME_FLOOR_S`."""
    nbytes = float(desc["bytes_read"]) + float(desc["bytes_written"])
    return max(float(desc["flops"]) / dev["peak_flops"], nbytes / dev["mem_bandwidth"], TIME_FLOOR_S)


def dominant_kind(op: str, attrs: dict | None = None, inputs=None) -> str:
    """Coarse kind of an op, one of :data:`DOMINANT_KINDS`.

    Examples
    --------
    >>> dominant_kind("relax.nn.conv2d", {"groups": 1})
    'conv2d'
    >>> dominant_kind("relax.permute_dims")
    'permute_dims'
    """
    name = _short(op)
    attrs = attrs or {}
    if name == "nn.conv2d":
        g = int(attrs.get("groups", 1) or 1)
        if g > 1 and inputs and len(inputs) >= 2 and len(inputs[1]) == 4 and inputs[1][1] == 1:
            return "depthwise_conv2d"
        return "conv2d"
    if name.startswith("nn.conv"):
        return "conv_other"
    if name in ("matmul", "nn.dense", "linear"):
        return "matmul"
    if name.startswith("nn.attention"):
        return "attention"
    if name in ("nn.softmax", "nn.log_softmax"):
        return "softmax"
    if name in ("nn.layer_norm", "nn.rms_norm"):
        return "layer_norm"
    if name == "nn.batch_norm":
        return "batch_norm"
    if "norm" in name:
        return "norm_other"
    if "adaptive" in name and "pool" in name:
        return "adaptive_pool"
    if "max_pool" in name:
        return "max_pool"
    if "avg_pool" in name:
        return "avg_pool"
    if name in ("reshape", "permute_dims", "concat", "split", "take", "strided_slice"):
        return name
    cat = op_category(op)
    if cat in ("reduction", "elementwise"):
        return cat
    if cat == "movement":
        return "movement_other"
    return "other"


def _l2(x: float) -> float:
    return math.log2(1.0 + max(float(x), 0.0))


def _prod(shape) -> float:
    # math.prod over floats multiplies in the order np.prod(float64) does (bit-identical on
    # the bundled data's 18,704 rows) at half the feature time of 18k rows
    return float(math.prod(float(d) for d in shape)) if shape else 1.0


def _dtype_size(desc: dict) -> float:
    """Bytes per element of the description's dtype (4 for a dtype :func:`dtype_bytes` does not know)."""
    try:
        return float(dtype_bytes(str(desc.get("dtype", "float32"))))
    except Exception:  # noqa: BLE001 - unknown dtype: treat as 4 bytes
        return 4.0


def _conv_features(kind: str, ins: list, attrs: dict, dom: dict) -> list[float]:
    """``conv_kh`` .. ``conv_pad`` of :data:`FEATURE_NAMES`: the dominant convolution's kernel,
    stride, dilation, groups, channels, output size and padding; zeros for other ops."""
    if not (kind in _CONV_KINDS and len(ins) >= 2 and len(ins[1]) >= 3):
        return [0.0] * 10
    w = ins[1]
    kh = float(w[2]) if len(w) > 2 else 1.0
    kw = float(w[3]) if len(w) > 3 else 1.0
    strides = list(attrs.get("strides", [1])) or [1]
    dil = list(attrs.get("dilation", [1])) or [1]
    pad = list(attrs.get("padding", [0])) or [0]
    groups = float(attrs.get("groups", 1) or 1)
    cin = float(ins[0][1]) if len(ins[0]) > 1 else 1.0
    o = dom.get("outputs", [[1]])[0] if dom.get("outputs") else [1]
    out_hw = _prod(o[2:]) if len(o) > 2 else 1.0
    return [kh, kw, float(strides[0]), float(dil[0]), _l2(groups), 1.0 if kind == "depthwise_conv2d" else 0.0,
            _l2(cin), _l2(float(w[0])), _l2(out_hw), float(sum(pad))]


def _matmul_features(kind: str, ins: list, desc: dict) -> list[float]:
    """``log2_mm_m`` .. ``mm_weight_const`` of :data:`FEATURE_NAMES`: the dominant matmul's
    sizes and whether its weight is a constant; zeros for other ops."""
    if not (kind == "matmul" and len(ins) >= 2 and ins[0] and ins[1]):
        return [0.0] * 5
    a, b = ins[0], ins[1]
    k = float(a[-1])
    m = float(a[-2]) if len(a) >= 2 else 1.0
    n = float(b[-1]) if len(b) >= 2 else 1.0
    batch = _prod(a[:-2]) if len(a) > 2 else 1.0
    return [_l2(m), _l2(n), _l2(k), _l2(batch), 1.0 if float(desc.get("param_bytes", 0)) > 0 else 0.0]


def _output_features(ins: list, outs: list, cats: list) -> list[float]:
    """``out_rank`` .. ``n_anchor_ops`` of :data:`FEATURE_NAMES`: the first output's rank and
    innermost sizes (and their alignment), the first input's innermost size, the number of
    outputs and of anchor ops."""
    o0 = outs[0] if outs else []
    last = float(o0[-1]) if o0 else 1.0
    red = float(ins[0][-1]) if ins and ins[0] else 1.0
    f = [float(len(o0)), _l2(last), 1.0 if int(last) % 8 == 0 else 0.0, _l2(red)]
    last2 = _prod(o0[-2:]) if o0 else 1.0
    return f + [float(len(outs)), 1.0 if int(last) % 4 == 0 else 0.0,
                1.0 if int(last) & (int(last) - 1) == 0 else 0.0, _l2(last2), float(cats.count("anchor"))]


def _access_features(kind: str, ins: list, attrs: dict, dtb: float, dom: dict, ops: list,
                     out_elems: float, dev: dict) -> list[float]:
    """``log2_red_stride`` .. ``log2_transcendental_elems`` of :data:`FEATURE_NAMES`: how the
    unscheduled code walks the dominant op's operands (:func:`strided_reduction`, a
    convolution's GEMM reduction length, broadcast inputs) and how many elements pass
    through :data:`TRANSCENDENTAL` ops."""
    f = [_l2(x) for x in strided_reduction(kind, ins, attrs, dtb, l2_sets_of(dev))]
    gemm_k = _prod(ins[1][1:]) if kind in _CONV_KINDS and len(ins) >= 2 else 0.0
    dom_out = _prod(dom["outputs"][0]) if dom.get("outputs") else out_elems
    f += [_l2(gemm_k), float(len(ins)), 1.0 if any(_prod(s) < dom_out for s in ins[1:]) else 0.0]
    n_trans = float(sum(_short(o.split("+")[0]) in TRANSCENDENTAL for o in ops))
    return f + [n_trans, _l2(n_trans * max(out_elems, dom_out))]


def _category_totals(desc: dict, dom: dict, flops: float, member: float) -> list[float]:
    """``log2_flops_<category>`` and ``log2_bytes_<category>`` of :data:`FEATURE_NAMES`
    (descriptions before version 2 lack them: everything counts as the dominant op's)."""
    cf, cb = desc.get("cat_flops"), desc.get("cat_bytes")
    if cf is None or cb is None:
        dcat = op_category(dom["op"])
        cf = [flops if c == dcat else 0.0 for c in CATEGORIES]
        cb = [member if c == dcat else 0.0 for c in CATEGORIES]
    return [_l2(x) for x in cf] + [_l2(x) for x in cb]


def _device_features(desc: dict, dev: dict, flops: float, br: float, bw: float) -> list[float]:
    """``log10_peak_flops`` .. ``log10_byte_s`` of :data:`FEATURE_NAMES`: the device's size and
    the subgraph's roofline times on it."""
    peak, bwd = float(dev["peak_flops"]), float(dev["mem_bandwidth"])
    return [math.log10(peak), math.log10(bwd), math.log10(max(float(dev.get("memory_bytes", 1.0)), 1.0)),
            float(dev.get("cores", 1)), 1.0 if dev.get("kind") == "gpu" else 0.0,
            math.log10(roofline_s(desc, dev)), math.log10(max(flops / peak, TIME_FLOOR_S)),
            math.log10(max((br + bw) / bwd, TIME_FLOOR_S))]


def feature_vector(desc: dict, dev: dict, backend: str, tuned: float = 0.0) -> np.ndarray:
    """The features of ``desc`` run by ``backend`` on device ``dev`` (see :data:`FEATURE_NAMES`).

    Parameters
    ----------
    desc : dict
        From :func:`describe_group` (or a log record's ``desc``).
    dev : dict
        From :func:`device_descriptor`.
    backend : str
        Backend name; names outside :data:`KNOWN_BACKENDS` share the ``backend_other`` column.
    tuned : float
        The share of the subgraph's work in kernels a MetaSchedule database holds schedules
        for (``tvm-ms``: :meth:`~tvm_pesto.backends.tvm_cpu.TvmMetaScheduleBackend.tuned_fraction`;
        1 for a tuning record itself, 0 for untuned code).

    Returns
    -------
    ndarray of float64, shape ``(len(FEATURE_NAMES),)``

    Examples
    --------
    >>> d = {"ops": ["relax.nn.relu"], "dominant": {"op": "relax.nn.relu", "attrs": {}, "inputs": [[4, 8]],
    ...      "outputs": [[4, 8]]}, "out_shapes": [[4, 8]], "dtype": "float32", "flops": 32.0,
    ...      "bytes_read": 128, "bytes_written": 128, "param_bytes": 0, "member_bytes": 256}
    >>> dev = {"kind": "cpu", "model": "x", "peak_flops": 1e11, "mem_bandwidth": 1e10, "memory_bytes": 8e9, "cores": 1}
    >>> f = feature_vector(d, dev, "torch")
    >>> float(f[FEATURE_NAMES.index("backend_torch")]), float(f[FEATURE_NAMES.index("dom_elementwise")])
    (1.0, 1.0)
    """
    ops = list(desc["ops"])
    dom = desc["dominant"]
    attrs = dom.get("attrs", {}) or {}
    ins = [list(s) for s in dom.get("inputs", [])]
    outs = [list(s) for s in desc.get("out_shapes", [])] or [list(s) for s in dom.get("outputs", [])]
    cats = [op_category(o.split("+")[0]) for o in ops]
    f: list[float] = [float(len(ops))] + [float(cats.count(c)) for c in CATEGORIES]
    kind = dominant_kind(dom["op"], attrs, ins)
    f += [1.0 if kind == k else 0.0 for k in DOMINANT_KINDS]
    flops = float(desc["flops"])
    br, bw = float(desc["bytes_read"]), float(desc["bytes_written"])
    member = float(desc.get("member_bytes", br + bw))
    in_elems = _prod(ins[0]) if ins else 0.0
    out_elems = sum(_prod(s) for s in outs)
    dtb = _dtype_size(desc)
    f += [_l2(flops), _l2(br), _l2(bw), _l2(desc.get("param_bytes", 0)), _l2(max(member - br - bw, 0.0)),
          _l2(member), _l2(in_elems), _l2(out_elems), _l2(flops / max(br + bw, 1.0)), dtb]
    f += _conv_features(kind, ins, attrs, dom)
    f += _matmul_features(kind, ins, desc)
    f += _output_features(ins, outs, cats)
    f += _access_features(kind, ins, attrs, dtb, dom, ops, out_elems, dev)
    f += _category_totals(desc, dom, flops, member)
    f += _device_features(desc, dev, flops, br, bw)
    f += [1.0 if backend == b else 0.0 for b in KNOWN_BACKENDS]
    f += [0.0 if backend in KNOWN_BACKENDS else 1.0, min(max(float(tuned), 0.0), 1.0)]
    arr = np.asarray(f, dtype=np.float64)
    assert arr.shape == (len(FEATURE_NAMES),), (arr.shape, len(FEATURE_NAMES))
    return arr


def feature_matrix(rows: Sequence[dict]) -> np.ndarray:
    """Stack :func:`feature_vector` over rows with ``desc``, ``device``, ``backend``, ``tuned``."""
    if not rows:
        return np.zeros((0, len(FEATURE_NAMES)))
    return np.stack([feature_vector(r["desc"], r["device"], r["backend"], float(r.get("tuned", 0.0)))
                     for r in rows])


__all__ = ["DESC_VERSION", "FEATURE_NAMES", "KNOWN_BACKENDS", "TRANSCENDENTAL", "describe_group", "device_descriptor",
           "device_key", "device_size_key", "dominant_kind", "feature_matrix", "feature_vector", "roofline_s"]
