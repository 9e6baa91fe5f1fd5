"""The graph-level backend: a whole subgraph becomes one ONNX model run by ONNX Runtime.

The subgraph function is exported with :func:`tvm_pesto.backends.onnx_export.relax_to_onnx`
(the one Relax -> ONNX converter, shared with TensorRT; constants become initializers, so
ONNX Runtime folds and pre-packs them). At run time inputs and the output are bound by
pointer (IOBinding over DLPack views), so ORT reads TVM's tensors and writes the DPS output
tensor in place (:func:`tvm_pesto.run.loaders.onnx_runner`, which a deployed bundle uses too).

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

from tvm import relax

from .base import Backend, device_cores, op_level_patterns, op_short_name
from .onnx_export import SUPPORTED_OPS, relax_to_onnx, supports_call

#: Short op names (``"nn.conv2d"``) the exporter converts.
SUPPORTED = frozenset(name[len("relax."):] for name in SUPPORTED_OPS)


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime (CPU execution provider), whole subgraphs at a time (graph-level).

    One session with ``intra_op_num_threads`` = the device's core count, created at build
    time. Worker spinning is off, so idle sessions do not take cores from other devices.
    """

    name = "onnxruntime"
    device_kinds = ("cpu",)
    graph_level = True
    max_ops = 4

    def patterns(self):
        return op_level_patterns("onnxruntime", set(SUPPORTED), max_depth=self.max_ops)

    def supports_op(self, call) -> bool:
        return bool(op_short_name(call)) and supports_call(call)

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
        from ..run.loaders import onnx_runner

        return onnx_runner(relax_to_onnx(func).SerializeToString(), device_cores(device))

    def export_artifact(self, func: relax.Function, device, out_dir: str, stem: str) -> dict:
        model = relax_to_onnx(func)
        fname = f"{stem}.onnx"
        with open(os.path.join(out_dir, fname), "wb") as f:
            f.write(model.SerializeToString())
        return {"kind": "onnx", "files": [fname]}
