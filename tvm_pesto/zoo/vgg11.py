"""VGG-11 (Simonyan & Zisserman, configuration "A") with random weights.

Eight 3x3 convolutions with ReLU and five max pools, then three fully connected layers.
A plain chain with very large classifier weights (the ``full`` model holds 133 M
parameters, 507 MiB, mostly in the first linear layer), so it stresses device memory
rather than parallelism. ``small``: 64x64 input, 1/8 of the channels, hidden 128.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ._common import he_init, preset, scale, seeded_inputs

CONFIG = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")

PRESETS = {
    "small": dict(image=64, width=1 / 8, pooled=1, hidden=128, classes=10),
    "full": dict(image=224, width=1.0, pooled=7, hidden=4096, classes=1000),
}


class VGG(nn.Module):
    """VGG-11 classifier.

    Parameters
    ----------
    width : float
        Channel multiplier for the convolutions.
    pooled : int
        Side of the adaptive average pool before the classifier (7 in the paper).
    hidden : int
        Width of the two hidden fully connected layers.
    classes : int
        Number of outputs.
    """

    def __init__(self, width: float = 1.0, pooled: int = 7, hidden: int = 4096, classes: int = 1000):
        super().__init__()
        layers, cin = [], 3
        for v in CONFIG:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                cout = scale(v, width)
                layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]
                cin = cout
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(pooled)
        self.classifier = nn.Sequential(nn.Linear(cin * pooled * pooled, hidden), nn.ReLU(),
                                        nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def build(size: str = "small") -> tuple[nn.Module, tuple[np.ndarray, ...]]:
    """Build the seeded VGG-11 model of a preset size and its example input.

    Parameters
    ----------
    size : {"small", "full"}
        ``small``: 64x64, 1/8 width. ``full``: 224x224, the paper's widths.

    Returns
    -------
    model : torch.nn.Module
        In eval mode, He-initialised so activations keep their scale.
    inputs : tuple of numpy.ndarray
        One ``(1, 3, image, image)`` float32 image.

    Examples
    --------
    >>> model, (x,) = build("small")
    >>> x.shape
    (1, 3, 64, 64)
    """
    p = preset(PRESETS, "vgg11", size)
    image = p.pop("image")
    torch.manual_seed(0)
    model = he_init(VGG(**p)).eval()
    return model, seeded_inputs([(1, 3, image, image)])
