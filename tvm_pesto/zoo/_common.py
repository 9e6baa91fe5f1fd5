"""Helpers shared by the zoo models: presets, seeded inputs and weight initialisation."""
from __future__ import annotations

from typing import Iterable

import numpy as np
import torch
from torch import nn

from ..errors import GraphError

SIZES = ("small", "full")


def preset(presets: dict[str, dict], model: str, size: str) -> dict:
    """Return the preset ``size`` of ``model``, or raise a :class:`GraphError` listing the valid ones."""
    try:
        return dict(presets[size])
    except KeyError:
        raise GraphError(f"unknown size {size!r} for zoo model {model!r}; "
                         f"valid sizes: {', '.join(sorted(presets))}") from None


def seeded_inputs(shapes: Iterable[tuple[int, ...]], seed: int = 0) -> tuple[np.ndarray, ...]:
    """Standard-normal float32 arrays of the given shapes from one seeded generator."""
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).astype(np.float32) for s in shapes)


def scale(channels: int, width: float, minimum: int = 4) -> int:
    """``channels * width`` rounded, and at least ``minimum``."""
    return max(minimum, int(round(channels * width)))


def he_init(model: nn.Module) -> nn.Module:
    """He-normal (fan-in) conv/linear weights and zero biases, so random activations keep their scale."""
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return model


def calibrate_batchnorm(model: nn.Module, input_shape: tuple[int, ...], batch: int = 4) -> nn.Module:
    """Set BatchNorm running statistics from one seeded random batch, then switch to eval mode.

    With random weights the default statistics (mean 0, variance 1) let activations
    grow or vanish with depth; one forward pass in train mode (cumulative average) over
    ``batch`` random samples of ``input_shape[1:]`` gives statistics under which every
    BatchNorm output is roughly normalised. The batch is >1 so 1x1 feature maps work.
    """
    (x,) = seeded_inputs([(batch,) + tuple(input_shape[1:])], seed=1)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        model(torch.from_numpy(x))
    for m in bns:
        m.momentum = 0.1
    return model.eval()


def build_bn_image_model(presets: dict[str, dict], name: str, size: str, make) -> tuple[nn.Module, tuple[np.ndarray, ...]]:
    """Seeded ``make(**preset)`` for a BatchNorm image model, its statistics calibrated,
    and one ``(1, 3, image, image)`` input (the preset's ``image`` entry)."""
    p = preset(presets, name, size)
    image = p.pop("image")
    torch.manual_seed(0)
    model = make(**p)
    shape = (1, 3, image, image)
    calibrate_batchnorm(model, shape)
    return model, seeded_inputs([shape])
