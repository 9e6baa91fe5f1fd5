"""Backends: libraries that run subgraphs, and the registry that names them.

Built in (:data:`~tvm_pesto.backends.registry.BUILTIN`, one module each): ``tvm``
(TVM-native, the fallback on every device), ``tvm-ms`` (TVM with a MetaSchedule database,
when one is given), ``onnxruntime``, ``onnxruntime-parallel`` and ``openvino`` (graph-level),
``torch`` (op-level), ``inductor`` (TorchInductor, graph-level; only when named) and, in
``gpu/``, ``tvm-cuda``, ``cublas``, ``cudnn``, ``tensorrt``. Each is imported on first use;
one that fails to import is reported by :func:`backend_status` with the module and the error.
:func:`register_backend` adds more.

Examples
--------
>>> from tvm_pesto.backends import backend_status, get_backend
>>> get_backend("tvm").name
'tvm'
>>> backend_status()["torch"]
(True, '')
"""
from __future__ import annotations

from .base import Backend, BackendUnavailableError, MatchContext, op_level_patterns  # noqa: F401
from .registry import (  # noqa: F401
    BUILTIN, available_backends, backend_status, get_backend, list_backends, register_backend, release_all,
    unregister_backend,
)

__all__ = ["BUILTIN", "Backend", "BackendUnavailableError", "MatchContext", "available_backends", "backend_status",
           "get_backend", "list_backends", "register_backend", "release_all", "unregister_backend"]
