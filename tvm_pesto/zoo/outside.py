"""Models outside the zoo: ``torch.nn`` networks built around modules and operators no zoo
model (:mod:`tvm_pesto.zoo`) uses, for the model-loader tests, for scoring the cost model on
models it never saw (``tvm-pesto cost-model eval --flow``), and for users to try.

Each model has seeded random weights and is in eval mode:

- ``vit``: a vision transformer. Patch embedding by a strided ``Conv2d``, a learned class
  token and position embedding, ``nn.TransformerEncoder`` of pre-LN layers
  (``norm_first=True``, GELU; attention through ``nn.MultiheadAttention``), head on the
  class token.
- ``text_encoder``: a text transformer encoder on integer token ids. ``nn.Embedding`` for
  tokens and positions, post-LN ``nn.TransformerEncoderLayer`` (ReLU), mean pool, linear head.
- ``convnext``: a ConvNeXt-style CNN. Depthwise 7x7 ``Conv2d`` (``groups`` = channels),
  ``nn.LayerNorm`` over channels on the channels-last permute, pointwise ``Linear`` with
  GELU, layer scale and residual; LayerNorm + 2x2 strided convolution between stages.
- ``mobilenet_v3``: a MobileNetV3-style CNN. Depthwise convolutions, ``Hardswish`` and
  ``SiLU`` activations, squeeze-excite with ``Hardsigmoid``, BatchNorm with calibrated
  running statistics (so the BatchNorm import path is exercised from every file form).

Two sizes each: ``small`` (quick to compile, for tests and profiling) and ``full`` (the paper-scale
network at batch 1). They are not in :data:`tvm_pesto.zoo.MODELS` (``zoo.load`` does not
know them); :func:`relax_module` imports one into Relax, and ``tests/outside_zoo.py`` writes
them as model files (ONNX, ``.pt2``, TVMScript).

Examples
--------
>>> from tvm_pesto.zoo.outside import build, list_models
>>> model, (x,) = build("vit", "small")
>>> x.shape, list_models()
((1, 3, 32, 32), ['convnext', 'mobilenet_v3', 'text_encoder', 'vit'])
"""
from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from ..frontend import INT_INPUT_RANGE, from_torch
from ._common import SIZES, calibrate_batchnorm
from ._transformer import transformer_init

PRESETS = {
    "vit": {
        "small": dict(image=32, patch=8, dim=32, layers=2, heads=2, mlp=64, classes=10),
        # ViT-B/16
        "full": dict(image=224, patch=16, dim=768, layers=12, heads=12, mlp=3072, classes=1000),
    },
    "text_encoder": {
        "small": dict(vocab=100, seq=16, dim=32, layers=2, heads=2, ffn=64, classes=4),
        # BERT-base sized encoder on token ids
        "full": dict(vocab=30522, seq=128, dim=768, layers=12, heads=12, ffn=3072, classes=2),
    },
    "convnext": {
        "small": dict(image=32, dims=(16, 32), depths=(1, 1), classes=10),
        # ConvNeXt-T
        "full": dict(image=224, dims=(96, 192, 384, 768), depths=(3, 3, 9, 3), classes=1000),
    },
    "mobilenet_v3": {
        "small": dict(image=32, width=0.25, max_blocks=4, classes=10),
        # MobileNetV3-Large
        "full": dict(image=224, width=1.0, max_blocks=15, classes=1000),
    },
}

class ViT(nn.Module):
    """Vision transformer classifier (Dosovitskiy et al., 2021)."""

    def __init__(self, image: int, patch: int, dim: int, layers: int, heads: int, mlp: int, classes: int):
        super().__init__()
        tokens = (image // patch) ** 2
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.5)
        layer = nn.TransformerEncoderLayer(dim, heads, mlp, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(dim),
                                             enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.encoder(x)[:, 0])


class TextEncoder(nn.Module):
    """Transformer encoder on token ids with a mean-pooled classification head."""

    def __init__(self, vocab: int, seq: int, dim: int, layers: int, heads: int, ffn: int, classes: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(seq, dim)
        self.register_buffer("position_ids", torch.arange(seq).unsqueeze(0), persistent=False)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(dim, heads, ffn, dropout=0.0, batch_first=True)
            for _ in range(layers))
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(self.position_ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


class ConvNeXtBlock(nn.Module):
    """x + gamma * Linear(GELU(Linear(LN(dwconv7x7(x)))))  (LN and Linear channels-last)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.gamma * self.fc2(self.act(self.fc1(self.ln(y))))
        return x + y.permute(0, 3, 1, 2)


class ChannelsLastLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor, through the NHWC permute."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """ConvNeXt classifier (Liu et al., 2022)."""

    def __init__(self, dims: tuple[int, ...], depths: tuple[int, ...], classes: int):
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, stride=4), ChannelsLastLayerNorm(dims[0], eps=1e-6)]
        for i, (dim, depth) in enumerate(zip(dims, depths)):
            if i:
                layers += [ChannelsLastLayerNorm(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, stride=2)]
            layers += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x):
        return self.head(self.norm(self.features(x).mean(dim=(2, 3))))


class SqueezeExcite(nn.Module):
    """Channel gate: x * hardsigmoid(fc2(relu(fc1(mean_hw(x)))))."""

    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        s = x.mean(dim=(2, 3), keepdim=True)
        return x * self.gate(self.fc2(torch.relu(self.fc1(s))))


def conv_bn_act(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, act: type | None = None):
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


class MBConv3(nn.Module):
    """MobileNetV3 block: 1x1 expand, depthwise kxk, optional squeeze-excite, 1x1 project."""

    def __init__(self, cin: int, hidden: int, cout: int, kernel: int, stride: int, se: bool, act: type):
        super().__init__()
        layers = [conv_bn_act(cin, hidden, 1, act=act)] if hidden != cin else []
        layers.append(conv_bn_act(hidden, hidden, kernel, stride, groups=hidden, act=act))
        if se:
            layers.append(SqueezeExcite(hidden, max(8, hidden // 4)))
        layers.append(conv_bn_act(hidden, cout, 1))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


# MobileNetV3-Large (Howard et al., 2019, Table 1): kernel, expansion, out, SE, activation, stride;
# "HS" is Hardswish; ReLU is replaced by SiLU here so no block uses a zoo activation.
MBV3_BLOCKS = ((3, 16, 16, False, "SI", 1), (3, 64, 24, False, "SI", 2), (3, 72, 24, False, "SI", 1),
               (5, 72, 40, True, "SI", 2), (5, 120, 40, True, "SI", 1), (5, 120, 40, True, "SI", 1),
               (3, 240, 80, False, "HS", 2), (3, 200, 80, False, "HS", 1), (3, 184, 80, False, "HS", 1),
               (3, 184, 80, False, "HS", 1), (3, 480, 112, True, "HS", 1), (3, 672, 112, True, "HS", 1),
               (5, 672, 160, True, "HS", 2), (5, 960, 160, True, "HS", 1), (5, 960, 160, True, "HS", 1))


class MobileNetV3(nn.Module):
    """MobileNetV3-Large-style classifier with SiLU in place of ReLU."""

    def __init__(self, width: float, max_blocks: int, classes: int):
        super().__init__()

        def ch(c: int) -> int:
            return max(8, int(round(c * width / 8)) * 8)

        cin = ch(16)
        layers = [conv_bn_act(3, cin, 3, 2, act=nn.Hardswish)]
        for k, exp, out, se, act, stride in MBV3_BLOCKS[:max_blocks]:
            layers.append(MBConv3(cin, ch(exp), ch(out), k, stride, se, nn.Hardswish if act == "HS" else nn.SiLU))
            cin = ch(out)
        last = ch(960)
        layers.append(conv_bn_act(cin, last, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Linear(last, ch(1280)), nn.Hardswish(), nn.Linear(ch(1280), classes))

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def _init_batchnorm(model: nn.Module, input_shape: tuple[int, ...], generator: torch.Generator) -> None:
    """Random BatchNorm affine parameters, and running statistics calibrated on a random batch
    (:func:`tvm_pesto.zoo._common.calibrate_batchnorm`), so activations stay O(1) and an import
    that ignored the statistics would not match."""
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    if not bns:
        return
    with torch.no_grad():
        for m in bns:
            m.weight.uniform_(0.8, 1.2, generator=generator)
            m.bias.uniform_(-0.1, 0.1, generator=generator)
    calibrate_batchnorm(model, input_shape)


MODELS = {"vit": ViT, "text_encoder": TextEncoder, "convnext": ConvNeXt, "mobilenet_v3": MobileNetV3}


def list_models() -> list[str]:
    """Names of the models here, sorted."""
    return sorted(MODELS)


def example_shape(name: str, size: str) -> tuple[int, ...]:
    """Shape of the one input of ``name`` at ``size`` (batch 1)."""
    p = PRESETS[name][size]
    return (1, p["seq"]) if name == "text_encoder" else (1, 3, p["image"], p["image"])


def build(name: str, size: str = "small", seed: int = 0) -> tuple[nn.Module, tuple[np.ndarray, ...]]:
    """Build the seeded model ``name`` at ``size`` in eval mode, and one example input.

    Parameters
    ----------
    name : str
        One of :func:`list_models`.
    size : {"small", "full"}
        Preset size.
    seed : int
        Seed of the weights and of the example input.

    Returns
    -------
    model : torch.nn.Module
        In eval mode.
    inputs : tuple of numpy.ndarray
        One input: a float32 image ``(1, 3, H, W)`` ~ N(0, 1), or int64 token ids
        ``(1, seq)`` in ``INT_INPUT_RANGE`` (the range ``load_model`` draws them from).
    """
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; choose from {', '.join(list_models())}")
    kwargs = dict(PRESETS[name][size])
    if name in ("convnext", "mobilenet_v3"):  # fully convolutional: the image side is the input's only
        kwargs.pop("image")
    torch.manual_seed(seed)
    # normal(0, 1/fan_in) weights, zero biases: activations stay O(1) and every branch matters
    model = transformer_init(MODELS[name](**kwargs))
    shape = example_shape(name, size)
    _init_batchnorm(model, shape, torch.Generator().manual_seed(seed + 1))
    rng = np.random.default_rng(seed)
    if name == "text_encoder":
        x = rng.integers(*INT_INPUT_RANGE, size=shape, dtype=np.int64)
    else:
        x = rng.standard_normal(shape).astype(np.float32)
    return model.eval(), (x,)


@functools.lru_cache(maxsize=None)
def relax_module(name: str, size: str = "small"):
    """Model ``name`` imported into Relax with :func:`tvm_pesto.frontend.from_torch` (weights
    as constants; cached per name and size in this process, do not modify it).

    Examples
    --------
    >>> relax_module("vit")["main"].params[0].ty.shape
    R.shape([1, 3, 32, 32])
    """
    model, inputs = build(name, size)
    return from_torch(model, inputs, name=f"{name}/{size}")


__all__ = ["MODELS", "PRESETS", "SIZES", "build", "example_shape", "list_models", "relax_module"]
