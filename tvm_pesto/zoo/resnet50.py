"""ResNet-50 (He et al., 2016) with bottleneck blocks and random weights.

Stride sits on the 3x3 convolution of each bottleneck (the "v1.5" variant torchvision
uses); a 1x1 projection with BatchNorm forms the shortcut when shapes change.
``full``: 224x224 input, stages [3, 4, 6, 3], base width 64. ``small``: 128x128 input,
stages [1, 1, 1, 1], base width 8.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ._common import build_bn_image_model

PRESETS = {
    "small": dict(image=128, base=8, layers=(1, 1, 1, 1), classes=10),
    "full": dict(image=224, base=64, layers=(3, 4, 6, 3), classes=1000),
}


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand (x4), plus identity or projection shortcut."""

    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1):
        super().__init__()
        cout = planes * self.expansion
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        s = x if self.shortcut is None else self.shortcut(x)
        return self.relu(y + s)


class ResNet(nn.Module):
    """Bottleneck ResNet classifier.

    Parameters
    ----------
    base : int
        Channels of the stem and of the first stage's bottleneck (64 in ResNet-50).
    layers : tuple of int
        Bottleneck blocks per stage.
    classes : int
        Number of outputs.
    """

    def __init__(self, base: int = 64, layers=(3, 4, 6, 3), classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, base, 7, stride=2, padding=3, bias=False),
                                  nn.BatchNorm2d(base), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], base
        for stage, n in enumerate(layers):
            planes = base * 2 ** stage
            for i in range(n):
                blocks.append(Bottleneck(cin, planes, stride=2 if (i == 0 and stage > 0) else 1))
                cin = planes * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.pool(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


def build(size: str = "small") -> tuple[nn.Module, tuple[np.ndarray, ...]]:
    """Build the seeded ResNet-50 model of a preset size and its example input.

    Parameters
    ----------
    size : {"small", "full"}
        ``small``: 128x128, width 8, one block per stage. ``full``: ResNet-50 at 224x224.

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
    (1, 3, 128, 128)
    """
    return build_bn_image_model(PRESETS, "resnet50", size, ResNet)
