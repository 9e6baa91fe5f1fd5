"""A small zoo of PyTorch models with random weights, imported into Relax.

Each model is written here without torchvision, built with ``torch.manual_seed(0)`` and
put in eval mode, in two sizes: ``small`` (compiles in seconds and runs in milliseconds
on one core, for tests) and ``full`` (the paper-size network at batch 1). Nothing is
downloaded.

Examples
--------
>>> from tvm_pesto import zoo
>>> "resnet50" in zoo.list_models()
True
>>> m = zoo.load("mlp_mixer", "small")
>>> m.example_inputs[0].shape, zoo.torch_reference(m).shape
((1, 3, 96, 96), (1, 10))
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm

from ..errors import GraphError
from . import bert, gpt2, inception_v3, mlp_mixer, mobilenet_v2, resnet50, vgg11
from ._common import SIZES

__all__ = ["MODELS", "SIZES", "ZooModel", "list_models", "load", "torch_reference"]

#: Model name -> ``build(size) -> (torch_model, example_inputs)``.
MODELS: dict[str, Callable] = {
    "inception_v3": inception_v3.build,
    "resnet50": resnet50.build,
    "bert": bert.build,
    "mobilenet_v2": mobilenet_v2.build,
    "vgg11": vgg11.build,
    "gpt2": gpt2.build,
    "mlp_mixer": mlp_mixer.build,
}


@dataclass(frozen=True)
class ZooModel:
    """A zoo model with its example inputs and its Relax module.

    Attributes
    ----------
    name, size : str
        Zoo name and preset.
    torch_model : torch.nn.Module
        The PyTorch model in eval mode.
    example_inputs : tuple of numpy.ndarray
        Seeded inputs, one per argument of ``main``.
    mod : tvm.IRModule
        The model imported with :func:`tvm_pesto.frontend.from_torch` (weights as constants).
    """

    name: str
    size: str
    torch_model: object
    example_inputs: tuple
    mod: tvm.IRModule


def list_models() -> list[str]:
    """Names of the zoo models, sorted.

    Examples
    --------
    >>> from tvm_pesto.zoo import list_models
    >>> list_models()[:2]
    ['bert', 'gpt2']
    """
    return sorted(MODELS)


def _check(name: str, size: str) -> None:
    if name not in MODELS:
        raise GraphError(f"unknown zoo model {name!r}; valid names: {', '.join(list_models())}")
    if size not in SIZES:
        raise GraphError(f"unknown size {size!r} for zoo model {name!r}; valid sizes: {', '.join(SIZES)}")


@functools.lru_cache(maxsize=None)
def _load(name: str, size: str) -> ZooModel:
    # lazy: TVM's Relax importer loads when a model is built, not with the zoo's list
    from ..frontend import from_torch

    model, inputs = MODELS[name](size)
    mod = from_torch(model, inputs, name=f"{name}/{size}")
    return ZooModel(name=name, size=size, torch_model=model, example_inputs=inputs, mod=mod)


def load(name: str, size: str = "small") -> ZooModel:
    """Build a zoo model and import it into Relax (cached per name and size in this process).

    Parameters
    ----------
    name : str
        One of :func:`list_models`.
    size : {"small", "full"}
        Preset size.

    Returns
    -------
    ZooModel
        The same object for repeated calls with the same arguments; do not modify it.

    Raises
    ------
    GraphError
        For an unknown name or size; the message lists the valid ones.

    Examples
    --------
    >>> from tvm_pesto import zoo
    >>> m = zoo.load("resnet50", "small")
    >>> [tuple(int(d) for d in p.ty.shape.values) for p in m.mod["main"].params]
    [(1, 3, 128, 128)]
    """
    _check(name, size)
    return _load(name, size)


def torch_reference(zoo_model: ZooModel) -> np.ndarray | tuple[np.ndarray, ...]:
    """Run the PyTorch model on its example inputs.

    Parameters
    ----------
    zoo_model : ZooModel
        A model from :func:`load`.

    Returns
    -------
    numpy.ndarray or tuple of numpy.ndarray
        The output (a tuple when the model returns several tensors).

    Examples
    --------
    >>> from tvm_pesto import zoo
    >>> zoo.torch_reference(zoo.load("vgg11")).shape
    (1, 10)
    """
    import torch

    args = [torch.from_numpy(a) for a in zoo_model.example_inputs]
    with torch.no_grad():
        out = zoo_model.torch_model.eval()(*args)
    if isinstance(out, (tuple, list)):
        return tuple(o.numpy() for o in out)
    return out.numpy()
