"""Models outside the zoo as model files, for tests of the model loader and for users to try.

The models themselves (``vit``, ``text_encoder``, ``convnext``, ``mobilenet_v3``: ``torch.nn``
networks built around modules and operators that no zoo model uses, two sizes each) are built
by :mod:`tvm_pesto.zoo.outside` and re-exported here. ``write_onnx``, ``write_pt2`` and
``write_tvmscript`` save a model in the file forms ``tvm_pesto.models.load_model`` reads.

Examples
--------
>>> from outside_zoo import build, write_onnx
>>> model, (x,) = build("vit", "small")
>>> x.shape
(1, 3, 32, 32)
"""
from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

# The builders live in the package (cost-model eval --flow scores these models too).
from tvm_pesto.zoo.export import to_onnx
from tvm_pesto.zoo.outside import MODELS, PRESETS, SIZES, build, example_shape, list_models  # noqa: F401


def torch_output(model: nn.Module, inputs) -> np.ndarray:
    """``model(*inputs)`` as numpy, without autograd."""
    with torch.no_grad():
        return model(*[torch.from_numpy(np.asarray(a)) for a in inputs]).numpy()


def tvm_output(mod, inputs) -> np.ndarray:
    """Compile ``mod`` whole for this CPU with TVM's default Relax pipeline and run ``main``."""
    import tvm
    from tvm import relax

    target = tvm.target.Target({"kind": "llvm"})
    ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    dev = tvm.cpu(0)
    vm = relax.VirtualMachine(ex, dev)
    return vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(a), device=dev) for a in inputs]).numpy()


def input_name(name: str) -> str:
    """Name of the model's input (in its ONNX file and as the parameter of ``forward``)."""
    return "ids" if name == "text_encoder" else "x"


def _torch_args(inputs) -> tuple:
    return tuple(torch.from_numpy(a) for a in inputs)


def write_onnx(name: str, directory: str | os.PathLike, size: str = "small", dynamic_batch: bool = False,
               opset: int = 17) -> str:
    """Export model ``name`` with the TorchScript ONNX exporter (``dynamo=False``).

    The input is called :func:`input_name` and the output ``y``. With ``dynamic_batch`` the
    batch axis is symbolic (``batch``), so loading needs ``input_shapes``.

    Returns
    -------
    str
        The path written: ``<directory>/<name>_<size>[_dynamic].onnx``.
    """
    model, inputs = build(name, size)
    in_name = input_name(name)
    path = os.path.join(os.fspath(directory), f"{name}_{size}{'_dynamic' if dynamic_batch else ''}.onnx")
    axes = {in_name: {0: "batch"}, "y": {0: "batch"}} if dynamic_batch else None
    return to_onnx(model, inputs, path, input_names=[in_name], dynamic_axes=axes, opset=opset)


def write_pt2(name: str, directory: str | os.PathLike, size: str = "small", dynamic_batch: bool = False) -> str:
    """Save ``torch.export.export(model, example_inputs)`` with :func:`torch.export.save`.

    With ``dynamic_batch`` the batch axis is exported as ``torch.export.Dim("batch", min=1,
    max=64)`` (traced at batch 2: torch specialises a dimension traced at size 1), so loading
    needs ``input_shapes``.

    Returns
    -------
    str
        The path written: ``<directory>/<name>_<size>[_dynamic].pt2``.
    """
    model, inputs = build(name, size)
    path = os.path.join(os.fspath(directory), f"{name}_{size}{'_dynamic' if dynamic_batch else ''}.pt2")
    dynamic = None
    if dynamic_batch:
        inputs = tuple(np.repeat(a, 2, axis=0) for a in inputs)
        dynamic = {input_name(name): {0: torch.export.Dim("batch", min=1, max=64)}}
    with torch.no_grad():
        ep = torch.export.export(model, _torch_args(inputs), dynamic_shapes=dynamic)
    torch.export.save(ep, path)
    return path


def write_tvmscript(name: str, directory: str | os.PathLike, size: str = "small", suffix: str = ".py") -> str:
    """Import ``name`` with :func:`tvm_pesto.frontend.from_torch` and write ``mod.script(show_meta=True)``
    (the weights travel in its ``metadata`` header).

    Parameters
    ----------
    suffix : {".py", ".tvmscript", ".relax"}
        ``.py`` is run as Python by the loader, the others are parsed as TVMScript text.

    Returns
    -------
    str
        The path written: ``<directory>/<name>_<size><suffix>``.
    """
    from tvm_pesto.frontend import from_torch

    model, inputs = build(name, size)
    mod = from_torch(model, inputs, name=name)
    path = os.path.join(os.fspath(directory), f"{name}_{size}{suffix}")
    with open(path, "w") as f:
        f.write(mod.script(show_meta=True))
    return path
