"""MobileNet-v2 (Sandler et al., 2018): inverted residuals with depthwise convolutions.

Each block expands with a 1x1 convolution, filters with a depthwise 3x3 (``groups`` =
channels) and projects back with a linear 1x1; ReLU6 activations, BatchNorm after
every convolution. ``full``: width 1.0 at 224x224. ``small``: width 0.5 at 96x96 with
one block per stage.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ._common import build_bn_image_model

# expansion t, output channels c, repeats n, first stride s (the paper's Table 2)
STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
          (6, 160, 3, 2), (6, 320, 1, 1))

PRESETS = {
    "small": dict(image=96, width=0.5, max_repeats=1, classes=10),
    "full": dict(image=224, width=1.0, max_repeats=4, classes=1000),
}


def _divisible(v: float, divisor: int = 8) -> int:
    """Round channels to a multiple of ``divisor`` without dropping more than 10 %."""
    out = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return out + divisor if out < 0.9 * v else out


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: bool = True):
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    if act:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """1x1 expand, depthwise 3x3, linear 1x1 project; residual when shapes match."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = [conv_bn(cin, hidden, 1)] if expand != 1 else []
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden), conv_bn(hidden, cout, 1, act=False)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    """MobileNet-v2 classifier.

    Parameters
    ----------
    width : float
        Channel multiplier.
    max_repeats : int
        Cap on the blocks per stage (4 keeps the paper's counts).
    classes : int
        Number of outputs.
    """

    def __init__(self, width: float = 1.0, max_repeats: int = 4, classes: int = 1000):
        super().__init__()
        cin = _divisible(32 * width)
        layers = [conv_bn(3, cin, 3, 2)]
        for t, c, n, s in STAGES:
            cout = _divisible(c * width)
            for i in range(min(n, max_repeats)):
                layers.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        last = _divisible(1280 * width)  # the paper keeps 1280 for width < 1; scaled here
        layers.append(conv_bn(cin, last, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(last, classes)

    def forward(self, x):
        x = self.pool(self.features(x))
        return self.fc(torch.flatten(x, 1))


def build(size: str = "small") -> tuple[nn.Module, tuple[np.ndarray, ...]]:
    """Build the seeded MobileNet-v2 model of a preset size and its example input.

    Parameters
    ----------
    size : {"small", "full"}
        ``small``: 96x96, width 0.5, one block per stage. ``full``: 224x224, width 1.0.

    Returns
    -------
    model : torch.nn.Module
        In eval mode, BatchNorm statistics calibrated on a random batch.
    inputs : tuple of numpy.ndarray
        One ``(1, 3, image, image)`` float32 image.

    Examples
    --------
    >>> model, (x,) = build("small")
    >>> x.shape
    (1, 3, 96, 96)
    """
    return build_bn_image_model(PRESETS, "mobilenet_v2", size, MobileNetV2)
