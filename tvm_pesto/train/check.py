"""Check a training step's gradients against PyTorch autograd.

:func:`gradient_check` compiles the step's forward + loss + backward
(``backbone_loss_adjoint`` of SetupTrainer's module, the function whose body the step
inlines) for the CPU, runs it on the model's initial weights and a batch, and compares each
parameter's gradient with ``torch.autograd`` on the same PyTorch model (a copy, in train
mode), weights, batch and loss. The error of a parameter is norm-wise,
``||g_tvm - g_torch|| / max(||g_torch||, FLOOR * ||G||)`` with ``||G||`` the norm of the
whole gradient: some parameters' true gradient is exactly zero (an attention key bias adds
the same score to a whole softmax row; a bias per token before a LayerNorm over channels
is removed by its mean), and both frameworks then return rounding noise (~1e-9) whose
relative difference means nothing, so they are judged at the scale ``FLOOR * ||G||`` and
listed in ``vanishing``. ``max_rel_err`` is the largest error over the parameters.

Examples
--------
>>> import torch
>>> from tvm_pesto.train import build_step, gradient_check
>>> _ = torch.manual_seed(0)
>>> net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
>>> gradient_check(build_step((net, (torch.randn(16, 8),)), "cross_entropy"))["max_rel_err"] < 1e-4
True
"""
from __future__ import annotations

import copy

import numpy as np
import tvm
from tvm import relax

from ..errors import TrainingError
from .data import synthetic_targets
from .step import TrainStep

__all__ = ["FLOOR", "gradient_check", "tvm_gradients", "torch_gradients"]

#: Gradients smaller than this fraction of the whole gradient's norm count as vanishing.
FLOOR = 1e-4


def tvm_gradients(step: TrainStep, inputs, targets) -> tuple[float, list[np.ndarray]]:
    """Loss and per-parameter gradients from TVM's adjoint, on one CPU device."""
    bb = step.backbone
    mod = relax.transform.LegalizeOps()(step.trainer)
    target = tvm.target.Target({"kind": "llvm"})
    ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    vm = relax.VirtualMachine(ex, tvm.cpu(0))
    args = [tvm.runtime.tensor(np.ascontiguousarray(a)) for a in
            [*inputs, *bb.params, *bb.states, targets]]
    (loss_and_states, grads) = vm["backbone_loss_adjoint"](*args)
    loss = loss_and_states[0] if bb.states else loss_and_states
    return float(loss.numpy()), [g.numpy() for g in grads]


def _torch_loss(name: str, out, targets):
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(np.ascontiguousarray(targets))
    if name == "cross_entropy":
        return F.cross_entropy(out, t)
    if name == "categorical_cross_entropy":
        return F.cross_entropy(out, t.argmax(dim=-1))
    if name == "mse":
        return F.mse_loss(out, t)
    return F.l1_loss(out, t)


def torch_gradients(step: TrainStep, inputs, targets) -> tuple[float, list[np.ndarray]]:
    """Loss and per-parameter gradients from PyTorch autograd (train mode, same weights)."""
    import torch

    bb = step.backbone
    if bb.torch_model is None:
        raise TrainingError(f"{bb.name!r} was not built from a PyTorch model, so there is no autograd reference; "
                            "build the trainer from a zoo model or a (torch.nn.Module, inputs) pair")
    model = copy.deepcopy(bb.torch_model).train()
    named = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in zip(bb.param_names, bb.params):
            named[name].copy_(torch.from_numpy(value))
    model.zero_grad()
    out = model(*[torch.from_numpy(np.ascontiguousarray(a)) for a in inputs])
    loss = _torch_loss(step.loss.name, out, targets)
    loss.backward()
    return float(loss.item()), [named[n].grad.numpy() if named[n].grad is not None else np.zeros_like(v)
                                for n, v in zip(bb.param_names, bb.params)]


def gradient_check(step: TrainStep, inputs=None, targets=None) -> dict:
    """Compare TVM's gradients of ``step`` with PyTorch's (see the module docstring).

    Parameters
    ----------
    step : TrainStep
    inputs, targets : optional
        The batch (default: the backbone's example batch and :func:`synthetic_targets`).

    Returns
    -------
    dict
        ``max_rel_err``, ``worst_param``, ``rel_err`` (per parameter name), ``vanishing``
        (parameters whose PyTorch gradient is below ``FLOOR * ||G||``), ``loss_tvm``,
        ``loss_torch``.
    """
    inputs = step.backbone.inputs if inputs is None else inputs
    targets = synthetic_targets(step.loss) if targets is None else targets
    loss_tvm, g_tvm = tvm_gradients(step, inputs, targets)
    loss_torch, g_torch = torch_gradients(step, inputs, targets)
    g_tvm = [np.asarray(a, np.float64) for a in g_tvm]
    g_torch = [np.asarray(b, np.float64) for b in g_torch]
    floor = FLOOR * float(np.sqrt(sum(np.sum(b * b) for b in g_torch)))
    errs, vanishing = {}, []
    for name, a, b in zip(step.backbone.param_names, g_tvm, g_torch):
        ref = float(np.linalg.norm(b))
        if ref < floor:
            vanishing.append(name)
        scale = max(ref, floor)
        errs[name] = float(np.linalg.norm(a - b) / scale) if scale > 0 else float(np.linalg.norm(a))
    worst = max(errs, key=errs.get)
    return {"max_rel_err": errs[worst], "worst_param": worst, "rel_err": errs, "vanishing": vanishing,
            "loss_tvm": loss_tvm, "loss_torch": loss_torch}
