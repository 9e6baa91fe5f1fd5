"""A PyTorch model as the ONNX file a user of ONNX Runtime or OpenVINO would make of it.

:func:`to_onnx` is ``torch.onnx.export`` with the TorchScript exporter (``dynamo=False``),
which needs no extra package, on the Python path of ``nn.TransformerEncoderLayer``: the
model's own ONNX, not tvm-pesto's Relax -> ONNX export (:mod:`tvm_pesto.backends.onnx_export.export`).
``tvm-pesto bench peers`` runs the peers on it; the tests write model files with it.

Examples
--------
>>> import tempfile, os, torch
>>> from tvm_pesto.zoo.export import to_onnx
>>> m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
>>> import numpy as np
>>> path = to_onnx(m, (np.ones((2, 4), np.float32),), os.path.join(tempfile.mkdtemp(), "m.onnx"))
>>> import onnx; [i.name for i in onnx.load(path).graph.input]
['x']
"""
from __future__ import annotations

import contextlib
import os
import warnings

import numpy as np
import torch

from ..errors import GraphError, error_line


@contextlib.contextmanager
def no_fastpath():
    """Trace the Python path of ``nn.TransformerEncoderLayer`` in eval mode. Without this the
    TorchScript ONNX exporter sees the fused ``aten::_transformer_encoder_layer_fwd``, which it
    cannot export (torch.export traces the Python path anyway)."""
    old = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(old)


def to_onnx(model: torch.nn.Module, inputs, path: str | os.PathLike, input_names=None, output_names=("y",),
            dynamic_axes: dict | None = None, opset: int = 17) -> str:
    """Export ``model`` called on ``inputs`` (numpy arrays) to the ONNX file ``path``.

    Parameters
    ----------
    input_names : sequence of str, optional
        One per input (default ``x``, ``x1``, ``x2``, ...).
    dynamic_axes : dict, optional
        As ``torch.onnx.export`` takes it (``{"x": {0: "batch"}}``).

    Returns
    -------
    str
        ``path``.

    Raises
    ------
    GraphError
        When the exporter fails; the message names the model class and the exporter's error.
    """
    args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in inputs)
    names = list(input_names) if input_names else ["x"] + [f"x{i}" for i in range(1, len(args))]
    path = os.fspath(path)
    try:
        with torch.no_grad(), no_fastpath(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is chosen on purpose
            torch.onnx.export(model, args, path, dynamo=False, input_names=names, output_names=list(output_names),
                              dynamic_axes=dynamic_axes, opset_version=opset)
    except Exception as e:  # noqa: BLE001 - the exporter's many error types, explained here
        raise GraphError(f"torch.onnx.export could not export {type(model).__name__} "
                         f"({error_line(e)})") from e
    return path


__all__ = ["no_fastpath", "to_onnx"]
