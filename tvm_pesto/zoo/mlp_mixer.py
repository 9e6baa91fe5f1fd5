"""MLP-Mixer (Tolstikhin et al., 2021) with random weights.

A strided convolution cuts the image into patch tokens; each mixer layer applies a
token-mixing MLP across patches (on the transposed token matrix) and a channel-mixing
MLP across features, both pre-LayerNorm with GELU and residual connections; the
classifier averages the tokens. ``full`` is Mixer-B/16 (224x224, patch 16, hidden 768,
12 layers, MLP widths 384/3072); ``small`` is 96x96, patch 8, hidden 64, 2 layers.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ._common import preset, seeded_inputs
from ._transformer import transformer_init

PRESETS = {
    "small": dict(image=96, patch=8, hidden=64, layers=2, token_mlp=32, channel_mlp=128, classes=10),
    "full": dict(image=224, patch=16, hidden=768, layers=12, token_mlp=384, channel_mlp=3072, classes=1000),
}


def mlp(dim: int, width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, width), nn.GELU(), nn.Linear(width, dim))


class MixerLayer(nn.Module):
    """x + token_mlp(LN(x)^T)^T, then x + channel_mlp(LN(x))."""

    def __init__(self, tokens: int, hidden: int, token_mlp: int, channel_mlp: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden, eps=1e-6)
        self.token_mlp = mlp(tokens, token_mlp)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-6)
        self.channel_mlp = mlp(hidden, channel_mlp)

    def forward(self, x):
        x = x + self.token_mlp(self.ln1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.ln2(x))


class MLPMixer(nn.Module):
    """MLP-Mixer classifier.

    Parameters
    ----------
    image, patch : int
        Input side and patch side (``image`` divisible by ``patch``).
    hidden, layers, token_mlp, channel_mlp, classes : int
        Channels per token, mixer layers, MLP widths and number of outputs.
    """

    def __init__(self, image: int = 224, patch: int = 16, hidden: int = 768, layers: int = 12,
                 token_mlp: int = 384, channel_mlp: int = 3072, classes: int = 1000):
        super().__init__()
        tokens = (image // patch) ** 2
        self.stem = nn.Conv2d(3, hidden, patch, stride=patch)
        self.layers = nn.Sequential(*(MixerLayer(tokens, hidden, token_mlp, channel_mlp)
                                      for _ in range(layers)))
        self.ln = nn.LayerNorm(hidden, eps=1e-6)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = self.ln(self.layers(x))
        return self.head(x.mean(dim=1))


def build(size: str = "small") -> tuple[nn.Module, tuple[np.ndarray, ...]]:
    """Build the seeded MLP-Mixer of a preset size and its example input.

    Parameters
    ----------
    size : {"small", "full"}
        ``small``: 96x96, patch 8, hidden 64, 2 layers. ``full``: Mixer-B/16.

    Returns
    -------
    model : torch.nn.Module
        In eval mode.
    inputs : tuple of numpy.ndarray
        One ``(1, 3, image, image)`` float32 image.

    Examples
    --------
    >>> model, (x,) = build("small")
    >>> x.shape
    (1, 3, 96, 96)
    """
    p = preset(PRESETS, "mlp_mixer", size)
    torch.manual_seed(0)
    model = transformer_init(MLPMixer(**p)).eval()
    return model, seeded_inputs([(1, 3, p["image"], p["image"])])
