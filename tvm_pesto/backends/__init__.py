"""Backends: libraries that run subgraphs, and the registry that names them.

Built in: ``tvm`` (TVM-native, always the fallback), ``onnxruntime`` (graph-level),
``torch`` (op-level) and ``tvm-ms`` (TVM with a MetaSchedule database, when one is given).
Other modules register more with :func:`register_backend` (the GPU backends do).

Examples
--------
>>> from tvm_pesto.backends import backend_status, get_backend
>>> get_backend("tvm").name
'tvm'
>>> backend_status()["torch"]
(True, '')
"""
from __future__ import annotations

from typing import Callable

from ..errors import PestoError
from .base import Backend, BackendUnavailableError, MatchContext, op_level_patterns  # noqa: F401

_FACTORIES: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    """Register a backend class (or any zero-argument factory) under ``name``.

    Examples
    --------
    >>> from tvm_pesto.backends import register_backend
    >>> from tvm_pesto.backends.torch_ops import TorchBackend
    >>> register_backend("torch", TorchBackend)
    """
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def list_backends() -> list[str]:
    """Names of all registered backends (available or not)."""
    _ensure_builtin()
    return sorted(_FACTORIES)


def get_backend(name: str) -> Backend:
    """The (shared) instance of backend ``name``.

    Raises
    ------
    PestoError
        If no backend has that name; the message lists the known ones.
    """
    _ensure_builtin()
    if name not in _FACTORIES:
        raise PestoError(f"unknown backend {name!r}; known backends: {', '.join(sorted(_FACTORIES))}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _FACTORIES[name]()
    return _INSTANCES[name]


def backend_status(names=None) -> dict[str, tuple[bool, str]]:
    """``{name: (available, reason)}`` for the given (default: all) backends; never raises."""
    out = {}
    for n in names if names is not None else list_backends():
        try:
            out[n] = get_backend(n).available()
        except Exception as e:  # noqa: BLE001 - a broken factory is "unavailable", with the reason
            out[n] = (False, f"{type(e).__name__}: {e}")
    return out


def available_backends(names=None, device_kind: str = "cpu") -> tuple[list[Backend], dict[str, str]]:
    """The usable backends among ``names`` for a device kind, and why the others are not.

    ``tvm`` is always first when usable (it is the fallback that covers every op).
    """
    names = list(names) if names is not None else list_backends()
    usable, why = [], {}
    for n, (ok, reason) in backend_status(names).items():
        if not ok:
            why[n] = reason
            continue
        bk = get_backend(n)
        if device_kind not in bk.device_kinds:
            why[n] = f"runs on {', '.join(bk.device_kinds)} devices, not {device_kind}"
            continue
        usable.append(bk)
    usable.sort(key=lambda b: (b.name != "tvm", b.name))
    return usable, why


def release_all() -> int:
    """Unregister the global functions every backend instance built so far (frees library
    sessions and their threads); later builds register them again."""
    return sum(b.release() for b in list(_INSTANCES.values()))


_BUILTIN_DONE = False


def _ensure_builtin() -> None:
    global _BUILTIN_DONE
    if _BUILTIN_DONE:
        return
    _BUILTIN_DONE = True
    from .onnxruntime import OnnxRuntimeBackend
    from .torch_ops import TorchBackend
    from .tvm_cpu import TvmBackend, TvmMetaScheduleBackend

    for name, fac in (("tvm", TvmBackend), ("tvm-ms", TvmMetaScheduleBackend), ("onnxruntime", OnnxRuntimeBackend),
                      ("torch", TorchBackend)):
        _FACTORIES.setdefault(name, fac)
    try:  # GPU backends, when their package is present
        from . import gpu  # noqa: F401
    except Exception:  # noqa: BLE001 - a missing GPU stack must not break the CPU backends
        pass


__all__ = ["Backend", "BackendUnavailableError", "MatchContext", "available_backends", "backend_status",
           "get_backend", "list_backends", "register_backend", "release_all"]
