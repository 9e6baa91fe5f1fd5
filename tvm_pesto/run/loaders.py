"""The runtime side of the backends: callables over deployed artifacts, no TVM compiler.

A backend's subgraph is called as ``f(*inputs, *outputs)`` on TVM tensors, writing its
results into the preallocated outputs (:mod:`tvm_pesto.backends.base`). The builders here
make that callable from what a backend exports (:meth:`Backend.export_artifact`), and the
backends use the same builders at build time, so the deployed call is the built one.

``LOADERS`` maps an artifact ``kind`` to its loader:

* ``onnx``: an ONNX model run by ONNX Runtime (``onnxruntime`` backend);
* ``torch-export``: a ``torch.export`` program (``torch`` backend);
* ``tvm-vm``: a TVM executable exported as a shared library (``tvm-ms``).

Examples
--------
>>> from tvm_pesto.run.loaders import LOADERS
>>> sorted(LOADERS)
['onnx', 'torch-export', 'tvm-vm']
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Callable

import numpy as np

from ..errors import ExecutionError


#: Bindings an ONNX Runtime callable keeps per thread (sets of tensor addresses).
KEPT_BINDINGS = 8


def _data_ptr(t) -> int:
    """Address of a tensor's first element (TVM tensors directly; anything else via DLPack)."""
    get = getattr(t, "data_ptr", None)
    return int(get()) if callable(get) else int(np.from_dlpack(t).ctypes.data)


def onnx_runner(model, cores: int) -> Callable:
    """``f(*inputs, *outputs)`` over an ONNX Runtime session of ``model`` (bytes or a path),
    with ``cores`` intra-op threads and no spinning workers; tensors bound by pointer.

    Bindings are kept (per calling thread, the last :data:`KEPT_BINDINGS` sets of addresses)
    and made only for addresses not seen: TVM's VM hands a subgraph the same few buffers call
    after call (convnext's ONNX Runtime unit: its input and one of three output buffers), and
    binding through ONNX Runtime's Python API costs more than a small kernel (two bindings and
    a run of a 4K-float ReLU: 13.6 us on this project's 2-core machine; the run on a kept
    binding 3.0 us).
    """
    import threading

    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = int(cores)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    # No busy-waiting workers: they would take cores from the other device (or the next
    # call) while this session is idle.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    in_names = [i.name for i in sess.get_inputs()]
    out_names = [o.name for o in sess.get_outputs()]
    n_in = len(in_names)
    kept = threading.local()  # .ios: addresses bound -> their binding, oldest first

    def bindings() -> OrderedDict:
        if not hasattr(kept, "ios"):
            kept.ios = OrderedDict()
        return kept.ios

    def bind(args, key):
        io = sess.io_binding()
        for nm, a in zip(in_names, args[:n_in]):
            arr = np.from_dlpack(a)
            io.bind_input(nm, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
        for nm, o in zip(out_names, args[n_in:]):
            arr = np.from_dlpack(o)
            io.bind_output(nm, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
        ios = bindings()
        ios[key] = io
        if len(ios) > KEPT_BINDINGS:
            ios.popitem(last=False)
        return io

    def run(*args):
        key = tuple(_data_ptr(a) for a in args)
        io = bindings().get(key)
        sess.run_with_iobinding(io if io is not None else bind(args, key))

    return run


def flatten(vals) -> list:
    """Nested tuples/lists of values, flattened in order."""
    out = []
    for v in vals:
        if isinstance(v, (tuple, list)):
            out.extend(flatten(v))
        else:
            out.append(v)
    return out


def torch_runner(fn: Callable, num_inputs: int, cores: int) -> Callable:
    """``f(*inputs, *outputs)`` over a torch callable (``fn(*tensors) -> tensor(s)``) with
    ``cores`` threads; inputs viewed through DLPack, results copied into the outputs."""
    import torch

    def run(*args):
        if torch.get_num_threads() != cores:
            torch.set_num_threads(cores)
        ins = [torch.from_dlpack(a) for a in args[:num_inputs]]
        with torch.no_grad():
            res = fn(*ins)
            res = flatten(res if isinstance(res, (tuple, list)) else [res])
            for o, r in zip(args[num_inputs:], res):
                torch.from_dlpack(o).copy_(r)

    return run


def vm_runner(main, num_inputs: int, num_outputs: int) -> Callable:
    """``f(*inputs, *outputs)`` over a VM function that returns its result(s)."""

    def run(*args):
        res = main(*args[:num_inputs])
        outs = [res[k] for k in range(num_outputs)] if num_outputs > 1 else [res]
        for o, r in zip(args[num_inputs:], outs):
            r.copyto(o)

    return run


def _file(meta: dict, root: str) -> str:
    return os.path.join(root, meta["files"][0])


def load_onnx(meta: dict, root: str, device) -> Callable:
    return onnx_runner(_file(meta, root), int(meta.get("cores", 1)))


def load_torch_export(meta: dict, root: str, device) -> Callable:
    import torch

    module = torch.export.load(_file(meta, root)).module()
    return torch_runner(module, int(meta["num_inputs"]), int(meta.get("cores", 1)))


def load_tvm_vm(meta: dict, root: str, device) -> Callable:
    import tvm
    import tvm.runtime.vm  # not imported by ``import tvm`` in runtime-only mode

    lib = tvm.runtime.load_module(_file(meta, root))
    vm = tvm.runtime.vm.VirtualMachine(lib, device.tvm_device())
    return vm_runner(vm["main"], int(meta["num_inputs"]), int(meta["num_outputs"]))


LOADERS: dict[str, Callable] = {"onnx": load_onnx, "torch-export": load_torch_export, "tvm-vm": load_tvm_vm}


def register_artifact(meta: dict, root: str, device) -> str:
    """Load one exported backend function and register it under its global name.

    Raises
    ------
    ExecutionError
        For an unknown artifact kind or a loader failure (the message names the file).
    """
    import tvm_ffi

    kind = meta.get("kind")
    loader = LOADERS.get(kind)
    if loader is None:
        raise ExecutionError(f"bundle artifact {meta.get('files')} has kind {kind!r}, which this tvm-pesto cannot "
                             f"load (known: {', '.join(sorted(LOADERS))}); export it again with this version")
    try:
        fn = loader(meta, root, device)
    except Exception as e:  # noqa: BLE001 - a library failure, explained at our boundary
        raise ExecutionError(f"loading {meta.get('backend')} artifact {meta['files'][0]} failed: "
                             f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}") from e
    tvm_ffi.register_global_func(meta["name"], fn, override=True)
    return meta["name"]


__all__ = ["LOADERS", "flatten", "onnx_runner", "register_artifact", "torch_runner", "vm_runner"]
