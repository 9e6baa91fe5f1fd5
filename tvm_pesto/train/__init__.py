"""Training: place and run whole training steps (forward, loss, backward, optimizer).

A stage-shaped package on top of the one flow, one concept per module:

- :mod:`.backbone`: a model exported in train mode with its parameters as inputs and its
  BatchNorm running statistics as states (``backbone`` for SetupTrainer);
- :mod:`.gradients`: gradients TVM 0.27 lacks for the zoo's operators;
- :mod:`.choices`: losses and optimizers by name;
- :mod:`.step`: SetupTrainer's functions inlined into one ``main`` for a whole step, with
  the role of every operator;
- :mod:`.constraints`: the Pesto/Baechi co-location groups of a step;
- :mod:`.data`: a learnable synthetic batch;
- :mod:`.check`: gradients against PyTorch autograd;
- :mod:`.trainer`: :func:`build_trainer` (place with :func:`tvm_pesto.place`, build with
  ``apply_plan`` + ``PlacedModule``) and :class:`Trainer` (state kept on the devices).

Examples
--------
>>> import torch
>>> from tvm_pesto.train import build_trainer
>>> _ = torch.manual_seed(0)
>>> net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
>>> tr = build_trainer((net, (torch.randn(16, 8),)), "cross_entropy", "sgd", "cpu:2", costs="roofline")
>>> losses = tr.fit(20)["losses"]
>>> losses[-1] < losses[0], len(tr.devices_used) >= 1, tr.simulated_step_s > 0
(True, True, True)

A zoo model trains the same way: ``build_trainer("mlp_mixer", "cross_entropy", "sgd", "cpu:2")``.
"""
from .check import gradient_check
from .choices import LOSSES, OPTIMIZERS
from .trainer import Trainer, build_step, build_trainer, place_step

__all__ = ["LOSSES", "OPTIMIZERS", "Trainer", "build_step", "build_trainer", "gradient_check", "place_step"]
