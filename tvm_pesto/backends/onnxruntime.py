"""The graph-level backends over ONNX: a whole subgraph becomes one ONNX model run by a library.

The subgraph function is exported with :func:`tvm_pesto.backends.onnx_export.export.relax_to_onnx`
(the one Relax -> ONNX converter, shared with TensorRT and OpenVINO; constants become
initializers, so the library folds and pre-packs them). :class:`OnnxGraphBackend` holds what
these backends share (which ops, the exported artifact); the library is the subclass's.

``onnxruntime`` runs the model in ONNX Runtime. At run time inputs and the output are bound by
pointer (IOBinding over DLPack views), so ORT reads TVM's tensors and writes the DPS output
tensor in place (:func:`tvm_pesto.run.libraries.loaders.onnx_runner`, which a deployed bundle uses too).
``onnxruntime-parallel`` runs it in ONNX Runtime's parallel mode (independent branches of the
region at once, one thread each); it is offered whole regions only, on devices of two or
more cores.

Examples
--------
>>> import tvm
>>> from tvm_pesto.backends import get_backend
>>> from tvm_pesto.candidates.examples import tiny_mlp
>>> from tvm_pesto.cluster import parse_cluster
>>> mod, (x,) = tiny_mlp()
>>> gname = get_backend("onnxruntime").build(mod["main"], parse_cluster("cpu:1").devices[0])
>>> out = tvm.runtime.empty((8, 16), "float32", tvm.cpu())
>>> tvm.get_global_func(gname)(tvm.runtime.tensor(x), out)   # what relax.call_dps_packed(gname, ...) calls
>>> out.numpy().shape
(8, 16)
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import warnings
import weakref
from collections import OrderedDict

from tvm import relax

from ..errors import BuildError, error_line
from ..package_data import cache_root
from ..run.libraries.loaders import onnx_runner
from .base import Backend, constant_bytes, device_cores, instance_key, op_level_patterns, op_short_name
from .onnx_export.export import EXPORT_STAMP, relax_to_onnx, write_onnx
from .onnx_export.ops import SUPPORTED_OPS, supports_call

#: Short op names (``"nn.conv2d"``) the exporter converts.
SUPPORTED = frozenset(name[len("relax."):] for name in SUPPORTED_OPS)


#: At most this many bytes of exported models are kept in memory by :func:`onnx_model` (the
#: newest one always): a region's libraries ask for its export one after another (measurement
#: entries and the final choice's options come in that order), so a few recent exports serve them.
EXPORTS_KEPT_BYTES = 128 << 20
#: A function with this many bytes of weights or more is exported to files (:class:`OnnxFile`),
#: not to bytes; the last :data:`FILES_KEPT` such exports are kept.
FILE_MIN_BYTES, FILES_KEPT = 32 << 20, 2
_exports: OrderedDict = OrderedDict()
_exports_lock = threading.Lock()


class OnnxFile(os.PathLike):
    """An exported model on disk: the graph file, its weights beside it (ONNX external data,
    :func:`~tvm_pesto.backends.onnx_export.export.write_onnx`), in a folder of its own under
    the cache folder (:func:`tvm_pesto.package_data.cache_root`, ``exports/``), removed when
    the last holder drops this object or the process ends. ONNX Runtime and OpenVINO read it
    by its path (``os.fspath``) and map the weights, where serialized bytes would hold the
    weights twice more in memory (the protobuf and its bytes) while a session is made.
    """

    def __init__(self, func: relax.Function):
        root = cache_root() / "exports"
        root.mkdir(parents=True, exist_ok=True)
        _remove_orphans(root)
        self.folder = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root)
        self._remove = weakref.finalize(self, shutil.rmtree, self.folder, ignore_errors=True)
        self.path = os.path.join(self.folder, "model.onnx")
        try:
            self.files = write_onnx(func, self.path)
        except BaseException:
            self._remove()
            raise

    def __fspath__(self) -> str:
        return self.path


def _remove_orphans(root) -> None:
    """Remove the export folders of processes that ended without removing them (killed): each
    folder's name starts with its process id."""
    for entry in os.scandir(root):
        pid = entry.name.split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # no such process: its exports are nobody's
            shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:  # another user's live process: not ours to judge
            pass


def onnx_model(func: relax.Function) -> "bytes | OnnxFile":
    """``func`` exported to ONNX: serialized bytes, or an :class:`OnnxFile` where its weights
    take :data:`FILE_MIN_BYTES` or more. ONNX Runtime in both modes and OpenVINO read the same
    export: the last ones are kept (:data:`EXPORTS_KEPT_BYTES` of bytes, :data:`FILES_KEPT`
    files) by the function's :func:`~tvm_pesto.backends.base.instance_key`, so measuring one
    region in three libraries exports its weights once.

    Examples
    --------
    >>> from tvm_pesto.candidates.examples import tiny_mlp
    >>> func = tiny_mlp()[0]["main"]
    >>> onnx_model(func) is onnx_model(func), type(onnx_model(func)).__name__
    (True, 'bytes')
    """
    key = instance_key(func)
    with _exports_lock:
        if key in _exports:
            _exports.move_to_end(key)
            return _exports[key]
    model = None
    if constant_bytes(func) >= FILE_MIN_BYTES:
        try:
            model = OnnxFile(func)
        except OSError as e:  # a cache folder that cannot be written: the weights go through memory
            warnings.warn(f"tvm-pesto cannot write a large model's ONNX export under {cache_root() / 'exports'} "
                          f"({error_line(e)}); it is kept in memory instead, which takes more: point "
                          "TVM_PESTO_CACHE at a writable folder", RuntimeWarning, stacklevel=2)
    if model is None:
        model = relax_to_onnx(func).SerializeToString()
    with _exports_lock:
        _exports[key] = model
        _trim_exports()
    return model


def _trim_exports() -> None:
    """Drop the oldest exports of each kind over its limit (bytes: :data:`EXPORTS_KEPT_BYTES`,
    the newest always kept; files: :data:`FILES_KEPT`); the caller holds the lock."""
    files = [k for k, m in _exports.items() if isinstance(m, OnnxFile)]
    for k in files[:max(0, len(files) - FILES_KEPT)]:
        del _exports[k]
    data = [k for k, m in _exports.items() if isinstance(m, bytes)]
    total = sum(len(_exports[k]) for k in data)
    for k in data[:-1]:
        if total <= EXPORTS_KEPT_BYTES:
            break
        total -= len(_exports.pop(k))


class OnnxGraphBackend(Backend):
    """A CPU library that runs the exported ONNX model of a subgraph (graph-level).

    Subclasses implement :meth:`available` and :meth:`make_callable` (from
    ``relax_to_onnx(func)``) and name the loader of their artifact in ``artifact_kind``
    (:data:`tvm_pesto.run.libraries.loaders.LOADERS`); :meth:`artifact_meta` adds what the loader reads.
    """

    device_kinds = ("cpu",)
    graph_level = True
    max_ops = 4
    #: the loader kind of the exported ONNX file
    artifact_kind = "onnx"
    direct = True  # the loaders' ONNX Runtime and OpenVINO callables have a call on numpy arrays
    version = "6"  # the exporter's converters (backends/onnx_export/): 5 uneven adaptive pools, 6 uneven split sections

    def patterns(self):
        return op_level_patterns(self.name, set(SUPPORTED), max_depth=self.max_ops)

    def supports_op(self, call) -> bool:
        return bool(op_short_name(call)) and supports_call(call)

    def artifact_meta(self) -> dict:
        """Entries the artifact's loader reads besides the file (none by default)."""
        return {}

    def measure_stamp(self) -> str | None:
        """The exported graph's form (:data:`~tvm_pesto.backends.onnx_export.export.EXPORT_STAMP`):
        a region timed in an earlier form is measured again."""
        return EXPORT_STAMP

    def export_artifact(self, func: relax.Function, device, out_dir: str, stem: str) -> dict:
        fname = f"{stem}.onnx"
        if constant_bytes(func) >= FILE_MIN_BYTES:  # its weights beside it, written from the constants
            files = write_onnx(func, os.path.join(out_dir, fname))
        else:
            with open(os.path.join(out_dir, fname), "wb") as f:
                f.write(onnx_model(func))
            files = [fname]
        return {"kind": self.artifact_kind, "files": files, **self.artifact_meta()}


class OnnxRuntimeBackend(OnnxGraphBackend):
    """ONNX Runtime (CPU execution provider), whole subgraphs at a time (graph-level).

    One session with ``intra_op_num_threads`` = the device's core count, created at build
    time. Worker spinning is off, so idle sessions do not take cores from other devices.
    """

    name = "onnxruntime"
    build_s_guess = (0.0005, 0.00014)  # a session per unit (1,884 builds of 1-194 ops, Xeon, 2 vCPUs)
    #: ONNX Runtime's parallel execution mode (:func:`tvm_pesto.run.libraries.loaders.onnx_session`)
    parallel = False

    def available(self) -> tuple[bool, str]:
        try:
            import onnx  # noqa: F401
            import onnxruntime as ort
        except Exception as e:  # noqa: BLE001
            return False, (f"onnxruntime/onnx cannot be imported ({type(e).__name__}: {e}); "
                           "install them with `pip install onnx onnxruntime`")
        if "CPUExecutionProvider" not in ort.get_available_providers():
            return False, "onnxruntime has no CPUExecutionProvider in this build"
        return True, ""

    def make_callable(self, func: relax.Function, device):
        return onnx_runner(onnx_model(func), device_cores(device), parallel=self.parallel)

    def artifact_meta(self) -> dict:
        return {"parallel": True} if self.parallel else {}


class OnnxRuntimeParallelBackend(OnnxRuntimeBackend):
    """ONNX Runtime in its parallel execution mode: ``inter_op_num_threads`` = the device's
    core count, one intra-op thread each, so independent branches of a region run at once.

    Only whole regions of supported ops (and windows of them) are offered, no op-level
    chains: a chain has no branches to run side by side. Devices of one core are refused
    (one inter-op thread is the sequential mode).
    """

    name = "onnxruntime-parallel"
    parallel = True
    cost_proxy = "onnxruntime"

    def patterns(self):
        return []

    def supports_device(self, device) -> bool:
        return super().supports_device(device) and device_cores(device) >= 2

    def build(self, func: relax.Function, device, key: str | None = None) -> str:
        if Backend.supports_device(self, device) and device_cores(device) < 2:
            raise BuildError(f"backend {self.name!r} needs a device of two or more cores (one inter-op thread "
                             f"each), and {getattr(device, 'name', device)!r} has one; use 'onnxruntime' there")
        return super().build(func, device, key)
