"""The runtime side of the backends: callables over deployed artifacts, no TVM compiler.

A backend's subgraph is called as ``f(*inputs, *outputs)`` on TVM tensors, writing its
results into the preallocated outputs (:mod:`tvm_pesto.backends.base`). The builders here
make that callable from what a backend exports (:meth:`Backend.export_artifact`), and the
backends use the same builders at build time, so the deployed call is the built one.

``LOADERS`` maps an artifact ``kind`` to its loader:

* ``onnx``: an ONNX model run by ONNX Runtime (``onnxruntime``, and ``onnxruntime-parallel``
  with ``"parallel": true`` in the artifact's description);
* ``openvino``: an ONNX model compiled by OpenVINO when loaded (``openvino`` backend);
* ``torch-export``: a ``torch.export`` program (``torch`` backend);
* ``inductor-aoti``: an AOTInductor package, compiled when exported (``inductor`` backend);
* ``tvm-vm``: a TVM executable exported as a shared library (``tvm-ms``).

Examples
--------
>>> from tvm_pesto.run.libraries.loaders import LOADERS
>>> sorted(LOADERS)
['inductor-aoti', 'onnx', 'openvino', 'torch-export', 'tvm-vm']
"""
from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from typing import Callable

import numpy as np

from ...cluster.device_thread import owns_every_core
from ...errors import ExecutionError, error_line
from .calls import OnnxRuntimeCall, OpenVinoCall


#: Bindings an ONNX Runtime callable keeps per thread (sets of tensor addresses).
KEPT_BINDINGS = 8


def _data_ptr(t) -> int:
    """Address of a tensor's first element (TVM tensors directly; anything else via DLPack)."""
    get = getattr(t, "data_ptr", None)
    return int(get()) if callable(get) else int(np.from_dlpack(t).ctypes.data)


def kept_per_address(make: Callable) -> Callable:
    """``get(args)``: what ``make(args)`` made for these arguments' addresses on this thread,
    made once (the last :data:`KEPT_BINDINGS` sets of addresses kept per thread, oldest
    dropped first). A library's binding of given buffers is made once, not per call.

    Examples
    --------
    >>> import numpy as np
    >>> made = []
    >>> get = kept_per_address(lambda args: made.append(1) or len(made))
    >>> a = np.zeros(3)
    >>> get([a]), get([a]), len(made)
    (1, 1, 1)
    """
    kept = threading.local()  # .objs: addresses -> what was made for them, oldest first

    def get(args):
        objs = getattr(kept, "objs", None)
        if objs is None:
            objs = kept.objs = OrderedDict()
        key = tuple(_data_ptr(a) for a in args)
        obj = objs.get(key)
        if obj is None:
            obj = objs[key] = make(args)
            if len(objs) > KEPT_BINDINGS:
                objs.popitem(last=False)
        return obj

    return get


def onnx_session(model, cores: int, parallel: bool = False, spin: bool = False):
    """An ONNX Runtime session of ``model`` (bytes or a path: a model whose weights are beside
    it, ONNX's external data, is read from its path) as tvm-pesto runs its units:
    ``cores`` intra-op threads (``parallel``: ONNX Runtime's parallel mode, ``cores``
    inter-op threads of one intra-op thread each), all graph optimizations.

    Idle workers spin (ONNX Runtime's default: lower latency between calls) only with
    ``spin``, which :func:`onnx_runner` asks for when the session runs alone on a device of
    every core. Beside other units or devices, spinning workers take the cores those need.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    if parallel:
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        so.inter_op_num_threads, so.intra_op_num_threads = int(cores), 1
    else:
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.inter_op_num_threads, so.intra_op_num_threads = 1, int(cores)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    flag = "1" if spin else "0"
    so.add_session_config_entry("session.intra_op.allow_spinning", flag)
    so.add_session_config_entry("session.inter_op.allow_spinning", flag)
    source = model if isinstance(model, (bytes, bytearray)) else os.fspath(model)
    return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


def onnx_runner(model, cores: int, parallel: bool = False) -> Callable:
    """``f(*inputs, *outputs)`` over :func:`onnx_session` of ``model`` (``parallel``: in ONNX
    Runtime's parallel mode); tensors bound by pointer.

    Bindings are kept (per calling thread, the last :data:`KEPT_BINDINGS` sets of addresses)
    and made only for addresses not seen: TVM's VM hands a subgraph the same few buffers call
    after call, and binding through ONNX Runtime's Python API costs more than a small kernel.

    ``f.direct(*arrays)`` is the library's own call on numpy arrays (:func:`direct_call`),
    used when this unit is the whole program. On a device of two or more cores that has
    every core (:func:`owns_every_core`) it runs a session whose workers spin: nothing else
    runs beside it then. The DPS call runs the session made with the runner, without
    spinning, which shares its device with other units; when the spinning session is made
    before any DPS call (a whole-model unit, called directly), the other one is dropped (each
    holds the weights and their prepacked copies) and a later DPS call runs the spinning one.
    ``f.direct.prepare()`` makes that session ahead of the first direct call (a program of this
    one unit does when it is made, so its first call is a call, not a session's set-up).
    """
    sessions = {"dps": onnx_session(model, cores, parallel=parallel)}
    in_names = [i.name for i in sessions["dps"].get_inputs()]
    out_names = [o.name for o in sessions["dps"].get_outputs()]
    n_in = len(in_names)
    dps_used = []  # set by the first DPS call
    swap = threading.Lock()  # held while the direct call replaces the DPS session

    def dps_session():
        sess = sessions.get("dps") or sessions.get("spin")
        if sess is None:
            with swap:
                return sessions.get("dps") or sessions["spin"]
        return sess

    def bind(args):
        io = dps_session().io_binding()
        for nm, a in zip(in_names, args[:n_in]):
            arr = np.from_dlpack(a)
            io.bind_input(nm, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
        for nm, o in zip(out_names, args[n_in:]):
            arr = np.from_dlpack(o)
            io.bind_output(nm, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
        return io

    binding = kept_per_address(bind)

    def run(*args):
        if not dps_used:
            dps_used.append(True)
        dps_session().run_with_iobinding(binding(args))

    # the model is kept only until the spinning session is made, and only where one will be
    pending = [model] if int(cores) > 1 and owns_every_core(cores) else []
    alone: list = []  # the direct call (calls.OnnxRuntimeCall), made on first use

    def prepare():
        if not alone:
            if pending:
                with swap:
                    if not dps_used:  # a whole-model unit called directly: its DPS session's copies go first
                        del sessions["dps"]
                    sessions["spin"] = onnx_session(pending.pop(), cores, parallel=parallel, spin=True)
            alone.append(OnnxRuntimeCall(sessions.get("spin") or sessions["dps"]))
        return alone[0]

    def direct(*arrays):
        return (alone[0] if alone else prepare())(*arrays)

    direct.prepare = prepare  # the session made now, not in the first call (runtime._direct)
    run.direct = direct  # numpy in, numpy out: the library's own call (see direct_call)
    return run


def openvino_model(model, cores: int, precision: str = "f32"):
    """An OpenVINO model compiled for the CPU from ``model`` (ONNX bytes or a path), as
    tvm-pesto runs its units: ``cores`` inference threads, the latency hint (one stream),
    ``precision`` inference (``f32``; OpenVINO's own default is ``bf16`` on CPUs that have
    it, which the ``openvino-bf16`` backend asks for) and no CPU pinning.

    OpenVINO's pinning re-pins the thread that calls ``infer`` to cores of its own choosing
    and afterwards to every core of the process, undoing the device thread's affinity
    (:func:`tvm_pesto.cluster.device_thread.enter_device_thread`) and putting two devices'
    units on one core. Without it the calling thread, which computes a one-thread model by
    itself, stays on its device's cores; OpenVINO's other worker threads (TBB's, shared by
    every model of the process) may run on any core of the process.
    """
    import openvino as ov

    core = _openvino_core()
    ov_model = core.read_model(bytes(model) if isinstance(model, (bytes, bytearray)) else os.fspath(model))
    config = {"INFERENCE_NUM_THREADS": int(cores), "PERFORMANCE_HINT": "LATENCY", "ENABLE_CPU_PINNING": False,
              "INFERENCE_PRECISION_HINT": getattr(ov.Type, precision)}
    return core.compile_model(ov_model, "CPU", config)


def onnx_input_names(model) -> list[str]:
    """The graph input names of an ONNX model (bytes or a path), in order, initializers left out."""
    import onnx

    m = (onnx.load_from_string(bytes(model)) if isinstance(model, (bytes, bytearray))
         else onnx.load(os.fspath(model), load_external_data=False))
    inits = {t.name for t in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in inits]


@functools.lru_cache(maxsize=1)
def _openvino_core():
    """The process's one ``openvino.Core`` (made on first use)."""
    import openvino as ov

    return ov.Core()


def openvino_runner(model, cores: int, precision: str = "f32") -> Callable:
    """``f(*inputs, *outputs)`` over :func:`openvino_model` of ``model`` (in ``precision``);
    tensors shared.

    Each set of buffer addresses gets an infer request whose input and output tensors are
    the DPS buffers themselves (``openvino.Tensor(view, shared_memory=True)``): OpenVINO
    reads TVM's inputs and writes the outputs in place, with no copy and no tensor setting
    per call (inputs matched by name: OpenVINO drops those the model does not read).
    Requests are kept per calling thread (an infer request is not thread-safe), the last
    :data:`KEPT_BINDINGS` sets of addresses, as :func:`onnx_runner` keeps its bindings; a
    kept request holds its buffers' views, so those buffers live as long as it is kept.
    """
    import openvino as ov

    names = onnx_input_names(model)  # first: its parse of the weights is freed before OpenVINO reads them
    compiled = openvino_model(model, cores, precision)
    n_in = len(names)
    port = {n: k for k, p in enumerate(compiled.inputs) for n in p.get_names()}
    # (argument position, OpenVINO input index) of the inputs OpenVINO kept: it drops unused ones
    used = [(pos, port[n]) for pos, n in enumerate(names) if n in port]

    def bind(args):
        req = compiled.create_infer_request()
        for pos, k in used:
            req.set_input_tensor(k, ov.Tensor(np.from_dlpack(args[pos]), shared_memory=True))
        for k, o in enumerate(args[n_in:]):
            req.set_output_tensor(k, ov.Tensor(np.from_dlpack(o), shared_memory=True))
        return req

    request = kept_per_address(bind)

    def run(*args):
        request(args).infer()

    run.direct = OpenVinoCall(compiled, used, n_in)  # numpy in, numpy out: the library's own call (see direct_call)
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
    return onnx_runner(_file(meta, root), int(meta.get("cores", 1)), parallel=bool(meta.get("parallel", False)))


def load_openvino(meta: dict, root: str, device) -> Callable:
    return openvino_runner(_file(meta, root), int(meta.get("cores", 1)), meta.get("precision", "f32"))


def load_torch_export(meta: dict, root: str, device) -> Callable:
    import torch

    module = torch.export.load(_file(meta, root)).module()
    return torch_runner(module, int(meta["num_inputs"]), int(meta.get("cores", 1)))


def load_inductor_aoti(meta: dict, root: str, device) -> Callable:
    """An AOTInductor package (``.pt2``) as ``f(*inputs, *outputs)``: the library compiled at
    export, loaded without compiling.

    PyTorch's loader unpacks the package into a folder of ``$TMPDIR`` that it removes when it
    is destroyed, which a loader held by TVM's function registry never is: the folder is made
    in a scratch folder of this process instead, removed when the process ends."""
    import torch

    lock = _AOTI_SCRATCH["lock"]
    with lock:
        if _AOTI_SCRATCH["dir"] is None:
            _AOTI_SCRATCH["dir"] = tempfile.mkdtemp(prefix="tvm-pesto-aoti-")
            atexit.register(shutil.rmtree, _AOTI_SCRATCH["dir"], ignore_errors=True)
        old = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = _AOTI_SCRATCH["dir"]
        try:
            model = torch._inductor.aoti_load_package(_file(meta, root))
        finally:
            if old is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = old
    return torch_runner(model, int(meta["num_inputs"]), int(meta.get("cores", 1)))


#: This process's scratch folder for unpacked AOTInductor packages (:func:`load_inductor_aoti`).
_AOTI_SCRATCH: dict = {"dir": None, "lock": threading.Lock()}


def load_tvm_vm(meta: dict, root: str, device) -> Callable:
    import tvm
    import tvm.runtime.vm  # not imported by ``import tvm`` in runtime-only mode

    lib = tvm.runtime.load_module(_file(meta, root))
    vm = tvm.runtime.vm.VirtualMachine(lib, device.tvm_device())
    return vm_runner(vm["main"], int(meta["num_inputs"]), int(meta["num_outputs"]))


LOADERS: dict[str, Callable] = {"onnx": load_onnx, "openvino": load_openvino, "torch-export": load_torch_export,
                                 "inductor-aoti": load_inductor_aoti, "tvm-vm": load_tvm_vm}


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
                             f"{error_line(e)}") from e
    register_unit(meta["name"], fn)
    return meta["name"]


#: Global name -> the callable registered under it (weakly: TVM's registry, or a placed
#: model, keeps it alive).
_UNITS: "weakref.WeakValueDictionary[str, Callable]" = weakref.WeakValueDictionary()


def register_unit(gname: str, fn: Callable) -> None:
    """Register a unit's ``f(*inputs, *outputs)`` under ``gname`` for ``R.call_dps_packed``
    (TVM's global function registry) and for :func:`direct_call`."""
    import tvm_ffi

    tvm_ffi.register_global_func(gname, fn, override=True)
    _UNITS[gname] = fn


def direct_call(gname: str) -> Callable | None:
    """The unit ``gname``'s call on numpy arrays, ``f(*arrays) -> list of arrays``, when its
    library has one (ONNX Runtime's ``session.run``); else None.

    A program that is this one unit (:class:`~tvm_pesto.run.runtime.PlacedRuntime`) calls
    it instead of the VM: no copy into TVM tensors, no VM call, no binding, the library's
    own call.
    """
    return getattr(_UNITS.get(gname), "direct", None)


__all__ = ["LOADERS", "direct_call", "flatten", "onnx_input_names", "kept_per_address", "onnx_runner", "onnx_session", "openvino_model",
           "openvino_runner", "register_artifact", "register_unit", "torch_runner", "vm_runner"]
