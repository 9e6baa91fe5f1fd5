"""Gradients of the Relax operators the zoo models use and TVM 0.27 does not differentiate.

``relax.transform.Gradient`` needs an ``FPrimalGradient`` attribute on every operator of
the function. TVM 0.27 registers it for most elementwise, reduction, matmul, conv2d and
pooling operators, but not for ``nn.gelu`` (BERT, MLP-Mixer), ``nn.gelu_tanh`` (GPT-2),
``nn.adaptive_avg_pool2d`` (the CNNs' global pooling) or ``clip`` (MobileNet-V2's ReLU6).
:func:`register` adds these, written with operators that have gradients and legalize
(``erf``, ``exp``, ``tanh``, ``grad.avg_pool2d_backward``); an operator that already has a
gradient (a newer TVM) keeps its own. Each follows PyTorch's definition, so a gradient
check against autograd compares like with like.

Examples
--------
>>> from tvm_pesto.train import gradients
>>> gradients.register()
>>> gradients.has_gradient("relax.nn.gelu")
True
"""
from __future__ import annotations

import math

import tvm
from tvm import relax

from ..errors import UnsupportedModuleError

__all__ = ["has_gradient", "missing_gradients", "register"]


def has_gradient(op_name: str) -> bool:
    """Whether ``relax.transform.Gradient`` can differentiate ``op_name``."""
    return tvm.ir.Op.get(op_name).get_attr("FPrimalGradient") is not None


def _const(value: float, like: relax.Expr) -> relax.Constant:
    return relax.const(value, str(like.ty.dtype))


def gelu_grad(orig_var, orig_call, output_grad, ctx):
    """``d/dx x·Φ(x) = Φ(x) + x·φ(x)`` (exact GELU, PyTorch's default)."""
    op = relax.op
    x = orig_call.args[0]
    cdf = op.multiply(_const(0.5, x), op.add(_const(1.0, x), op.erf(op.multiply(x, _const(1 / math.sqrt(2), x)))))
    pdf = op.multiply(_const(1 / math.sqrt(2 * math.pi), x), op.exp(op.multiply(_const(-0.5, x), op.multiply(x, x))))
    return [op.multiply(output_grad, op.add(cdf, op.multiply(x, pdf)))]


def gelu_tanh_grad(orig_var, orig_call, output_grad, ctx):
    """Derivative of ``0.5·x·(1 + tanh(k·(x + 0.044715·x³)))``, ``k = √(2/π)``."""
    op = relax.op
    x = orig_call.args[0]
    k, a = math.sqrt(2 / math.pi), 0.044715
    x2 = op.multiply(x, x)
    t = op.tanh(op.multiply(_const(k, x), op.multiply(x, op.add(_const(1.0, x), op.multiply(_const(a, x), x2)))))
    du = op.multiply(_const(k, x), op.add(_const(1.0, x), op.multiply(_const(3 * a, x), x2)))
    left = op.multiply(_const(0.5, x), op.add(_const(1.0, x), t))
    right = op.multiply(op.multiply(_const(0.5, x), x), op.multiply(op.subtract(_const(1.0, x), op.multiply(t, t)), du))
    return [op.multiply(output_grad, op.add(left, right))]


def adaptive_avg_pool2d_grad(orig_var, orig_call, output_grad, ctx):
    """An adaptive average pool whose output size divides its input is an average pool
    with kernel = stride = input / output; its gradient is that pool's."""
    x = orig_call.args[0]
    layout = str(orig_call.attrs.layout)
    in_shape = [int(v) for v in x.ty.shape.values]
    out_shape = [int(v) for v in orig_var.ty.shape.values]
    h, w = layout.index("H"), layout.index("W")
    if in_shape[h] % out_shape[h] or in_shape[w] % out_shape[w]:
        raise UnsupportedModuleError(
            f"adaptive_avg_pool2d from {in_shape[h]}x{in_shape[w]} to {out_shape[h]}x{out_shape[w]} has no "
            "gradient here (only output sizes that divide the input); train the model at an input size whose "
            "last feature map is a multiple of the pooled size")
    kernel = [in_shape[h] // out_shape[h], in_shape[w] // out_shape[w]]
    out_layout = str(orig_call.attrs.out_layout or layout)
    return [relax.op.grad.avg_pool2d_backward(output_grad, x, kernel, kernel, [0, 0, 0, 0], [1, 1], False, True,
                                              layout, out_layout)]


def clip_grad(orig_var, orig_call, output_grad, ctx):
    """The gradient passes where ``min < x < max`` (PyTorch's ``hardtanh_backward``)."""
    op = relax.op
    x, lo, hi = orig_call.args
    zero = _const(0.0, x)
    bounds = [_const(float(getattr(b.value, "value", b.value)), x) for b in (lo, hi)]  # PrimValue(FloatImm | float)
    outside = op.logical_or(op.less_equal(x, bounds[0]), op.greater_equal(x, bounds[1]))
    return [op.where(outside, zero, output_grad), op.grad.no_grad(lo), op.grad.no_grad(hi)]


#: Operator -> gradient function added by :func:`register`.
GRADIENTS = {
    "relax.nn.gelu": gelu_grad,
    "relax.nn.gelu_tanh": gelu_tanh_grad,
    "relax.nn.adaptive_avg_pool2d": adaptive_avg_pool2d_grad,
    "relax.clip": clip_grad,
}


def register() -> None:
    """Register the gradients of :data:`GRADIENTS` that TVM does not have (idempotent)."""
    for name, fn in GRADIENTS.items():
        if not has_gradient(name):
            relax.op.register_gradient(name, fn)


def missing_gradients(func: relax.Function) -> list[str]:
    """Operators called in ``func`` that have no gradient (after :func:`register`), sorted."""
    register()
    names: set[str] = set()

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and not e.op.name.startswith("relax.grad."):
            if e.op.name not in ("relax.nn.batch_norm", "relax.nn.layer_norm") and not has_gradient(e.op.name):
                names.add(e.op.name)  # batch_norm / layer_norm are decomposed before the Gradient pass

    relax.analysis.post_order_visit(func.body, visit)
    return sorted(names)
