"""A learnable synthetic task: one fixed batch with fixed random targets.

The batch is the model's seeded example input (:class:`~tvm_pesto.train.backbone.Backbone`
``inputs``); the targets are drawn once from a seeded generator: class labels for
``cross_entropy``, one-hot labels for ``categorical_cross_entropy``, standard-normal values
of the output's shape for ``mse`` and ``l1``. A network can fit a fixed batch, so the loss of
a working training step goes down from step to step.

Examples
--------
>>> from tvm import relax
>>> from tvm_pesto.train.choices import make_loss
>>> synthetic_targets(make_loss("cross_entropy", relax.TensorType((2, 10), "float32")), seed=0)
array([8, 6])
"""
from __future__ import annotations

import numpy as np

from .choices import LossChoice

__all__ = ["synthetic_targets"]


def synthetic_targets(loss: LossChoice, seed: int = 0) -> np.ndarray:
    """Seeded targets for ``loss`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(v) for v in loss.output_type.shape.values)
    if loss.name == "cross_entropy":
        return rng.integers(0, shape[1], size=shape[0]).astype("int64")
    if loss.name == "categorical_cross_entropy":
        return np.eye(shape[1], dtype="int64")[rng.integers(0, shape[1], size=shape[0])]
    return rng.standard_normal(shape).astype(str(loss.output_type.dtype))
