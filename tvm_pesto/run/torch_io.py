"""Torch tensors in, torch tensors out: a placed model called from PyTorch.

A CPU torch tensor is viewed as a numpy array (no copy: the model then treats it as it
treats numpy), a tensor on another device is passed through DLPack as a TVM tensor; the
outputs come back as torch tensors that share the outputs' memory (``torch.from_numpy``,
``torch.from_dlpack``). Nothing here imports torch: a program that has a torch tensor has
imported it.

Examples
--------
>>> import numpy as np, torch
>>> args, to_torch = from_torch((torch.arange(3.0), np.ones(2)))
>>> [type(a).__name__ for a in args], to_torch
(['ndarray', 'ndarray'], True)
>>> as_torch((np.zeros(2, "float32"), np.ones(1, "int64")))
(tensor([0., 0.]), tensor([1]))
"""
from __future__ import annotations

import sys

import numpy as np
import tvm
import tvm_ffi

from ..errors import ExecutionError


def _tensor_type():
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def from_torch(args, views: dict | None = None) -> tuple[list, bool]:
    """``(args, torch_in)``: ``args`` with each torch tensor as numpy (on the CPU, a view)
    or a TVM tensor (elsewhere, or a dtype numpy lacks, through DLPack), and whether any was
    a torch tensor (then the outputs go back as torch tensors, :func:`as_torch`).

    ``views`` (a dict the caller keeps between calls) holds the last view made per argument
    position: the same contiguous CPU tensor, at the same address and of the same shape,
    gets the same numpy object again, which a library's binding of its inputs recognises
    without looking at the memory (:class:`~tvm_pesto.run.libraries.calls.OpenVinoCall`). The
    last tensors stay alive until other tensors come at their positions, as a binding's do.

    Raises
    ------
    ExecutionError
        For a tensor that requires grad: the placed model runs inference and gives no
        gradient, so a caller expecting one is told instead of getting a silent break.
    """
    tensor = _tensor_type()
    if tensor is None or not any(isinstance(a, tensor) for a in args):
        return list(args), False
    out = []
    for k, a in enumerate(args):
        if not isinstance(a, tensor):
            out.append(a)
            continue
        if a.requires_grad:
            raise ExecutionError(f"input {k} is a torch tensor that requires grad: a placed model runs inference "
                                 "and returns no gradient; pass it detached (x.detach()) or make it under "
                                 "torch.no_grad()")
        plain = a.is_cpu and a.is_contiguous() and not a.is_conj() and not a.is_neg()  # viewed as it is
        seen = views.get(k) if views is not None and plain else None
        if seen is not None and seen[0] is a and seen[1] == a.data_ptr() and seen[2] == a.shape:
            out.append(seen[3])
            continue
        out.append(_view(a))
        if plain and views is not None and isinstance(out[-1], np.ndarray):
            views[k] = (a, a.data_ptr(), a.shape, out[-1])
    return out, True


def _view(a):
    """A torch tensor as a numpy view (CPU) or a TVM tensor (through DLPack)."""
    a = a.resolve_conj().resolve_neg().contiguous()  # no copy when it already is
    if a.is_cpu:
        try:
            return a.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16): through DLPack
            pass
    return tvm_ffi.from_dlpack(a)


def as_torch(value):
    """``value`` (a numpy array, a TVM tensor, or a tuple of them) as torch tensors sharing
    its memory."""
    torch = sys.modules["torch"]  # a caller passed torch tensors in
    if isinstance(value, tuple):
        return tuple(as_torch(v) for v in value)
    if isinstance(value, np.ndarray):
        try:
            return torch.from_numpy(value)
        except TypeError:  # a dtype torch has no numpy form of: through DLPack
            return torch.from_dlpack(value)
    if isinstance(value, tvm.runtime.Tensor):
        return torch.from_dlpack(value)
    return value


__all__ = ["as_torch", "from_torch"]
