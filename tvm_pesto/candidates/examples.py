"""Tiny Relax models (weights as constants, seeded) for tests, docs and quick checks.

Examples
--------
>>> from tvm_pesto.candidates.examples import tiny_cnn
>>> mod, inputs = tiny_cnn()
>>> [tuple(a.shape) for a in inputs]
[(1, 3, 12, 12)]
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


def _c(rng, *shape, scale=0.3):
    return relax.const((rng.standard_normal(shape) * scale).astype("float32"))


def tiny_cnn(seed: int = 0, size: int = 12) -> tuple[tvm.IRModule, list[np.ndarray]]:
    """conv-bn-relu, a residual add, two branches (conv + clip, avg-pool + tanh) joined by
    concat, pooling, a linear head with bias, and softmax: most ops the CPU backends cover,
    in 20-odd bindings."""
    rng = np.random.default_rng(seed)
    op = relax.op
    x = relax.Var("x", relax.TensorType((1, 3, size, size), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c1 = bb.emit(op.nn.conv2d(x, _c(rng, 8, 3, 3, 3), padding=[1, 1, 1, 1]))
            bn = bb.emit(op.nn.batch_norm(c1, relax.const(np.ones(8, "float32")), _c(rng, 8),
                                          _c(rng, 8), relax.const(np.full(8, 1.5, "float32")), axis=1,
                                          training=False))
            b0 = bb.emit(relax.TupleGetItem(bn, 0))
            r1 = bb.emit(op.nn.relu(b0))
            c2 = bb.emit(op.nn.conv2d(r1, _c(rng, 8, 8, 3, 3, scale=0.1), padding=[1, 1, 1, 1]))
            bias = bb.emit(op.reshape(_c(rng, 8), [1, 8, 1, 1]))
            a2 = bb.emit(op.add(c2, bias))
            res = bb.emit(op.add(a2, r1))
            r2 = bb.emit(op.nn.relu(res))
            p = bb.emit(op.nn.max_pool2d(r2, pool_size=[2, 2], strides=[2, 2]))
            br1 = bb.emit(op.clip(bb.emit(op.nn.conv2d(p, _c(rng, 4, 8, 1, 1))), 0.0, 0.5))
            br2 = bb.emit(op.tanh(bb.emit(op.nn.avg_pool2d(p, pool_size=[3, 3], strides=[1, 1],
                                                            padding=[1, 1, 1, 1]))))
            cat = bb.emit(op.concat([br1, br2], axis=1))
            m = bb.emit(op.mean(cat, axis=[2, 3], keepdims=False))
            w = bb.emit(op.permute_dims(_c(rng, 10, 12)))
            fc = bb.emit(op.matmul(m, w))
            lo = bb.emit(op.add(fc, _c(rng, 10)))
            out = bb.emit_output(op.nn.softmax(lo, axis=-1))
        bb.emit_func_output(out)
    inputs = [rng.standard_normal((1, 3, size, size)).astype("float32")]
    return bb.get(), inputs


def tiny_mlp(seed: int = 0, tokens: int = 8, dim: int = 16) -> tuple[tvm.IRModule, list[np.ndarray]]:
    """A transformer-style block: layer norm, matmul + bias + gelu, matmul, residual add,
    a batch matmul with a transpose, softmax, and a reshape."""
    rng = np.random.default_rng(seed)
    op = relax.op
    x = relax.Var("x", relax.TensorType((1, tokens, dim), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            ln = bb.emit(op.nn.layer_norm(x, relax.const(np.ones(dim, "float32")), _c(rng, dim), axes=[-1]))
            h = bb.emit(op.matmul(ln, _c(rng, dim, 2 * dim)))
            h = bb.emit(op.add(h, _c(rng, 2 * dim)))
            h = bb.emit(op.nn.gelu(h))
            h = bb.emit(op.matmul(h, _c(rng, 2 * dim, dim)))
            r = bb.emit(op.add(h, x))
            t = bb.emit(op.permute_dims(r, [0, 2, 1]))
            s = bb.emit(op.matmul(r, t))
            s = bb.emit(op.multiply(s, relax.const(np.float32(0.25))))
            pr = bb.emit(op.nn.softmax(s, axis=-1))
            o = bb.emit(op.matmul(pr, r))
            o = bb.emit_output(op.reshape(o, [tokens, dim]))
        bb.emit_func_output(o)
    inputs = [rng.standard_normal((1, tokens, dim)).astype("float32")]
    return bb.get(), inputs


def transformer_stack(layers: int = 69, seed: int = 0, tokens: int = 16, dim: int = 32, heads: int = 4,
                      ) -> tuple[tvm.IRModule, list[np.ndarray]]:
    """``layers`` pre-norm transformer encoder layers written as Relax ops, the shape
    ``torch.export`` gives ``nn.TransformerEncoderLayer``: transposed weights
    (``permute_dims`` of a constant, ops without inputs), q/k/v projections with bias, heads
    split by reshape + permute, scaled scores, softmax, the output projection, residual
    adds, layer norms and a GELU MLP. 36 ops per layer as written, 29 in the op graph (the six
    weight transposes are constants, folded at import, and the key's head split and transpose
    are one ``permute_dims`` in canonical form): 69 layers give 2,001 ops, a transformer-sized
    search problem that builds in a second (no PyTorch import).

    Examples
    --------
    >>> from tvm_pesto.graph.relax_import import from_relax
    >>> mod, _ = transformer_stack(2)
    >>> from_relax(mod).graph.num_nodes
    58
    """
    rng = np.random.default_rng(seed)
    op = relax.op
    hd = dim // heads
    x = relax.Var("x", relax.TensorType((1, tokens, dim), "float32"))
    bb = relax.BlockBuilder()

    def linear(h, d_in, d_out):
        w = bb.emit(op.permute_dims(_c(rng, d_out, d_in, scale=0.2)))
        return bb.emit(op.add(bb.emit(op.matmul(h, w)), _c(rng, d_out, scale=0.1)))

    def heads_of(h):  # (1, t, d) -> (1, heads, t, hd)
        return bb.emit(op.permute_dims(bb.emit(op.reshape(h, [1, tokens, heads, hd])), [0, 2, 1, 3]))

    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(layers):
                ln = bb.emit(op.nn.layer_norm(h, relax.const(np.ones(dim, "float32")), _c(rng, dim), axes=[-1]))
                q, k, v = (heads_of(linear(ln, dim, dim)) for _ in range(3))
                kt = bb.emit(op.permute_dims(k, [0, 1, 3, 2]))
                s = bb.emit(op.multiply(bb.emit(op.matmul(q, kt)), relax.const(np.float32(hd ** -0.5))))
                a = bb.emit(op.matmul(bb.emit(op.nn.softmax(s, axis=-1)), v))
                a = bb.emit(op.reshape(bb.emit(op.permute_dims(a, [0, 2, 1, 3])), [1, tokens, dim]))
                h = bb.emit(op.add(h, linear(a, dim, dim)))
                ln2 = bb.emit(op.nn.layer_norm(h, relax.const(np.ones(dim, "float32")), _c(rng, dim), axes=[-1]))
                m = linear(bb.emit(op.nn.gelu(linear(ln2, dim, 2 * dim))), 2 * dim, dim)
                h = bb.emit(op.add(h, m))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get(), [rng.standard_normal((1, tokens, dim)).astype("float32")]


def reference_output(mod: tvm.IRModule, inputs) -> np.ndarray:
    """The TVM-only single-device output (default pipeline, CPU)."""
    tgt = tvm.target.Target({"kind": "llvm"})
    ex = tvm.compile(mod, target=tgt, relax_pipeline=relax.get_default_pipeline(tgt))
    vm = relax.VirtualMachine(ex, tvm.cpu(0))
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


__all__ = ["reference_output", "tiny_cnn", "tiny_mlp", "transformer_stack"]
