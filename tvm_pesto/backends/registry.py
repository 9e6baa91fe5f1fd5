"""Backends by name: a table of built-in backends, imported on first use, plus any that other
code registers. A backend whose module fails to import is reported with the error, never
dropped: ``backend_status()`` names the module and the exception.

Examples
--------
>>> from tvm_pesto.backends.registry import BUILTIN
>>> sorted(BUILTIN)[:3]
['cublas', 'cudnn', 'inductor']
"""
from __future__ import annotations

import importlib
from typing import Callable

from ..errors import BuildError, PestoError, error_line
from .base import GLOBAL_PREFIX, Backend, BackendUnavailableError, BuiltUnit

#: Built-in backends: name -> "module:Class" (module relative to ``tvm_pesto.backends``).
#: Adding a backend is one file in this package and one line here.
BUILTIN: dict[str, str] = {
    "tvm": "tvm_cpu:TvmBackend",
    "tvm-ms": "tvm_cpu:TvmMetaScheduleBackend",
    "onnxruntime": "onnxruntime:OnnxRuntimeBackend",
    "onnxruntime-parallel": "onnxruntime:OnnxRuntimeParallelBackend",
    "openvino": "openvino:OpenVinoBackend",
    "openvino-bf16": "openvino:OpenVinoBf16Backend",
    "torch": "torch_ops:TorchBackend",
    "inductor": "inductor:InductorBackend",
    "tvm-cuda": "gpu.tvm_cuda:TvmCudaBackend",
    "cublas": "gpu.cublas:CublasBackend",
    "cudnn": "gpu.cudnn:CudnnBackend",
    "tensorrt": "gpu.tensorrt:TensorRTBackend",
}

#: Backends that ``all`` (``available_backends(None)``) leaves out: offered only when named
#: (``--backends inductor,tvm``). Each Inductor candidate is a C++ compile of seconds, and
#: measured costs build every candidate (hundreds in a zoo model); ``openvino-bf16`` computes
#: in reduced precision, which only the user can accept.
NAMED_ONLY: frozenset[str] = frozenset({"inductor", "openvino-bf16"})

_FACTORIES: dict[str, Callable[[], Backend]] = {}
_INSTANCES: dict[str, Backend] = {}


def _builtin_factory(name: str) -> Callable[[], Backend]:
    module, cls = BUILTIN[name].split(":")

    def make() -> Backend:
        try:
            mod = importlib.import_module(f".{module}", __package__)
        except Exception as e:  # noqa: BLE001 - reported as this backend's status, with the cause
            raise BackendUnavailableError(f"tvm_pesto/backends/{module.replace('.', '/')}.py failed to import "
                                          f"({error_line(e)}); that is a bug in the backend, or a "
                                          "broken install of its library") from e
        return getattr(mod, cls)()

    return make


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    """Register a backend class (or any zero-argument factory) under ``name``.

    Examples
    --------
    >>> from tvm_pesto.backends import register_backend, unregister_backend
    >>> from tvm_pesto.backends.torch_ops import TorchBackend
    >>> register_backend("torch-copy", TorchBackend)
    >>> unregister_backend("torch-copy")
    """
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def unregister_backend(name: str) -> None:
    """Forget a registered backend (a built-in one comes back as built in)."""
    _FACTORIES.pop(name, None)
    _INSTANCES.pop(name, None)


def _factory(name: str) -> Callable[[], Backend] | None:
    if name in _FACTORIES:
        return _FACTORIES[name]
    if name in BUILTIN:
        return _builtin_factory(name)
    return None


def list_backends() -> list[str]:
    """Names of all known backends (available or not)."""
    return sorted(set(BUILTIN) | set(_FACTORIES))


def get_backend(name: str) -> Backend:
    """The (shared) instance of backend ``name``.

    Raises
    ------
    PestoError
        If no backend has that name; the message lists the known ones.
    BackendUnavailableError
        If the backend's module fails to import (the message names the module and the error).
    """
    if name in _INSTANCES:
        return _INSTANCES[name]
    factory = _factory(name)
    if factory is None:
        raise PestoError(f"unknown backend {name!r}; known backends: {', '.join(list_backends())}")
    _INSTANCES[name] = factory()
    return _INSTANCES[name]


def backend_status(names=None) -> dict[str, tuple[bool, str]]:
    """``{name: (available, reason)}`` for the given (default: all) backends; never raises.

    The reason says what is missing (a package, a driver) or which module failed to import.

    Examples
    --------
    >>> backend_status(["torch"])
    {'torch': (True, '')}
    """
    out = {}
    for n in names if names is not None else list_backends():
        try:
            out[n] = get_backend(n).available()
        except BackendUnavailableError as e:
            out[n] = (False, str(e))
        except PestoError as e:
            out[n] = (False, str(e))
        except Exception as e:  # noqa: BLE001 - a broken factory is "unavailable", with the reason
            out[n] = (False, f"{type(e).__name__}: {e}")
    return out


def available_backends(names=None, device_kind: str = "cpu") -> tuple[list[Backend], dict[str, str]]:
    """The usable backends among ``names`` (None: every backend but :data:`NAMED_ONLY`) for a
    device kind, and why the others are not.

    ``tvm`` is always first when usable (it is the fallback that covers every op).
    """
    names = list(names) if names is not None else [n for n in list_backends() if n not in NAMED_ONLY]
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


def unit_backend(gname: str) -> str | None:
    """The backend whose unit global name ``gname`` is (``pesto.<backend>.<key>...``), or None
    for any other global function (one a user registered and calls in a module).

    Examples
    --------
    >>> unit_backend("pesto.onnxruntime.9e8446a4f2ed03be.c1"), unit_backend("my.kernel")
    ('onnxruntime', None)
    """
    parts = gname.split(".")
    if len(parts) >= 3 and parts[0] == GLOBAL_PREFIX and parts[1] in list_backends():
        return parts[1]
    return None


def built_unit(gname: str) -> BuiltUnit:
    """What a backend built as ``gname``, for a holder to keep.

    Raises
    ------
    BuildError
        When ``gname`` is not a backend's unit name (:func:`unit_backend`), or its backend
        did not build it in this process (or released it since).
    """
    backend = unit_backend(gname)
    if backend is None:
        raise BuildError(f"{gname!r} is not the global name of a backend's unit ({GLOBAL_PREFIX}.<backend>.<key>)")
    return get_backend(backend).built(gname)


def release_all() -> int:
    """Unregister the global functions every backend instance built so far and drop the
    backends' references to them (library sessions and their threads are freed once no
    one else holds them); later builds register them again. A placed model holds its own
    units (:class:`~tvm_pesto.backends.base.BuiltUnit`), so it still runs and exports."""
    return sum(b.release() for b in list(_INSTANCES.values()))


__all__ = ["BUILTIN", "NAMED_ONLY", "available_backends", "backend_status", "built_unit", "get_backend",
           "list_backends", "register_backend", "release_all", "unit_backend", "unregister_backend"]
