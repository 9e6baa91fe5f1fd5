"""A corpus tvm-pesto was not written for: timm and torchvision architectures, random weights.

``tvm-pesto bench peers --corpus timm`` measures on these models; nothing in tvm-pesto was
tuned on them. Each :class:`Arch` names a model of `timm <https://github.com/huggingface/pytorch-image-models>`_
(``timm.create_model(name, pretrained=False)``) or of ``torchvision.models`` (``weights=None``),
its family, and what its ``small`` size changes: a reduced input and, where the
architecture takes it as an argument, fewer blocks. ``full`` is the architecture as
published at its default input (``timm``'s ``pretrained_cfg["input_size"]``, 224 x 224 for
torchvision, 299 for Inception v3). Weights are seeded random; nothing is downloaded.

Both libraries are optional (``pip install timm torchvision``, the ``corpus`` extra): a
corpus model whose library is missing fails to load with a :class:`~tvm_pesto.errors.GraphError`
that says so. A torchvision wheel built for CUDA beside a CPU build of PyTorch cannot load
its compiled operators (``torchvision::nms``), and its import fails registering them;
:func:`import_torchvision` then declares those two operators' schemas so that the Python
models import (no classification model calls them) and says so in a warning.

Examples
--------
>>> from tvm_pesto.zoo.corpus import CORPUS, families
>>> len(CORPUS) >= 30, "ViT" in families()
(True, True)
>>> CORPUS["resnet18"].family, CORPUS["resnet18"].input_shape("small")
('ResNet', (1, 3, 64, 64))
"""
from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import GraphError, error_line
from ._common import calibrate_batchnorm

#: Height and width of the ``small`` input unless an architecture sets its own.
SMALL_IMAGE = 64


@dataclass(frozen=True)
class Arch:
    """One architecture of the corpus.

    Attributes
    ----------
    name : str
        The library's model name (``timm.list_models()`` or ``torchvision.models``).
    family : str
        What a user would call it (ResNet, ViT, ...): ``--holdout family`` groups by it.
    library : {"timm", "torchvision"}
    small : dict
        Constructor arguments of the ``small`` size (fewer blocks, a smaller image size
        where the model takes one).
    small_image : int
        Height and width of the ``small`` input.
    full_image : int or None
        Height and width of the ``full`` input (None: the library's default for the model).
    """

    name: str
    family: str
    library: str = "timm"
    small: dict = field(default_factory=dict)
    small_image: int = SMALL_IMAGE
    full_image: int | None = None

    def input_shape(self, size: str) -> tuple[int, int, int, int]:
        """The ``(1, 3, H, W)`` input at ``size`` (``small`` or ``full``)."""
        if size == "small":
            return (1, 3, self.small_image, self.small_image)
        if size != "full":
            raise GraphError(f"unknown corpus size {size!r}; use small or full")
        if self.full_image is not None:
            return (1, 3, self.full_image, self.full_image)
        if self.library == "timm":
            cfg = _timm().get_pretrained_cfg(self.name)
            _, h, w = (cfg.input_size if cfg is not None else (3, 224, 224))
            return (1, 3, int(h), int(w))
        return (1, 3, 224, 224)

    def build(self, size: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[np.ndarray]]:
        """The model in eval mode with seeded random weights, and one seeded input. Its
        BatchNorm statistics are set from one seeded random batch
        (:func:`~tvm_pesto.zoo._common.calibrate_batchnorm`), as a trained model's are from its
        data: with the defaults a deep network's activations grow with depth (torchvision's
        inception_v3 at size small gave outputs of 2e9, where float32 rounding alone is 1e2)."""
        shape = self.input_shape(size)
        kwargs = dict(self.small) if size == "small" else {}
        torch.manual_seed(seed)
        try:
            if self.library == "timm":
                model = _timm().create_model(self.name, pretrained=False, **kwargs)
            else:
                model = getattr(import_torchvision().models, self.name)(weights=None, **kwargs)
        except GraphError:
            raise
        except Exception as e:  # noqa: BLE001 - the library's own error, said at our boundary
            raise GraphError(f"{self.library} could not build {self.name!r} at size {size}: {error_line(e)}") from e
        x = np.random.default_rng(seed).standard_normal(shape).astype("float32")
        return calibrate_batchnorm(model, shape), (x,)


def _arch(name, family, library="timm", small_image=SMALL_IMAGE, full_image=None, **small) -> Arch:
    return Arch(name, family, library, small, small_image, full_image)


_ONE = (1, 1, 1, 1)
#: The corpus by name: every family a user brings, convolutional, attention and MLP models.
CORPUS: dict[str, Arch] = {a.name: a for a in [
    _arch("resnet18", "ResNet", layers=_ONE),
    _arch("resnet50", "ResNet", layers=_ONE),
    _arch("resnext50_32x4d", "ResNeXt", layers=_ONE),
    _arch("regnetx_002", "RegNet"),
    _arch("regnety_004", "RegNet"),
    _arch("efficientnet_b0", "EfficientNet"),
    _arch("efficientnet_lite0", "EfficientNet"),
    _arch("mobilenetv2_100", "MobileNetV2"),
    _arch("mobilenetv3_small_100", "MobileNetV3"),
    _arch("mobilenetv3_large_100", "MobileNetV3"),
    _arch("mnasnet_100", "MNASNet"),
    _arch("ghostnet_100", "GhostNet"),
    _arch("lcnet_050", "LCNet"),
    _arch("rexnet_100", "ReXNet"),
    _arch("densenet121", "DenseNet"),
    _arch("dla34", "DLA"),
    _arch("cspresnet50", "CSPNet"),
    _arch("repvgg_a0", "RepVGG"),
    _arch("convnext_atto", "ConvNeXt", depths=_ONE),
    _arch("convnext_tiny", "ConvNeXt", depths=_ONE),
    _arch("edgenext_xx_small", "EdgeNeXt"),
    _arch("poolformer_s12", "MetaFormer"),
    _arch("mobilevit_xxs", "MobileViT"),
    _arch("vit_tiny_patch16_224", "ViT", depth=2, img_size=SMALL_IMAGE),
    _arch("vit_small_patch16_224", "ViT", depth=2, img_size=SMALL_IMAGE),
    _arch("vit_base_patch16_224", "ViT", depth=2, img_size=SMALL_IMAGE),
    _arch("deit_tiny_patch16_224", "DeiT", depth=2, img_size=SMALL_IMAGE),
    _arch("deit_small_distilled_patch16_224", "DeiT", depth=2, img_size=SMALL_IMAGE),
    _arch("beit_base_patch16_224", "BEiT", depth=2, img_size=SMALL_IMAGE),
    _arch("swin_tiny_patch4_window7_224", "Swin", depths=_ONE, window_size=2, img_size=SMALL_IMAGE),
    _arch("mixer_s16_224", "MLP-Mixer", img_size=SMALL_IMAGE),
    _arch("mixer_b16_224", "MLP-Mixer", img_size=SMALL_IMAGE),
    _arch("resmlp_12_224", "ResMLP", img_size=SMALL_IMAGE),
    _arch("inception_v3", "Inception", small_image=96),
    _arch("squeezenet1_1", "SqueezeNet", "torchvision"),
    _arch("shufflenet_v2_x1_0", "ShuffleNet", "torchvision"),
    _arch("googlenet", "GoogLeNet", "torchvision", aux_logits=False, init_weights=True),
    _arch("alexnet", "AlexNet", "torchvision"),
    _arch("mobilenet_v3_small", "MobileNetV3", "torchvision"),
    _arch("regnet_y_400mf", "RegNet", "torchvision"),
]}


def list_models() -> list[str]:
    """The corpus's model names, in the order of :data:`CORPUS`."""
    return list(CORPUS)


def families() -> list[str]:
    """The families of the corpus, each once."""
    return sorted({a.family for a in CORPUS.values()})


def load(name: str, size: str = "small", seed: int = 0):
    """``(torch_model, inputs)`` of corpus model ``name`` at ``size``.

    Raises
    ------
    GraphError
        An unknown name (the message lists the corpus), a missing library, or a model the
        library cannot build.
    """
    if name not in CORPUS:
        raise GraphError(f"{name!r} is not in the corpus; corpus models: {', '.join(CORPUS)}")
    return CORPUS[name].build(size, seed)


def _timm():
    import_torchvision()  # timm imports torchvision
    try:
        # lazy: an optional dependency, needed only by the timm corpus
        import timm
    except ImportError as e:
        raise GraphError("the timm corpus needs timm: pip install timm torchvision "
                         "(or pip install 'tvm-pesto[corpus]')") from e
    return timm


_DECLARED: list = []


def import_torchvision():
    """``torchvision``, imported; where its compiled operators cannot load (a CUDA wheel
    beside a CPU build of PyTorch), with the two schemas its import registers declared."""
    try:
        # lazy: an optional dependency, needed only by the corpus
        import torchvision
        return torchvision
    except ImportError as e:
        raise GraphError("the corpus needs torchvision: pip install torchvision "
                         "(the release that matches your PyTorch)") from e
    except RuntimeError as e:
        if "torchvision::nms" not in str(e):
            raise GraphError(f"torchvision does not import: {error_line(e)}") from e
    if not _DECLARED:
        lib = torch.library.Library("torchvision", "DEF")
        for op in ("nms", "qnms"):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _DECLARED.append(lib)
        warnings.warn(f"torchvision's compiled operators do not load with this PyTorch ({torch.__version__}); "
                      "its models import without them (detection operators such as nms are unavailable)",
                      RuntimeWarning, stacklevel=2)
    for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[mod]  # the half-imported package from the failed attempt
    # lazy: as above, now that its operators are declared
    import torchvision
    return torchvision


def model_files(folder: str | os.PathLike) -> list[str]:
    """The ONNX and ``.pt2`` files of ``folder`` (``--corpus DIR``), sorted.

    Raises
    ------
    GraphError
        ``folder`` is not a folder or holds no such file.
    """
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise GraphError(f"corpus folder {folder!r} does not exist; give a folder of .onnx or .pt2 files, or 'timm'")
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith((".onnx", ".pt2")))
    if not files:
        raise GraphError(f"corpus folder {folder!r} holds no .onnx or .pt2 file")
    return files


__all__ = ["Arch", "CORPUS", "SMALL_IMAGE", "families", "import_torchvision", "list_models", "load", "model_files"]
