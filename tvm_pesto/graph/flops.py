"""FLOP counts per Relax operator, table driven.

Conventions: a multiply-accumulate is 2 FLOPs; an elementwise op is 1 FLOP per output
element; softmax is 5 per element (max, subtract, exp, sum, divide); layer/group norm 8
per element; a reduction 1 per input element; data movement (reshape, transpose, concat,
take, ...) 0.
"""
from __future__ import annotations

import functools

import numpy as np

from .opgraph import TensorSpec

ELEMENTWISE = {
    "add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum",
    "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu", "sigmoid", "tanh", "exp", "log", "sqrt",
    "rsqrt", "negative", "abs", "clip", "erf", "astype", "where", "equal", "not_equal", "less",
    "greater", "less_equal", "greater_equal", "nn.leakyrelu", "nn.prelu", "square", "floor",
    "ceil", "round", "sin", "cos", "logical_and", "logical_or", "logical_not", "bitwise_and",
    "nn.dropout", "hardswish", "nn.hardswish", "mod", "floor_mod", "sign", "zeros_like",
    "ones_like", "full_like", "nn.selu", "nn.softplus", "nn.elu",
}
MOVEMENT = {
    "reshape", "permute_dims", "concat", "split", "take", "strided_slice", "squeeze",
    "expand_dims", "broadcast_to", "flatten", "repeat", "tile", "flip", "layout_transform",
    "dynamic_strided_slice", "zeros", "ones", "full", "arange", "collapse_sum_like", "stack",
    "scatter_elements", "gather_elements", "one_hot", "tril", "triu",
}
REDUCTION = {"sum", "mean", "max", "min", "prod", "variance", "std", "argmax", "argmin", "cumsum"}


def _short(op: str) -> str:
    return op[len("relax."):] if op.startswith("relax.") else op


def op_flops(op: str, attrs: dict, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> float:
    """FLOPs of one operator call given its attributes and static shapes.

    Examples
    --------
    >>> from tvm_pesto.graph.opgraph import TensorSpec as T
    >>> op_flops("relax.matmul", {}, [T((2, 3)), T((3, 4))], [T((2, 4))])
    48.0
    """
    name = _short(op)
    out_elems = float(sum(t.size for t in outputs))
    if name in ("nn.conv2d", "nn.conv1d", "nn.conv3d") and len(inputs) >= 2:
        w = inputs[1].shape  # OIHW / OIW / OIDHW
        layout = str(attrs.get("kernel_layout", "OIHW"))
        o_axis = layout.index("O") if "O" in layout else 0
        # The weight already holds in_channels / groups, so this covers grouped convs.
        per_out = float(np.prod(w, dtype=np.float64)) / w[o_axis]
        return 2.0 * out_elems * per_out
    if name in ("nn.conv2d_transpose", "nn.conv1d_transpose") and len(inputs) >= 2:
        w = inputs[1].shape  # IOHW
        return 2.0 * float(inputs[0].size) * float(np.prod(w[1:], dtype=np.float64))
    if name in ("matmul", "nn.dense", "linear") and len(inputs) >= 2:
        k = inputs[0].shape[-1] if inputs[0].shape else 1
        return 2.0 * out_elems * k
    if name in ("nn.softmax", "nn.log_softmax"):
        return 5.0 * out_elems
    if name in ("nn.layer_norm", "nn.group_norm", "nn.rms_norm", "nn.batch_norm", "nn.instance_norm"):
        return 8.0 * float(inputs[0].size) if inputs else 0.0
    if name in ("nn.max_pool2d", "nn.avg_pool2d", "nn.max_pool1d", "nn.avg_pool1d", "nn.max_pool3d", "nn.avg_pool3d"):
        pool = attrs.get("pool_size", (1, 1))
        return out_elems * float(np.prod(pool, dtype=np.float64))
    if name in ("nn.adaptive_avg_pool2d", "nn.adaptive_avg_pool1d", "nn.adaptive_max_pool2d") and inputs:
        return float(inputs[0].size)
    if name in REDUCTION:
        return float(inputs[0].size) if inputs else 0.0
    if name in ELEMENTWISE:
        return out_elems
    if name in ("nn.attention", "nn.attention_bias") and len(inputs) >= 3:
        b, s, h, d = inputs[0].shape
        sk = inputs[1].shape[1]
        return 4.0 * b * h * s * sk * d + 5.0 * b * h * s * sk
    return 0.0


@functools.lru_cache(maxsize=1024)
def op_category(op: str) -> str:
    """One of ``anchor`` (conv/matmul/attention), ``elementwise``, ``movement``,
    ``reduction``, ``softmax``, ``norm``, ``pool`` or ``other``."""
    name = _short(op)
    if name.startswith("nn.conv") or name in ("matmul", "nn.dense", "linear", "nn.attention", "nn.attention_bias"):
        return "anchor"
    if name in ELEMENTWISE:
        return "elementwise"
    if name in MOVEMENT:
        return "movement"
    if name in REDUCTION:
        return "reduction"
    if name in ("nn.softmax", "nn.log_softmax"):
        return "softmax"
    if "norm" in name:
        return "norm"
    if "pool" in name:
        return "pool"
    return "other"
