"""Seeded random Relax modules over the operators the model importers produce.

:func:`random_function` builds one small ``main`` with :class:`tvm.relax.BlockBuilder`
from a random sequence of blocks, each the shape of something ``torch.export`` and ONNX
imports give: int64 constants and index arithmetic on ``arange`` (relative positions,
bucketing with ``where``/``minimum``/``abs``), embedding lookups (``take``), attention
masks built from an int64 input (``equal`` with a scalar constant, or ``(1 - mask) * min``),
attention (reshape/permute, matmul, broadcasting adds of scalar constants, softmax),
tuples (``split``, ``Tuple`` and ``TupleGetItem``) and reshapes around a matmul. Blocks read
earlier values at random, so the graph branches and rejoins.

Examples
--------
>>> from random_relax import random_function, example_inputs
>>> mod = random_function(0)
>>> [p.name for p in mod["main"].params]
['x', 'ids', 'mask']
>>> [a.dtype for a in example_inputs(0)]
[dtype('float32'), dtype('int64'), dtype('int64')]
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

B, S, D, H = 2, 4, 8, 2  # batch, sequence, width, heads
HD = D // H
VOCAB, BUCKETS = 16, 6


def _f32(x) -> relax.Constant:
    return relax.const(np.float32(x), "float32")


def _i64(x) -> relax.Constant:
    return relax.const(np.int64(x), "int64")


class _Gen:
    """The state of one random function: the block builder, the generator and the values so far."""

    def __init__(self, bb: relax.BlockBuilder, rng: np.random.Generator, x, ids, mask):
        self.bb, self.rng = bb, rng
        self.hidden = [x]  # (B, S, D) float32
        self.bias = []  # (1 or B, H or 1, S or 1, S) float32, added to attention scores
        self.masks = []  # (B, 1, 1, S) bool, True where attention is masked out
        self.ids, self.mask = ids, mask

    def emit(self, expr):
        return self.bb.emit(expr)

    def weight(self, *shape, scale: float = 0.5) -> relax.Constant:
        return relax.const((self.rng.standard_normal(shape) * scale).astype("float32"))

    def pick(self, pool):
        return pool[int(self.rng.integers(len(pool)))]

    # blocks -------------------------------------------------------------------------
    def embed(self):
        """Token embedding: int64 ids -> int32 -> flat -> take from a table -> (B, S, D)."""
        idx = self.emit(R.reshape(self.emit(R.astype(self.ids, "int32")), (B * S,)))
        rows = self.emit(R.take(self.weight(VOCAB, D), idx, axis=0))
        self.hidden.append(self.emit(R.add(self.pick(self.hidden), self.emit(R.reshape(rows, (B, S, D))))))

    def positions(self):
        """Position ids from ``arange`` with int64 arithmetic on scalar constants, broadcast to the batch."""
        pos = self.emit(R.arange(0, S, 1, "int64"))
        if self.rng.random() < 0.5:
            pos = self.emit(R.add(pos, _i64(int(self.rng.integers(1, 3)))))
            pos = self.emit(R.floor_mod(pos, _i64(S)))
        pos = self.emit(R.broadcast_to(self.emit(R.expand_dims(pos, [0])), (B, S)))
        flat = self.emit(R.reshape(pos, (B * S,)))
        rows = self.emit(R.reshape(self.emit(R.take(self.weight(S, D), flat, axis=0)), (B, S, D)))
        self.hidden.append(self.emit(R.add(self.pick(self.hidden), rows)))

    def relative_bias(self):
        """T5-style relative position bias: memory - context positions, bucketed, looked up per head."""
        ctx = self.emit(R.expand_dims(self.emit(R.arange(0, S, 1, "int64")), [1]))
        mem = self.emit(R.expand_dims(self.emit(R.arange(0, S, 1, "int64")), [0]))
        rel = self.emit(R.subtract(mem, ctx))
        sign = self.emit(R.where(self.emit(R.greater(rel, _i64(0))), _i64(BUCKETS // 2), _i64(0)))
        near = self.emit(R.minimum(self.emit(R.abs(rel)), _i64(BUCKETS // 2 - 1)))
        bucket = self.emit(R.reshape(self.emit(R.add(sign, near)), (S * S,)))
        vals = self.emit(R.reshape(self.emit(R.take(self.weight(BUCKETS, H), bucket, axis=0)), (S, S, H)))
        self.bias.append(self.emit(R.expand_dims(self.emit(R.permute_dims(vals, [2, 0, 1])), [0])))

    def attention_mask(self):
        """A mask from the int64 input: boolean (``mask == 0``) or additive float ((1 - m) * min)."""
        if self.rng.random() < 0.5:
            m = self.emit(R.equal(self.mask, _i64(0)))
            self.masks.append(self.emit(R.reshape(m, (B, 1, 1, S))))
        else:
            m = self.emit(R.subtract(_f32(1.0), self.emit(R.astype(self.mask, "float32"))))
            m = self.emit(R.multiply(m, _f32(np.finfo(np.float32).min)))
            self.bias.append(self.emit(R.reshape(m, (B, 1, 1, S))))

    def attention(self):
        """Multi-head self-attention with the biases and masks made so far."""
        h = self.pick(self.hidden)
        flat = self.emit(R.reshape(h, (B * S, D)))

        def heads(perm):
            p = self.emit(R.add(self.emit(R.matmul(flat, self.weight(D, D))), self.weight(D)))
            return self.emit(R.permute_dims(self.emit(R.reshape(p, (B, S, H, HD))), perm))

        q, k, v = heads([0, 2, 1, 3]), heads([0, 2, 3, 1]), heads([0, 2, 1, 3])
        scores = self.emit(R.multiply(self.emit(R.matmul(q, k)), _f32(1.0 / np.sqrt(HD))))
        if self.bias and self.rng.random() < 0.8:
            scores = self.emit(R.add(scores, self.pick(self.bias)))
        if self.masks and self.rng.random() < 0.8:
            full = self.emit(R.broadcast_to(self.pick(self.masks), (B, H, S, S)))
            scores = self.emit(R.where(full, _f32(-1e9), scores))
        w = self.emit(R.nn.softmax(scores, axis=-1))
        ctx = self.emit(R.reshape(self.emit(R.permute_dims(self.emit(R.matmul(w, v)), [0, 2, 1, 3])), (B * S, D)))
        out = self.emit(R.reshape(self.emit(R.matmul(ctx, self.weight(D, D))), (B, S, D)))
        self.hidden.append(self.emit(R.add(h, out)))

    def tuples(self):
        """A split into a tuple, its items read back (or a Tuple built and taken apart)."""
        h = self.pick(self.hidden)
        if self.rng.random() < 0.5:
            parts = self.emit(R.split(h, 2, axis=-1))
        else:
            a = self.emit(R.multiply(h, _f32(0.5)))
            parts = self.emit(relax.Tuple([a, self.emit(R.nn.relu(h))]))
        a, b = self.emit(relax.TupleGetItem(parts, 0)), self.emit(relax.TupleGetItem(parts, 1))
        if a.ty.shape[-1].value == D:
            self.hidden.append(self.emit(R.add(a, b)))
        else:
            self.hidden.append(self.emit(R.concat([b, self.emit(R.tanh(a))], axis=-1)))

    def feed_forward(self):
        """Reshape to rows, matmul, a scalar-constant add and an activation, reshape back, residual."""
        h = self.pick(self.hidden)
        y = self.emit(R.matmul(self.emit(R.reshape(h, (B * S, D))), self.weight(D, 2 * D)))
        y = self.emit(R.add(y, _f32(float(self.rng.standard_normal()))))
        y = self.emit(R.nn.gelu(y) if self.rng.random() < 0.5 else R.nn.relu(y))
        y = self.emit(R.reshape(self.emit(R.matmul(y, self.weight(2 * D, D))), (B, S, D)))
        self.hidden.append(self.emit(R.add(self.pick(self.hidden), y)))

    def rms_norm(self):
        """T5's layer norm: mean of squares over the width, rsqrt of it plus a scalar constant."""
        h = self.pick(self.hidden)
        var = self.emit(R.mean(self.emit(R.multiply(h, h)), axis=[-1], keepdims=True))
        scale = self.emit(R.rsqrt(self.emit(R.add(var, _f32(1e-6)))))
        self.hidden.append(self.emit(R.multiply(self.emit(R.multiply(h, scale)), self.weight(D))))

    def gather(self):
        """A gather along the sequence with an int64 constant index tensor."""
        idx = relax.const(self.rng.integers(0, S, S).astype("int64"))
        self.hidden.append(self.emit(R.take(self.pick(self.hidden), idx, axis=1)))


_BLOCKS = ["embed", "positions", "relative_bias", "attention_mask", "attention", "tuples", "feed_forward",
           "rms_norm", "gather"]


def random_function(seed: int, blocks: int | None = None) -> tvm.IRModule:
    """A module whose ``main(x, ids, mask)`` is a random sequence of blocks (2 to 4 by default).

    ``main`` returns the last hidden value, or a tuple of it and another value.
    """
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 5)) if blocks is None else blocks
    x = relax.Var("x", relax.TensorType((B, S, D), "float32"))
    ids = relax.Var("ids", relax.TensorType((B, S), "int64"))
    mask = relax.Var("mask", relax.TensorType((B, S), "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, ids, mask]):
        with bb.dataflow():
            g = _Gen(bb, rng, x, ids, mask)
            kinds = list(rng.choice(_BLOCKS, n))
            if "attention" not in kinds and rng.random() < 0.3:
                kinds.append("attention")
            for kind in kinds:
                getattr(g, str(kind))()
            last = g.hidden[-1]
            if last.same_as(x):  # no block made a hidden value: make one
                last = bb.emit(R.add(x, _f32(1.0)))
            extra = [v for v in g.hidden[1:-1] + g.bias if not v.same_as(last)]
            if extra and rng.random() < 0.4:
                out = bb.emit_output(relax.Tuple([last, g.pick(extra)]))
            else:
                out = bb.emit_output(last)
        bb.emit_func_output(out)
    return bb.get()


def example_inputs(seed: int) -> list[np.ndarray]:
    """Inputs for every random ``main``: random ``x``, token ids in range, a 0/1 mask whose
    second row ends in zeros."""
    rng = np.random.default_rng(seed)
    mask = np.ones((B, S), dtype="int64")
    mask[1, int(rng.integers(1, S)):] = 0
    return [rng.standard_normal((B, S, D)).astype("float32"), rng.integers(0, VOCAB, (B, S)).astype("int64"), mask]
