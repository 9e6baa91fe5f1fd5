"""Inception-v3 style network (Szegedy et al., 2016) with random weights.

Stem, Inception-A blocks (1x1 / 5x5 / double 3x3 / pool branches), a grid reduction,
Inception-C blocks with factorised 1x7 / 7x1 convolutions, a second reduction and
Inception-E blocks with split 1x3 / 3x1 branches; the branch outputs are concatenated.
``full`` follows the paper (299x299, 3 A, 4 C, 2 E blocks, no auxiliary head); ``small``
keeps the same branch structure with 1/8 of the channels and fewer blocks.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ._common import build_bn_image_model, scale

PRESETS = {
    "small": dict(image=147, width=1 / 8, a_pool=(32, 64), c7=(128, 192), e_blocks=1, classes=10),
    "full": dict(image=299, width=1.0, a_pool=(32, 64, 64), c7=(128, 160, 160, 192), e_blocks=2,
                 classes=1000),
}


class ConvBN(nn.Sequential):
    """Convolution without bias, BatchNorm and ReLU."""

    def __init__(self, cin: int, cout: int, kernel, stride=1, padding=0):
        super().__init__(nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False),
                         nn.BatchNorm2d(cout, eps=1e-3), nn.ReLU())


class InceptionA(nn.Module):
    """Four parallel branches at the 35x35 grid: 1x1, 1x1-5x5, 1x1-3x3-3x3, avgpool-1x1."""

    def __init__(self, cin: int, pool: int, w: float):
        super().__init__()
        c = lambda n: scale(n, w)  # noqa: E731
        self.b1 = ConvBN(cin, c(64), 1)
        self.b5 = nn.Sequential(ConvBN(cin, c(48), 1), ConvBN(c(48), c(64), 5, padding=2))
        self.b3 = nn.Sequential(ConvBN(cin, c(64), 1), ConvBN(c(64), c(96), 3, padding=1),
                                ConvBN(c(96), c(96), 3, padding=1))
        self.bp = nn.Sequential(nn.AvgPool2d(3, 1, 1), ConvBN(cin, c(pool), 1))
        self.out_channels = c(64) + c(64) + c(96) + c(pool)

    def forward(self, x):
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), self.bp(x)], dim=1)


class InceptionB(nn.Module):
    """Grid reduction 35->17: strided 3x3, strided double 3x3, max pool."""

    def __init__(self, cin: int, w: float):
        super().__init__()
        c = lambda n: scale(n, w)  # noqa: E731
        self.b3 = ConvBN(cin, c(384), 3, stride=2)
        self.bd = nn.Sequential(ConvBN(cin, c(64), 1), ConvBN(c(64), c(96), 3, padding=1),
                                ConvBN(c(96), c(96), 3, stride=2))
        self.pool = nn.MaxPool2d(3, 2)
        self.out_channels = c(384) + c(96) + cin

    def forward(self, x):
        return torch.cat([self.b3(x), self.bd(x), self.pool(x)], dim=1)


class InceptionC(nn.Module):
    """17x17 grid block with factorised 7x7 convolutions (1x7 then 7x1)."""

    def __init__(self, cin: int, c7: int, w: float):
        super().__init__()
        c = lambda n: scale(n, w)  # noqa: E731
        m = c(c7)
        self.b1 = ConvBN(cin, c(192), 1)
        self.b7 = nn.Sequential(ConvBN(cin, m, 1), ConvBN(m, m, (1, 7), padding=(0, 3)),
                                ConvBN(m, c(192), (7, 1), padding=(3, 0)))
        self.bd = nn.Sequential(ConvBN(cin, m, 1), ConvBN(m, m, (7, 1), padding=(3, 0)),
                                ConvBN(m, m, (1, 7), padding=(0, 3)), ConvBN(m, m, (7, 1), padding=(3, 0)),
                                ConvBN(m, c(192), (1, 7), padding=(0, 3)))
        self.bp = nn.Sequential(nn.AvgPool2d(3, 1, 1), ConvBN(cin, c(192), 1))
        self.out_channels = 4 * c(192)

    def forward(self, x):
        return torch.cat([self.b1(x), self.b7(x), self.bd(x), self.bp(x)], dim=1)


class InceptionD(nn.Module):
    """Grid reduction 17->8: 1x1-3x3/2, 1x1-1x7-7x1-3x3/2, max pool."""

    def __init__(self, cin: int, w: float):
        super().__init__()
        c = lambda n: scale(n, w)  # noqa: E731
        self.b3 = nn.Sequential(ConvBN(cin, c(192), 1), ConvBN(c(192), c(320), 3, stride=2))
        self.b7 = nn.Sequential(ConvBN(cin, c(192), 1), ConvBN(c(192), c(192), (1, 7), padding=(0, 3)),
                                ConvBN(c(192), c(192), (7, 1), padding=(3, 0)),
                                ConvBN(c(192), c(192), 3, stride=2))
        self.pool = nn.MaxPool2d(3, 2)
        self.out_channels = c(320) + c(192) + cin

    def forward(self, x):
        return torch.cat([self.b3(x), self.b7(x), self.pool(x)], dim=1)


class InceptionE(nn.Module):
    """8x8 grid block whose 3x3 branches split into parallel 1x3 and 3x1 convolutions."""

    def __init__(self, cin: int, w: float):
        super().__init__()
        c = lambda n: scale(n, w)  # noqa: E731
        self.b1 = ConvBN(cin, c(320), 1)
        self.b3 = ConvBN(cin, c(384), 1)
        self.b3a = ConvBN(c(384), c(384), (1, 3), padding=(0, 1))
        self.b3b = ConvBN(c(384), c(384), (3, 1), padding=(1, 0))
        self.bd = nn.Sequential(ConvBN(cin, c(448), 1), ConvBN(c(448), c(384), 3, padding=1))
        self.bda = ConvBN(c(384), c(384), (1, 3), padding=(0, 1))
        self.bdb = ConvBN(c(384), c(384), (3, 1), padding=(1, 0))
        self.bp = nn.Sequential(nn.AvgPool2d(3, 1, 1), ConvBN(cin, c(192), 1))
        self.out_channels = c(320) + 4 * c(384) + c(192)

    def forward(self, x):
        y3 = self.b3(x)
        yd = self.bd(x)
        return torch.cat([self.b1(x), self.b3a(y3), self.b3b(y3), self.bda(yd), self.bdb(yd),
                          self.bp(x)], dim=1)


class InceptionV3(nn.Module):
    """Inception-v3 classifier without the auxiliary head.

    Parameters
    ----------
    width : float
        Channel multiplier (1.0 = paper).
    a_pool : tuple of int
        Pool-branch channels of each Inception-A block (one block per entry).
    c7 : tuple of int
        Inner channels of each Inception-C block (one block per entry).
    e_blocks : int
        Number of Inception-E blocks.
    classes : int
        Number of outputs.
    """

    def __init__(self, width: float = 1.0, a_pool=(32, 64, 64), c7=(128, 160, 160, 192),
                 e_blocks: int = 2, classes: int = 1000):
        super().__init__()
        c = lambda n: scale(n, width)  # noqa: E731
        self.stem = nn.Sequential(
            ConvBN(3, c(32), 3, stride=2), ConvBN(c(32), c(32), 3), ConvBN(c(32), c(64), 3, padding=1),
            nn.MaxPool2d(3, 2), ConvBN(c(64), c(80), 1), ConvBN(c(80), c(192), 3), nn.MaxPool2d(3, 2))
        blocks, cin = [], c(192)
        for pool in a_pool:
            blocks.append(InceptionA(cin, pool, width))
            cin = blocks[-1].out_channels
        blocks.append(InceptionB(cin, width))
        cin = blocks[-1].out_channels
        for m in c7:
            blocks.append(InceptionC(cin, m, width))
            cin = blocks[-1].out_channels
        blocks.append(InceptionD(cin, width))
        cin = blocks[-1].out_channels
        for _ in range(e_blocks):
            blocks.append(InceptionE(cin, width))
            cin = blocks[-1].out_channels
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.pool(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


def build(size: str = "small") -> tuple[nn.Module, tuple[np.ndarray, ...]]:
    """Build the seeded Inception-v3 model of a preset size and its example input.

    Parameters
    ----------
    size : {"small", "full"}
        ``small``: 147x147 input, 1/8 width, 2 A + 2 C + 1 E blocks. ``full``: the paper model.

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
    (1, 3, 147, 147)
    """
    return build_bn_image_model(PRESETS, "inception_v3", size, InceptionV3)
