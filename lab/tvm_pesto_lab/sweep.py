"""Shape sweeps: synthetic Relax modules whose groups cover op shapes the zoo does not.

Each sweep *family* is one module whose ``main`` runs many independent branches (one per
shape configuration) and returns them as a tuple, so one profile run (one compile)
measures all of them. Families: ``conv2d`` (kernel, stride, groups, channels, size; with
bias+ReLU or batch norm), ``matmul`` (2-d and batched, with bias and activation),
``attention`` (QK^T, scale, softmax, ·V), ``elementwise`` (chains of 1-4 ops, layer norm,
softmax, reductions), ``pool``, ``movement`` (reshape, transpose, concat, split), ``small``
(ops of a few microseconds: bias and residual adds, activations, norms, splits, odd
sizes), ``conv1x1`` (pointwise and strided 1x1 convolutions) and ``large`` (shapes of the
other families whose operands are past the L2, 1-6 MiB: what a model at its full size does
to the caches, in shapes no model has).

Shapes are kept small enough that profiling a family's unscheduled TVM kernels stays quick
(``large``: a few seconds each).
``tvm-pesto profile sweep`` (:func:`tvm_pesto_lab.profile.profile_zoo`) measures them.
Weights are seeded constants, so the modules (and their structural keys) are the same on
every run.

Examples
--------
>>> from tvm_pesto_lab.sweep import FAMILIES, sweep_module
>>> sorted(FAMILIES)[:2]
['attention', 'conv1x1']
>>> mod = sweep_module("movement", limit=2)
>>> len(mod["main"].params)
2
"""
from __future__ import annotations

import zlib
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from tvm_pesto.errors import CostError

_RNG_SEED = 0


class _Builder:
    """Collects branches: each adds parameters and returns one output expression."""

    def __init__(self, seed: int = _RNG_SEED):
        self.rng = np.random.default_rng(seed)
        self.params: list = []
        self.branches: list[Callable] = []

    def const(self, shape, scale=0.1):
        return relax.const((self.rng.standard_normal(shape) * scale).astype("float32"))

    def input(self, shape, dtype="float32"):
        v = relax.Var(f"x{len(self.params)}", relax.TensorType(tuple(int(s) for s in shape), dtype))
        self.params.append(v)
        return v

    def build(self) -> tvm.IRModule:
        bb = relax.BlockBuilder()
        with bb.function("main", self.params):
            with bb.dataflow():
                outs = [fn(bb) for fn in self.branches]
                ret = bb.emit_output(relax.Tuple(outs) if len(outs) > 1 else outs[0])
            bb.emit_func_output(ret)
        return bb.get()


R = relax.op


def _act(bb, y, act):
    if act == "relu":
        return bb.emit(R.nn.relu(y))
    if act == "gelu":
        return bb.emit(R.nn.gelu(y))
    if act == "sigmoid":
        return bb.emit(R.sigmoid(y))
    if act == "tanh":
        return bb.emit(R.tanh(y))
    if act == "clip":
        return bb.emit(R.clip(y, 0.0, 6.0))
    return y


def _chain(b: _Builder, x, ops, gamma, beta, own: dict):
    """Add the branch that passes ``x`` through ``ops`` in turn: an op that ``own`` names by
    its function of ``(bb, y)``, any other as :func:`_common_op` does (with ``gamma`` and ``beta``)."""

    def fn(bb):
        y = x
        for op in ops:
            y = own[op](bb, y) if op in own else _common_op(bb, y, op, gamma, beta)
        return y

    b.branches.append(fn)


def _common_op(bb, y, op, gamma, beta):
    """``y`` through ``op``, one of the ops the ``elementwise`` and ``small`` chains share: a
    layer norm over the last axis (scaled by ``gamma``, shifted by ``beta``), a softmax over
    it, a mean over it, a sum over axes 2 and 3, or an activation (:func:`_act`)."""
    if op == "layer_norm":
        return bb.emit(R.nn.layer_norm(y, gamma, beta, axes=[-1]))
    if op == "softmax":
        return bb.emit(R.nn.softmax(y, axis=-1))
    if op == "mean":
        return bb.emit(R.mean(y, axis=[-1], keepdims=True))
    if op == "sum":
        return bb.emit(R.sum(y, axis=[2, 3]))
    return _act(bb, y, op)


# (cin, cout, hw, k, stride, groups, tail) with tail in {"bias_relu", "bn_relu", "bias", "bn"}
CONV_CONFIGS = [
    (3, 16, 64, 3, 1, 1, "bias_relu"), (3, 32, 96, 3, 2, 1, "bn_relu"), (3, 24, 96, 7, 2, 1, "bias_relu"),
    (8, 8, 48, 3, 1, 1, "bias_relu"), (16, 16, 32, 3, 1, 1, "bn_relu"), (16, 32, 32, 3, 2, 1, "bias"),
    (32, 32, 16, 3, 1, 1, "bias_relu"), (32, 64, 16, 1, 1, 1, "bn"), (64, 64, 8, 3, 1, 1, "bias_relu"),
    (64, 128, 8, 1, 1, 1, "bn_relu"), (128, 128, 4, 3, 1, 1, "bias_relu"), (128, 32, 8, 1, 1, 1, "bn"),
    (16, 8, 24, 1, 1, 1, "bias_relu"), (24, 24, 24, 5, 1, 1, "bias"), (48, 48, 12, 3, 1, 1, "bn_relu"),
    (12, 12, 24, 3, 1, 12, "bn_relu"), (32, 32, 16, 3, 1, 32, "bn_relu"), (64, 64, 8, 3, 2, 64, "bn"),
    (96, 96, 12, 3, 1, 96, "bn_relu"), (24, 24, 32, 5, 1, 24, "bias"), (16, 16, 32, 3, 1, 4, "bias_relu"),
    (8, 32, 40, 1, 1, 1, "bias_relu"), (40, 40, 20, 3, 1, 1, "bias_relu"), (20, 40, 20, 5, 2, 1, "bn_relu"),
    (16, 24, 17, 3, 1, 1, "bn_relu"), (24, 16, 35, 1, 1, 1, "bn"), (4, 8, 128, 3, 1, 1, "bias_relu"),
    (48, 24, 12, 1, 1, 1, "bias_relu"), (32, 48, 9, 3, 1, 1, "bn_relu"), (8, 16, 64, 3, 2, 1, "bn_relu"),
]

# (batch dims, m, k, n, tail) tail in {"", "bias", "bias_relu", "bias_gelu", "bias_add"}
MATMUL_CONFIGS = [
    ((), 1, 256, 256, "bias"), ((), 1, 512, 128, "bias_relu"), ((), 8, 128, 128, "bias_gelu"),
    ((), 16, 256, 64, "bias"), ((), 32, 64, 256, "bias_relu"), ((), 64, 64, 64, ""), ((), 128, 32, 128, "bias"),
    ((), 4, 1024, 64, "bias"), ((), 1, 2048, 10, "bias"), ((), 64, 128, 32, "bias_add"),
    ((1,), 16, 64, 64, "bias"), ((1,), 32, 64, 128, "bias_gelu"), ((1,), 64, 32, 32, "bias_add"),
    ((1,), 24, 96, 96, "bias"), ((1,), 49, 48, 96, "bias_gelu"), ((1,), 96, 49, 49, "bias"),
    ((2,), 32, 32, 64, "bias_relu"), ((1,), 128, 64, 64, "bias_add"), ((1,), 8, 256, 256, "bias_gelu"),
    ((1,), 50, 64, 192, "bias"), ((), 16, 16, 16, ""), ((), 256, 16, 64, "bias_relu"),
]

# (batch, heads, seq, head_dim)
ATTENTION_CONFIGS = [(1, 2, 16, 16), (1, 4, 32, 16), (1, 2, 64, 32), (1, 4, 24, 8), (1, 8, 16, 32),
                     (1, 1, 128, 16), (1, 2, 48, 24), (1, 4, 50, 16), (1, 12, 8, 64)]

# (batch, sequence, heads, head size) of the fused attention op
SDPA_CONFIGS = [(1, 24, 2, 16), (1, 32, 4, 16), (1, 48, 2, 32), (1, 64, 4, 32), (1, 40, 8, 8), (1, 20, 6, 24)]

# (shape, ops) elementwise and friends
ELEMENTWISE_CONFIGS = [
    ((1, 64, 32, 32), ("add",)), ((1, 256), ("relu",)), ((1, 16, 56, 56), ("add", "relu")),
    ((1, 128, 128), ("multiply", "add")), ((1, 32, 64), ("gelu",)), ((4096,), ("sigmoid", "multiply")),
    ((1, 8, 96, 96), ("tanh",)), ((1, 64, 16, 16), ("add", "relu", "multiply", "add")),
    ((1, 49, 192), ("layer_norm",)), ((1, 16, 256), ("layer_norm",)), ((1, 2, 32, 32), ("softmax",)),
    ((1, 4, 64, 64), ("softmax",)), ((1, 128, 64), ("mean",)), ((1, 64, 14, 14), ("sum",)),
    ((1, 32, 28, 28), ("batch_norm", "relu")), ((1, 96, 12, 12), ("batch_norm", "clip")),
    ((1, 16, 112), ("divide", "exp")), ((1, 24, 48, 48), ("clip",)), ((1, 512), ("add", "gelu")),
    ((1, 197, 64), ("layer_norm",)), ((1, 12, 32, 32), ("softmax",)), ((8192,), ("add", "add", "add")),
]

# small ops around the VM call overhead: (shape, ops); "bias" adds a constant over the last axis,
# "residual" adds a second input of the same shape
SMALL_CONFIGS = [
    ((1, 16, 64), ("bias",)), ((1, 32, 128), ("bias",)), ((1, 48, 192), ("bias",)), ((1, 96, 384), ("bias",)),
    ((1, 24, 512), ("bias", "gelu")), ((1, 40, 768), ("bias",)), ((1, 16, 48), ("residual",)),
    ((1, 32, 96), ("residual", "residual")), ((1, 80, 64), ("residual",)), ((1, 128, 256), ("residual",)),
    ((1, 8, 8, 32), ("multiply",)), ((1, 12, 20, 20), ("relu",)), ((1, 24, 14, 14), ("bias", "relu")),
    ((1, 64, 7, 7), ("residual", "relu")), ((1, 200), ("tanh",)), ((1, 36, 300), ("gelu",)),
    ((1, 20, 160), ("layer_norm",)), ((1, 72, 96), ("layer_norm",)), ((1, 3, 40, 40), ("softmax",)),
    ((1, 6, 24, 24), ("softmax",)), ((1, 56, 120), ("split",)), ((1, 30, 90), ("split",)),
    ((1, 10, 6, 50), ("permute",)), ((1, 44, 88), ("reshape",)), ((1, 20, 30, 30), ("sum",)),
    ((1, 100, 40), ("mean",)), ((1, 28, 28, 28), ("bias", "sigmoid", "multiply")),
]

# 1x1 convolutions (pointwise and strided downsampling): (cin, cout, hw, stride, tail)
CONV1X1_CONFIGS = [
    (16, 32, 32, 1, "bn"), (32, 16, 32, 1, "bias"), (32, 64, 32, 2, "bn"), (64, 128, 16, 2, "bn"),
    (128, 256, 8, 2, "bias"), (64, 32, 16, 1, "bias_relu"), (24, 144, 12, 1, "bn_relu"), (144, 24, 12, 1, "bn"),
    (96, 16, 24, 1, "bn"), (256, 64, 4, 1, "bias_relu"), (48, 96, 20, 2, "bn"), (8, 48, 56, 1, "bn_relu"),
    (40, 240, 10, 1, "bias"), (320, 80, 4, 1, "bn"), (12, 24, 48, 2, "bias_relu"), (160, 160, 6, 1, "bn_relu"),
]

# (channels, hw, kind, k, stride)
POOL_CONFIGS = [(16, 64, "max", 3, 2), (32, 32, "max", 2, 2), (64, 16, "avg", 3, 1), (24, 35, "avg", 3, 1),
                (64, 8, "adaptive", 1, 1), (128, 7, "adaptive", 1, 1), (8, 96, "max", 3, 2), (48, 17, "max", 3, 2),
                (32, 24, "avg", 2, 2)]

# (shape, kind)
MOVEMENT_CONFIGS = [((1, 64, 8, 8), "reshape"), ((1, 32, 64), "permute"), ((1, 4, 16, 32), "permute4"),
                    ((1, 16, 24, 24), "concat"), ((1, 96, 48), "split"), ((1, 256, 128), "permute"),
                    ((1, 8, 32, 32), "concat"), ((1, 512, 7, 7), "reshape"), ((1, 16, 64), "permute"),
                    ((1, 12, 50, 64), "permute4"), ((1, 48, 32, 32), "split")]


def _conv(b: _Builder, cin, cout, hw, k, stride, groups, tail):
    x = b.input((1, cin, hw, hw))
    w = b.const((cout, cin // groups, k, k))
    bias = b.const((1, cout, 1, 1))
    bn = [b.const((cout,), 1.0), b.const((cout,)), b.const((cout,)), relax.const(np.ones(cout, "float32"))]

    def fn(bb):
        y = bb.emit(R.nn.conv2d(x, w, strides=(stride, stride), padding=(k // 2, k // 2), groups=groups))
        if tail.startswith("bias"):
            y = bb.emit(R.add(y, bias))
        if tail.startswith("bn"):
            t = bb.emit(R.nn.batch_norm(y, *bn, axis=1, training=False))
            y = bb.emit(relax.TupleGetItem(t, 0))
        return _act(bb, y, "relu") if tail.endswith("relu") else y

    b.branches.append(fn)


def _matmul(b: _Builder, batch, m, k, n, tail):
    x = b.input(tuple(batch) + (m, k))
    w = b.const((n, k))
    bias = b.const((n,))
    res = b.input(tuple(batch) + (m, n)) if tail == "bias_add" else None

    def fn(bb):
        wt = bb.emit(R.permute_dims(w, [1, 0]))
        y = bb.emit(R.matmul(x, wt))
        if tail.startswith("bias"):
            y = bb.emit(R.add(y, bias))
        if tail == "bias_add":
            y = bb.emit(R.add(y, res))
        if tail == "bias_relu":
            y = _act(bb, y, "relu")
        if tail == "bias_gelu":
            y = _act(bb, y, "gelu")
        return y

    b.branches.append(fn)


def _attention(b: _Builder, batch, heads, seq, dim):
    q = b.input((batch, heads, seq, dim))
    k = b.input((batch, heads, seq, dim))
    v = b.input((batch, heads, seq, dim))

    def fn(bb):
        kt = bb.emit(R.permute_dims(k, [0, 1, 3, 2]))
        s = bb.emit(R.matmul(q, kt))
        s = bb.emit(R.multiply(s, relax.const(np.float32(1.0 / np.sqrt(dim)))))
        p = bb.emit(R.nn.softmax(s, axis=-1))
        return bb.emit(R.matmul(p, v))

    b.branches.append(fn)


def _sdpa(b: _Builder, batch, seq, heads, dim):
    """Relax's fused attention op (``R.nn.attention``, sequence-major ``(B, S, H, D)``), as
    the importers emit it for ``scaled_dot_product_attention``."""
    q, k, v = (b.input((batch, seq, heads, dim)) for _ in range(3))
    b.branches.append(lambda bb: bb.emit(R.nn.attention(q, k, v)))


def _elementwise(b: _Builder, shape, ops):
    x = b.input(shape)
    c = b.const(shape[-1:], 1.0)
    gamma, beta = b.const(shape[-1:], 1.0), b.const(shape[-1:])
    ch = shape[1] if len(shape) > 1 else shape[0]
    bn = [b.const((ch,), 1.0), b.const((ch,)), b.const((ch,)), relax.const(np.ones(ch, "float32"))]

    def batch_norm(bb, y):
        t = bb.emit(R.nn.batch_norm(y, *bn, axis=1, training=False))
        return bb.emit(relax.TupleGetItem(t, 0))

    _chain(b, x, ops, gamma, beta, {
        "add": lambda bb, y: bb.emit(R.add(y, c)),
        "multiply": lambda bb, y: bb.emit(R.multiply(y, c)),
        "divide": lambda bb, y: bb.emit(R.divide(y, relax.const(np.float32(3.0)))),
        "exp": lambda bb, y: bb.emit(R.exp(y)),
        "batch_norm": batch_norm,
    })


def _small(b: _Builder, shape, ops):
    x = b.input(shape)
    res = b.input(shape) if "residual" in ops else None
    bias = b.const(shape[-1:], 0.5)
    gamma, beta = b.const(shape[-1:], 1.0), b.const(shape[-1:])

    def split(bb, y):
        t = bb.emit(R.split(y, 3, axis=-1))
        return bb.emit(relax.TupleGetItem(t, 1))

    _chain(b, x, ops, gamma, beta, {
        "bias": lambda bb, y: bb.emit(R.add(y, bias)),
        "residual": lambda bb, y: bb.emit(R.add(y, res)),
        "multiply": lambda bb, y: bb.emit(R.multiply(y, relax.const(np.float32(0.5)))),
        "split": split,
        "permute": lambda bb, y: bb.emit(R.permute_dims(y, [0, 2, 1, 3])),
        "reshape": lambda bb, y: bb.emit(R.reshape(y, (shape[0], shape[1] * shape[2]))),
    })


def _conv1x1(b: _Builder, cin, cout, hw, stride, tail):
    _conv(b, cin, cout, hw, 1, stride, 1, tail)


def _pool(b: _Builder, ch, hw, kind, k, stride):
    x = b.input((1, ch, hw, hw))

    def fn(bb):
        if kind == "max":
            return bb.emit(R.nn.max_pool2d(x, pool_size=(k, k), strides=(stride, stride), padding=(k // 2, k // 2)))
        if kind == "avg":
            return bb.emit(R.nn.avg_pool2d(x, pool_size=(k, k), strides=(stride, stride), padding=(k // 2, k // 2)))
        return bb.emit(R.nn.adaptive_avg_pool2d(x, output_size=(1, 1)))

    b.branches.append(fn)


def _movement(b: _Builder, shape, kind):
    x = b.input(shape)
    y2 = b.input(shape) if kind == "concat" else None

    def fn(bb):
        if kind == "reshape":
            return bb.emit(R.reshape(x, (shape[0], int(np.prod(shape[1:])))))
        if kind == "permute":
            return bb.emit(R.permute_dims(x, [0, 2, 1]))
        if kind == "permute4":
            return bb.emit(R.permute_dims(x, [0, 2, 1, 3]))
        if kind == "permute4_last":
            return bb.emit(R.permute_dims(x, [0, 1, 3, 2]))
        if kind == "channels_last":
            return bb.emit(R.permute_dims(x, [0, 2, 3, 1]))
        if kind == "concat":
            return bb.emit(R.concat([x, y2], axis=1))
        t = bb.emit(R.split(x, 2, axis=1))
        return bb.emit(relax.TupleGetItem(t, 0))

    b.branches.append(fn)


# Past the L2 or at a full-size model's scale: operands an unscheduled kernel walks with a
# stride, or tensors it streams, of 1-6 MiB (the rows above stay under 0.3 MiB), and the
# convolutions, movements and attention of a model at its full input, in shapes no zoo model
# has; as (family, configuration) of the families above. What a model at its full size does
# to the caches and the kernels, taught by shapes of its own.
LARGE_CONFIGS = [
    ("matmul", ((), 96, 640, 1280, "bias")), ("matmul", ((), 64, 512, 1536, "bias_gelu")),
    ("matmul", ((), 160, 896, 896, "bias")), ("matmul", ((), 32, 1024, 1024, "bias_relu")),
    ("matmul", ((), 48, 384, 2048, "bias")), ("matmul", ((), 1, 1536, 1000, "bias")),
    ("matmul", ((1,), 100, 640, 640, "bias_add")), ("matmul", ((), 16, 1280, 640, "bias")),
    ("matmul", ((), 128, 512, 512, "bias")), ("matmul", ((), 200, 576, 1152, "bias_gelu")),
    ("conv2d", (96, 96, 80, 3, 1, 1, "bias_relu")), ("conv2d", (48, 48, 120, 3, 1, 48, "bn_relu")),
    ("conv2d", (160, 160, 36, 3, 1, 160, "bn")), ("conv2d", (64, 128, 72, 3, 2, 1, "bn_relu")),
    ("conv1x1", (256, 64, 48, 1, "bn")), ("conv1x1", (96, 384, 40, 1, "bn_relu")),
    ("conv1x1", (512, 128, 24, 1, "bias")), ("conv1x1", (128, 256, 64, 2, "bn")),
    ("elementwise", ((1, 96, 112, 112), ("add", "relu"))), ("elementwise", ((1, 384, 1000), ("layer_norm",))),
    ("elementwise", ((1, 6, 320, 320), ("softmax",))), ("elementwise", ((1, 48, 160, 160), ("batch_norm", "relu"))),
    ("elementwise", ((1, 300, 1536), ("gelu",))), ("elementwise", ((1, 640, 48, 48), ("sum",))),
    ("movement", ((1, 320, 1024), "permute")), ("movement", ((1, 200, 10, 64), "permute4")),
    ("movement", ((1, 96, 56, 56), "concat")), ("movement", ((1, 192, 48, 48), "split")),
    ("movement", ((1, 1000, 7, 7), "reshape")), ("pool", (96, 112, "max", 3, 2)),
    ("attention", (1, 6, 320, 48)), ("attention", (1, 16, 144, 40)),
    # the convolution regimes of a full-size CNN: few input channels over a large image, many
    # over a small one, depthwise kernels of 3 and 5 on wide layers, and a strided stem
    ("conv1x1", (20, 120, 64, 1, "bn_relu")), ("conv1x1", (12, 80, 104, 1, "bn")),
    ("conv1x1", (40, 240, 40, 1, "bn_relu")), ("conv1x1", (28, 20, 104, 1, "bn")),
    ("conv1x1", (800, 144, 8, 1, "bn")), ("conv1x1", (320, 640, 16, 1, "bn_relu")),
    ("conv1x1", (1536, 384, 9, 1, "bn")), ("conv1x1", (192, 448, 40, 1, "bn")),
    ("conv2d", (120, 120, 48, 3, 1, 120, "bn_relu")), ("conv2d", (480, 480, 12, 3, 1, 480, "bn")),
    ("conv2d", (800, 800, 8, 5, 1, 800, "bn_relu")), ("conv2d", (56, 56, 64, 5, 1, 56, "bn_relu")),
    ("conv2d", (24, 24, 104, 3, 1, 24, "bn_relu")), ("conv2d", (80, 80, 96, 3, 2, 80, "bn")),
    ("conv2d", (320, 320, 20, 5, 1, 320, "bn")), ("conv2d", (256, 256, 12, 3, 1, 1, "bn_relu")),
    ("conv2d", (160, 160, 24, 3, 1, 1, "bn_relu")), ("conv2d", (40, 48, 96, 3, 1, 1, "bn_relu")),
    ("conv2d", (3, 24, 208, 3, 2, 1, "bn_relu")),
    ("elementwise", ((1, 200, 48, 48), ("batch_norm",))), ("elementwise", ((1, 20, 120, 120), ("batch_norm", "relu"))),
    ("elementwise", ((1, 64, 96, 96), ("batch_norm",))),
    # movement of each axis order a model's attention and layout changes make, and a long GEMV
    ("movement", ((1, 160, 8, 96), "permute4")), ("movement", ((1, 10, 150, 80), "permute4")),
    ("movement", ((1, 240, 640), "permute")), ("movement", ((1, 640, 240), "permute")),
    ("movement", ((1, 10, 150, 80), "permute4_last")), ("movement", ((1, 96, 48, 48), "channels_last")),
    ("matmul", ((), 1, 1792, 1200, "bias")), ("matmul", ((), 1, 2560, 640, "bias")),
    ("attention", (1, 10, 160, 64)),
    ("conv1x1", (16, 128, 80, 1, "bn")), ("conv1x1", (24, 160, 48, 1, "bn_relu")),
    ("conv1x1", (32, 128, 60, 1, "bn")), ("conv1x1", (24, 96, 72, 1, "bn")),
    ("conv1x1", (48, 192, 36, 1, "bn_relu")), ("conv1x1", (16, 48, 88, 1, "bn")),
    ("sdpa", (1, 160, 10, 64)), ("sdpa", (1, 96, 16, 48)), ("sdpa", (1, 200, 6, 64)), ("sdpa", (1, 64, 8, 96)),
]


def _large(b: _Builder, family: str, config: tuple):
    FAMILIES[family][1](b, *config)


FAMILIES: dict[str, tuple[list, Callable]] = {
    "conv2d": (CONV_CONFIGS, _conv),
    "matmul": (MATMUL_CONFIGS, _matmul),
    "attention": (ATTENTION_CONFIGS, _attention),
    "elementwise": (ELEMENTWISE_CONFIGS, _elementwise),
    "pool": (POOL_CONFIGS, _pool),
    "small": (SMALL_CONFIGS, _small),
    "conv1x1": (CONV1X1_CONFIGS, _conv1x1),
    "movement": (MOVEMENT_CONFIGS, _movement),
    "sdpa": (SDPA_CONFIGS, _sdpa),
    "large": (LARGE_CONFIGS, _large),
}


def sweep_module(family: str, limit: int | None = None, offset: int = 0) -> tvm.IRModule:
    """The Relax module of one sweep family (configurations ``offset .. offset+limit``).

    Raises
    ------
    CostError
        For an unknown family (the message lists the known ones).

    Examples
    --------
    >>> from tvm_pesto.graph.analysis import analyze
    >>> len(analyze(sweep_module("pool", limit=3)).groups)
    3
    """
    if family not in FAMILIES:
        raise CostError(f"unknown sweep family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    configs, add = FAMILIES[family]
    chosen = configs[offset:offset + limit] if limit is not None else configs[offset:]
    if not chosen:
        raise CostError(f"sweep family {family!r} has {len(configs)} configurations; offset {offset} selects none")
    b = _Builder(seed=_RNG_SEED + zlib.crc32(family.encode()))  # stable when families are added
    for cfg in chosen:
        add(b, *cfg)
    return b.build()


__all__ = ["FAMILIES", "sweep_module"]
